"""The draft forest of one DSBD iteration: layout, forest attention masks, drafting, commits.

Per prompt: ``Wc`` input beams (cache rows), ``G = gamma`` layers of ``C = W_S`` nodes; node ids in
the target pass's order are the input beams' pending tokens, then layer by layer
(:class:`Layout`). A layer's joint is flat over (parent slot, token). Caches are one row per
prompt: beam ``r`` owns slots ``r * S ..``; the draft's row ends in scratch slots for the
forest's keys and values. A node attends to its root beam's committed slots and its ancestors
only (masks built on device from the ancestor table ``anc [B, T, G + 1]``), so each node runs
once through the model whatever its root. The draft cache lags one slot behind the target's
(each iteration's first draft call runs ``[prev, pending]``), keeping ``gamma`` draft calls an
iteration. Long form: docs/results/design_notes.md.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp

from dsbd_jax.decoding import common
from dsbd_jax.models.cache import KVCache
from dsbd_jax.decoding import drafting
from dsbd_jax.decoding.rules import draw_gumbel
from dsbd_jax.decoding.dsbd.tops import parent_tops, row_size, sparse_applies, warp_layer
from dsbd_jax.decoding.warping import draw_from, draw_short, warp_logits

NEG_INF = -jnp.inf


@dataclasses.dataclass(frozen=True)
class Layout:
    """Static sizes of one iteration's forest."""

    Wc: int   # input beams (cache rows) per prompt
    C: int    # nodes per draft layer (W_S)
    G: int    # layers (gamma)
    S: int    # cache slots per beam
    V: int    # vocabulary

    @property
    def T(self) -> int:
        return self.Wc + self.G * self.C

    @property
    def P(self) -> int:
        return max(self.Wc, self.C)

    @property
    def Td(self) -> int:
        return 2 * self.Wc + (self.G - 1) * self.C

    def layer_start(self, l):
        """Target id of node 0 of layer ``l`` (``l = 0``: the input beams)."""
        return jnp.where(l == 0, 0, self.Wc + (l - 1) * self.C)

    def depth(self) -> jax.Array:
        """``[T]`` depth of every node."""
        return jnp.concatenate([jnp.zeros((self.Wc,), jnp.int32),
                                jnp.repeat(jnp.arange(1, self.G + 1, dtype=jnp.int32), self.C)])


@flax.struct.dataclass
class Forest:
    """One iteration's draft forest (batch axis first)."""

    tokens: jax.Array    # [B, G, C] int32
    parent: jax.Array    # [B, G, C] parent slot in the previous layer
    flat: jax.Array      # [B, G, C] parent * V + token
    valid: jax.Array     # [B, G, C] bool: drawn with positive probability (not dead)
    finished: jax.Array  # [B, G, C] bool: EOS on the path
    q: jax.Array         # [B, G, P * V] the distribution each layer was drawn from (probs);
                         # with q_index, [B, G, K]: its values at q_index, 0 elsewhere
    anc: jax.Array       # [B, T, G + 1] ancestors (target ids) by depth
    node_tokens: jax.Array  # [B, T] token of every node (pending tokens first)
    # [B, G, K] the flat indices of q's entries (tops.sparse_applies: the draft drew from its
    # parents' K largest entries, module tops), or None: q is [P * V]
    q_index: Optional[jax.Array] = None


# ---------------------------------------------------------------------------------------------
# masks
def visible(ids: jax.Array, ok: jax.Array, size: int) -> jax.Array:
    """``[B, n, k]`` ids (with ``ok``) -> ``[B, n, size]`` bool: the listed entries."""
    hit = (ids[..., None] == jnp.arange(size)) & ok[..., None]
    return jnp.any(hit, axis=-2)


def root_slots(root: jax.Array, filled: jax.Array, Wc: int, S: int) -> jax.Array:
    """``[B, n]`` roots, ``[B]`` filled slots -> ``[B, n, Wc * S]``: root slots ``< filled``."""
    beam = jnp.arange(Wc)[None, None, :, None] == root[:, :, None, None]
    slot = jnp.arange(S)[None, None, None, :] < filled[:, None, None, None]
    return (beam & slot).reshape(root.shape + (Wc * S,))


