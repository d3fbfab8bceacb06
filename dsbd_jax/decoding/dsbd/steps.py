"""The named steps of one DSBD iteration, in the order ``generate.iteration`` runs them.

``draft_forest`` (the draft beam-samples ``gamma`` layers from the input beams), ``score_forest``
(one target pass over every node: node scores and each layer's joint), ``verify`` (module
``verify``, dense or on the rows' largest entries), ``emit_beams`` (the verdict's output beams),
``commit_caches`` (each output beam's rows: its root's plus its accepted path) and ``advance``
(the next state and the counts). Every step works on the whole batch; a finished prompt keeps
its state. Steps trace their operations in a fixed order: the compiled program depends on it.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from dsbd_jax.decoding import common, drafting
from dsbd_jax.decoding.configs import DSBDConfig
from dsbd_jax.decoding.dsbd.forest import Layout, build_forest, commit_rows, row_positions, target_mask
from dsbd_jax.decoding.dsbd.state import DSBDState, DSBDStats
from dsbd_jax.decoding.dsbd.tops import row_tops
from dsbd_jax.decoding.dsbd.verify import (Verdict, make_randoms, randoms_size, randoms_table,
                                           split_randoms, verify_dense, verify_tops)
from dsbd_jax.models.cache import KVCache

NEG_INF = -jnp.inf


def random_table(config: DSBDConfig, keys: jax.Array):
    """``[B, max_new_tokens, size]``: every iteration's random numbers made before the loop
    (``verify.randoms_table``; an iteration makes at least one token), or ``None`` where they
    stay inside the iteration (``replacement=False``: Gumbel noise over the vocabulary)."""
    if not config.replacement:
        return None
    G, C, W = config.gamma, config.layer_width, config.beam_width
    return randoms_table(keys, config.max_new_tokens, randoms_size(G, C, W, 0, True))


def draft_forest(config: DSBDConfig, params, prompt_lengths, state: DSBDState, table=None):
    """Step 1: the draft forest grown from the state's input beams.

    ``table``: :func:`random_table`'s numbers, or ``None`` to draw them here.
    Returns ``(forest, draft buffer, layout, randoms, base slots, input-beam fields)``."""
    B, W, N = state.sequences.shape
    G, C, V = config.gamma, config.layer_width, config.target.vocab_size
    Wc = config.cache_rows
    S = state.target_cache.k.shape[2] // Wc
    lay = Layout(Wc=Wc, C=C, G=G, S=S, V=V)
    if table is None:
        rand = jax.vmap(lambda k, i: make_randoms(jax.random.fold_in(k, i), G, C, W, lay.P * V,
                                                  config.replacement))(state.keys, state.row_iter)
    else:
        with jax.named_scope("random"):
            at = jnp.minimum(state.row_iter, table.shape[1] - 1)[:, None, None]
            u = jnp.take_along_axis(table, at, axis=1)[:, 0]
            rand = jax.vmap(lambda u: split_randoms(u, G, C, W, lay.P * V, True))(u)
    base = prompt_lengths + state.generated - 1                       # slot of pending tokens
    in_idx = (state.anchor[:, None] if config.single_beam
              else jnp.broadcast_to(jnp.arange(W)[None], (B, W)))     # [B, Wc]
    inputs = {k: common.take_rows(getattr(state, k), in_idx)
              for k in ("pending", "prev", "scores", "finished", "live", "feat")}
    forest, dbuf = build_forest(config, lay, params, state.draft_cache, base,
                                inputs["prev"], inputs["pending"], inputs["scores"],
                                inputs["finished"], inputs["live"], rand.draft_u, rand.draft_g,
                                feats=inputs["feat"] if drafting.uses_head(config) else None)
    return forest, dbuf, lay, rand, base, in_idx, inputs


def same_context(seq_in, anc, anc_tok, depth, ok, fin) -> jax.Array:
    """``[B, T]``: for every node of a forest pass, the first node whose context is the same
    (itself when none comes before it): same input-beam tokens (``seq_in [B, Wc, N]``), depth
    and tokens from the root's pending token down (``anc_tok [B, T, G + 1]``; ``anc`` column 0
    the input beam), both valid (``ok [B, T]``) and alike in being finished (``fin [B, T]``).

    Why: the target's logits of one context at two places of a pass differ by a few ulps (their
    attention sums run in another order). Beam sampling's joint holds equal entries for
    duplicate beams, and a top-k or top-p cut keeps or drops both; rows a few ulps apart would
    be cut apart and leave beam sampling's distribution (docs/algorithm.md)."""
    B, Wc, _ = seq_in.shape
    T, G1 = anc.shape[1], anc.shape[2]
    same_seq = jnp.all(seq_in[:, :, None, :] == seq_in[:, None, :, :], axis=-1)   # [B, Wc, Wc]
    root = anc[:, :, 0]                                                          # [B, T]
    roots_same = jax.vmap(lambda m, r: m[r[:, None], r[None, :]])(same_seq, root)  # [B, T, T]
    on = jnp.arange(G1)[None, :] <= depth[:, None]                               # [T, G + 1]
    toks_same = jnp.all(jnp.where(on[None, :, None, :],
                                  anc_tok[:, :, None, :] == anc_tok[:, None, :, :], True),
                        axis=-1)                                                 # [B, T, T]
    same = (roots_same & toks_same & (depth[:, None] == depth[None, :])[None]
            & (ok[:, :, None] & ok[:, None, :]) & (fin[:, :, None] == fin[:, None, :]))
    same = same | jnp.eye(T, dtype=bool)[None]
    return jnp.argmax(same, axis=-1).astype(jnp.int32)


