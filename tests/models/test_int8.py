"""The eight-bit kernel kind (dsbd_jax.models.weights.Int8) and int8 models.

What an Int8 kernel must do: its codes and scales give back the float kernel to half a step per
output row; its product is the float product up to the two quantisations (activations per row,
weights per output), through XLA's ``s8 x s8 -> s32`` dot in the compiled program; one row is
padded to two without changing its value; a NaN in the activations stays non-finite; it lives
in a parameter tree like any kernel (jit, scan over a stacked layer axis, the parameter check,
a truncated head, a head's prompt rows, the host-form cache); ``int8_params`` quantises every
projection and the head (a tied head untied) and keeps everything else.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import exact_reference as ref
from dsbd_jax.models import products, vocab, weights
from dsbd_jax.host import cpu_options
from dsbd_jax.models import kinds
from dsbd_jax.models.llama import convert_layout, logits
from dsbd_jax.models.param_check import check_params


def _rel(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))


def test_codes_and_scales_give_back_the_kernel():
    rng = np.random.default_rng(0)
    w = rng.standard_normal((48, 40)).astype(np.float32)      # [in, out]
    w[:, 3] = 0.0                                              # an all-zero output
    k = weights.Int8.quantize(jnp.asarray(w))
    assert k.codes.dtype == jnp.int8 and k.scales.dtype == jnp.float32
    assert k.codes.shape == (40, 48) and k.scales.shape == (40,)
    assert weights.shape_of(k) == (48, 40) == k.shape
    back = np.asarray(weights.plain(k))
    step = np.asarray(k.scales)[None, :]
    assert np.all(np.abs(back - w) <= 0.5 * step + 1e-7)
    assert np.all(np.abs(np.asarray(k.codes)).max(axis=1)[np.abs(w).max(0) > 0] == 127)
    np.testing.assert_array_equal(np.asarray(k.codes)[3], 0)
    assert float(k.scales[3]) == 1.0
    # the kind keeps its dtypes whatever float dtype a model asks for
    assert weights.astype(k, jnp.bfloat16) is k


@pytest.mark.parametrize("rows", [1, 2, 5])
def test_product_is_the_float_product_up_to_quantisation(rows):
    rng = np.random.default_rng(rows)
    w = rng.standard_normal((64, 96)).astype(np.float32) / 8
    x = rng.standard_normal((3, rows, 64)).astype(np.float32)   # leading axes pass through
    k = weights.Int8.quantize(jnp.asarray(w))
    y = jax.jit(weights.product)(jnp.asarray(x), k)
    assert y.shape == (3, rows, 96) and y.dtype == jnp.float32
    assert _rel(y, x @ w) < 0.02
    # the exact integer arithmetic: codes times codes, both scales after
    xq, xs = products.quantize_rows(jnp.asarray(x.reshape(-1, 64)))
    want = (np.asarray(xq, np.int64) @ np.asarray(k.codes, np.int64).T).astype(np.float32)
    want = want * np.asarray(xs)[:, None] * np.asarray(k.scales)[None, :]
    np.testing.assert_allclose(np.asarray(y).reshape(-1, 96), want, rtol=1e-6, atol=1e-6)


def test_one_row_is_padded_without_changing_it():
    rng = np.random.default_rng(1)
    k = weights.Int8.quantize(jnp.asarray(rng.standard_normal((32, 24)).astype(np.float32)))
    x = jnp.asarray(rng.standard_normal((2, 32)).astype(np.float32))
    both = weights.product(x, k)
    np.testing.assert_array_equal(np.asarray(weights.product(x[:1], k)), np.asarray(both[:1]))


def test_the_compiled_product_is_an_integer_dot():
    k = weights.Int8.quantize(jnp.ones((32, 24), jnp.float32))
    x = jnp.ones((1, 32), jnp.float32)
    hlo = jax.jit(weights.product).lower(x, k).compile().as_text()
    dots = [line for line in hlo.splitlines() if " dot(" in line]
    assert dots and all("s32[2,24]" in d for d in dots), dots   # s8 x s8 -> s32, two rows
    assert "f32[24,32]" not in hlo and "f32[32,24]" not in hlo  # no float copy of the weight


def test_non_finite_activations_stay_non_finite_and_zero_rows_give_zero():
    k = weights.Int8.quantize(jnp.asarray(np.random.default_rng(2).standard_normal((16, 8)),
                                          jnp.float32))
    x = jnp.zeros((3, 16), jnp.float32).at[1, 4].set(jnp.nan).at[2, 0].set(jnp.inf)
    y = np.asarray(weights.product(x, k))
    np.testing.assert_array_equal(y[0], 0.0)
    assert not np.isfinite(y[1]).any() and not np.isfinite(y[2]).all()


def test_a_stacked_int8_kernel_scans_like_any_leaf():
    rng = np.random.default_rng(3)
    w = rng.standard_normal((4, 16, 16)).astype(np.float32) / 4
    k = weights.Int8.quantize(jnp.asarray(w))
    assert k.leading == (4,) and weights.shape_of(k) == (4, 16, 16)

    def step(h, kl):
        return weights.product(h, kl), None
    x = jnp.asarray(rng.standard_normal((2, 16)).astype(np.float32))
    out, _ = jax.lax.scan(step, x, k)
    want = np.asarray(x)
    for layer in range(4):
        want = want @ w[layer]
    assert _rel(out, want) < 0.05


def test_take_outputs_keeps_the_kind():
    k = weights.Int8.quantize(jnp.asarray(np.random.default_rng(4).standard_normal((8, 10)),
                                          jnp.float32))
    idx = jnp.asarray([7, 2, 5])
    t = weights.take_outputs(k, idx)
    assert isinstance(t, weights.Int8) and weights.shape_of(t) == (8, 3)
    np.testing.assert_array_equal(np.asarray(weights.plain(t)),
                                  np.asarray(weights.plain(k))[:, [7, 2, 5]])


@pytest.mark.parametrize("tied", [False, True])
def test_int8_params_quantise_every_projection_and_the_head(tied):
    config, params = ref.toy_model(11, seed=0, layers=2, tie_word_embeddings=tied)
    q, qc = kinds.int8_params(params, config)
    assert qc.tie_word_embeddings is False
    assert "lm_head" in q and isinstance(q["lm_head"]["kernel"], weights.Int8)
    assert isinstance(params.get("lm_head", {}).get("kernel", jnp.zeros(())), jax.Array)  # input kept
    leaf_kinds = {type(leaf).__name__ for leaf in weights.leaves(q)}
    assert leaf_kinds == {"Int8", "ArrayImpl"}
    for path, leaf in weights.leaves_with_path(q):
        name = jax.tree_util.keystr(path)
        assert isinstance(leaf, weights.Int8) == name.endswith("['kernel']"), name
    assert kinds.is_int8(q) and not kinds.is_int8(params)
    # a float32 model's embedding table is stored in bfloat16 (the rows, rounded), the input's
    # kept float32; a 16-bit model's is left as it is
    table = q["embed"]["embedding"]
    assert params["embed"]["embedding"].dtype == jnp.float32 and table.dtype == jnp.bfloat16
    np.testing.assert_array_equal(np.asarray(table),
                                  np.asarray(params["embed"]["embedding"].astype(jnp.bfloat16)))
    half = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    hq, _ = kinds.int8_params(half, config)
    assert hq["embed"]["embedding"] is half["embed"]["embedding"]
    check_params("draft", qc, q)
    ids = jnp.asarray([[1, 2, 3, 4, 5]])
    assert _rel(logits(qc, q, ids), logits(config, params, ids)) < 0.05
    # int8 programs run under XLA's own products, never on Eigen (no integer product there)
    assert weights.kernel_dtype(q) == "int8"
    assert cpu_options.options_name("plain", "int8") in cpu_options.candidates()
    assert cpu_options.options_name("plain", "int8") not in cpu_options.EIGEN_PRODUCTS
    # the stacked layout too
    s, sc = kinds.int8_params(convert_layout(params, "stacked"), config)
    assert weights.shape_of(s["layers"]["mlp"]["up_proj"]["kernel"])[0] == 2
    np.testing.assert_allclose(np.asarray(logits(sc, s, ids)), np.asarray(logits(qc, q, ids)),
                               rtol=1e-5, atol=1e-5)


def test_a_truncated_int8_head_with_prompt_rows():
    """Prompt rows of an int8 head get the codes a quantisation of the whole head gives them:
    the logits of those rows equal the full int8 head's."""
    config, params = ref.toy_model(12, seed=1)
    full, fc = kinds.int8_params(params, config)
    trunc = vocab.truncate_head(params, config, [0, 3, 5], prompt_rows=True)
    tq, tc = kinds.int8_params(trunc, config)
    assert isinstance(tq["vocab_head"]["kernel"], weights.Int8)
    check_params("draft", tc, tq)
    prompt = jnp.asarray([[7, 9, 7]])
    with_rows = vocab.with_prompt_rows(tq, prompt)
    ids = jnp.asarray([[1, 7, 2]])
    got, want = np.asarray(logits(tc, with_rows, ids)), np.asarray(logits(fc, full, ids))
    for r in (0, 3, 5, 7, 9):
        np.testing.assert_allclose(got[..., r], want[..., r], rtol=1e-5, atol=1e-5)
    assert np.isneginf(got[..., 1]).all()


def test_weights_kind_is_checked():
    assert kinds.check_weights("int8") == "int8"
    with pytest.raises(ValueError, match="--draft-weights must be one of"):
        kinds.check_weights("int4", "--draft-weights")
