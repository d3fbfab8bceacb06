"""Dynamic width of a draft layer (DSBD Eq. 2-7, with the fixes of docs/algorithm.md).

For one layer with target beam joint ``p = p_beam`` (warped, over accepted parents x V) and the
draft distribution ``q`` its ``m`` candidates were drawn from (restricted to those parents):

* ``alpha_j = sum_x min(p_j(x), q(x))`` with ``p_1 = p`` and ``p_{j+1} = norm(max(p_j - q, 0))``
  (ONE residual update per step): the probability that a candidate is accepted after ``j - 1``
  rejections since the last acceptance (the multi-candidate rule restarts from ``p`` after every
  acceptance).
* ``P(m, k)``, the probability that ``k`` of ``m`` candidates are accepted:
  ``P(0, 0) = 1``, ``P(m, 0) = prod_{j<=m} (1 - alpha_j)``, ``P(m, k) = 0`` for ``k > m``,
  ``P(m, k) = sum_{i=1..m} alpha_i prod_{j<i} (1 - alpha_j) P(m - i, k - 1)``.
* ``W~ = max{K in 0..m : P(m, >= K) >= t}`` where ``P(m, >= K) = 1 - sum_{k<K} P(m, k)``
  (computed as the tail sum ``sum_{k>=K} P(m, k)``, equal in exact arithmetic and never negative;
  ``K = 0`` always qualifies).
* ``W_L = min(max_width, max(min_width, W~))``: ``max_width`` caps the beams a layer can carry.

Threshold semantics: ``t = 1`` is FIXED WIDTH: ``W_L = min_width`` at every layer, whatever the
models (the formula would give ``W~ = m`` only when acceptance is certain, i.e. ``p == q`` to the
last bit, which rounding makes arbitrary; so ``t = 1`` is defined as ``W~ = 0``). ``t = 0`` gives
``W~ = m`` (all candidates may be accepted). Exactness never depends on the width: it only has to
be a function of what is known before the layer is verified (``p``, ``q``, ``m``).

The same formula is used with ``replacement=False`` (there it is the paper's model, an
approximation of the true acceptance counts; it only steers efficiency).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.decoding.warping import residual


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