class Scored(NamedTuple):
    """The target's view of a forest (``T`` nodes: the input beams, then the layers)."""

    tkv: KVCache             # the pass's new cache entries
    tfeat: object            # [B, T, d] a draft head's features, or None
    node_fin: jax.Array      # [B, T] finished nodes
    anc: jax.Array           # [B, T, G + 1] each node's ancestors by depth (0: input beam)
    flat_lp: jax.Array       # [B, T * V] target log-probs after each node (absorbing EOS)
    s_node: jax.Array        # [B, T] node scores: root score + log-probs along the path
    joint: jax.Array         # [B, G + 1, P, V] each layer's parents' joint log-weights
    input_ok: jax.Array      # [B, P] live input beams


def score_forest(config: DSBDConfig, params, state: DSBDState, forest, lay: Layout, base,
                 in_idx, inputs) -> Scored:
    """Step 2: ONE target pass over every node with the forest's attention mask; nodes of the
    same context read one node's row (:func:`same_context`), so their joint rows are equal."""
    B, G, V, T = state.sequences.shape[0], lay.G, lay.V, lay.T
    C, Wc = lay.C, lay.Wc
    depth = lay.depth()
    positions = base[:, None] + depth[None, :]
    mask = target_mask(lay, forest.anc, base)
    logits, tkv, tfeat = drafting.target_forward(config, params, forest.node_tokens, positions,
                                                 mask, state.target_cache,
                                                 key_positions=row_positions(lay, B))
    node_fin = jnp.concatenate([inputs["finished"], forest.finished.reshape(B, G * C)], axis=1)
    logp = common.absorb_finished(jax.nn.log_softmax(logits, axis=-1), node_fin, config.pad_id)
    anc = forest.anc
    anc_tok = common.take_rows(forest.node_tokens, anc)                # [B, T, G + 1]
    node_ok = jnp.concatenate([inputs["live"], forest.valid.reshape(B, G * C)], axis=1)
    seq_in = common.take_rows(state.sequences, in_idx)                 # [B, Wc, N]
    canon = same_context(seq_in, anc, anc_tok, depth, node_ok, node_fin)
    logp = common.take_rows(logp, canon)
    flat_lp = logp.reshape(B, T * V)
    steps = common.take_rows(flat_lp, anc[:, :, :-1] * V + anc_tok[:, :, 1:])      # [B, T, G]
    on_path = jnp.arange(1, G + 1)[None, :] <= depth[:, None]          # [T, G]
    s_node = (common.take_rows(inputs["scores"], anc[:, :, 0])
              + jnp.sum(jnp.where(on_path[None], steps, 0.0), axis=-1))
    Pp = lay.P
    par_ids = jnp.minimum(jnp.stack([lay.layer_start(l) for l in range(G + 1)])[:, None]
                          + jnp.arange(Pp)[None, :], T - 1)             # [G + 1, Pp]
    joint = (common.take_rows(s_node, par_ids[None].repeat(B, 0))[..., None]
             + common.take_rows(logp, par_ids[None].repeat(B, 0)))     # [B, G + 1, Pp, V]
    input_ok = jnp.zeros((B, Pp), bool).at[:, :Wc].set(inputs["live"])
    return Scored(tkv, tfeat, node_fin, anc, flat_lp, s_node, joint, input_ok)