def target_mask(lay: Layout, anc: jax.Array, base: jax.Array) -> jax.Array:
    """``[B, T, Wc * S + T]``: root's slots ``< base``, then ancestors-or-self among the nodes."""
    k = jnp.arange(lay.G + 1)
    ok = jnp.broadcast_to(k[None, None, :] <= lay.depth()[None, :, None], anc.shape)
    return jnp.concatenate([root_slots(anc[:, :, 0], base, lay.Wc, lay.S),
                            visible(anc, ok, lay.T)], axis=-1)


# ---------------------------------------------------------------------------------------------
# drafting
def _sanitize(lw: jax.Array) -> jax.Array:
    """Warping an all ``-inf`` row (a finished prompt's junk) gives NaN: make it ``-inf``."""
    return jnp.where(jnp.isnan(lw), NEG_INF, lw)


def draft_layer(config, u: jax.Array, g: jax.Array, logits: jax.Array, dscore: jax.Array,
                finished: jax.Array, ok: jax.Array, P: int):
    """Draw one draft layer by beam sampling on the draft's own warped joint.

    Args:
      u: ``[B, C]`` uniforms (i.i.d. draws); g: ``[B, >= n * V]`` Gumbel noise (without
        replacement).
      logits: ``[B, n, V]`` draft logits of the parents; dscore: ``[B, n]`` their draft beam
        scores; finished / ok: ``[B, n]`` (finished parents are absorbing; not-ok parents have
        weight 0).
    Returns:
      dict of ``[B, C]`` arrays (parent, token, flat, valid, dscore, finished) and ``q [B, P*V]``.
    """
    B, n, V = logits.shape
    C = config.layer_width
    logq = common.absorb_finished(jax.nn.log_softmax(logits, axis=-1), finished, config.pad_id)
    joint = jnp.where(ok[..., None], dscore[..., None] + logq, NEG_INF).reshape(B, n * V)
    # computed once: left to fusion, XLA:CPU recomputes it inside each consumer (the warp and
    # the step log-probs), a full pass over all B x n x V entries each
    # (benchmarks/phase_profile.py)
    joint = jax.lax.optimization_barrier(joint)
    out = {}
    if sparse_applies(config):
        # the warp on each parent's largest entries (module tops): the draft's q is whatever it
        # draws from, so no check of equal entries past them is needed here
        v, tflat = parent_tops(joint.reshape(B, n, V), row_size(config.top_k, V),
                               config.temperature)
        lw, index, _ = warp_layer(v, tflat, None, config)
        q = jnp.exp(lw)                   # [B, K]: not normalised where the warp kept more
        at = draw_short(q, u)
        flat = jnp.take_along_axis(index, at, axis=1)
        valid = jnp.take_along_axis(lw, at, axis=1) > NEG_INF
        out["q_index"] = index
    else:
        lw = _sanitize(warp_logits(joint, config.temperature, config.top_k, config.top_p))
        if config.replacement:
            flat = jax.vmap(draw_from)(jnp.exp(lw), u)
        else:
            flat = jax.vmap(lambda x, gg: draw_gumbel(x, gg[:n * V], C))(lw, g)
        valid = jnp.take_along_axis(lw, flat, axis=1) > NEG_INF
        q = jnp.pad(jnp.exp(lw), ((0, 0), (0, (P - n) * V)))
    parent, token = flat // V, (flat % V).astype(jnp.int32)
    step_lp = jnp.take_along_axis(logq.reshape(B, n * V), flat, axis=1)
    return dict(parent=parent, token=token, flat=flat, valid=valid,
                dscore=jnp.take_along_axis(dscore, parent, axis=1) + step_lp,
                finished=(jnp.take_along_axis(finished, parent, axis=1)
                          | common.is_eos(token, config.eos_ids)),
                q=q, **out)


