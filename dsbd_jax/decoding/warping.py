"""Warping (temperature, then top-k, then top-p) and sampling from warped distributions.

Every function works on the last axis, so the same code warps one token distribution per row
and the joint beam distribution (``[..., W * V]``: top-k 10 keeps 10 (beam, token) pairs in all).
The rules match Hugging Face's warpers with ``min_tokens_to_keep=1``: ties at the top-k boundary
are all kept; top-p keeps the largest entry always and ``top_p == 1`` drops nothing; temperature
0 is greedy. Removed entries get ``-inf`` and are never drawn. Results are normalised float32
log-probabilities. Long form: docs/results/design_notes.md.
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


# candidates examined for top-p without top-k before the exact full-sort fallback
TOP_P_CANDIDATES = 128


def top_k_isolated(x: jax.Array, k: int):
    """``lax.top_k`` over the last axis behind optimization barriers.

    XLA:CPU lowers a ``top_k`` that is fused into a larger program to a full sort of the row,
    far slower over a vocabulary; kept apart it stays the TopK custom call. Returns
    ``(values, indices)`` in descending order (ties: lower index first).
    """
    v, i = jax.lax.top_k(jax.lax.optimization_barrier(x), k)
    # one barrier per output: a barrier over the (values, indices) tuple can become a direct
    # user of the TopK, which XLA's TopkDecomposer cannot handle in SPMD-partitioned programs
    return jax.lax.optimization_barrier(v), jax.lax.optimization_barrier(i)


@jax.named_scope("warp")
def warp_logits(logits: jax.Array, temperature: float = 1.0, top_k: Optional[int] = None,
                top_p: float = 1.0) -> jax.Array:
    """Warped, normalised log-probabilities over the last axis (see module doc for the rules).

    ``temperature``, ``top_k`` and ``top_p`` are Python numbers (static). No full-row sort: top-k
    takes the k largest (:func:`top_k_isolated`) and top-p works on the entries that can survive
    (:func:`_top_p_keep`); top-p without top-k looks at the ``TOP_P_CANDIDATES`` largest entries
    and falls back to a full sort (``lax.cond``; under ``vmap`` both branches run) only when
    their mass falls short of ``top_p``.
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
        v, idx = top_k_isolated(x, top_k)
        x = jnp.where(x < v[..., -1:], NEG_INF, x)
        if top_p < 1.0:
            x = jnp.where(_top_p_keep(x, v, idx, top_p, below=False)[0], x, NEG_INF)
    elif top_p < 1.0:
        m = min(n, TOP_P_CANDIDATES)
        v, idx = top_k_isolated(x, m)
        keep, short = _top_p_keep(x, v, idx, top_p, below=m < n)
        if m < n:
            keep = jax.lax.cond(jnp.any(short), lambda: _top_p_keep_sorted(x, top_p),
                                lambda: keep)
        x = jnp.where(keep, x, NEG_INF)
    return jax.nn.log_softmax(x, axis=-1)


