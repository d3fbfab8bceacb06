"""Transposed projection kernels (``kinds.transpose_params``, ``load_model(...,
kernel_blocks="transposed")``): the product for one row and for several, tree conversion in both
weight layouts and back, the trace-time shape check, the forward and decoders on transposed
trees, and every place that needs ``[in, out]`` kernels. Run with ``PYTHONPATH=tests``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import exact_reference as ref
from dsbd_jax.decoding.beam import beam_sample
from dsbd_jax.decoding.configs import BeamSampleConfig, SpeculativeConfig
from dsbd_jax.decoding._jit.inputs import check_params
from dsbd_jax.models import weights
from dsbd_jax.models import kinds
from dsbd_jax.models.llama import convert_layout


model = ref.kernel_model


def test_product_for_one_row_and_for_several():
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((2, 24, 48)), jnp.float32)  # a stacked [L, in, out]
    for n in (4, 16, 24, 48):
        t = kinds.transpose_block(w, n)
        assert t.shape == (2, 48 // n, n, 24)
        np.testing.assert_array_equal(np.asarray(kinds.untranspose(t)), np.asarray(w))
        # row j of block c is output column c * n + j
        np.testing.assert_array_equal(np.asarray(t[1, -1, 0]), np.asarray(w[1, :, 48 - n]))
        for lead in ((1,), (1, 1), (2,), (3,), (2, 5)):
            x = jnp.asarray(rng.standard_normal(lead + (24,)), jnp.float32)
            np.testing.assert_allclose(np.asarray(kinds.project_t(x, t[1])),
                                       np.asarray(x @ w[1]), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="does not divide"):
        kinds.transpose_block(w, 5)


def test_one_row_is_a_matrix_vector_product_on_the_rows():
    """One row contracts the ``[out, in]`` rows (no batched product, no transpose of the
    weight); several rows run one batched product per block."""
    t = jnp.zeros((7, 1280, 1536), jnp.float32)
    one = jax.make_jaxpr(kinds.project_t)(jnp.zeros((1, 1, 1536)), t)
    dots = [e for e in one.eqns if e.primitive.name == "dot_general"]
    assert len(dots) == 1 and dots[0].params["dimension_numbers"] == (((1,), (1,)), ((), ()))
    assert "transpose" not in {e.primitive.name for e in one.eqns}
    four = jax.make_jaxpr(kinds.project_t)(jnp.zeros((4, 1536)), t)
    dots = [e for e in four.eqns if e.primitive.name == "dot_general"]
    assert len(dots) == 1 and dots[0].params["dimension_numbers"] == (((2,), (2,)), ((0,), (0,)))


def test_widths():
    assert kinds.transposed_width(8960) == 1280  # 7 blocks
    assert kinds.transposed_width(1536) == 768
    assert kinds.transposed_width(4864) == 1216  # 4 blocks (64 x 19)
    assert kinds.transposed_width(256) == 128
    assert kinds.transposed_width(30) == 15  # no multiple of 64 fits: the largest divisor
    assert kinds.transposed_width(7) == 7  # a prime: one block
    for dout in range(1, 3000, 37):
        n = kinds.transposed_width(dout)
        assert dout % n == 0 and (n <= kinds.T_MAX_WIDTH or n == dout)


@pytest.mark.parametrize("layout", ["per_layer", "stacked"])
def test_transposed_tree_gives_the_same_forward(layout):
    config, params = model(layout)
    widths = kinds.transposed_widths(config)
    t = kinds.transpose_params(params, widths)
    assert kinds.transposed_of(t) == widths and kinds.transposed_of(params) == {}
    # every projection kernel is a RowBlocks leaf that says its form
    assert all(isinstance(k, kinds.RowBlocks) for p, k in weights.leaves_with_path(t)
               if "proj" in jax.tree_util.keystr(p))
    back = kinds.unblock_params(t)
    assert jax.tree.structure(back) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # from a tree of other typed kernels (made plain first), and partly transposed
    up = kinds.transpose_params(params, {"up_proj": 8})
    part = kinds.transpose_params(up, {"down_proj": 8})
    assert kinds.transposed_of(part) == {"down_proj": 8}
    # convert_layout carries transposed kernels across layouts
    other = "stacked" if layout == "per_layer" else "per_layer"
    assert kinds.transposed_of(convert_layout(t, other)) == widths
    check_params("target", config, t)  # the trace-time check knows transposed kernels
    check_params("target", config, part)
    # one row in all, and several
    ref.assert_same_forward(config, params, [t, part], [(1, 1), (2, 1), (2, 3)])


@pytest.mark.parametrize("layout", ["per_layer", "stacked"])
def test_in_place_transpose_builds_the_same_tree(layout):
    """``transpose_params_`` (the loaders' in-place form, one kernel at a time) gives the tree
    ``transpose_params`` (+ ``transpose_head``) gives: the same keys in the same order, the same
    values; from a tree of typed kernels too."""
    config, params = model(layout)
    params = {**params, "lm_head": {"kernel": jnp.ones((config.hidden_size, config.vocab_size))}}
    widths = kinds.transposed_widths(config)

    def copy(tree):
        return jax.tree.map(lambda x: x, tree)

    def same(a, b):
        assert jax.tree.structure(a) == jax.tree.structure(b)
        assert [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(a)[0]] \
            == [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(b)[0]]
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
            np.testing.assert_array_equal(np.asarray(x), np.asarray(y))

    want = kinds.transpose_params(params, widths)
    got = copy(params)
    assert kinds.transpose_params_(got, widths) is got
    same(got, want)
    assert "kernel" in got["lm_head"]                           # the head only when asked
    got = kinds.transpose_params_(copy(params), widths, head=True)
    same(got, kinds.transpose_head(want))
    up = kinds.transpose_params(params, {"up_proj": 8})
    same(kinds.transpose_params_(copy(up), {"down_proj": 8}),
         kinds.transpose_params(up, {"down_proj": 8}))
    with pytest.raises(ValueError, match="unknown projections"):
        kinds.transpose_params_(copy(params), {"nope": 8})


def test_check_params_rejects_a_transposed_kernel_of_the_wrong_size():
    config, params = model()
    bad = kinds.transpose_params(params, {"down_proj": 8})
    w = bad["layers_0"]["mlp"]["down_proj"]["kernel"]
    bad["layers_0"]["mlp"]["down_proj"]["kernel"] = type(w)(w.value[:, :, :5])
    with pytest.raises(ValueError, match=r"layers_0.*down_proj.*expected shape \(32, 16\)"):
        check_params("draft", config, bad)
    with pytest.raises(ValueError, match="unknown projections"):
        kinds.transpose_params(params, {"lm_head": 4})


def test_decoders_on_a_transposed_tree():
    """Beam sampling (several rows per pass) and speculative sampling with a transposed draft
    (one row per draft pass) give what the plain trees give."""
    from dsbd_jax.decoding.speculative import speculative_sample
    config, params = model()
    t = kinds.transpose_params(params, kinds.transposed_widths(config))
    cfg = BeamSampleConfig(target=config, max_new_tokens=6, num_beams=3, top_k=6)
    ids = jnp.asarray([[1, 2, 3, 4], [5, 6, 7, 0]], jnp.int32)
    lens = jnp.asarray([4, 3], jnp.int32)
    want = beam_sample(params, ids, jax.random.key(0), cfg, prompt_lengths=lens)
    got = beam_sample(t, ids, jax.random.key(0), cfg, prompt_lengths=lens)
    np.testing.assert_array_equal(np.asarray(got.sequences), np.asarray(want.sequences))
    np.testing.assert_allclose(np.asarray(got.log_likelihoods),
                               np.asarray(want.log_likelihoods), rtol=1e-5, atol=1e-5)
    dconfig, dparams = ref.toy_model(vocab=12, seed=4, layers=1, hidden=16, intermediate=32)
    scfg = SpeculativeConfig(target=config, draft=dconfig, max_new_tokens=6, gamma=3, top_k=6)
    one = ids[:1]
    want = speculative_sample({"target": params, "draft": dparams}, one, jax.random.key(1), scfg)
    got = speculative_sample({"target": params,
                              "draft": kinds.transpose_params(
                                  dparams, kinds.transposed_widths(dconfig))},
                             one, jax.random.key(1), scfg)
    np.testing.assert_array_equal(np.asarray(got.sequences), np.asarray(want.sequences))


def test_load_model_transposed_and_unblocking_users(bench_pair, tmp_path):
    from dsbd_jax import load_model
    from dsbd_jax.training.export import save_hf
    t, _, _, _ = bench_pair
    plain = load_model(t, progress=False)
    tr = load_model(t, progress=False, kernel_blocks="transposed")
    assert tr.info["kernel_transposed"] == kinds.transposed_widths(tr.config)
    assert kinds.transposed_of(tr.params) == tr.info["kernel_transposed"]
    assert plain.info["kernel_transposed"] == {}
    save_hf(tmp_path / "b", tr.config, tr.params)  # export writes [in, out] kernels back out
    again = load_model(str(tmp_path / "b"), progress=False)
    for a, b in zip(jax.tree.leaves(again.params), jax.tree.leaves(plain.params)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_per_layer_blocks_share_one_trace():
    """A per-layer model traces its block once per pass shape, not once per layer: every layer
    is a call of the same jitted block with the same traced program (tracing a 28-layer
    target block by block cost seconds per decoder program), and the result is unchanged."""
    from dsbd_jax.models.cache import empty_cache
    config, params = ref.kernel_model("per_layer")
    stacked = convert_layout(params, "stacked")
    B, T, S = 2, 3, 4
    tok = jnp.ones((B, T), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    mask = jnp.concatenate([jnp.zeros((B, T, S), bool),
                            jnp.tril(jnp.ones((T, T), bool))[None].repeat(B, 0)], -1)
    cache = empty_cache(config, B, S)
    from dsbd_jax.models.llama import forward
    jaxpr = jax.make_jaxpr(lambda p: forward(config, p, tok, pos, mask, cache))(params)
    calls = [e for e in jaxpr.eqns if e.primitive.name in ("pjit", "jit")
             and e.params["name"] == "_layer_call"]
    assert len(calls) == config.num_layers == 2
    assert len({id(e.params["jaxpr"]) for e in calls}) == 1
    want = forward(config, stacked, tok, pos, mask, cache)[0]
    got = jax.jit(lambda p: forward(config, p, tok, pos, mask, cache)[0])(params)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
