"""Dynamic width of a draft layer (DSBD Eq. 2-7, with the fixes of docs/algorithm.md).

From the layer's ``p = p_beam`` and draft ``q``: ``alpha_j`` (acceptance after ``j - 1`` rejections,
one residual update a step), ``P(m, k)`` (``k`` of ``m`` candidates accepted), ``W~ = max{K :
P(m, >= K) >= t}`` (a tail sum, never negative) and ``W_L = min(max_width, max(min_width, W~))``.
``t = 1`` is fixed width ``min_width``; ``t = 0`` allows every candidate.

Invariant: exactness never depends on the width, which is a function only of what is known before
the layer is verified (``p``, ``q``, ``m``). Long form: docs/results/design_notes.md.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.decoding.rules import residual


def acceptance_rates(p: jax.Array, q: jax.Array, num: int) -> jax.Array:
    """``alpha_1 .. alpha_num`` of the residual chain: ``p, q [..., N]`` (probabilities) ->
    ``[..., num]``. Straight-line code (``num`` is static and small): no loop in the program."""
    alphas, pj = [], p
    for j in range(num):
        alphas.append(jnp.sum(jnp.minimum(pj, q), axis=-1))
        if j + 1 < num:
            pj = residual(pj, q)
    return jnp.stack(alphas, axis=-1)


def rates_from_chain(chain, q: jax.Array, emptied: jax.Array) -> jax.Array:
    """:func:`acceptance_rates` from the verification's residual chain (nothing computed twice).

    ``chain``: the ``num`` arrays ``[N]`` (a list, or stacked ``[num, N]``) ``p_1 = p``, ``p_{j+1} = safe_residual(p_j, q)``
    (``verify.residual_chain``); ``emptied [>= num - 1]``: whether step ``j``'s plain residual
    was all zero. The chain here takes the plain residual, which stays all zero once it empties
    (then every later ``alpha`` is 0) where the safe one keeps ``p_j``; before that the two are
    the same arrays, so the alphas are :func:`acceptance_rates`'. Returns ``[num]``.
    """
    num = len(chain)
    if isinstance(chain, (list, tuple)):
        alphas = jnp.stack([jnp.sum(jnp.minimum(r, q), axis=-1) for r in chain])
    else:   # one stacked [num, N] array (short rows)
        alphas = jnp.sum(jnp.minimum(chain, q), axis=-1)
    before = jnp.concatenate([jnp.zeros((1,), bool), jnp.cumsum(emptied[:num - 1]) > 0])
    return jnp.where(before, jnp.zeros((), alphas.dtype), alphas)


def count_probs(alphas: jax.Array) -> jax.Array:
    """``P [n + 1, n + 1]`` with ``P[m, k]`` = P(k of the first m candidates accepted).

    ``alphas``: ``[n]`` (``alpha_1 .. alpha_n``). Row ``m`` only uses ``alpha_1 .. alpha_m``.
    """
    n = alphas.shape[0]
    one_minus = 1.0 - alphas
    survive = jnp.concatenate([jnp.ones((1,), alphas.dtype), jnp.cumprod(one_minus)])  # z_0..z_n
    first = alphas * survive[:-1]                       # c_i: first acceptance at candidate i
    rows = [jnp.zeros((n + 1,), alphas.dtype).at[0].set(1.0)]
    i = np.arange(1, n + 1)
    for m in range(1, n + 1):   # n is static and small: straight-line code, no loop
        prev = jnp.stack([rows[r] for r in np.clip(m - i, 0, n)])   # P[m - i]: rows made
        use = jnp.asarray(i <= m)[:, None]
        shifted = jnp.concatenate([jnp.zeros((n, 1), alphas.dtype), prev[:, :-1]], axis=1)
        new = jnp.sum(jnp.where(use, first[:, None] * shifted, 0.0), axis=0)
        rows.append(new.at[0].set(survive[m]))
    return jnp.stack(rows)


def width_from_counts(P: jax.Array, m: jax.Array, threshold: float, min_width: int,
                      max_width: int) -> jax.Array:
    """``W_L = min(max_width, max(min_width, W~))`` from the ``P`` table (see module doc)."""
    n = P.shape[0] - 1
    row = jnp.take(P, jnp.clip(m, 0, n), axis=0)                       # [n + 1]
    tail = jnp.cumsum(row[::-1])[::-1]                                 # P(m, >= K), K = 0..n
    K = jnp.arange(n + 1)
    ok = ((tail >= threshold) & (K <= m)) | (K == 0)
    w_tilde = jnp.max(jnp.where(ok, K, 0))
    return jnp.minimum(max_width, jnp.maximum(min_width, w_tilde)).astype(jnp.int32)


@jax.named_scope("width")
def layer_width(p: jax.Array, q: jax.Array, m: jax.Array, threshold: float, min_width: int,
                max_width: int, num_draft: int, alphas=None) -> jax.Array:
    """Width ``W_L`` of one layer (int32 scalar).

    Args:
      p: ``[N]`` warped target beam joint over (accepted parents x V), probabilities.
      q: ``[N]`` the candidates' drafting distribution restricted to those parents.
      m: scalar int, candidates actually present (``<= num_draft``).
      threshold, min_width, max_width, num_draft: static (``num_draft = W_S``).
      alphas: ``[num_draft]`` the chain's acceptance rates when the caller has them
        (:func:`rates_from_chain`); computed from ``p`` and ``q`` otherwise.
    """
    if threshold >= 1.0:  # fixed width (module doc)
        return jnp.asarray(min(min_width, max_width), jnp.int32)
    if alphas is None:
        alphas = acceptance_rates(p, q, num_draft)
    return width_from_counts(count_probs(alphas), m, threshold, min_width, max_width)


def expected_layers(a, gamma: int):
    """Theorem 3.2: expected layers (tokens) per iteration ``(1 - a^(gamma+1)) / (1 - a)``."""
    a = jnp.asarray(a, jnp.float32)
    return jnp.where(a < 1.0, (1.0 - a ** (gamma + 1)) / jnp.where(a < 1.0, 1.0 - a, 1.0),
                     float(gamma + 1))