def _draft_forward(config, params, buffer: KVCache, tokens, feats, positions, mask, offset,
                   key_positions, logits_at=None):
    """Draft forward over new tokens against the whole draft buffer; writes their keys/values
    into the buffer at slot ``offset`` (the scratch tail). ``params``: both models'; ``feats``:
    the features a draft head reads (``None`` for a draft model). ``key_positions [B, slots]``:
    the buffer's RoPE positions (:func:`buffer_positions`). Returns ``(logits, buffer,
    features or None)``."""
    logits, new, out = drafting.draft_forward(config, params, tokens, feats, positions, mask,
                                              buffer, logits_at=logits_at,
                                              key_positions=key_positions)

    def put(c, x):
        return jax.lax.dynamic_update_slice(c, x.astype(c.dtype), (0, 0, offset, 0, 0))

    return logits, KVCache(put(buffer.k, new.k), put(buffer.v, new.v)), out


def row_positions(lay: Layout, batch: int) -> jax.Array:
    """``[B, Wc * S]``: the RoPE position of every slot of a row cache (beam ``r``'s slot
    ``r * S + s`` holds position ``s``); sliding-window models read them."""
    return jnp.broadcast_to(jnp.arange(lay.Wc * lay.S, dtype=jnp.int32) % lay.S,
                            (batch, lay.Wc * lay.S))


