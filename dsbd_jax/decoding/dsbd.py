"""Dynamic-Width Speculative Beam Decoding (Qin et al., AAAI 2025), as docs/algorithm.md fixes it.

``dsbd_generate`` runs the whole generation in ONE jit: a ``lax.while_loop`` over iterations; each
iteration, for every prompt of the batch at once:

1. ``forest.build_forest``: the draft beam-samples ``gamma`` layers of ``W_S`` nodes from the input
   beams (its beam scores start from the target log-likelihoods of the input beams), with forest
   attention against the per-beam caches (``gamma`` draft calls).
2. ONE target call over all ``Wc + gamma * W_S`` nodes (the input beams' pending tokens and the
   forest) with the forest attention mask: ``p(. | node)`` for every node.
3. ``verify.verify_forest`` (vmapped over prompts): layer-by-layer multi-candidate verification,
   dynamic width (``width.py``), correction layer or extra layer.
4. Commit: every output beam's caches (target and draft) = its root's rows + its accepted path
   (``forest.commit_rows``). ``single_beam=True`` keeps one cache row per prompt: only the most
   likely output beam is committed and it is the next iteration's single input beam (the other
   output beams are kept as sequences, so the last iteration's output still has all of them).

Widths: layer ``l`` keeps ``W_L = min(max_width, max(min_width, W~))`` beams (``width.py``);
``threshold = 1`` is fixed width ``min_width``. The extra layer draws ``num_beams`` beams
(``None``: the last layer's ``W_L``). So ``threshold = 1`` with ``num_beams`` None (or
``== min_width``) is exactly beam sampling of width ``min_width`` (Theorem 3.1), and in general
every step is a beam-sampling step of the width the rule picked for it.

Output (``common.GenerateOutput``): ``sequences [B, beam_width, N]`` holds the final beams in slots
``0 .. num_beams_out - 1`` in the order of the last iteration's output layer (accepted candidates
first, in draft order, then the correction / extra-layer draws); unused or dead slots have
``log_likelihoods == -inf``, ``lengths == 0`` and pad tokens (``stats["num_beams_out"] [B]`` counts
the live beams). ``log_likelihoods`` are unwarped target log-probabilities.

EOS: finished beams are absorbing (pad at log-probability 0); a prompt stops when all its live
beams are finished (docs/algorithm.md) or after exactly ``max_new_tokens`` tokens (layers beyond the
remaining budget are never verified).

Stats (ints unless noted): ``iterations`` (loop trips), ``target_calls`` / ``draft_calls`` (forward
passes over the batch after the prefills; ``gamma`` draft calls per iteration),
``generated_tokens [B]``, ``row_iterations [B]``, ``accepted_layers [B]`` (verified layers that
passed) and ``mean_accepted_layers [B]`` (float, per iteration), ``mean_layers_per_iteration
[B]`` (float: tokens per iteration = accepted layers + the correction or extra layer),
``depth_hist [B, gamma+2]`` (iterations whose budget allowed all ``gamma + 1`` tokens, by the
depth they produced: Theorem 3.2), ``step_widths [B, N]`` (beams at each generated step),
``layer_verified / layer_passed / layer_candidates / layer_accepted / layer_width_sum [gamma]``
(sums over prompts and iterations), ``layer_acceptance_rate [gamma]`` (passed / verified),
``candidate_acceptance_rate [gamma]`` (accepted / candidates), ``mean_layer_width [gamma]`` (mean
``W_L``), ``mean_accepted_width`` (accepted candidates per verified layer) (floats), ``num_beams_out [B]``.
"""

from __future__ import annotations

import functools

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.decoding import calls, common, drafting, inputs
from dsbd_jax.host.cpu_options import tuned_jit
from dsbd_jax.models.cache import KVCache
from dsbd_jax.decoding.common import GenerateOutput
from dsbd_jax.decoding.configs import DSBDConfig, check_config
from dsbd_jax.decoding.forest import Layout, build_forest, commit_rows, row_positions, target_mask
from dsbd_jax.decoding.tops import row_tops
from dsbd_jax.decoding.verify import (make_randoms, randoms_size, randoms_table, split_randoms,
                                      verify_forest)

