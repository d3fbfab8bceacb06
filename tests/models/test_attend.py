"""``llama.attend``: the softmax attention every layer runs, against a float64 reference (grouped
query heads, a mask, soft-capping), a row that may attend to nothing (the mean of the values, no
NaN), and its gradient (finite, the reference's); keys and values in parts (the cache's and the new
tokens'), in float32 and in bfloat16 (its products' operands in 16 bits, to bfloat16's
precision)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dsbd_jax.models.llama import attend

B, T, S, K, G, D = 2, 3, 7, 2, 3, 8


def reference(q, keys, values, mask, scale, cap):
    """float64: scores per query head, soft-capped, masked (a row with nothing allowed: uniform,
    as a softmax of equal scores), softmax over the keys, weighted values."""
    q, keys, values = (np.asarray(a, np.float64) for a in (q, keys, values))
    s = np.einsum("btkgd,bskd->bkgts", q, keys) * scale
    if cap is not None:
        s = cap * np.tanh(s / cap)
    s = np.where(np.asarray(mask)[:, None, None], s, -np.inf)
    empty = ~np.asarray(mask).any(-1)[:, None, None, :, None]
    s = np.where(empty, 0.0, s)
    w = np.exp(s - s.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    return np.einsum("bkgts,bskd->btkgd", w, values)


def inputs(seed=0):
    r = np.random.default_rng(seed)
    q = r.normal(size=(B, T, K, G, D)).astype(np.float32) * 2
    keys = r.normal(size=(B, S, K, D)).astype(np.float32)
    values = r.normal(size=(B, S, K, D)).astype(np.float32)
    mask = r.random((B, T, S)) < 0.6
    mask[:, :, 0] = True
    mask[1, 2, :] = False  # a row that may attend to nothing
    return q, keys, values, mask


@pytest.mark.parametrize("cap", [None, 5.0])
def test_attend_matches_a_float64_reference(cap):
    q, keys, values, mask = inputs()
    out = np.asarray(attend(jnp.asarray(q), jnp.asarray(keys), jnp.asarray(values),
                            jnp.asarray(mask), D ** -0.5, cap))
    assert out.shape == (B, T, K, G, D) and np.isfinite(out).all()
    np.testing.assert_allclose(out, reference(q, keys, values, mask, D ** -0.5, cap),
                               rtol=2e-5, atol=2e-6)
    # the empty row is the mean of its batch row's values, per kv head
    np.testing.assert_allclose(out[1, 2], np.broadcast_to(values[1].mean(0)[:, None], (K, G, D)),
                               rtol=1e-5, atol=1e-6)


def test_attend_gradient_is_the_references():
    q, keys, values, mask = inputs(1)
    mask[1, 2, :] = True  # the reference's gradient below is the plain softmax's

    def loss(q, keys, values):
        return (attend(q, keys, values, jnp.asarray(mask), D ** -0.5) ** 2).sum()

    def loss_ref(q, keys, values):
        s = jnp.einsum("btkgd,bskd->bkgts", q, keys) * D ** -0.5
        w = jax.nn.softmax(jnp.where(jnp.asarray(mask)[:, None, None], s, -jnp.inf), axis=-1)
        return (jnp.einsum("bkgts,bskd->btkgd", w, values) ** 2).sum()

    args = tuple(jnp.asarray(a) for a in (q, keys, values))
    grads = jax.grad(loss, argnums=(0, 1, 2))(*args)
    want = jax.grad(loss_ref, argnums=(0, 1, 2))(*args)
    for g, w in zip(grads, want):
        assert np.isfinite(np.asarray(g)).all()
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("cap", [None, 5.0])
def test_attend_over_parts_is_attend_over_the_whole(cap):
    """Keys and values in two parts along the keys (``attend_cache``: the cache, then the new
    tokens) give the attention over the joined arrays, to float32 roundings."""
    q, keys, values, mask = inputs(2)
    args = [jnp.asarray(a) for a in (q, keys, values)]
    whole = attend(args[0], args[1], args[2], jnp.asarray(mask), D ** -0.5, cap)
    split = attend(args[0], (args[1][:, :4], args[1][:, 4:]), (args[2][:, :4], args[2][:, 4:]),
                   jnp.asarray(mask), D ** -0.5, cap)
    assert split.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(split), np.asarray(whole), rtol=1e-5, atol=1e-6)


def test_attend_over_bfloat16_parts_is_the_reference_to_bfloat16_precision():
    """A 16-bit cache: each product takes 16-bit operands (the queries and weights rounded to
    bfloat16) and accumulates in float32; the output is float32 and within bfloat16's rounding
    of the float64 reference over the same (bfloat16) keys and values, not further: a product
    accumulated in 16 bits, or the wrong part's weights, would miss it."""
    q, keys, values, mask = inputs(3)
    k16, v16 = (jnp.asarray(a, jnp.bfloat16) for a in (keys, values))
    out = attend(jnp.asarray(q), (k16[:, :5], k16[:, 5:]), (v16[:, :5], v16[:, 5:]),
                 jnp.asarray(mask), D ** -0.5)
    assert out.dtype == jnp.float32 and np.isfinite(np.asarray(out)).all()
    want = reference(q, np.asarray(k16, np.float32), np.asarray(v16, np.float32), mask,
                     D ** -0.5, None)
    err = np.abs(np.asarray(out) - want).max() / np.abs(want).max()
    assert err < 2e-2, err
    swapped = attend(jnp.asarray(q), (k16[:, :5], k16[:, 5:]), (v16[:, 5:], v16[:, :5]),
                     jnp.asarray(mask), D ** -0.5)
    assert np.abs(np.asarray(swapped) - want).max() / np.abs(want).max() > 10 * err
