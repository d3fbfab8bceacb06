"""Typed kernel leaves (:mod:`dsbd_jax.models.weights`): each built-in kind answers for its
own shape, plain array and product; and a new kind is one class with its product rule. The
int8 kind below lives in this file only: the model, the parameter check, truncation,
unblocking, the compiler-option walk and a decoder all take it without any other module
knowing it exists."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import exact_reference as ref
from dsbd_jax.decoding._jit import inputs
from dsbd_jax.decoding.configs import SampleConfig
from dsbd_jax.decoding.sampling import sample
from dsbd_jax.models import weights
from dsbd_jax.models import kinds
from dsbd_jax.models.vocab import truncate_head


class Int8Cols(weights.Kernel):
    """A test-only kind: ``[in, out]`` int8 values with a float32 scale per output."""

    fields = ("q", "scale")
    rank = 2

    def product(self, x):
        y = jax.lax.dot_general(x.astype(jnp.float32), self.q.astype(jnp.float32),
                                (((x.ndim - 1,), (0,)), ((), ())))
        return y * self.scale

    def plain(self):
        return self.q.astype(jnp.float32) * self.scale[..., None, :]


def quantize(w) -> Int8Cols:
    scale = jnp.max(jnp.abs(w), axis=-2) / 127.0
    return Int8Cols(jnp.round(w / scale[..., None, :]).astype(jnp.int8), scale)


def quantize_tree(params):
    """Every projection kernel and the vocabulary head as :class:`Int8Cols`."""
    def one(path, x):
        keys = [str(getattr(k, "key", k)) for k in path]
        return quantize(x) if keys[-1] == "kernel" else x
    return jax.tree_util.tree_map_with_path(one, params)


@pytest.mark.parametrize("layout", ["per_layer", "stacked"])
def test_a_new_kind_is_one_class(layout):
    config, params = ref.kernel_model(layout)
    q = quantize_tree(params)
    assert weights.kind("Int8Cols") is Int8Cols
    plain = kinds.unblock_params(q)          # the dequantized model, as [in, out] arrays
    assert jax.tree.structure(plain) == jax.tree.structure(params)
    assert not any(weights.is_kernel(x) for x in weights.leaves(plain))
    # the forward pass runs each leaf's own product: the dequantized model's logits
    ref.assert_same_forward(config, plain, [q], [(1, 1), (2, 3)])
    # the trace-time check reads the kind's plain shape, and rejects a wrong one
    inputs.check_params("target", config, q)
    bad = dict(q, lm_head={"kernel": Int8Cols(q["lm_head"]["kernel"].q[:, :-1],
                                              q["lm_head"]["kernel"].scale[:-1])})
    with pytest.raises(ValueError, match=r"lm_head.*expected shape"):
        inputs.check_params("target", config, bad)
    # the compiler-option walk sees a plain float32 program
    assert weights.program_kind(q) == ("plain", "float32", False)
    # truncation asks the leaf (this kind has no form for a subset: plain [d, N] columns)
    cut = truncate_head(q, config, [0, 3, 5])
    np.testing.assert_allclose(np.asarray(cut["vocab_head"]["kernel"]),
                               np.asarray(plain["lm_head"]["kernel"][:, [0, 3, 5]]), rtol=1e-6)
    inputs.check_params("draft", config, cut)


def test_a_decoder_runs_on_a_new_kind_under_jit():
    config, params = ref.kernel_model()
    q = quantize_tree(params)
    dc = SampleConfig(target=config, max_new_tokens=5, temperature=0.0)
    ids = np.asarray([[1, 2, 3], [4, 5, 6]], np.int32)
    got = sample(q, ids, jax.random.key(0), dc)
    want = sample(kinds.unblock_params(q), ids, jax.random.key(0), dc)
    np.testing.assert_array_equal(np.asarray(got.sequences), np.asarray(want.sequences))


def test_each_built_in_kind_answers_for_itself():
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((3, 16, 24)), jnp.float32)   # stacked [L, in, out]
    x = jnp.asarray(rng.standard_normal((2, 5, 16)), jnp.float32)
    made = {"Rows": weights.Rows(jnp.swapaxes(w, -1, -2)),
            "RowBlocks": weights.RowBlocks(kinds.transpose_block(w, 8))}
    for name, k in made.items():
        assert weights.kind(name) is type(k) and repr(k).startswith(name)
        assert k.shape == weights.shape_of(k) == (3, 16, 24) and k.leading == (3,)
        np.testing.assert_array_equal(np.asarray(weights.plain(k)), np.asarray(w))
        for i in range(3):  # a layer's slice, as lax.scan hands it to the layer
            one = jax.tree.map(lambda a: a[i], k)
            assert type(one) is type(k) and one.shape == (16, 24)
            np.testing.assert_allclose(np.asarray(weights.product(x, one)),
                                       np.asarray(x @ w[i]), rtol=1e-5, atol=1e-5)
        # a pytree: jit sees its arrays, the kind is static; a key path names the field
        (path, _), = jax.tree_util.tree_flatten_with_path(jax.tree.map(lambda a: a[0], k))[0]
        assert jax.tree_util.keystr(path) == ".value"
        assert jax.jit(lambda k: k)(k).shape == k.shape
        with pytest.raises(AttributeError, match="immutable"):
            k.value = w
    rows = made["Rows"].take_outputs(jnp.asarray([1, 4]))
    assert isinstance(rows, weights.Rows) and rows.shape == (3, 16, 2)
    np.testing.assert_array_equal(np.asarray(made["RowBlocks"].take_outputs(jnp.asarray([1, 4]))),
                                  np.asarray(w[..., [1, 4]]))
    with pytest.raises(KeyError, match="unknown kernel kind"):
        weights.kind("Nope")
    with pytest.raises(TypeError, match="takes 1 arrays"):
        weights.Rows(w, w)


def test_a_bfloat16_kernel_of_any_kind_runs_in_mixed_precision():
    rng = np.random.default_rng(1)
    w = jnp.asarray(rng.standard_normal((16, 24)), jnp.bfloat16)
    x = jnp.asarray(rng.standard_normal((1, 16)), jnp.float32)
    want = np.asarray(x.astype(jnp.bfloat16).astype(jnp.float32) @ w.astype(jnp.float32))
    for k in (w, weights.Rows(w.T), weights.RowBlocks(kinds.transpose_block(w, 8))):
        y = weights.product(x, k)
        assert y.dtype == jnp.float32, type(k)
        np.testing.assert_allclose(np.asarray(y), want, rtol=1e-5, atol=1e-4)
        assert weights.astype(k, jnp.bfloat16) is k   # no copy when already in that dtype