NEG_INF = -jnp.inf


# ---------------------------------------------------------------------------------------------
def num_slots(config: DSBDConfig, prompt_len: int) -> int:
    """Cache slots per beam: prompt + max_new_tokens + gamma + 1."""
    return prompt_len + config.max_new_tokens + config.gamma + 1


def layout(config: DSBDConfig, prompt_len: int) -> Layout:
    return Layout(Wc=config.cache_rows, C=config.layer_width, G=config.gamma,
                  S=num_slots(config, prompt_len), V=config.target.vocab_size)


@flax.struct.dataclass
class DSBDState:
    """Decode state between iterations (B prompts, W = max_width, N = max_new_tokens)."""

    target_cache: KVCache   # [L, B, Wc * S, K, D]
    draft_cache: KVCache    # [L, B, Wc * S + Td, K, D]
    keys: jax.Array         # [B] row keys
    row_iter: jax.Array     # [B]
    generated: jax.Array    # [B] new tokens so far (same for every beam of a prompt)
    done: jax.Array         # [B]
    anchor: jax.Array       # [B] single-beam mode: the beam whose path is in cache row 0
    sequences: jax.Array    # [B, W, N]
    scores: jax.Array       # [B, W] unwarped target log-likelihoods (-inf: dead / unused)
    finished: jax.Array     # [B, W]
    live: jax.Array         # [B, W]
    pending: jax.Array      # [B, W] last token (slot base), not yet run through the models
    prev: jax.Array         # [B, W] token at slot base - 1
    step_widths: jax.Array  # [B, N]
    depth_hist: jax.Array   # [B, gamma + 2]
    accepted_layers: jax.Array  # [B]
    layer_verified: jax.Array   # [gamma]
    layer_passed: jax.Array     # [gamma]
    layer_width: jax.Array      # [gamma]
    layer_candidates: jax.Array  # [gamma]
    layer_accepted: jax.Array   # [gamma]
    iterations: jax.Array
    target_calls: jax.Array
    draft_calls: jax.Array
    feat: jax.Array             # [B, W, 2, d] a draft head's features read with prev, pending


def _to_rows(cache: KVCache, Wc: int, extra: int = 0) -> KVCache:
    """Prefill cache ``[L, B, S, K, D]`` -> per-prompt row ``[L, B, Wc * S + extra, K, D]`` with the
    prompt in beam 0 (the other beams are empty at the start)."""
    def f(x):
        L, B, S, K, D = x.shape
        rows = jnp.zeros((L, B, Wc, S, K, D), x.dtype).at[:, :, 0].set(x)
        return jnp.concatenate([rows.reshape(L, B, Wc * S, K, D),
                                jnp.zeros((L, B, extra, K, D), x.dtype)], axis=2)
    return KVCache(f(cache.k), f(cache.v))