def buffer_positions(lay: Layout, base: jax.Array) -> jax.Array:
    """``[B, Wc * S + Td]``: positions of the draft buffer's slots: the rows, then the scratch
    tail as :func:`build_forest` fills it (``prev`` at ``base - 1``, ``pending`` at ``base``,
    layer ``l``'s ``C`` nodes at ``base + l``)."""
    B = base.shape[0]
    Wc, C, G = lay.Wc, lay.C, lay.G
    scratch = jnp.concatenate([jnp.broadcast_to(jnp.maximum(base - 1, 0)[:, None], (B, Wc)),
                               jnp.broadcast_to(base[:, None], (B, Wc)),
                               base[:, None] + 1 + jnp.arange((G - 1) * C)[None] // C], axis=1)
    return jnp.concatenate([row_positions(lay, B), scratch.astype(jnp.int32)], axis=1)


def build_forest(config, lay: Layout, params, buffer: KVCache, base: jax.Array,
                 prev: jax.Array, pending: jax.Array, scores: jax.Array, finished: jax.Array,
                 live: jax.Array, draft_u: jax.Array, draft_g: jax.Array, feats=None):
    """Run the draft: ``gamma`` forward calls, ``gamma`` layers of ``C`` nodes each (``W_S``;
    with a node budget, ``config.layer_width``: then only each layer's first ``W_S`` nodes are
    the next layer's parents, the draft's beam of width ``W_S``, and the others are leaves,
    candidates for their own layer's verification only).

    Args:
      params: ``{"target": .., "draft": ..}`` (a draft head reads the target's embedding and
        vocabulary head).
      buffer: draft cache ``[L, B, Wc * S + Td, K, D]``.
      base: ``[B]`` slot of the pending tokens. prev, pending: ``[B, Wc]`` tokens at ``base - 1``
        and ``base``. scores: ``[B, Wc]`` target log-likelihoods of the input beams (the draft's
        beam scores start from them). finished, live: ``[B, Wc]``.
      draft_u: ``[B, G, C]`` uniforms; draft_g: ``[B, G, P * V]`` Gumbel noise (or empty): the
        draft's random numbers (``verify.Randoms``).
      feats: a draft head's ``[B, Wc, 2, d]`` features read with each input beam's prev and
        pending tokens (``None`` for a draft model); each layer's nodes read their parent's
        output feature, so every draft beam carries its own chain of features.
    Returns:
      ``(Forest, buffer)``; the buffer's scratch holds prev, pending and layers ``1 .. G-1``.
    """
    Wc, C, G = lay.Wc, lay.C, lay.G
    B = base.shape[0]
    has_prev = base >= 1
    draft_filled = jnp.maximum(base - 1, 0)
    r, key_pos, buffer, out0, first = _root_call(
        config, lay, params, buffer, base, has_prev, draft_filled, prev, pending, feats,
        (draft_u, draft_g, scores, finished, live))
    anc_in = jnp.broadcast_to(r[None, :, None], (B, Wc, G + 1))   # input beams: themselves
    anc1 = _new_anc(lay, anc_in, 1, first["parent"])
    # a head's layer-1 nodes read their root's output feature (from the pending row of call 0)
    d = drafting.feature_size(config)
    feat1 = (jnp.zeros((B, C, 0), jnp.float32) if out0 is None else
             jnp.take_along_axis(out0[:, Wc:], first["parent"][..., None], axis=1))
    step = functools.partial(_layer_call, config, lay, params, base, has_prev, draft_filled,
                             key_pos, draft_u, draft_g, d)
    layers = {k: v[:, None] for k, v in first.items()}                    # [B, 1, ...]
    anc = jnp.concatenate([anc_in, anc1], axis=1)
    if G > 1:
        (buffer, _, _, _), (rest, rest_anc) = jax.lax.scan(step, (buffer, first, anc1, feat1),
                                                           jnp.arange(1, G))
        layers = {k: jnp.concatenate([v, jnp.moveaxis(rest[k], 0, 1)], axis=1)
                  for k, v in layers.items()}                              # [B, G, ...]
        anc = jnp.concatenate([anc, jnp.moveaxis(rest_anc, 0, 1).reshape(B, (G - 1) * C, G + 1)],
                              axis=1)                                      # [B, T, G+1]
    tokens = layers["token"]
    forest = Forest(tokens=tokens, parent=layers["parent"], flat=layers["flat"],
                    valid=layers["valid"], finished=layers["finished"], q=layers["q"], anc=anc,
                    node_tokens=jnp.concatenate([pending, tokens.reshape(B, G * C)], axis=1),
                    q_index=layers.get("q_index"))
    return forest, buffer


def _root_call(config, lay: Layout, params, buffer, base, has_prev, draft_filled, prev, pending,
               feats, layer0):
    """The forest's first draft call, ``[prev_r, pending_r]`` for every input beam ``r``, and
    layer 1 drawn from it (``layer0``: the draft's uniforms and Gumbel noise, and the input
    beams' scores, finished and live). Returns ``(r, key positions, buffer, output features, layer 1)``."""
    Wc, S = lay.Wc, lay.S
    B = base.shape[0]
    r = jnp.arange(Wc)
    root0 = jnp.broadcast_to(jnp.concatenate([r, r])[None], (B, 2 * Wc))
    eye = jnp.eye(2 * Wc, dtype=bool)
    prev_of_pending = jnp.zeros((2 * Wc, 2 * Wc), bool).at[Wc + r, r].set(True)
    new0 = eye[None] | (prev_of_pending[None] & has_prev[:, None, None])
    mask0 = jnp.concatenate([root_slots(root0, draft_filled, Wc, S),
                             jnp.zeros((B, 2 * Wc, lay.Td), bool), new0], axis=-1)
    tokens0 = jnp.concatenate([prev, pending], axis=1)
    pos0 = jnp.concatenate([jnp.broadcast_to(draft_filled[:, None], (B, Wc)),
                            jnp.broadcast_to(base[:, None], (B, Wc))], axis=1)
    key_pos = buffer_positions(lay, base)
    feats0 = None if feats is None else jnp.concatenate([feats[:, :, 0], feats[:, :, 1]], 1)
    logits0, buffer, out0 = _draft_forward(config, params, buffer, tokens0, feats0, pos0, mask0,
                                           Wc * S, key_pos,
                                           logits_at=jnp.broadcast_to(Wc + r, (B, Wc)))
    draft_u, draft_g, scores, finished, live = layer0
    first = draft_layer(config, draft_u[:, 0], draft_g[:, 0], logits0, scores, finished, live,
                        lay.P)
    return r, key_pos, buffer, out0, first


def _new_anc(lay: Layout, parent_anc, l, parent):
    """Ancestors of layer-``l`` nodes: the parent's, with the node itself from depth ``l`` on."""
    C, G = lay.C, lay.G
    a = jnp.take_along_axis(parent_anc, parent[..., None], axis=1)        # [B, C, G+1]
    ids = lay.layer_start(l) + jnp.arange(C)
    return jnp.where(jnp.arange(G + 1)[None, None, :] >= l, ids[None, :, None], a)


def _layer_call(config, lay: Layout, params, base, has_prev, draft_filled, key_pos, draft_u,
                draft_g, d, carry, l):
    """One draft call over layer ``l``'s nodes (1 .. G-1) and layer ``l + 1`` drawn from it:
    the body of ``build_forest``'s scan. The next layer's parents are the layer's first
    ``W_S`` nodes (all of it without a node budget); the others are leaves."""
    Wc, C, G, S = lay.Wc, lay.C, lay.G, lay.S
    Wp = min(config.draft_width, C)        # parents of the next layer in each layer
    B = base.shape[0]
    buffer, cur, cur_anc, cur_feat = carry                # cur: layer l (1 .. G-1)
    sid = jnp.where(jnp.arange(G + 1)[None, None, :] < l, cur_anc + Wc, 0)
    sok = jnp.broadcast_to(jnp.arange(G + 1)[None, None, :] < l, sid.shape)
    prev_id = cur_anc[:, :, :1]                           # scratch id of the root's prev
    ids = jnp.concatenate([sid, prev_id], axis=-1)
    ok = jnp.concatenate([sok, jnp.broadcast_to(has_prev[:, None, None], prev_id.shape)], -1)
    mask = jnp.concatenate([root_slots(cur_anc[:, :, 0], draft_filled, Wc, S),
                            visible(ids, ok, lay.Td),
                            jnp.broadcast_to(jnp.eye(C, dtype=bool), (B, C, C))], axis=-1)
    pos = jnp.broadcast_to((base + l)[:, None], (B, C))
    logits, buffer, out = _draft_forward(
        config, params, buffer, cur["token"], cur_feat if d else None, pos, mask,
        Wc * S + 2 * Wc + (l - 1) * C, key_pos,
        logits_at=None if Wp == C else jnp.broadcast_to(jnp.arange(Wp), (B, Wp)))
    pick = lambda x: jax.lax.dynamic_index_in_dim(x, l, 1, keepdims=False)  # noqa: E731
    nxt = draft_layer(config, pick(draft_u), pick(draft_g), logits, cur["dscore"][:, :Wp],
                      cur["finished"][:, :Wp], cur["valid"][:, :Wp], lay.P)
    nxt_anc = _new_anc(lay, cur_anc, l + 1, nxt["parent"])
    nxt_feat = (cur_feat if out is None else
                jnp.take_along_axis(out, nxt["parent"][..., None], axis=1))
    return (buffer, nxt, nxt_anc, nxt_feat), (nxt, nxt_anc)


# ---------------------------------------------------------------------------------------------
# commits
@jax.named_scope("cache")
def commit_rows(rows: KVCache, src: KVCache, roots: jax.Array, ids: jax.Array, start: jax.Array,
                Wc: int, S: int) -> KVCache:
    """New per-beam caches: row ``o`` = old row ``roots[b, o]`` with ``src`` entries ``ids[b, o]``
    written at slots ``start[b] ..`` (the accepted path; EAGLE-style copy).

    rows: ``[L, B, Wc * S, K, D]``; src: ``[L, B, Tsrc, K, D]``; roots: ``[B, Wc]``;
    ids: ``[B, Wc, n]`` (clipped into ``src``); start: ``[B]`` (``start + n <= S``).
    """
    def one(c, s, root, idx, st):            # c: [L, Wc*S, K, D], s: [L, Tsrc, K, D]
        L, _, K, D = c.shape
        c = jnp.take(c.reshape(L, Wc, S, K, D), root, axis=1)
        path = jnp.take(s, jnp.clip(idx, 0, s.shape[1] - 1).reshape(-1), axis=1)
        path = path.reshape(L, Wc, idx.shape[-1], K, D).astype(c.dtype)
        c = jax.lax.dynamic_update_slice(c, path, (0, 0, st, 0, 0))
        return c.reshape(L, Wc * S, K, D)

    f = jax.vmap(one, in_axes=(1, 1, 0, 0, 0), out_axes=1)
    return KVCache(f(rows.k, src.k, roots, ids, start), f(rows.v, src.v, roots, ids, start))
