"""The rules every speculative decoder verifies with, each written once (docs/algorithm.md).

Pure functions over the last axis of probability vectors: the accept test
``u * q(x) < p(x)``, the residual ``norm(max(p - q, 0))`` (plain, and the safe form that keeps
``p`` where rounding leaves nothing), removal of a drawn entry (draws without replacement) and
the Gumbel-top-k draw. Speculative sampling, the tree sampler and DSBD import them from here,
so checking this module against the spec checks all three.

Invariant: no function here divides by zero or makes a NaN; an all-zero row stays all zero.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def accept_test(u: jax.Array, p_x: jax.Array, q_x: jax.Array) -> jax.Array:
    """Accept a draft ``x ~ q`` with probability ``min(1, p(x) / q(x))``, written as
    ``u * q(x) < p(x)`` for ``u ~ Uniform(0, 1)`` (no division; ``p >= q`` always accepts)."""
    return u * q_x < p_x


def normalize(p: jax.Array) -> jax.Array:
    """``p / sum(p)`` over the last axis; an all-zero row stays all zero (no NaN)."""
    s = jnp.sum(p, axis=-1, keepdims=True)
    return jnp.where(s > 0, p / jnp.where(s > 0, s, 1.0), 0.0)


def residual(p: jax.Array, q: jax.Array) -> jax.Array:
    """The plain residual ``norm(max(p - q, 0))``: all zero when ``p == q`` (a rejection then
    has probability zero, so nothing is drawn from it)."""
    return normalize(jnp.maximum(p - q, 0.0))


def safe_residual(p: jax.Array, q: jax.Array) -> jax.Array:
    """:func:`residual`, but ``p`` itself where rounding leaves nothing (``p == q``)."""
    return safe_residual_and_left(p, q)[0]


def safe_residual_and_left(p: jax.Array, q: jax.Array):
    """:func:`safe_residual` and whether the plain residual left anything (``[..., 1]`` bool;
    ``False`` where ``p`` was kept)."""
    # the normalised residual sums to more than 0 exactly where the plain one does (its largest
    # entry is at least 1/N), so ``left`` needs no second sum over the row
    x = jnp.maximum(p - q, 0.0)
    s = jnp.sum(x, axis=-1, keepdims=True)
    left = s > 0
    return jnp.where(left, x / jnp.where(left, s, 1.0), p), left


def remove(dist: jax.Array, x: jax.Array) -> jax.Array:
    """``dist [N]`` with entry ``x`` set to 0, renormalised (without-replacement bookkeeping)."""
    return normalize(jnp.where(jnp.arange(dist.shape[0]) == x, 0.0, dist))


def draw_gumbel(logp: jax.Array, g: jax.Array, k: int) -> jax.Array:
    """``k`` successive draws without replacement (Gumbel-top-k) from log-probs ``logp`` with
    Gumbel noise ``g`` (same shape), in draw order, over the last axis. Surplus draws beyond
    the support are entries of probability 0: callers mark them invalid."""
    return jax.lax.top_k(logp + g, k)[1].astype(jnp.int32)


def sample_without_replacement(key: jax.Array, logprobs: jax.Array, k: int) -> jax.Array:
    """:func:`draw_gumbel` with the noise drawn from ``key``: ``[..., k]`` in draw order."""
    return draw_gumbel(logprobs, jax.random.gumbel(key, logprobs.shape, jnp.float32), k)