def init_state(config: DSBDConfig, params, prompt_ids, prompt_lengths, key) -> DSBDState:
    """Prefill both models once per prompt; the prompt is beam 0, its last token pending."""
    B, P = prompt_ids.shape
    lay = layout(config, P)
    W, N, G = config.beam_width, config.max_new_tokens, config.gamma
    tcache, dcache, feats = drafting.prefill_pair(config, params, prompt_ids, prompt_lengths,
                                                  lay.S, lay.S)
    if feats is None:
        feat = drafting.empty_features((B, W, 2))
    else:
        fprev, fpend = drafting.prompt_features(feats, prompt_lengths)
        feat = jnp.broadcast_to(jnp.stack([fprev, fpend], axis=1)[:, None],
                                (B, W, 2, fprev.shape[-1]))
    rows = jnp.arange(B)
    first = jnp.arange(W)[None, :] == 0
    zi = jnp.zeros((B,), jnp.int32)
    zg = jnp.zeros((G,), jnp.int32)
    return DSBDState(
        target_cache=_to_rows(tcache, lay.Wc), draft_cache=_to_rows(dcache, lay.Wc, lay.Td),
        keys=inputs.row_keys(key, B), row_iter=zi, generated=zi, done=jnp.zeros((B,), bool),
        anchor=zi,
        sequences=jnp.full((B, W, N), config.pad_id, jnp.int32),
        scores=jnp.where(first, 0.0, NEG_INF).repeat(B, 0).astype(jnp.float32),
        finished=jnp.zeros((B, W), bool), live=jnp.broadcast_to(first, (B, W)),
        pending=jnp.broadcast_to(prompt_ids[rows, prompt_lengths - 1][:, None], (B, W)),
        prev=jnp.broadcast_to(prompt_ids[rows, jnp.maximum(prompt_lengths - 2, 0)][:, None],
                              (B, W)),
        step_widths=jnp.zeros((B, N), jnp.int32), depth_hist=jnp.zeros((B, G + 2), jnp.int32),
        accepted_layers=zi, layer_verified=zg, layer_passed=zg, layer_width=zg,
        layer_candidates=zg, layer_accepted=zg, iterations=jnp.int32(0),
        target_calls=jnp.int32(0), draft_calls=jnp.int32(0), feat=feat)


def random_table(config: DSBDConfig, keys: jax.Array):
    """``[B, max_new_tokens, size]``: every iteration's random numbers made before the loop
    (``verify.randoms_table``; an iteration makes at least one token, so ``max_new_tokens``
    iterations cover a row), or ``None`` where they stay inside the iteration
    (``replacement=False``: Gumbel noise over the vocabulary for every layer)."""
    if not config.replacement:
        return None
    G, C, W = config.gamma, config.layer_width, config.beam_width
    return randoms_table(keys, config.max_new_tokens, randoms_size(G, C, W, 0, True))


def draft_forest(config: DSBDConfig, params, prompt_lengths, state: DSBDState, table=None):
    """Step 1 of an iteration: the draft forest grown from the state's input beams.

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
    (itself when none comes before it). Two nodes share a context when their input beams hold
    the same tokens (``seq_in [B, Wc, N]``) and they have the same depth and the same tokens
    from the root's pending token down to themselves (``anc_tok [B, T, G + 1]`` by depth;
    ``anc [B, T, G + 1]``, column 0 the input beam), both being valid (``ok [B, T]``) and alike
    in being finished (``fin [B, T]``).

    Why: the target's logits of one context computed at two places of a pass differ by a few
    ulps (their attention sums run over keys in another order). Beam sampling's joint over
    duplicate beams holds equal entries, and a top-k or top-p cut through such a pair keeps
    both; in DSBD the two rows, a few ulps apart, would be cut apart and the output would
    leave beam sampling's distribution (seen with replacement, where duplicate beams are
    common, on an int8 target at p < 1e-6; on float targets in about 1 % of the cuts)."""
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