def verify(config: DSBDConfig, rand, scored: Scored, forest, budget, lay: Layout) -> Verdict:
    """Step 3: every prompt's forest verified layer by layer (``verify``). With a top-k forest,
    on each row's largest entries, unless equal entries could reach past them in some row of
    the batch: then on the ``[P * V]`` vectors (one branch runs; the condition is the batch's)."""
    G, V = lay.G, lay.V
    rest = (forest.flat, forest.valid, forest.finished, budget)
    dense = jax.vmap(functools.partial(verify_dense, config=config))
    args = (rand, scored.joint, scored.input_ok)
    if forest.q_index is None:
        return dense(*args, forest.q, *rest)
    tops = jax.vmap(functools.partial(row_tops, config=config))(scored.joint)

    def on_rows():
        q = jax.vmap(lambda qv, qi: jnp.zeros((G, lay.P * V), qv.dtype).at[
            jnp.arange(G)[:, None], qi].set(qv, mode="drop"))(forest.q, forest.q_index)
        return dense(*args, q, *rest)

    on_tops = jax.vmap(lambda *a: verify_tops(*a[:-2], config=config, tops=a[-2],
                                              q_index=a[-1]))
    return jax.lax.cond(jnp.any(tops.risk), on_rows,
                        lambda: on_tops(*args, forest.q, *rest, tops._replace(risk=None),
                                        forest.q_index))


class Beams(NamedTuple):
    """The iteration's output beams ``[B, W]`` (and what commits them)."""

    depth: jax.Array        # [B] tokens this iteration made per beam
    tokens: jax.Array       # [B, W] each beam's last token (pending next)
    path: jax.Array         # [B, W, G + 1] each beam's accepted nodes (column 0: its root)
    valid: jax.Array        # [B, W]
    sequences: jax.Array    # [B, W, N]
    scores: jax.Array       # [B, W]
    finished: jax.Array     # [B, W]
    prev: jax.Array         # [B, W]
    feat: jax.Array         # [B, W, 2, d]
    generated: jax.Array    # [B]


def emit_beams(config: DSBDConfig, state: DSBDState, forest, scored: Scored, verdict: Verdict,
               lay: Layout, in_idx, inputs, active) -> Beams:
    """Step 4: the verdict's beams: each one's path from its root, its tokens written after
    the root's sequence, its score and, with a draft head, its features."""
    W, N, G, V, T = state.sequences.shape[1], state.sequences.shape[2], lay.G, lay.V, lay.T
    d = verdict.depth                                                  # [B]
    slot, tok = verdict.flat // V, (verdict.flat % V).astype(jnp.int32)
    par = jnp.minimum(lay.layer_start(jnp.maximum(d - 1, 0))[:, None] + slot, T - 1)  # [B, W]
    path = common.take_rows(scored.anc, par)                           # [B, W, G + 1]
    root = path[:, :, 0]
    valid = verdict.valid & active[:, None]
    k = jnp.arange(G + 1)
    path_tok = jnp.where(k[None, None, :] < (d - 1)[:, None, None],   # [B, W, G + 1]
                         common.take_rows(forest.node_tokens,
                                          jnp.concatenate([path[:, :, 1:], path[:, :, :1]], -1)),
                         tok[:, :, None])
    dest = jnp.broadcast_to(jnp.where(k[None, None, :] < d[:, None, None],
                                      state.generated[:, None, None] + k[None, None, :], N),
                            path_tok.shape)
    seqs = common.take_rows(state.sequences, common.take_rows(in_idx, root))
    seqs = jax.vmap(jax.vmap(lambda s, i, t: s.at[i].set(t, mode="drop")))(seqs, dest, path_tok)
    seqs = jnp.where(valid[..., None], seqs, config.pad_id)
    scores = jnp.where(valid, common.take_rows(scored.s_node, par)
                       + common.take_rows(scored.flat_lp, par * V + tok), NEG_INF)
    fin = common.take_rows(scored.node_fin, par) | common.is_eos(tok, config.eos_ids)
    prev = common.take_rows(forest.node_tokens, par)
    if scored.tfeat is not None:
        # pending reads the target's feature at par, prev at par's parent (par's ancestor at
        # depth d - 2, or the root's own prev feature)
        gather = jax.vmap(lambda f, i: f[i])
        f_pend = gather(scored.tfeat, par)                             # [B, W, d]
        above = jnp.take_along_axis(path, jnp.maximum(d - 2, 0)[:, None, None].repeat(W, 1),
                                    axis=2)[..., 0]                    # [B, W]
        root_prev = gather(inputs["feat"][:, :, 1], root)              # [B, W, d]
        f_prev = jnp.where((d >= 2)[:, None, None], gather(scored.tfeat, above), root_prev)
        feat = jnp.stack([f_prev, f_pend], axis=2)
    else:
        feat = state.feat
    generated = state.generated + jnp.where(active, d, 0)
    return Beams(d, tok, path, valid, seqs, scores, fin, prev, feat, generated)


