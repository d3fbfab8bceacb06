"""Warping (temperature, then top-k, then top-p) and sampling from warped distributions.

Every function works on the **last axis** of its input, so the same code warps one token
distribution per row (``[..., V]``) and the joint beam distribution (flatten beams x vocab to
``[..., W * V]`` first: top-k = 10 then keeps 10 (beam, token) pairs in total).

Exact rules (they match Hugging Face's ``TemperatureLogitsWarper``, ``TopKLogitsWarper`` and
``TopPLogitsWarper`` with ``min_tokens_to_keep=1``):

* ``temperature``: logits / temperature. ``temperature == 0`` means greedy: only the largest
  entry is kept (ties: the lowest index), regardless of top-k/top-p.
* ``top_k``: keep every entry whose logit is >= the k-th largest logit (ties at the boundary are
  all kept, so more than k may survive, as in HF). ``top_k is None``, ``0`` or ``>= N`` keeps all.
* ``top_p``: sort ascending, drop the entries whose ascending cumulative probability is
  ``<= 1 - top_p``; the largest entry is always kept. ``top_p == 1`` keeps all (nothing is dropped,
  whatever the rounding). top-p is applied to the distribution that top-k left.
* Removed entries get log-probability ``-inf`` and are never sampled. Entries that already had
  probability zero (``-inf`` logits) stay at zero.

The result is returned as normalised log-probabilities (float32).
"""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

NEG_INF = -jnp.inf


def validate_warping(temperature: float, top_k: Optional[int], top_p: float) -> None:
    """Raise ``ValueError`` for settings that have no meaning (never clamp silently)."""
    if not (temperature >= 0.0) or temperature != temperature or temperature == float("inf"):
        raise ValueError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None and (not isinstance(top_k, int) or top_k < 0):
        raise ValueError(f"top_k must be None or an int >= 0 (0 = off), got {top_k!r}")
    if not (0.0 < top_p <= 1.0):
        raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")


def warp_logits(logits: jax.Array, temperature: float = 1.0, top_k: Optional[int] = None,
                top_p: float = 1.0) -> jax.Array:
    """Warped, normalised log-probabilities over the last axis (see module doc for the rules).

    ``temperature``, ``top_k`` and ``top_p`` are Python numbers (static).
    """
    validate_warping(temperature, top_k, top_p)
    x = logits.astype(jnp.float32)
    n = x.shape[-1]
    if temperature == 0.0:
        best = jnp.argmax(x, axis=-1)
        keep = jnp.arange(n) == best[..., None]
        return jnp.where(keep, 0.0, NEG_INF)
    if temperature != 1.0:
        x = x / temperature
    if top_k is not None and 0 < top_k < n:
        kth = jax.lax.top_k(x, top_k)[0][..., -1:]
        x = jnp.where(x < kth, NEG_INF, x)
    if top_p < 1.0:
        order = jnp.argsort(x, axis=-1)  # ascending
        sorted_x = jnp.take_along_axis(x, order, axis=-1)
        cum = jnp.cumsum(jax.nn.softmax(sorted_x, axis=-1), axis=-1)
        remove_sorted = cum <= (1.0 - top_p)
        remove_sorted = remove_sorted.at[..., -1].set(False)  # always keep the largest
        remove = jnp.zeros_like(remove_sorted)
        remove = jnp.put_along_axis(remove, order, remove_sorted, axis=-1, inplace=False)
        x = jnp.where(remove, NEG_INF, x)
    return jax.nn.log_softmax(x, axis=-1)


def sample(key: jax.Array, logprobs: jax.Array, shape=None) -> jax.Array:
    """Draw indices from normalised log-probabilities (last axis), i.i.d. (with replacement).

    ``shape`` is the output shape (defaults to ``logprobs.shape[:-1]``); entries at ``-inf`` are
    never drawn.
    """
    return jax.random.categorical(key, logprobs, axis=-1, shape=shape)


def sample_without_replacement(key: jax.Array, logprobs: jax.Array, k: int) -> jax.Array:
    """``k`` successive draws without replacement (Gumbel-top-k) over the last axis: ``[..., k]``.

    The order of the result is the draw order. If fewer than ``k`` entries have non-zero
    probability, the surplus draws are zero-probability entries: callers must ensure
    ``k <= support`` or handle them (the support size is ``sum(isfinite(logprobs))``).
    """
    g = jax.random.gumbel(key, logprobs.shape, jnp.float32)
    return jax.lax.top_k(logprobs + g, k)[1]


def normalize(p: jax.Array) -> jax.Array:
    """p / sum(p) over the last axis; an all-zero row stays all zero (no NaN)."""
    s = jnp.sum(p, axis=-1, keepdims=True)
    return jnp.where(s > 0, p / jnp.where(s > 0, s, 1.0), 0.0)


def residual(p: jax.Array, q: jax.Array) -> jax.Array:
    """Speculative-sampling residual ``norm(max(p - q, 0))`` over the last axis (probabilities).

    If p == q exactly the residual is all zero; callers only sample from it after a rejection,
    which has probability zero in that case.
    """
    return normalize(jnp.maximum(p - q, 0.0))
