"""Draft heads as a model kind (dsbd_jax/models/head.py): config, features, parameters, saving,
loading, sharding."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dsbd_jax.decoding.configs import DSBDConfig, SpeculativeConfig, TreeConfig
from dsbd_jax.loading import heads
from dsbd_jax.models import head as mh
from dsbd_jax.models import llama
from dsbd_jax.models.config import ModelConfig

ROOT = Path(__file__).resolve().parents[2]
CFG = ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2,
                  num_kv_heads=1, head_dim=8, max_position_embeddings=64)


def _target():
    return llama.init_params(CFG, jax.random.PRNGKey(0), "per_layer")


def test_config_reads_as_a_one_layer_model_and_checks_its_fields():
    hc = mh.HeadConfig(CFG, intermediate_size=8, feature_layers=(0, 1))
    assert (hc.num_layers, hc.vocab_size, hc.intermediate_size, hc.feature_size) == (1, 32, 8, 32)
    assert hc.replace(num_kv_heads=2).target.num_kv_heads == 2
    assert mh.HeadConfig.from_dict(hc.to_dict()) == hc
    with pytest.raises(ValueError, match="feature_layers"):
        mh.HeadConfig(CFG, feature_layers=(2,))
    with pytest.raises(ValueError, match="intermediate_size"):
        mh.HeadConfig(CFG, intermediate_size=0)
    other = CFG.replace(hidden_size=24)
    for cls in (SpeculativeConfig, TreeConfig, DSBDConfig):   # every drafted decoder's config
        with pytest.raises(ValueError, match="another target"):
            cls(target=other, draft=mh.HeadConfig(CFG))


def test_target_returns_features_and_the_head_started_from_the_last_layer_reproduces_it():
    """The final-normed features are what the vocabulary head reads (logits = head(features));
    a head initialised from the target's last layer, read with the layer before's output as its
    feature... is not the target, but its logits come through the target's own head."""
    tp = _target()
    B, T = 2, 5
    toks = jax.random.randint(jax.random.PRNGKey(1), (B, T), 0, 32)
    pos = jnp.broadcast_to(jnp.arange(T), (B, T))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (B, T, T))
    logits, kv = llama.forward(CFG, tp, toks, pos, mask)
    logits2, kv2, feats = llama.forward(CFG, tp, toks, pos, mask, feature_layers=())
    np.testing.assert_array_equal(logits, logits2)
    np.testing.assert_allclose(logits, feats @ tp["embed"]["embedding"].T if CFG.tie_word_embeddings
                               else feats @ tp["lm_head"]["kernel"], rtol=1e-5, atol=1e-5)
    _, _, fused = llama.forward(CFG, tp, toks, pos, mask, feature_layers=(0, 1))
    assert fused.shape == (B, T, 32)
    hc = mh.HeadConfig(CFG)
    hp = mh.init_params(hc, jax.random.PRNGKey(2), target_params=tp)
    hl, hkv, hf = mh.forward(hc, hp, tp, toks, mh.features_of_prompt(feats), pos, mask)
    assert hl.shape == (B, T, 32) and hkv.k.shape == (1, B, T, 1, 8) and hf.shape == feats.shape
    np.testing.assert_allclose(hl, hf @ tp["lm_head"]["kernel"], rtol=1e-5, atol=1e-5)
    # the copied block is the target's last layer
    for leaf_t, leaf_h in zip(jax.tree.leaves(tp["layers_1"]), jax.tree.leaves(hp["layers_0"])):
        np.testing.assert_array_equal(leaf_t, leaf_h)


def test_truncated_head_save_load_and_bad_parameters(tmp_path):
    tp = _target()
    hc = mh.HeadConfig(CFG, intermediate_size=8)
    hp = mh.truncate(hc, mh.init_params(hc, jax.random.PRNGKey(3)), tp, np.arange(0, 32, 2))
    heads.save(tmp_path / "h", hc, hp, {"note": "x"})
    hc2, hp2, meta = heads.load(tmp_path / "h", CFG.replace(dtype="bfloat16"))
    assert meta == {"note": "x"} and hc2.target.dtype == "bfloat16"
    flat = lambda t: {jax.tree_util.keystr(p): np.asarray(x, np.float32)  # noqa: E731
                      for p, x in jax.tree_util.tree_flatten_with_path(t)[0]}
    a, b = flat(hp), flat(hp2)
    assert a.keys() == b.keys()
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-2, atol=1e-2)
    assert hp2["vocab_head"]["rows"].dtype == jnp.int32
    with pytest.raises(ValueError, match="made for a target"):
        heads.load(tmp_path / "h", CFG.replace(hidden_size=24, head_dim=12))
    bad = dict(hp, fc={"kernel": jnp.zeros((3, 3)), "bias": hp["fc"]["bias"]})
    with pytest.raises(ValueError, match="fc"):
        mh.check_params(hc, bad)
    with pytest.raises(FileNotFoundError):
        heads.load(tmp_path / "nothing")


def _same_logits(hc, a, b):
    """A head's logits over four tokens and random features are the same with ``a`` and ``b``,
    each ``(head params, target params)``."""
    T = 4
    toks = jnp.arange(T)[None] + 3
    pos = jnp.arange(T)[None]
    mask = jnp.tril(jnp.ones((T, T), bool))[None]
    feats = jax.random.normal(jax.random.PRNGKey(4), (1, T, 16))
    la, lb = (mh.forward(hc, hp, tp, toks, feats, pos, mask)[0] for hp, tp in (a, b))
    np.testing.assert_allclose(la, lb, rtol=1e-5, atol=1e-5)


