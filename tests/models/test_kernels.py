"""Kernel forms (dsbd_jax.models.kinds): a plain kernel is Flax's ``Dense`` bit for bit, and
the removed blocked kernels: ``load_model``'s former values load plain kernels with a
deprecation warning, the product rule and its kind are gone. Run with ``PYTHONPATH=tests``."""

from __future__ import annotations

import warnings

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dsbd_jax.host import forms
from dsbd_jax.models import weights
from dsbd_jax.models import kinds
from dsbd_jax.models.llama import Dense


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


def test_blocked_kernels_are_gone():
    """No blocked kind, product or conversion is left for a caller to reach by mistake."""
    for name in ("block_params", "blocks_of", "choose_blocks", "uniform_blocks", "block",
                 "unblock", "HALVES"):
        assert not hasattr(kinds, name) and not hasattr(forms, name), name
    with pytest.raises(KeyError, match="unknown kernel kind"):
        weights.kind("ColBlocks")
    assert kinds.unblock_params({"a": jnp.ones(2)})["a"].shape == (2,)


def test_load_model_removed_block_values(bench_pair, monkeypatch):
    """``kernel_blocks="auto"`` / ``"halves"`` / a width / ``{projection: width}`` load plain
    kernels with a ``DeprecationWarning`` that says what to use; ``$DSBD_JAX_KERNEL_BLOCKS``
    warns that it does nothing; an unknown value is an error."""
    from dsbd_jax import load_model
    t, _, _, _ = bench_pair
    plain = load_model(t, progress=False, kernel_blocks=None)
    assert plain.info["kernel_transposed"] == {}
    d = plain.config.hidden_size
    for value in ("auto", "halves", "64", {"down_proj": d // 2}):
        with pytest.warns(DeprecationWarning, match="blocked kernels were removed.*measured"):
            m = load_model(t, progress=False, kernel_blocks=value)
        assert "kernel_blocks" not in m.info and m.info["kernel_transposed"] == {}
        assert not any(weights.is_kernel(k) for k in weights.leaves(m.params))
        for a, b in zip(jax.tree.leaves(m.params), jax.tree.leaves(plain.params)):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="kernel_blocks must be 'measured', 'transposed' or None"):
        load_model(t, progress=False, kernel_blocks="fast")
    monkeypatch.setenv("DSBD_JAX_KERNEL_BLOCKS", "64")
    with pytest.warns(DeprecationWarning, match="DSBD_JAX_KERNEL_BLOCKS has no effect"):
        load_model(t, progress=False, kernel_blocks=None)
    monkeypatch.delenv("DSBD_JAX_KERNEL_BLOCKS")
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        load_model(t, progress=False, kernel_blocks=None)   # nothing to warn about