def _top_p_keep(x: jax.Array, v: jax.Array, idx: jax.Array, top_p: float, below: bool):
    """Which entries top-p keeps, from the ``m`` largest entries ``(v, idx)`` (descending).

    The rule (HF's): in ascending order (value, then index), drop every entry whose cumulative
    probability is ``<= 1 - top_p``, always keeping the last. The cumulative probability is
    monotone, so the kept set is a suffix of that order: it is found without sorting. Entries are
    split by ``c = v[-1]`` into *above* (``> c``: all among the candidates), *tied* (``== c``:
    ordered among themselves by index, counted over the whole row) and *below* (``< c``; their
    total mass only, ``below=True``; with ``below=False`` they have probability zero, e.g.
    removed by top-k). Returns ``(keep [..., n], short [...])``: ``short`` is True where an entry
    below ``c`` would be kept too (the candidates were too few; the result is then not valid).
    """
    n = x.shape[-1]
    c, mx = v[..., -1:], v[..., :1]
    finite_c = c > NEG_INF
    tie = (x == c) & finite_c                                           # [..., n]
    e_c = jnp.where(finite_c, jnp.exp(c - mx), 0.0)                     # [..., 1]
    n_tie = jnp.sum(tie, axis=-1, keepdims=True)
    if below:
        mass_below = jnp.sum(jnp.where(x < c, jnp.exp(x - mx), 0.0), axis=-1, keepdims=True)
    else:
        mass_below = jnp.zeros_like(c)
    above = v > c                                                       # [..., m]
    e_above = jnp.where(above, jnp.exp(v - mx), 0.0)
    total = mass_below + n_tie * e_c + jnp.sum(e_above, axis=-1, keepdims=True)
    thr = 1.0 - top_p
    has_above = jnp.any(above, axis=-1, keepdims=True)
    # tied entries: the r-th (1-based, by index) has cumulative probability below/total + r p_c;
    # the first `removed` of them are dropped (never the last one when nothing lies above)
    p_c, base = e_c / total, mass_below / total
    removed = jnp.floor((thr - base) / jnp.where(p_c > 0, p_c, 1.0))
    removed = jnp.clip(jnp.where(p_c > 0, removed, 0.0), 0, n_tie).astype(jnp.int32)
    removed = jnp.where(has_above, removed, jnp.minimum(removed, n_tie - 1))
    tie_kept = removed < n_tie
    i_tie = _nth_true(tie, removed)
    # entries above c: cumulative probability from the ones before them in ascending order
    vc, vd = v[..., :, None], v[..., None, :]
    ic, id_ = idx[..., :, None], idx[..., None, :]
    before = ((vd < vc) | ((vd == vc) & (id_ <= ic))) & above[..., None, :]
    cum_above = (mass_below + n_tie * e_c
                 + jnp.sum(jnp.where(before, e_above[..., None, :], 0.0), axis=-1)) / total
    last = jnp.max(jnp.where(above & (v == mx), idx, -1), axis=-1, keepdims=True)
    keep_above = above & ((cum_above > thr) | (idx == last))   # the last entry is always kept
    v_above = jnp.min(jnp.where(keep_above, v, jnp.inf), axis=-1, keepdims=True)
    i_above = jnp.min(jnp.where(keep_above & (v == v_above), idx, n), axis=-1, keepdims=True)
    # the cut: the first kept entry in ascending order; everything after it is kept
    v_cut = jnp.where(tie_kept, c, v_above)
    i_cut = jnp.where(tie_kept, i_tie, i_above)
    keep = (x > v_cut) | ((x == v_cut) & (jnp.arange(n) >= i_cut))
    short = base[..., 0] > thr
    return keep, short