def commit_caches(config: DSBDConfig, state: DSBDState, dbuf: KVCache, tkv: KVCache,
                  beams: Beams, base, lay: Layout, active):
    """Step 5: every output beam's cache rows (target and draft) = its root's rows + its
    accepted path. ``single_beam``: only the most likely beam's, in row 0 (the next anchor).
    Returns ``(target cache, draft cache, anchor)``."""
    B, Wc, S = base.shape[0], lay.Wc, lay.S
    if config.single_beam:
        best = jnp.argmax(beams.scores, axis=1).astype(jnp.int32)
        roots = jnp.zeros((B, 1), jnp.int32)
        cpath = common.take_rows(beams.path, best[:, None])           # [B, 1, G + 1]
        anchor = jnp.where(active, best, state.anchor)
    else:
        roots, cpath, anchor = beams.path[:, :, 0], beams.path, state.anchor
    tcache = commit_rows(state.target_cache, tkv, roots, cpath, base, Wc, S)
    has_prev = (base >= 1)[:, None, None]
    dids = cpath + Wc                                                  # draft scratch ids
    dids = jnp.where(has_prev, jnp.concatenate([cpath[:, :, :1], dids], axis=-1),
                     jnp.concatenate([dids, dids[:, :, -1:]], axis=-1))
    off = Wc * S
    drows = KVCache(dbuf.k[:, :, :off], dbuf.v[:, :, :off])
    dsrc = KVCache(dbuf.k[:, :, off:], dbuf.v[:, :, off:])
    drows = commit_rows(drows, dsrc, roots, dids, jnp.maximum(base - 1, 0), Wc, S)
    dcache = KVCache(jax.lax.dynamic_update_slice(dbuf.k, drows.k, (0, 0, 0, 0, 0)),
                     jax.lax.dynamic_update_slice(dbuf.v, drows.v, (0, 0, 0, 0, 0)))
    return tcache, dcache, anchor


def advance(config: DSBDConfig, state: DSBDState, beams: Beams, verdict: Verdict, budget,
            active, caches) -> DSBDState:
    """Step 6: the next state, the output beams in place of the input beams, and the counts
    (:class:`DSBDStats`); finished prompts keep theirs."""
    G, N = config.gamma, state.sequences.shape[2]
    tcache, dcache, anchor = caches
    a = active[:, None]
    upd = lambda new, old: jnp.where(a if old.ndim == 2 else a[..., None], new, old)  # noqa: E731
    live = jnp.where(a, beams.valid, state.live)
    fin = upd(beams.finished, state.finished)
    done = state.done | (active & ((beams.generated >= N) | jnp.all(~live | fin, axis=1)))
    counted = count(state.stats, verdict, state.generated, budget, active, G)
    return state.replace(
        target_cache=tcache, draft_cache=dcache, row_iter=state.row_iter + active,
        generated=beams.generated, done=done, anchor=anchor,
        sequences=upd(beams.sequences, state.sequences), scores=upd(beams.scores, state.scores),
        finished=fin, live=live, pending=upd(beams.tokens, state.pending),
        prev=upd(beams.prev, state.prev),
        feat=jnp.where(a[..., None, None], beams.feat, state.feat), stats=counted(state.stats))


def count(stats: DSBDStats, verdict: Verdict, generated, budget, active, G: int):
    """The counts of one iteration: the step widths and depth histogram now, and a function
    that adds the per-layer sums (called last: the program keeps the order it was traced in)."""
    d = verdict.depth
    k = jnp.arange(G + 1)
    wdest = jnp.where(k[None, :] < d[:, None], generated[:, None] + k[None, :],
                      stats.step_widths.shape[1])
    step_widths = jax.vmap(lambda s, i, w: s.at[i].set(w, mode="drop"))(
        stats.step_widths, wdest, verdict.widths)
    full = active & (budget >= G + 1)
    depth_hist = stats.depth_hist + (full[:, None] & (jnp.arange(G + 2)[None, :] == d[:, None]))
    vsum = lambda x: jnp.sum(x.astype(jnp.int32), axis=0)  # noqa: E731

    def sums(old: DSBDStats) -> DSBDStats:
        return DSBDStats(
            step_widths=step_widths, depth_hist=depth_hist,
            accepted_layers=old.accepted_layers + jnp.sum(verdict.passed, axis=1),
            layer_verified=old.layer_verified + vsum(verdict.verified),
            layer_passed=old.layer_passed + vsum(verdict.passed),
            layer_width=old.layer_width + vsum(verdict.widths[:, :G]),
            layer_candidates=old.layer_candidates + vsum(verdict.candidates),
            layer_accepted=old.layer_accepted + vsum(verdict.accepted),
            iterations=old.iterations + 1, target_calls=old.target_calls + 1,
            draft_calls=old.draft_calls + G)
    return sums
