"""Fused projections (dsbd_jax.models.fused): q/k/v and gate/up stored as one kernel each.

A fused tree is the same model: each output column is the same dot product of the same operands,
so 16-bit and int8 models give bit-identical logits and float32 ones agree to float32 rounding
(XLA:CPU's float32 product may block a wider kernel's reduction differently). The parts go back
out exactly (``unfuse_projections``); the wrong order of parts gives other logits (so the logits
checks below can fail); the parameter check, ``jit``, both layouts, biases and int8 kernels
take fused trees; ``load_model(fused_projections=...)`` stores them so and refuses what it cannot
do before reading a weight; the sharding rules and LoRA refuse fused trees by name.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import exact_reference as ref
from dsbd_jax.models import fused, kinds, weights
from dsbd_jax.models.axes import logical_axes
from dsbd_jax.models.llama import convert_layout, logits, params_layout
from dsbd_jax.models.param_check import check_params

IDS = jnp.array([[1, 2, 3, 4, 5, 0, 2], [3, 3, 1, 0, 4, 5, 1]])


def _model(dtype="float32", layout="per_layer", bias=False, seed=0):
    c, p = ref.toy_model(64, seed=seed, layers=2, dtype=dtype, attention_bias=bias)
    if params_layout(p) != layout:
        p = convert_layout(p, layout)
    return c, p


def _same_arrays(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return (jax.tree.structure(a) == jax.tree.structure(b)
            and all(x.dtype == y.dtype and np.array_equal(np.asarray(x), np.asarray(y))
                    for x, y in zip(la, lb)))


@pytest.mark.parametrize("layout", ["per_layer", "stacked"])
@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "int8"])
def test_a_fused_model_is_the_same_model(dtype, layout, bias):
    c, p = _model("float32" if dtype == "int8" else dtype, layout, bias)
    if dtype == "int8":
        p, c = kinds.int8_params(p, c)
    f = fused.fuse_projections(p)
    assert fused.is_fused(f) and not fused.is_fused(p)
    block = f["layers"] if layout == "stacked" else f["layers_1"]
    assert set(block["attn"]) >= {"qkv_proj"} and "q_proj" not in block["attn"]
    assert set(block["mlp"]) == {"gate_up_proj", "down_proj"}
    assert ("bias" in block["attn"]["qkv_proj"]) == bias
    H, K, D = c.num_heads, c.num_kv_heads, c.head_dim
    assert weights.shape_of(block["attn"]["qkv_proj"]["kernel"])[-2:] == (c.hidden_size,
                                                                         (H + 2 * K) * D)
    check_params("target", c, f)
    want = logits(c, p, IDS)
    got = jax.jit(lambda q: logits(c, q, IDS))(f)
    if dtype == "float32":
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    else:
        np.testing.assert_array_equal(got, want)
    # the parts come back exactly, in their kind
    assert _same_arrays(fused.unfuse_projections(f, c), p)
    assert fused.fuse_projections(f) is not f and _same_arrays(fused.fuse_projections(f), f)


def test_the_parts_order_matters():
    """Fused in another order (v, k, q; up, gate), the model is another one: the logits checks
    above can fail."""
    c, p = _model()
    f = fused.fuse_projections(p)
    orders = {"qkv_proj": ("attn", ("v_proj", "k_proj", "q_proj")),
              "gate_up_proj": ("mlp", ("up_proj", "gate_proj"))}
    wrong = fused.copy_dicts(p)
    for block in fused._blocks(wrong):
        for name, (module, parts) in orders.items():
            fused._fuse_module_(block[module], name, parts, wait=False)
    check_params("target", c, wrong)   # the same shapes (K = H / 2 here: q is wider than k, v)
    assert np.abs(np.asarray(logits(c, wrong, IDS) - logits(c, f, IDS))).max() > 1e-2


def test_int8_fused_codes_are_the_fused_kernels_codes():
    c, p = _model()
    q, _ = kinds.int8_params(p, c)
    a = fused.fuse_projections(q)["layers_0"]["mlp"]["gate_up_proj"]["kernel"]
    plain = jnp.concatenate([p["layers_0"]["mlp"][k]["kernel"] for k in ("gate_proj", "up_proj")],
                            axis=-1)
    b = weights.Int8.quantize(plain)
    np.testing.assert_array_equal(a.codes, b.codes)
    np.testing.assert_array_equal(a.scales, b.scales)


def test_in_place_fusing_and_its_refusals():
    c, p = _model()
    tree = fused.copy_dicts(p)
    kept = tree["layers_0"]["attn"]
    out = fused.fuse_projections_(tree)
    assert out is tree and fused.is_fused(tree) and "q_proj" in kept   # module dicts replaced
    assert _same_arrays(tree, fused.fuse_projections(p))
    assert fused.fuse_projections_(tree) is tree and _same_arrays(tree, fused.fuse_projections(p))
    with pytest.raises(TypeError, match="parameter dict"):
        fused.fuse_projections_([p])
    # transposed row blocks have no fused form
    t = kinds.transpose_params(p, kinds.transposed_widths(c))
    with pytest.raises(ValueError, match="RowBlocks.*only plain"):
        fused.fuse_projections(t)
    # a module with some of the parts only
    broken = fused.copy_dicts(p)
    del broken["layers_0"]["attn"]["v_proj"]
    with pytest.raises(ValueError, match="not \\['v_proj'\\]"):
        fused.fuse_projections(broken)


def test_sharding_rules_and_lora_refuse_fused_trees():
    with pytest.raises(ValueError, match="fused projections are not sharded"):
        logical_axes(("layers_0", "attn", "qkv_proj", "kernel"), 2)
    from dsbd_jax.training.distill import init_lora
    c, p = _model()
    with pytest.raises(ValueError, match="fused"):
        init_lora(fused.fuse_projections(p), 2, jax.random.key(0))
    assert init_lora(fused.unfuse_projections(fused.fuse_projections(p), c), 2, jax.random.key(0))


def test_load_model_fuses_on_request(tmp_path):
    from hf_files import hf_config, hf_tensors, write_hf

    from dsbd_jax.loading.load import load_model
    write_hf(tmp_path / "m", hf_config("Qwen2ForCausalLM"), hf_tensors(seed=4, bias=True))
    auto = load_model(tmp_path / "m", progress=False)
    on_cpu = jax.default_backend() == "cpu"   # "auto": separate on the CPU, fused off it
    assert auto.info["fused_projections"] is (not on_cpu) and fused.is_fused(auto.params) is (
        not on_cpu)
    sep = load_model(tmp_path / "m", jnp.float32, progress=False, kernel_blocks=None)
    fz = load_model(tmp_path / "m", jnp.float32, progress=False, fused_projections=True)
    assert fz.info["fused_projections"] is True and fused.is_fused(fz.params)
    assert fz.info["kernel_transposed"] == {}
    check_params("target", fz.config, fz.params)
    np.testing.assert_allclose(logits(fz.config, fz.params, IDS % fz.config.vocab_size),
                               logits(sep.config, sep.params, IDS % sep.config.vocab_size),
                               rtol=1e-4, atol=1e-4)   # float32 rounding
    q = load_model(tmp_path / "m", progress=False, fused_projections=True, weights="int8")
    assert isinstance(q.params["layers_0"]["attn"]["qkv_proj"]["kernel"], weights.Int8)
    # refused before any weight is read (the path does not exist)
    for bad in ("yes", 1, None):
        with pytest.raises(ValueError, match="fused_projections must be"):
            load_model(tmp_path / "nothing", progress=False, fused_projections=bad)
    with pytest.raises(ValueError, match="cannot place onto a mesh"):
        load_model(tmp_path / "nothing", progress=False, fused_projections=True,
                   place=lambda path, host, dtype: host)


def test_a_head_started_from_a_fused_target_has_separate_kernels():
    """A draft head copies the target's last block (``models.head.init_params``): from a fused
    target it gets the same separate kernels as from the separate one, and the head's forward
    runs with the fused target."""
    from dsbd_jax.models import head as mh
    c, p = _model()
    hc = mh.HeadConfig(c)
    a = mh.init_params(hc, jax.random.key(2), target_params=p)
    b = mh.init_params(hc, jax.random.key(2), target_params=fused.fuse_projections(p))
    assert not fused.is_fused(b) and _same_arrays(a, b)
    mh.check_params(hc, b)



def test_a_sharded_decoder_places_a_fused_tree_as_separate_kernels():
    """``ShardedDecoder.place`` splits fused projections back (the rules name the separate
    ones): a fused target decodes on a (1, 1) mesh as the separate one does on one device; an
    unplaced fused tree handed to the sharding rules is refused by name."""
    from dsbd_jax import SampleConfig, sample
    from dsbd_jax.parallel import ShardedDecoder, make_mesh
    from dsbd_jax.parallel.rules import param_shardings
    c, p = _model("bfloat16")
    cfg = SampleConfig(target=c, max_new_tokens=4, eos_token_id=())
    ids = np.array([[1, 2, 3], [3, 2, 1]], np.int32)
    dec = ShardedDecoder(sample, cfg, make_mesh(1, 1))
    placed = dec.place(fused.fuse_projections(p))
    assert not fused.is_fused(placed)
    out = dec(placed, ids, jax.random.key(3))
    ref = sample(p, ids, jax.random.key(3), cfg)
    np.testing.assert_array_equal(np.asarray(out.sequences), np.asarray(ref.sequences))
    with pytest.raises(ValueError, match="fused projections are not sharded"):
        param_shardings(fused.fuse_projections(p), cfg, dec.rules)


def test_quantising_a_fused_tree_gives_the_fused_int8_tree():
    """``int8_params`` of a fused tree quantises the fused kernels too (per output channel: the
    same codes as fusing the int8 parts), nothing left in float."""
    c, p = _model()
    a, _ = kinds.int8_params(fused.fuse_projections(p), c)
    b = fused.fuse_projections(kinds.int8_params(p, c)[0])
    assert isinstance(a["layers_0"]["attn"]["qkv_proj"]["kernel"], weights.Int8)
    assert _same_arrays(a, b)
