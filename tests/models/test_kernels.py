"""Blocked projection kernels (dsbd_jax.models.kernels): the product, tree conversion in both
weight layouts, the forward and a decoder on blocked trees, the per-host choice, and every place
that needs ``[in, out]`` kernels. Run with ``PYTHONPATH=tests``."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import exact_reference as ref
from dsbd_jax.decoding.common import DecodeConfig
from dsbd_jax.decoding.inputs import check_params
from dsbd_jax.decoding.beam import beam_sample
from dsbd_jax.models import cpu_options, kernels
from dsbd_jax.models.llama import Dense, convert_layout

BLOCKS = {"q_proj": 8, "k_proj": 4, "v_proj": 8, "o_proj": 8, "gate_proj": 16,
          "up_proj": 8, "down_proj": 4}


model = ref.kernel_model


def test_product_and_round_trip():
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((2, 24, 48)), jnp.float32)  # a stacked [L, in, out]
    for n in (4, 16, 48):
        b = kernels.block(w, n)
        assert b.shape == (2, 48 // n, 24, n)
        np.testing.assert_array_equal(np.asarray(kernels.unblock(b)), np.asarray(w))
        for lead in ((1,), (3,), (2, 5), (1, 1)):
            x = jnp.asarray(rng.standard_normal(lead + (24,)), jnp.float32)
            np.testing.assert_allclose(np.asarray(kernels.project(x, b[1])),
                                       np.asarray(x @ w[1]), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="does not divide"):
        kernels.block(w, 5)


def test_dense_with_a_plain_kernel_is_flax_dense_bit_for_bit():
    x = jnp.asarray(np.random.default_rng(1).standard_normal((3, 5, 16)), jnp.float32)
    ours = Dense(24, True, jnp.float32)
    theirs = nn.Dense(24, use_bias=True, dtype=jnp.float32, param_dtype=jnp.float32,
                      kernel_init=nn.initializers.normal(0.02))
    variables = ours.init(jax.random.key(0), x)
    variables = jax.tree.map(lambda v: v + 0.1, variables)  # a non-zero bias too
    assert jax.tree.map(jnp.shape, variables) == jax.tree.map(
        jnp.shape, theirs.init(jax.random.key(0), x))
    np.testing.assert_array_equal(np.asarray(ours.apply(variables, x)),
                                  np.asarray(theirs.apply(variables, x)))


@pytest.mark.parametrize("layout", ["per_layer", "stacked"])
def test_blocked_tree_gives_the_same_forward(layout):
    config, params = model(layout)
    blocked = kernels.block_params(params, BLOCKS)
    assert kernels.blocks_of(blocked) == BLOCKS and kernels.blocks_of(params) == {}
    back = kernels.unblock_params(blocked)
    assert jax.tree.structure(back) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert kernels.unblock_params(params) is params
    reblocked = kernels.block_params(blocked, {"down_proj": 2})
    assert kernels.blocks_of(reblocked)["down_proj"] == 2
    # convert_layout carries blocked kernels across layouts
    other = "stacked" if layout == "per_layer" else "per_layer"
    assert kernels.blocks_of(convert_layout(blocked, other)) == BLOCKS
    check_params("target", config, blocked)  # the trace-time check knows blocked kernels
    # one row per call (padded to two inside) and several
    ref.assert_same_forward(config, params, [blocked], [(2, 1), (2, 3)])


def test_check_params_rejects_a_blocked_kernel_of_the_wrong_size():
    config, params = model()
    bad = kernels.block_params(params, {"down_proj": 4})
    w = bad["layers_0"]["mlp"]["down_proj"]["kernel"]
    bad["layers_0"]["mlp"]["down_proj"]["kernel"] = kernels.ColBlocks(w.value[:3])
    with pytest.raises(ValueError, match=r"layers_0.*down_proj.*expected shape \(32, 16\)"):
        check_params("draft", config, bad)


def test_a_decoder_on_a_blocked_tree():
    config, params = model()
    blocked = kernels.block_params(params, BLOCKS)
    cfg = DecodeConfig(target=config, max_new_tokens=6, num_beams=3, top_k=6)
    ids = jnp.asarray([[1, 2, 3, 4], [5, 6, 7, 0]], jnp.int32)
    lens = jnp.asarray([4, 3], jnp.int32)
    want = beam_sample(params, ids, jax.random.key(0), cfg, prompt_lengths=lens)
    got = beam_sample(blocked, ids, jax.random.key(0), cfg, prompt_lengths=lens)
    np.testing.assert_array_equal(np.asarray(got.sequences), np.asarray(want.sequences))
    np.testing.assert_allclose(np.asarray(got.log_likelihoods), np.asarray(want.log_likelihoods), rtol=1e-5,
                               atol=1e-5)


def test_pick_policy():
    base = {1: 1.0, 4: 2.0, 16: 3.0}
    assert kernels.pick({0: base, 64: {1: 1.0, 4: 1.0, 16: 1.5}}) == 64
    # faster in total but 10% slower at one row: not taken
    assert kernels.pick({0: base, 64: {1: 1.1, 4: 1.0, 16: 1.5}}) == 0
    # not 10% faster in total: not taken
    assert kernels.pick({0: base, 64: {1: 1.0, 4: 1.9, 16: 2.7}}) == 0
    assert kernels.pick({0: base, 32: {1: 1.0, 4: 1.2, 16: 1.5},
                         64: {1: 1.0, 4: 1.0, 16: 1.5}}) == 64


def test_choose_blocks(monkeypatch, tmp_path):
    monkeypatch.setenv("DSBD_JAX_CACHE", str(tmp_path))
    config, _ = model()
    kernels._choose.cache_clear()
    monkeypatch.setenv(kernels.ENV, "auto")
    assert kernels.choose_blocks(config) == {}  # small shapes are never blocked, nor measured
    assert not any(e.startswith("blocks") for e in cpu_options.host_entries())
    monkeypatch.setenv(kernels.ENV, "none")
    assert kernels.choose_blocks(config) == {}
    monkeypatch.setenv(kernels.ENV, "16")  # every projection whose output 16 divides (not = 16)
    assert kernels.choose_blocks(config) == {"gate_proj": 16, "up_proj": 16}  # q, o: 16 wide
    monkeypatch.setenv(kernels.ENV, "halves")  # half of every projection's output columns
    halves = kernels.choose_blocks(config)
    shapes = kernels.projection_shapes(config)
    assert halves == {p: dout // 2 for p, (_, dout) in shapes.items()}
    for p, n in halves.items():
        assert kernels.width_of(kernels.HALVES, shapes[p][1]) == n and shapes[p][1] == 2 * n
    monkeypatch.setenv(kernels.ENV, "big")
    with pytest.raises(ValueError, match="DSBD_JAX_KERNEL_BLOCKS"):
        kernels.choose_blocks(config)
    # the measurement itself, and its cache (a shape above MIN_ELEMENTS, few rounds)
    monkeypatch.setattr(kernels, "MIN_ELEMENTS", 1)
    monkeypatch.setattr(kernels, "PROBE_LAYERS", 1)
    monkeypatch.setattr(kernels, "PROBE_REPEATS", 1)
    monkeypatch.setenv(kernels.ENV, "auto")
    n = kernels._choose(64, 256, "float32")
    assert n in (0, 32, 64, 128)
    entry = cpu_options.host_entries()[kernels.choose_key(64, 256, "float32")]
    assert entry["choice"] == n and set(entry["min_ms"]) == {"0", "32", "64", "128"}
    # a cached choice made under other compiler options or candidates is not reused
    assert "options " in kernels.choose_key(64, 256, "float32")
    assert "blocks 0,32,64,128" in kernels.choose_key(64, 256, "float32")
    kernels._choose.cache_clear()
    assert kernels._choose(64, 256, "float32") == n  # read back from the cache
    kernels._choose.cache_clear()


def test_load_model_blocks_and_unblocking_users(bench_pair, tmp_path):
    from dsbd_jax import load_model
    from dsbd_jax.training.export import save_hf
    t, _, _, _ = bench_pair
    plain = load_model(t, progress=False)  # opt-in: plain kernels by default
    assert plain.info["kernel_blocks"] == {} and kernels.blocks_of(plain.params) == {}
    auto = load_model(t, progress=False, kernel_blocks="auto")  # tiny shapes: never blocked
    assert auto.info["kernel_blocks"] == {}
    d = plain.config.hidden_size
    blocked = load_model(t, progress=False, kernel_blocks={"down_proj": d // 2})
    assert blocked.info["kernel_blocks"] == {"down_proj": d // 2}
    assert kernels.blocks_of(blocked.params) == {"down_proj": d // 2}
    with pytest.raises(ValueError, match="kernel_blocks must be"):
        load_model(t, progress=False, kernel_blocks="fast")
    # export writes [in, out] kernels back out: the same checkpoint as from the plain tree
    save_hf(tmp_path / "a", plain.config, plain.params)
    save_hf(tmp_path / "b", blocked.config, blocked.params)
    again = load_model(str(tmp_path / "b"), progress=False, kernel_blocks=None)
    for a, b in zip(jax.tree.leaves(again.params), jax.tree.leaves(plain.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_kernel_blocks_benchmark_small(tmp_path):
    import json
    from bench_setup import load_bench
    bench = load_bench("kernel_blocks")
    out = tmp_path / "kb.json"
    bench.main(["--small", "--blocks", "16", "--max-new-tokens", "4", "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["machine"]["cpu_model"] and data["blocks"]
    for m in ("sample", "beam_sample_W4"):
        run = data["runs"][m]
        assert run["plain"]["tokens"] == run["blocked"]["tokens"] == 8
        assert run["blocked_vs_plain"] > 0
