"""DSBD's verification on the entries a warp can keep (``replacement=True`` with a top-k).

A layer's warp keeps at most its ``top_k`` largest entries and those equal to the last, so
``p_beam`` and every residual ``p'`` are zero elsewhere: the rule needs them only on each parent
row's ``K = top_k + SPARSE_EXTRA`` largest entries (:func:`row_tops`), ``P * K`` a layer instead of
``P * V``. There the warp is one sort and a draw one cumulative sum.

Invariant: the kept set, its probabilities, the residuals and the widths are the dense path's;
only sums run in another order. Where equal entries could reach past a row's ``K``
(:attr:`Tops.risk`), ``steps.verify`` verifies on the ``[P * V]`` vectors instead.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from dsbd_jax.decoding.warping import top_k_isolated, warp_sorted

NEG_INF = -jnp.inf
SPARSE_EXTRA = 22   # entries per row beyond top_k (32 in all at the paper's top-k 10)


class Tops(NamedTuple):
    """Each joint row's largest entries (:func:`row_tops`), for one prompt or the batch.

    values: ``[..., L, P, K]`` float32, the joint divided by the temperature.
    flat:   ``[..., L, P, K]`` int32, their flat indices ``parent * V + token``.
    risk:   ``[...]`` bool: top-k might keep an entry past a row's ``K`` or more than ``K``
            entries of a layer (:func:`row_tops`); then only the ``[P * V]`` vectors are exact.
    """

    values: jax.Array
    flat: jax.Array
    risk: jax.Array


def sparse_applies(config) -> bool:
    """Whether DSBD's verification can run on :func:`row_tops`: i.i.d. draws, a temperature
    above 0 and a top-k below the vocabulary's size."""
    return bool(config.replacement and config.temperature > 0 and config.top_k
                and config.top_k < config.target.vocab_size)


def row_size(top_k: int, V: int) -> int:
    """``K``: the entries kept of each parent's row, and of each layer (module doc)."""
    return min(V, top_k + SPARSE_EXTRA)


@jax.named_scope("warp")
def row_tops(joint: jax.Array, config) -> Tops:
    """The ``K = min(V, top_k + SPARSE_EXTRA)`` largest entries of each row of one prompt's
    ``joint [L, P, V]`` after the temperature.

    Why they are enough: top-k keeps the entries ``>= c``, ``c`` the ``top_k``-th largest of
    the allowed rows together, and ``c`` is at least every allowed row's own ``top_k``-th
    largest. An entry ``>= c`` missing from its row's ``K`` would need ``K + 1`` entries of that
    row ``>= c``, so the row's ``top_k``-th and ``K``-th largest would both equal ``c``: that is
    ``risk``, checked on every row, allowed or not. Without it, top-k and then top-p (which only
    looks at what top-k kept) keep the same entries with the same probabilities.

    A layer is then warped on the ``K`` largest entries of its allowed rows
    (``warping.warp_sorted``'s ``keep``), so ``risk`` is also set where top-k could keep more
    than ``K`` of them. If an allowed row has ``top_k`` finite entries, ``c`` is at least ``m``,
    the least ``top_k``-th largest of such rows, and top-k keeps at most ``top_k - 1`` entries
    above ``c`` and those equal to it: at most ``top_k - 1 + e``, ``e`` the most entries of the
    layer that hold one value ``>= m``. Otherwise it keeps at most the finite entries of the
    rows with fewer than ``top_k``.
    """
    L, P, V = joint.shape
    k, K = config.top_k, row_size(config.top_k, V)
    v, flat = parent_tops(joint, K, config.temperature)
    risk = jnp.zeros((), bool)
    if K < V:
        risk = jnp.any((v[..., k - 1] > NEG_INF) & (v[..., K - 1] == v[..., k - 1]))
    if k - 1 + P * K > K:   # more than K kept in a layer: only with many equal entries
        kth = v[..., k - 1]                                               # [L, P]
        full = kth > NEG_INF
        m = jnp.min(jnp.where(full, kth, jnp.inf), axis=-1)               # [L]
        flat_v = v.reshape(L, P * K)
        same = ((flat_v[:, :, None] == flat_v[:, None, :])
                & (flat_v[:, :, None] >= m[:, None, None]))
        short = jnp.sum(jnp.where(full[..., None], False, v > NEG_INF), axis=(1, 2))   # [L]
        risk = risk | jnp.any(k - 1 + jnp.max(jnp.sum(same, axis=-1), axis=-1) > K)
        risk = risk | jnp.any(short > K)
    return Tops(v, flat, risk)