def test_head_from_a_transposed_target_runs_checks_and_saves_plain(tmp_path):
    """A block copied from a target in the transposed kernel form (what ``load_model`` gives on
    hosts that pick it) keeps that form: it passes the check, gives the plain block's logits,
    and is saved in the plain form, so that the file loads anywhere."""
    from dsbd_jax.models import kinds
    tp = _target()
    tpt = kinds.transpose_params(tp, kinds.transposed_widths(CFG))
    hc = mh.HeadConfig(CFG)
    plain = mh.init_params(hc, jax.random.PRNGKey(2), target_params=tp)
    trans = mh.init_params(hc, jax.random.PRNGKey(2), target_params=tpt)
    assert isinstance(trans["layers_0"]["mlp"]["up_proj"]["kernel"], kinds.RowBlocks)
    mh.check_params(hc, trans)
    _same_logits(hc, (plain, tp), (trans, tpt))
    heads.save(tmp_path / "h", hc, trans)
    _, back, _ = heads.load(tmp_path / "h", CFG)
    assert "kernel" in back["layers_0"]["mlp"]["up_proj"]
    for (pa, x), (pb, y) in zip(jax.tree_util.tree_flatten_with_path(plain)[0],
                                jax.tree_util.tree_flatten_with_path(back)[0]):
        assert pa == pb
        np.testing.assert_array_equal(x, y)


def test_a_head_bound_to_its_target_loads_in_the_hosts_kernel_form(tmp_path, monkeypatch):
    """``load`` with the target's config gives the block the kernel form ``load_model`` would give
    a model of its shape on this host (forced here through ``$DSBD_JAX_KERNEL_FORM``): transposed
    row blocks, the same logits as the plain block, saved plain again; unbound, or where the
    host's form is plain, the kernels stay plain."""
    from dsbd_jax.models import kinds
    from dsbd_jax.host import forms
    tp = _target()
    hc = mh.HeadConfig(CFG)
    hp = mh.init_params(hc, jax.random.PRNGKey(2), target_params=tp)
    heads.save(tmp_path / "h", hc, hp)
    monkeypatch.setenv(forms.FORM_ENV, "transposed")
    _, trans, _ = heads.load(tmp_path / "h", CFG)
    _, unbound, _ = heads.load(tmp_path / "h")
    monkeypatch.setenv(forms.FORM_ENV, "plain")
    _, plain, _ = heads.load(tmp_path / "h", CFG)
    layer = trans["layers_0"]
    for blk, names in (("attn", ("q_proj", "k_proj", "v_proj", "o_proj")),
                       ("mlp", ("gate_proj", "up_proj", "down_proj"))):
        for n in names:
            assert isinstance(layer[blk][n]["kernel"], kinds.RowBlocks), n
            assert not kinds.weights.is_kernel(plain["layers_0"][blk][n]["kernel"])
            assert not kinds.weights.is_kernel(unbound["layers_0"][blk][n]["kernel"])
    assert not kinds.weights.is_kernel(trans["fc"]["kernel"])  # not a projection of the block
    _same_logits(hc, (plain, tp), (trans, tp))
    heads.save(tmp_path / "again", hc, trans)
    _, back, _ = heads.load(tmp_path / "again", CFG)   # $DSBD_JAX_KERNEL_FORM is plain here
    for (pa, x), (pb, y) in zip(jax.tree_util.tree_flatten_with_path(plain)[0],
                                jax.tree_util.tree_flatten_with_path(back)[0]):
        assert pa == pb
        np.testing.assert_array_equal(x, y)


def test_sharded_dsbd_with_a_head_equals_one_device():
    """ShardedDecoder (data 2 x model 2 virtual CPU devices, in a fresh process) with a head as
    the draft: the same tokens as one device."""
    code = textwrap.dedent("""
        import os, sys
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + " --xla_force_host_platform_device_count=4")
        sys.path[:0] = ["tests", "tests/decoding"]
        import jax, numpy as np
        import exact_reference as ref
        from head_toys import toy_head
        from dsbd_jax.decoding.dsbd import DSBDConfig, dsbd_generate
        from dsbd_jax.parallel import ShardedDecoder, make_mesh
        tc, tp = ref.toy_model(6, seed=1, layers=2, heads=4, kv_heads=2)
        hc, hp = toy_head(tc)
        cfg = DSBDConfig(target=tc, draft=hc, gamma=2, draft_width=2, threshold=0.9,
                         max_new_tokens=5)
        ids = np.tile(np.array([[1, 2, 3]], np.int32), (4, 1))
        one = dsbd_generate({"target": tp, "draft": hp}, ids, jax.random.key(0), cfg)
        sd = ShardedDecoder(dsbd_generate, cfg, make_mesh(data=2, model=2))
        out = sd(sd.place({"target": tp, "draft": hp}), ids, jax.random.key(0))
        assert np.array_equal(np.asarray(one.sequences), np.asarray(out.sequences))
        print("SAME")
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0 and "SAME" in r.stdout, r.stderr[-3000:]