def iteration(config: DSBDConfig, params, prompt_lengths, state: DSBDState,
              table=None) -> DSBDState:
    """One DSBD iteration for every prompt (module doc). Finished prompts are left unchanged.
    ``table``: the random numbers made before the loop (:func:`random_table`), or ``None``."""
    B, W, N = state.sequences.shape
    G, C, V = config.gamma, config.layer_width, config.target.vocab_size
    pad = config.pad_id
    active = ~state.done
    budget = jnp.where(active, N - state.generated, 0)
    # 1. draft forest
    forest, dbuf, lay, rand, base, in_idx, inputs = draft_forest(config, params, prompt_lengths,
                                                                 state, table)
    Wc, S = lay.Wc, lay.S
    s_in, fin_in, live_in = inputs["scores"], inputs["finished"], inputs["live"]

    # 2. one target pass over every node
    depth = lay.depth()
    positions = base[:, None] + depth[None, :]
    mask = target_mask(lay, forest.anc, base)
    logits, tkv, tfeat = drafting.target_forward(config, params, forest.node_tokens, positions,
                                                 mask, state.target_cache,
                                                 key_positions=row_positions(lay, B))
    node_fin = jnp.concatenate([fin_in, forest.finished.reshape(B, G * C)], axis=1)   # [B, T]
    logp = common.absorb_finished(jax.nn.log_softmax(logits, axis=-1), node_fin, pad)
    T = lay.T
    anc = forest.anc                                                   # [B, T, G + 1]
    anc_tok = common.take_rows(forest.node_tokens, anc)                            # [B, T, G + 1]
    # nodes with the same context (duplicate beams, a token drawn twice) read one node's row,
    # so their joint rows are equal to the bit, as beam sampling's are: a top-k or top-p cut
    # through equal entries then keeps or drops them together (same_context)
    node_ok = jnp.concatenate([live_in, forest.valid.reshape(B, G * C)], axis=1)
    seq_in = common.take_rows(state.sequences, in_idx)                            # [B, Wc, N]
    canon = same_context(seq_in, anc, anc_tok, depth, node_ok, node_fin)
    logp = common.take_rows(logp, canon)
    # node scores: root score + the target log-probs along the path
    flat_lp = logp.reshape(B, T * V)
    steps = common.take_rows(flat_lp, anc[:, :, :-1] * V + anc_tok[:, :, 1:])      # [B, T, G]
    on_path = jnp.arange(1, G + 1)[None, :] <= depth[:, None]          # [T, G]
    s_node = common.take_rows(s_in, anc[:, :, 0]) + jnp.sum(jnp.where(on_path[None], steps, 0.0), axis=-1)
    # joint log-weights of every layer's parents: row l = nodes of layer l (l = 0: input beams)
    Pp = lay.P
    par_ids = jnp.minimum(jnp.stack([lay.layer_start(l) for l in range(G + 1)])[:, None]
                          + jnp.arange(Pp)[None, :], T - 1)             # [G + 1, Pp]
    joint = (common.take_rows(s_node, par_ids[None].repeat(B, 0))[..., None]
             + common.take_rows(logp, par_ids[None].repeat(B, 0)))                  # [B, G + 1, Pp, V]
    input_ok = jnp.zeros((B, Pp), bool).at[:, :Wc].set(live_in)

    # 3. verification
    rest = (forest.flat, forest.valid, forest.finished, budget)
    dense = jax.vmap(functools.partial(verify_forest, config=config))
    if forest.q_index is None:
        verdict = dense(rand, joint, input_ok, forest.q, *rest)
    else:
        # on each row's largest entries (module tops); where equal entries could reach past
        # them in any row of the batch, on the [P * V] vectors (the draft's q spread out
        # there). One branch runs: the condition is the batch's.
        tops = jax.vmap(functools.partial(row_tops, config=config))(joint)

        def on_rows():
            q = jax.vmap(lambda qv, qi: jnp.zeros((G, lay.P * V), qv.dtype).at[
                jnp.arange(G)[:, None], qi].set(qv, mode="drop"))(forest.q, forest.q_index)
            return dense(rand, joint, input_ok, q, *rest)

        on_tops = jax.vmap(lambda *a: verify_forest(*a[:-2], config=config, tops=a[-2],
                                                    q_index=a[-1]))
        verdict = jax.lax.cond(jnp.any(tops.risk), on_rows,
                               lambda: on_tops(rand, joint, input_ok, forest.q, *rest,
                                               tops._replace(risk=None), forest.q_index))
    d = verdict.depth                                                  # [B]
    slot, tok = verdict.flat // V, (verdict.flat % V).astype(jnp.int32)
    par = jnp.minimum(lay.layer_start(jnp.maximum(d - 1, 0))[:, None] + slot, T - 1)  # [B, W]
    path = common.take_rows(anc, par)                                             # [B, W, G + 1]
    root = path[:, :, 0]
    valid = verdict.valid & active[:, None]

    # 4. the output beams
    k = jnp.arange(G + 1)
    path_tok = jnp.where(k[None, None, :] < (d - 1)[:, None, None],
                         common.take_rows(forest.node_tokens, jnp.concatenate([path[:, :, 1:], path[:, :, :1]],
                                                                    axis=-1)),
                         tok[:, :, None])                              # [B, W, G + 1]
    dest = jnp.broadcast_to(jnp.where(k[None, None, :] < d[:, None, None],
                                      state.generated[:, None, None] + k[None, None, :], N),
                            path_tok.shape)
    seqs = common.take_rows(state.sequences, common.take_rows(in_idx, root))
    seqs = jax.vmap(jax.vmap(lambda s, i, t: s.at[i].set(t, mode="drop")))(seqs, dest, path_tok)
    seqs = jnp.where(valid[..., None], seqs, pad)
    new_scores = jnp.where(valid, common.take_rows(s_node, par) + common.take_rows(flat_lp, par * V + tok), NEG_INF)
    new_fin = common.take_rows(node_fin, par) | common.is_eos(tok, config.eos_ids)
    new_prev = common.take_rows(forest.node_tokens, par)
    if tfeat is not None:
        # a head's features for the output beams: pending reads the target's feature at par,
        # prev at par's parent (par's ancestor at depth d - 2, or the root's own prev feature)
        gather = jax.vmap(lambda f, i: f[i])
        f_pend = gather(tfeat, par)                                    # [B, W, d]
        above = jnp.take_along_axis(path, jnp.maximum(d - 2, 0)[:, None, None].repeat(W, 1),
                                    axis=2)[..., 0]                    # [B, W]
        root_prev = gather(inputs["feat"][:, :, 1], root)              # [B, W, d]
        f_prev = jnp.where((d >= 2)[:, None, None], gather(tfeat, above), root_prev)
        new_feat = jnp.stack([f_prev, f_pend], axis=2)
    else:
        new_feat = state.feat
    generated = state.generated + jnp.where(active, d, 0)

    # 5. commit the accepted paths into the caches
    if config.single_beam:
        best = jnp.argmax(new_scores, axis=1).astype(jnp.int32)
        roots = jnp.zeros((B, 1), jnp.int32)
        cpath = common.take_rows(path, best[:, None])                            # [B, 1, G + 1]
        anchor = jnp.where(active, best, state.anchor)
    else:
        roots, cpath, anchor = root, path, state.anchor
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

    # 6. bookkeeping (finished prompts keep their state)
    a = active[:, None]
    upd = lambda new, old: jnp.where(a if old.ndim == 2 else a[..., None], new, old)  # noqa: E731
    live = jnp.where(a, valid, state.live)
    fin = upd(new_fin, state.finished)
    done = state.done | (active & ((generated >= N) | jnp.all(~live | fin, axis=1)))
    wdest = jnp.where(k[None, :] < d[:, None], state.generated[:, None] + k[None, :], N)
    step_widths = jax.vmap(lambda s, i, w: s.at[i].set(w, mode="drop"))(
        state.step_widths, wdest, verdict.widths)
    full = active & (budget >= G + 1)
    depth_hist = state.depth_hist + (full[:, None] & (jnp.arange(G + 2)[None, :] == d[:, None]))
    vsum = lambda x: jnp.sum(x.astype(jnp.int32), axis=0)  # noqa: E731
    return state.replace(
        target_cache=tcache, draft_cache=dcache, row_iter=state.row_iter + active,
        generated=generated, done=done, anchor=anchor,
        sequences=upd(seqs, state.sequences), scores=upd(new_scores, state.scores),
        finished=fin, live=live, pending=upd(tok, state.pending), prev=upd(new_prev, state.prev),
        feat=jnp.where(a[..., None, None], new_feat, state.feat),
        step_widths=step_widths, depth_hist=depth_hist,
        accepted_layers=state.accepted_layers + jnp.sum(verdict.passed, axis=1),
        layer_verified=state.layer_verified + vsum(verdict.verified),
        layer_passed=state.layer_passed + vsum(verdict.passed),
        layer_width=state.layer_width + vsum(verdict.widths[:, :G]),
        layer_candidates=state.layer_candidates + vsum(verdict.candidates),
        layer_accepted=state.layer_accepted + vsum(verdict.accepted),
        iterations=state.iterations + 1, target_calls=state.target_calls + 1,
        draft_calls=state.draft_calls + G)