def _blocked(x: jax.Array, block: int):
    """``x [..., N]`` padded to whole blocks ``[..., nb, block]``, the block sums ``[..., nb]`` and
    their running sums: the first half of a blocked search (a full-row cumsum is a slow
    reduce-window on XLA:CPU and costs several ms on long rows)."""
    N = x.shape[-1]
    nb = -(-N // block)
    lead = x.shape[:-1]
    blocks = jnp.pad(x, [(0, 0)] * len(lead) + [(0, nb * block - N)]).reshape(lead + (nb, block))
    bsum = jnp.sum(blocks, axis=-1)
    return blocks, bsum, jnp.cumsum(bsum, axis=-1)


def _blocked_search(blocks, bsum, bcum, target, max_block):
    """The second half: for each ``target [..., k]``, the block where the running sum first exceeds
    it (at most ``max_block``), that block's entries ``[..., k, block]`` and the number ``j`` of its
    entries whose running sum is still ``<= target`` (the searched index is ``blk * block + j``)."""
    blk = jnp.sum(bcum[..., None, :] <= target[..., :, None], axis=-1)
    blk = jnp.minimum(blk, max_block)                                    # [..., k]
    start = jnp.take_along_axis(bcum - bsum, blk, axis=-1)
    inner = jnp.take_along_axis(blocks, blk[..., None], axis=-2)         # [..., k, block]
    icum = start[..., None] + jnp.cumsum(inner, axis=-1)
    return blk, inner, jnp.sum(icum <= target[..., None], axis=-1)


def _nth_true(mask: jax.Array, r: jax.Array, block: int = 256) -> jax.Array:
    """Index of the ``r``-th (0-based) True of ``mask`` along the last axis (``n`` if fewer), by
    the blocked search of :func:`draw_from`. ``mask [..., n]``, ``r [..., 1]`` -> ``[..., 1]``."""
    n = mask.shape[-1]
    blocks, bsum, bcum = _blocked(mask.astype(jnp.int32), block)
    blk, _, j = _blocked_search(blocks, bsum, bcum, r, bsum.shape[-1] - 1)
    return jnp.where(bcum[..., -1:] > r, blk * block + j, n)


def _top_p_keep_sorted(x: jax.Array, top_p: float) -> jax.Array:
    """The same top-p rule by a full ascending (stable) sort: the exact fallback."""
    order = jnp.argsort(x, axis=-1)  # ascending
    sorted_x = jnp.take_along_axis(x, order, axis=-1)
    cum = jnp.cumsum(jax.nn.softmax(sorted_x, axis=-1), axis=-1)
    remove_sorted = cum <= (1.0 - top_p)
    remove_sorted = remove_sorted.at[..., -1].set(False)  # always keep the largest
    remove = jnp.put_along_axis(jnp.zeros_like(remove_sorted), order, remove_sorted, axis=-1,
                                inplace=False)
    return ~remove


@jax.named_scope("random")
def draw_from(p: jax.Array, u: jax.Array, block: int = 256) -> jax.Array:
    """i.i.d. draws by inverting the CDF of probabilities ``p [..., N]`` (need not sum to 1) with
    uniforms ``u [..., k]``: the first index whose cumulative mass exceeds ``u * total``.

    One uniform per draw (no noise over the whole row) and no full-row cumsum (XLA:CPU's is a
    slow reduce-window): block sums, a cumsum over the blocks, then one block per draw. Entries
    with zero probability are never drawn (the CDF is flat there, and rounding of ``u * total``
    up to the total falls back to the last positive entry). An all-zero ``p`` has nothing to
    draw: it gives the last index of the padded blocks, ``block * ceil(N / block) - 1``, past
    the row unless ``N`` is a multiple of ``block`` (callers read ``p`` at what they drew, and
    their gathers clamp). Returns ``[..., k]`` int32.
    """
    blocks, bsum, bcum = _blocked(p, block)
    nb = bsum.shape[-1]
    target = u * bcum[..., -1:]                                          # [..., k]
    last_blk = nb - 1 - jnp.argmax((bsum > 0)[..., ::-1], axis=-1)       # [...]
    blk, inner, j = _blocked_search(blocks, bsum, bcum, target, last_blk[..., None])
    last_in = block - 1 - jnp.argmax((inner > 0)[..., ::-1], axis=-1)
    return (blk * block + jnp.minimum(j, last_in)).astype(jnp.int32)


def sample(key: jax.Array, logprobs: jax.Array, shape=None) -> jax.Array:
    """Draw indices from normalised log-probabilities (last axis), i.i.d. (with replacement).

    ``shape`` is the output shape (defaults to ``logprobs.shape[:-1]``); entries at ``-inf`` are
    never drawn.
    """
    return jax.random.categorical(key, logprobs, axis=-1, shape=shape)


# ---------------------------------------------------------------------------------------------
# short rows: the few entries a warp can keep (``tops.row_tops``)
def cumsum_short(x: jax.Array) -> jax.Array:
    """Running sums over the last axis of a SHORT row as one masked sum (``[..., n, n]``):
    XLA:CPU runs ``jnp.cumsum`` as a tree of several reduce-window steps."""
    n = x.shape[-1]
    tri = jnp.arange(n)[None, :] <= jnp.arange(n)[:, None]             # [i, j]: j <= i
    return jnp.sum(jnp.where(tri, x[..., None, :], jnp.zeros((), x.dtype)), axis=-1)


@jax.named_scope("warp")
def warp_sorted(x: jax.Array, top_k: Optional[int], top_p: float, keep: Optional[int] = None):
    """:func:`warp_logits`' top-k and top-p (temperature 1: ``x`` is already scaled) by one
    sort, for SHORT rows: ``x [..., n]`` -> ``(logprobs, order)``, both ``[..., m]`` in
    ascending order of ``(value, index)``: ``logprobs[..., i]`` belongs to entry
    ``order[..., i]``. ``keep``: only the ``m = keep`` largest entries are warped and
    returned (``top_k <= keep``; the caller makes sure that top-k keeps no more than these, or
    takes what they give: ``tops.row_tops``); ``None``: all, ``m = n``.

    The same rule: top-k keeps the entries ``>= c``, ``c`` the ``top_k``-th largest; top-p
    walks the kept ones in ascending ``(value, index)`` order and drops every entry whose
    cumulative probability is ``<= 1 - top_p``, never the last (the largest, of the highest
    index among equals); the rest get ``-inf``. On a row of a vocabulary's length the sort
    would be slow on XLA:CPU: :func:`warp_logits` finds the same set without sorting. Here the
    sort makes the whole warp a handful of operations.
    """
    n = x.shape[-1]
    iota = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), x.shape)
    xs, order = jax.lax.sort((x.astype(jnp.float32), iota), dimension=x.ndim - 1, num_keys=1,
                             is_stable=True)
    if keep is not None and keep < n:
        # the rest is a handful of sums: XLA:CPU splits a sum over more than 32 entries into
        # several steps, so short rows stay short
        xs, order, n = xs[..., n - keep:], order[..., n - keep:], keep
    mx = xs[..., -1:]
    finite = mx > NEG_INF
    kept = xs > NEG_INF
    if top_k is not None and 0 < top_k < n:
        kept = kept & (xs >= xs[..., n - top_k:n - top_k + 1])
    e = jnp.where(kept & finite, jnp.exp(xs - jnp.where(finite, mx, 0.0)), 0.0)
    total = jnp.sum(e, axis=-1, keepdims=True)
    if top_p < 1.0:
        cum = cumsum_short(e) / jnp.where(total > 0, total, 1.0)
        last = jnp.arange(n) == n - 1
        kept = kept & ((cum > 1.0 - top_p) | last)
        e = jnp.where(kept, e, 0.0)
        total = jnp.sum(e, axis=-1, keepdims=True)
    lp = jnp.where(kept & finite, xs - mx - jnp.log(jnp.where(total > 0, total, 1.0)), NEG_INF)
    return lp, order


@jax.named_scope("random")
def draw_short(p: jax.Array, u: jax.Array) -> jax.Array:
    """:func:`draw_from` for SHORT rows (one cumulative sum, no blocks): ``p [..., n]``
    (need not sum to 1), ``u [..., k]`` -> ``[..., k]`` int32, the first position whose
    cumulative mass exceeds ``u * total``; zero entries are never drawn (rounding up to the
    total falls back to the last positive one); an all-zero ``p`` gives ``n - 1`` (callers
    check ``p`` at what they drew)."""
    n = p.shape[-1]
    cum = cumsum_short(p)
    target = u * cum[..., -1:]
    pos = jnp.sum(cum[..., None, :] <= target[..., :, None], axis=-1)
    last = n - 1 - jnp.argmax((p > 0)[..., ::-1], axis=-1)
    return jnp.minimum(pos, last[..., None]).astype(jnp.int32)