def parent_tops(x: jax.Array, K: int, temperature: float):
    """The ``K`` largest entries of each row of ``x [..., n, V]`` (log-probabilities of ``n``
    parents) divided by the temperature, as ``warp_logits`` scales, and their flat indices
    ``parent * V + token`` (int32): ``(values, flat)``, each ``[..., n, K]``. What
    :func:`row_tops` keeps of the target's joint, and the draft's warp its own
    (``forest.draft_layer``)."""
    n, V = x.shape[-2:]
    x = x.astype(jnp.float32)
    if temperature != 1.0:
        x = x / temperature
    v, i = top_k_isolated(x, K)
    return v, (jnp.arange(n)[:, None] * V + i).astype(jnp.int32)


def warp_layer(values: jax.Array, flat: jax.Array, parent_ok, config):
    """A layer warped on its parents' largest entries: ``values, flat [..., P, K]`` (from
    :func:`parent_tops`), ``parent_ok [..., P]`` (None: every parent allowed). The entries of
    allowed parents warped together by top-k / top-p and cut to the ``K`` largest
    (``warping.warp_sorted``): ``(logprobs, index, ok)``, each ``[..., K]`` in ascending order
    of value, ``index`` the flat indices, ``ok`` whether an entry's parent is allowed (None
    with ``parent_ok`` None)."""
    *lead, P, K = values.shape
    x = values.reshape(*lead, P * K)
    ok = None
    if parent_ok is not None:
        ok = jnp.repeat(parent_ok, K, axis=-1) if lead else jnp.repeat(parent_ok, K)
        x = jnp.where(ok, x, NEG_INF)
    lp, order = warp_sorted(x, config.top_k, config.top_p, keep=K)
    if not lead:     # one layer (the verification): plain indexing
        return lp, flat.reshape(-1)[order], (None if ok is None else ok[order])
    pick = lambda a: jnp.take_along_axis(a, order, axis=-1)   # noqa: E731
    return lp, pick(flat.reshape(*lead, P * K)), (None if ok is None else pick(ok))


class LayerTops(NamedTuple):
    """One layer's distributions on its parents' largest entries (:func:`layer_on_tops`)."""

    p_beam: jax.Array   # [K] warped target joint on the K largest entries of allowed parents
    q: jax.Array        # [K] the draft's joint restricted to the allowed parents
    index: jax.Array    # [K] each entry's flat index
    q_x: jax.Array      # [C] q at the candidates
    at: jax.Array       # [C] the candidates' positions among the K entries
    found: jax.Array    # [C] whether the K entries hold the candidate (else p' = 0 there)


def layer_on_tops(values: jax.Array, flat: jax.Array, parent_ok: jax.Array, q: jax.Array,
                  q_index: jax.Array, cand: jax.Array, cand_parent_ok: jax.Array, V: int,
                  config) -> LayerTops:
    """One layer on its parents' largest entries.

    ``values, flat [P, K]``: the layer's :class:`Tops`; ``parent_ok [P]``; ``q, q_index [m]``:
    the draft's joint the layer was drawn from, at its entries (``forest.Forest``);
    ``cand [C]`` flat indices, ``cand_parent_ok [C]`` whether their parent is
    allowed; ``V`` the vocabulary's size.
    """
    lp, index, ok = warp_layer(values, flat, parent_ok, config)
    # q restricted to the allowed parents and renormalised (verify.restrict_draft), read at the
    # target's entries and at the candidates by their flat indices
    allowed = parent_ok[q_index // V]
    q_ok = jnp.where(allowed, q, 0.0)
    z = jnp.sum(q_ok)
    z = jnp.where(z > 0, z, 1.0)
    q_at = jnp.sum(jnp.where(index[:, None] == q_index[None, :], q_ok[None, :], 0.0), axis=-1)
    q_x = jnp.sum(jnp.where(cand[:, None] == q_index[None, :], q_ok[None, :], 0.0), axis=-1)
    hit = index[None, :] == cand[:, None]                                   # [C, n]
    return LayerTops(p_beam=jnp.exp(lp), q=jnp.where(ok, q_at, 0.0) / z, index=index,
                     q_x=jnp.where(cand_parent_ok, q_x, 0.0) / z,
                     at=jnp.argmax(hit, axis=-1), found=jnp.any(hit, axis=-1))