def to_output(config: DSBDConfig, state: DSBDState) -> GenerateOutput:
    loglik = jnp.where(state.live, state.scores, NEG_INF)
    lengths, best = common.best_and_lengths(state.sequences, loglik, config.eos_ids)
    lengths = jnp.where(state.live, lengths, 0)
    f = lambda x: x.astype(jnp.float32)  # noqa: E731
    ratio = lambda a, b: f(a) / jnp.maximum(f(b), 1.0)  # noqa: E731
    stats = dict(
        iterations=state.iterations, target_calls=state.target_calls,
        draft_calls=state.draft_calls, generated_tokens=state.generated,
        row_iterations=state.row_iter, accepted_layers=state.accepted_layers,
        mean_layers_per_iteration=ratio(state.generated, state.row_iter),
        mean_accepted_layers=ratio(state.accepted_layers, state.row_iter),
        depth_hist=state.depth_hist, step_widths=state.step_widths,
        layer_verified=state.layer_verified, layer_passed=state.layer_passed,
        layer_candidates=state.layer_candidates, layer_accepted=state.layer_accepted,
        layer_width_sum=state.layer_width,
        layer_acceptance_rate=ratio(state.layer_passed, state.layer_verified),
        candidate_acceptance_rate=ratio(state.layer_accepted, state.layer_candidates),
        mean_layer_width=ratio(state.layer_width, state.layer_verified),
        mean_accepted_width=ratio(jnp.sum(state.layer_accepted), jnp.sum(state.layer_verified)),
        num_beams_out=jnp.sum(state.live, axis=1).astype(jnp.int32))
    return GenerateOutput(sequences=state.sequences, lengths=lengths, log_likelihoods=loglik,
                          best=best, stats=stats)


@calls.core("dsbd_generate")
@functools.partial(tuned_jit, static_argnames=("config",))
def _dsbd_core(params, prompt_ids, prompt_lengths, keys, config: DSBDConfig) -> GenerateOutput:
    invalid, prompt_ids, prompt_lengths = inputs.guard_inputs(
        "dsbd_generate", config, params, prompt_ids, prompt_lengths)
    params = inputs.with_prompt_rows(params, prompt_ids)
    state = init_state(config, params, prompt_ids, prompt_lengths, keys)
    table = random_table(config, state.keys)
    state = calls.loop(
        config, lambda s: jnp.any(~s.done), functools.partial(iteration, config, params,
                                                            prompt_lengths, table=table), state,
        lambda s: dict(iterations=s.iterations, generated=s.generated, done=s.done,
                       target_calls=s.target_calls, accepted=jnp.sum(s.layer_accepted),
                       verified=jnp.sum(s.layer_verified)))
    return inputs.mark_invalid(to_output(config, state), invalid, config.pad_id)


# ---------------------------------------------------------------------------------------------
def check_inputs(params, prompt_ids, config, prompt_lengths, key=None) -> None:
    """Host-side validation (concrete values, clear ``ValueError``s) before the jitted core;
    ``key`` is required."""
    check_config("dsbd_generate", config)
    if not isinstance(params, dict) or "target" not in params or "draft" not in params:
        raise ValueError('params must be a dict {"target": ..., "draft": ...}')
    for name, mc in (("target", config.target), ("draft", config.draft)):
        try:
            rows = params[name]["embed"]["embedding"].shape[0]
        except (KeyError, TypeError, AttributeError):
            rows = None
        if rows is not None and rows != mc.vocab_size:
            raise ValueError(f"{name} parameters have a vocabulary of {rows}, the config says "
                             f"{mc.vocab_size}")
    inputs.check_prompt_batch(prompt_ids, prompt_lengths, config.target.vocab_size)
    B, P = np.shape(prompt_ids)
    inputs.check_positions({"target": config.target, "draft": config.draft}, P,
                           config.max_new_tokens, num_slots(config, P) - P - config.max_new_tokens)
    inputs.check_key(key, B)


def _dsbd_call(params, prompt_ids, key, config: DSBDConfig, prompt_lengths=None):
    """``dsbd_generate``'s checked ``calls.CoreCall``, not run."""
    return _dsbd_core.bind(*_prepare(params, prompt_ids, key, config, prompt_lengths),
                           config=config)


@calls.prepared_by(_dsbd_call)
def dsbd_generate(params, prompt_ids, key, config: DSBDConfig, prompt_lengths=None
                  ) -> GenerateOutput:
    """Dynamic-width speculative beam decoding (module doc).

    Args:
      params: ``{"target": target params, "draft": draft params}``.
      prompt_ids: ``[B, P]`` int, right-padded; ``prompt_lengths``: ``[B]`` (None: all ``P``).
      key: one PRNG key (row b uses ``fold_in(key, b)``) or ``[B]`` keys (row b uses ``key[b]``);
        iteration i of row b uses ``fold_in(row_key, i)``.
      config: ``DSBDConfig``.
    Returns:
      ``GenerateOutput`` with ``sequences [B, max_width, N]`` (unused slots: ``log_likelihoods``
      ``-inf``, see ``stats["num_beams_out"]``) and the DSBD stats of the module doc.
    """
    return _dsbd_call(params, prompt_ids, key, config, prompt_lengths)()


def _prepare(params, prompt_ids, key, config: DSBDConfig, prompt_lengths):
    """Validate (host side) and return the jitted cores' ``(params, prompt_ids, lengths, keys)``."""
    check_inputs(params, prompt_ids, config, prompt_lengths, key=key)
    prompt_ids = jnp.asarray(prompt_ids, jnp.int32)
    lengths = common.prompt_lengths_or_full(prompt_ids, prompt_lengths)
    params = {"target": params["target"], "draft": params["draft"]}
    # [B] row keys before the jit: a single key and a batch of keys share one compiled program
    keys = inputs.row_keys(key, prompt_ids.shape[0])
    return params, prompt_ids, lengths, keys


@functools.partial(tuned_jit, static_argnames=("config",))
def _first_forest_core(params, prompt_ids, prompt_lengths, keys, config: DSBDConfig):
    prompt_ids = inputs.mask_padding(prompt_ids, prompt_lengths)
    params = inputs.with_prompt_rows(params, prompt_ids)
    state = init_state(config, params, prompt_ids, prompt_lengths, keys)
    return draft_forest(config, params, prompt_lengths, state)[0]


def first_forest(params, prompt_ids, key, config: DSBDConfig, prompt_lengths=None):
    """The draft forest of the first iteration, for inspection: a ``forest.Forest`` whose
    ``tokens [B, gamma, W_S]`` are the drafted tokens of each layer, ``parent [B, gamma, W_S]``
    the slot of each node's parent in the layer before (layer 0: the input beam), ``valid`` the
    nodes drawn with positive probability and ``q`` the joint each layer was drawn from (with
    a top-k and i.i.d. draws, its values at ``q_index``: module ``tops``). Same arguments as
    :func:`dsbd_generate` (and the same draws as its first iteration)."""
    return _first_forest_core(*_prepare(params, prompt_ids, key, config, prompt_lengths),
                              config=config)
