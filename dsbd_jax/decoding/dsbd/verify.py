"""DSBD verification of a draft forest (docs/algorithm.md, steps 3-4), one prompt at a time.

Pure functions on ONE prompt (callers ``vmap``); a layer's joint is a flat ``[P * V]`` vector over
(parent slot, token). Layer by layer: the candidates are the nodes whose parent was accepted;
``q`` is their draft distribution restricted to those parents (:func:`restrict_draft`), ``p_beam``
the warped joint (:func:`beam_distribution`); the width rule gives ``W_L``; the multi-candidate
rule (the accept test and residuals of ``rules``) accepts up to ``W_L``; fewer -> the correction
layer (:func:`correct_layer`) ends the iteration; all layers passed -> the extra layer.
:func:`verify_dense` runs on the ``[P * V]`` vectors, :func:`verify_tops` on the rows' largest
entries (module ``tops``); both share the layer loop and give the same :class:`Verdict`.
Long form: docs/results/design_notes.md.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from dsbd_jax.decoding.rules import (accept_test, draw_gumbel, normalize, remove, safe_residual,
                                     safe_residual_and_left)
from dsbd_jax.decoding.dsbd.tops import layer_on_tops, warp_layer
from dsbd_jax.decoding.warping import draw_from, draw_short, warp_logits
from dsbd_jax.decoding.dsbd.width import layer_width, rates_from_chain

NEG_INF = -jnp.inf


# ---------------------------------------------------------------------------------------------
# draws from given random numbers (all of an iteration's randomness is generated in one call, so
# the compiled program holds one PRNG kernel instead of one per draw site)
class Randoms(NamedTuple):
    """One prompt's random numbers for one iteration (``N = P * V``; the Gumbel arrays are empty
    with ``replacement=True``)."""

    draft_u: jax.Array   # [G, C] draft draws (i.i.d.)
    draft_g: jax.Array   # [G, N] draft draws (without replacement)
    accept_u: jax.Array  # [G, C] acceptance tests
    corr_u: jax.Array    # [G, 1 + W] correction layer
    corr_g: jax.Array    # [G, N]
    extra_u: jax.Array   # [W] extra layer
    extra_g: jax.Array   # [N]


def randoms_size(G: int, C: int, W: int, N: int, replacement: bool) -> int:
    """How many uniforms one prompt's iteration draws (:func:`make_randoms`)."""
    n_g = 0 if replacement else N
    return 2 * G * C + 2 * G * n_g + G * (1 + W) + W + n_g


def split_randoms(u: jax.Array, G: int, C: int, W: int, N: int, replacement: bool) -> Randoms:
    """One prompt's ``[randoms_size(...)]`` uniforms as the iteration's :class:`Randoms`."""
    n_g = 0 if replacement else N
    sizes = [G * C, G * n_g, G * C, G * (1 + W), G * n_g, W, n_g]
    parts, start = [], 0
    for s in sizes:
        parts.append(u[start:start + s])
        start += s
    gumbel = lambda x: -jnp.log(-jnp.log(jnp.maximum(x, jnp.finfo(jnp.float32).tiny)))  # noqa: E731
    return Randoms(draft_u=parts[0].reshape(G, C), draft_g=gumbel(parts[1]).reshape(G, n_g),
                   accept_u=parts[2].reshape(G, C), corr_u=parts[3].reshape(G, 1 + W),
                   corr_g=gumbel(parts[4]).reshape(G, n_g), extra_u=parts[5],
                   extra_g=gumbel(parts[6]))


@jax.named_scope("random")
def make_randoms(key: jax.Array, G: int, C: int, W: int, N: int, replacement: bool) -> Randoms:
    """All of one prompt's random numbers for an iteration from ONE ``uniform`` call."""
    u = jax.random.uniform(key, (randoms_size(G, C, W, N, replacement),), jnp.float32)
    return split_randoms(u, G, C, W, N, replacement)


@jax.named_scope("random")
def randoms_table(keys: jax.Array, iterations: int, size: int) -> jax.Array:
    """``[B, iterations, size]``: row ``b``'s uniforms of iteration ``i``, the very numbers
    :func:`make_randoms` draws from ``fold_in(keys[b], i)``, made before the decoding loop so
    that no random-bits kernel (a loop of its own on XLA:CPU) runs inside an iteration. Only
    for draws that stay small (``replacement=True``: no Gumbel noise over the vocabulary)."""
    one = lambda k, i: jax.random.uniform(jax.random.fold_in(k, i), (size,), jnp.float32)  # noqa: E731
    return jax.vmap(lambda k: jax.vmap(lambda i: one(k, i))(jnp.arange(iterations)))(keys)


# ---------------------------------------------------------------------------------------------
# the rules, one small function each
def parent_mask(parent_ok: jax.Array, V: int) -> jax.Array:
    """``[P] -> [P * V]``: which flat entries belong to an allowed parent."""
    return jnp.repeat(parent_ok, V)


def restrict_draft(q: jax.Array, parent_ok: jax.Array) -> jax.Array:
    """The drafting distribution ``q [P * V]`` restricted to accepted parents, renormalised."""
    V = q.shape[0] // parent_ok.shape[0]
    return normalize(jnp.where(parent_mask(parent_ok, V), q, 0.0))


def beam_distribution(joint: jax.Array, parent_ok: jax.Array, temperature: float, top_k,
                      top_p: float) -> jax.Array:
    """``p_beam``: warped joint over (allowed parents) x V as probabilities ``[P * V]``.

    ``joint [P, V]``: unwarped log-weights ``s_parent + log p(v | parent)`` (absorbing EOS
    applied). Rows of parents that are not allowed get ``-inf`` before warping.
    """
    lw = jnp.where(parent_ok[:, None], joint, NEG_INF).reshape(-1)
    lw = warp_logits(lw, temperature, top_k, top_p)
    return jnp.where(jnp.isnan(lw), 0.0, jnp.exp(lw))   # no parent at all (unused layer): zeros


def pick(v: jax.Array, idx: jax.Array) -> jax.Array:
    """``v[idx]`` for a 1-D ``v`` written as a one-hot reduction (``idx`` scalar or ``[k]``): under
    ``vmap`` this stays a fused elementwise op instead of a batched gather, which compiles much
    faster on CPU and costs O(N) like the residual updates around it."""
    hit = jnp.arange(v.shape[0]) == jnp.asarray(idx)[..., None]
    if v.dtype == jnp.bool_:
        return jnp.any(hit & v, axis=-1)
    return jnp.sum(jnp.where(hit, v, jnp.zeros((), v.dtype)), axis=-1)


def one_hot(idx: jax.Array, n: int) -> jax.Array:
    return jnp.arange(n) == idx


def _log(p: jax.Array) -> jax.Array:
    return jnp.where(p > 0, jnp.log(jnp.where(p > 0, p, 1.0)), NEG_INF)


def compact(values: jax.Array, keep: jax.Array, size: int):
    """The kept ``values`` in order, packed to the front of a ``[size]`` array; and their count."""
    pos = jnp.where(keep, jnp.cumsum(keep) - 1, size)
    hit = pos[None, :] == jnp.arange(size)[:, None]                     # [size, C]
    out = jnp.sum(jnp.where(hit, values[None, :], jnp.zeros((), values.dtype)), axis=1)
    return out.astype(values.dtype), jnp.sum(keep).astype(jnp.int32)


# ---------------------------------------------------------------------------------------------
class CandidateResult(NamedTuple):
    accepted: jax.Array      # [C] bool, in candidate order
    num_accepted: jax.Array  # int32 scalar (<= width)
    residual: jax.Array      # [N] p' after the last verified candidate
    taken: jax.Array         # [N] bool: outputs taken (replacement=False bookkeeping)


def residual_chain(p: jax.Array, q: jax.Array, num: int):
    """The residuals a layer's rule can reach (``replacement=True``): ``p' = p_j`` after ``j``
    rejections since the last acceptance, ``p_0 = p`` and ``p_{j+1} = safe_residual(p_j, q)``.

    Returns ``(chain, emptied)``: ``chain`` the list ``[p_0, ..., p_num]`` of ``[N]`` arrays,
    ``emptied [num]`` whether step ``j``'s plain residual was all zero (``reject_update`` kept
    ``p_j``). Straight-line code: ``num = C`` is static and small. The width's acceptance rates
    come from the same chain (``width.rates_from_chain``). A list, not a stacked array: XLA:CPU
    reduces a ``[num + 1, N]`` array over its first axis far slower than it reads the rows.
    """
    chain, emptied = [p], []
    for _ in range(num):
        r, left = safe_residual_and_left(chain[-1], q)
        chain.append(r)
        emptied.append(~left[0])
    return chain, jnp.stack(emptied)


def verify_candidates(u: jax.Array, p_beam: jax.Array, q: jax.Array, cand: jax.Array,
                      cand_ok: jax.Array, width: jax.Array, replacement: bool,
                      chain=None) -> CandidateResult:
    """The multi-candidate rule over one layer's candidates, in order.

    Args:
      u: ``[C]`` uniforms. p_beam, q: ``[N]`` (``q`` already restricted, see
      :func:`restrict_draft`). cand: ``[C]`` flat indices. cand_ok: ``[C]`` which nodes are
      candidates (parent accepted, node not dead). width: ``W_L`` (stop when reached).
      chain: ``replacement=True`` only: :func:`residual_chain` of ``p_beam`` and ``q`` over
        ``C`` steps, when the caller has it.

    With replacement ``q`` never changes, so ``p'`` is always ``p_j`` of the residual chain,
    ``j`` the rejections since the last acceptance: every test ``u_c q(x_c) < p_j(x_c)`` is
    computed at once and only the count of rejections is followed candidate by candidate (a
    few scalar operations each). Without replacement ``q`` and ``p'`` depend on every earlier
    outcome; that rule runs candidate by candidate, unrolled (no loop in the program).
    """
    N = p_beam.shape[0]
    if replacement:
        return _verify_with_replacement(u, p_beam, q, cand, cand_ok, width, chain)

    def step(carry, xs):
        p_res, q_cur, taken, n_acc = carry
        u_c, x, ok = xs
        live = ok & (n_acc < width)
        acc = live & accept_test(u_c, pick(p_res, x), pick(q_cur, x))
        rej = live & ~acc
        p_rej = safe_residual(p_res, q_cur)
        taken_next = taken | (one_hot(x, N) & acc)
        p_acc = normalize(jnp.where(taken_next, 0.0, p_beam))
        q_next = jnp.where(live, remove(q_cur, x), q_cur)
        p_next = jnp.where(acc, p_acc, jnp.where(rej, p_rej, p_res))
        return (p_next, q_next, taken_next, n_acc + acc.astype(jnp.int32)), acc

    init = (p_beam, q, jnp.zeros((N,), bool), jnp.zeros((), jnp.int32))
    (p_res, _, taken, n_acc), accepted = jax.lax.scan(step, init, (u, cand, cand_ok),
                                                      unroll=True)
    return CandidateResult(accepted, n_acc, p_res, taken)


def _verify_with_replacement(u, p_beam, q, cand, cand_ok, width, chain, q_x=None, found=None):
    """``cand``: the candidates' positions in the vectors; ``q_x``: their ``q`` (read at ``cand``
    when ``None``); ``found``: which candidates the vectors hold (the others have ``p' = 0``;
    ``None``: all, the dense vectors)."""
    N, C = p_beam.shape[0], cand.shape[0]
    if chain is None:
        chain, _ = residual_chain(p_beam, q, C)
    if q_x is None:
        q_x = q[cand]   # a gather: one thunk (XLA:CPU sums a long row as a tree of several)

    if isinstance(chain, list):
        reads = [chain[j][cand] for j in range(C)]     # [j][c]: a gather of C each
    else:
        reads = chain[:C][:, cand]                      # one stacked array: one gather
    if found is not None:
        reads = [jnp.where(found, r, jnp.zeros((), r.dtype)) for r in reads]
    tests = [accept_test(u, reads[j], q_x) for j in range(C)]   # [j][c]
    j, n_acc, accepted = jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32), []
    for c in range(C):
        live = cand_ok[c] & (n_acc < width)
        acc = live & jnp.any(jnp.stack([(j == i) & tests[i][c] for i in range(c + 1)]))
        j = jnp.where(acc, 0, jnp.where(live, j + 1, j))
        n_acc = n_acc + acc.astype(jnp.int32)
        accepted.append(acc)
    if isinstance(chain, list):
        p_res = chain[C]
        for i in reversed(range(C)):   # p_j, as an elementwise select over the rows
            p_res = jnp.where(j == i, chain[i], p_res)
    else:
        p_res = chain[j]
    return CandidateResult(jnp.stack(accepted), n_acc, p_res, jnp.zeros((N,), bool))


def correct_layer(u: jax.Array, g: jax.Array, p_beam: jax.Array, res: CandidateResult,
                  cand: jax.Array, width: jax.Array, num_out: int, replacement: bool,
                  index=None):
    """Output of a layer that accepted fewer than ``width``: the accepted candidates, one draw
    from ``p'``, then draws from ``p_beam`` up to ``width`` beams (slots ``>= width`` invalid).

    ``u``: ``[1 + num_out]`` uniforms; ``g``: ``[N]`` Gumbel noise (``replacement=False`` only).
    ``index``: ``replacement=True`` only: the flat index of each entry of ``p_beam`` and ``p'``
    when they hold a layer's largest entries (``tops.LayerTops``; ``None``: ``[P * V]``).
    Returns ``(flat [num_out], valid [num_out])``.
    """
    acc_flat, n_acc = compact(cand, res.accepted, num_out)
    if replacement:
        # p' is a row of the residual chain: p_beam, or a residual that kept mass; it is all
        # zero only where p_beam is (an unused layer), so it is p_y as it stands
        p_y = res.residual
        if index is None:
            y = draw_from(p_y, u[:1])[0]
            fill = draw_from(p_beam, u[1:])
        else:   # short vectors: both rows' draws at once
            both = draw_short(jnp.stack([p_y, p_beam]),
                              jnp.stack([jnp.broadcast_to(u[0], (num_out,)), u[1:]]))
            y, fill = both[0, 0], both[1]
        y_ok = p_y[y] > 0          # gathers: one thunk each (a one-hot sum over N is several)
        fill_ok = p_beam[fill] > 0
        if index is not None:
            y, fill = index[y], index[fill]
    else:
        base = jnp.where(res.taken, 0.0, p_beam)
        p_y = jnp.where(jnp.sum(res.residual) > 0, res.residual, base)
        y = draw_from(p_y, u[:1])[0]
        y_ok = pick(p_y, y) > 0
        avail = jnp.where(res.taken | (one_hot(y, p_beam.shape[0]) & y_ok), 0.0, p_beam)
        fill = draw_gumbel(_log(avail), g, num_out)
        fill_ok = pick(avail, fill) > 0
    k = jnp.arange(num_out)
    f = jnp.clip(k - n_acc - 1, 0, num_out - 1)
    flat = jnp.where(k < n_acc, acc_flat, jnp.where(k == n_acc, y, pick(fill, f)))
    valid = jnp.where(k < n_acc, True, jnp.where(k == n_acc, y_ok, pick(fill_ok, f))) & (k < width)
    return flat, valid


def draw_layer(u: jax.Array, g: jax.Array, p_beam: jax.Array, width: jax.Array, num_out: int,
               replacement: bool, index=None):
    """``width`` beams drawn from ``p_beam`` (i.i.d. or without replacement): the extra layer.

    ``u``: ``[num_out]`` uniforms; ``g``: ``[N]`` Gumbel noise (``replacement=False`` only);
    ``index``: as in :func:`correct_layer`.
    Returns ``(flat [num_out], valid [num_out])``; slots ``>= width`` and dead draws are invalid.
    """
    if replacement:
        flat = draw_from(p_beam, u) if index is None else draw_short(p_beam, u)
    else:
        flat = draw_gumbel(_log(p_beam), g, num_out)
    valid = (p_beam[flat] > 0) & (jnp.arange(num_out) < width)
    return (flat if index is None else index[flat]), valid


# ---------------------------------------------------------------------------------------------
class Verdict(NamedTuple):
    """Result of verifying one prompt's forest.

    depth:   int32, the output beams' depth d (1..gamma+1): their parents are layer d-1 nodes
             (layer 0 = input beams); 0 if nothing was verified (no budget).
    flat:    [Wout] flat indices (parent slot of layer d-1) * V + token.
    valid:   [Wout] bool.
    widths:  [gamma + 1] width of each step (W_L per verified layer, then the extra layer's W;
             0 where not reached).
    verified, passed: [gamma] bool per layer. candidates, accepted: [gamma] int32 (m, accepted).
    """

    depth: jax.Array
    flat: jax.Array
    valid: jax.Array
    widths: jax.Array
    verified: jax.Array
    passed: jax.Array
    candidates: jax.Array
    accepted: jax.Array


def verify_forest(rand: Randoms, joint: jax.Array, input_ok: jax.Array, q: jax.Array,
                  cand: jax.Array, cand_ok: jax.Array, cand_finished: jax.Array,
                  budget: jax.Array, config, tops=None, q_index=None) -> Verdict:
    """Verify one prompt's forest layer by layer: :func:`verify_tops` where ``tops`` is given,
    else :func:`verify_dense` (same arguments, same rule, same verdict)."""
    args = (rand, joint, input_ok, q, cand, cand_ok, cand_finished, budget)
    if tops is None:
        return verify_dense(*args, config=config)
    return verify_tops(*args, config=config, tops=tops, q_index=q_index)


@jax.named_scope("verify")
def verify_dense(rand: Randoms, joint: jax.Array, input_ok: jax.Array, q: jax.Array,
                 cand: jax.Array, cand_ok: jax.Array, cand_finished: jax.Array,
                 budget: jax.Array, config) -> Verdict:
    """Verify one prompt's forest on the ``[P * V]`` vectors.

    Args:
      rand: this prompt's random numbers for the iteration (:func:`make_randoms`).
      joint: ``[gamma + 1, P, V]`` target joint log-weights of each layer's parents (row ``l``:
        parents of layer ``l + 1``; row 0 = the input beams, row ``gamma`` = the extra layer's).
      input_ok: ``[P]`` live input beams.
      q: ``[gamma, P * V]`` the distributions the draft layers were drawn from.
      cand: ``[gamma, C]`` drafted flat indices; cand_ok: ``[gamma, C]`` drafted nodes that are
        not dead; cand_finished: ``[gamma, C]`` nodes that are finished (EOS).
      budget: int32, tokens left for this prompt (layers deeper than it are not verified).
      config: a ``DSBDConfig`` (static): warping, replacement, widths, threshold.
    """
    G, C = cand.shape
    V = joint.shape[2]
    W_out, rep = config.beam_width, config.replacement
    warp = (config.temperature, config.top_k, config.top_p)

    def weigh(parent_ok, par_ok, is_cand, m, xs):
        joint_l, q_l, cand_l = xs[4], xs[5], xs[6]
        chain = alphas = None
        p_beam = beam_distribution(joint_l, parent_ok, *warp)
        q_a = restrict_draft(q_l, parent_ok)
        if rep:   # one residual chain for the width and the rule
            chain, emptied = residual_chain(p_beam, q_a, C)
            alphas = rates_from_chain(chain[:C], q_a, emptied)
        w = layer_width(p_beam, q_a, m, config.threshold, config.min_width, W_out, C, alphas)
        res = verify_candidates(xs[1], p_beam, q_a, cand_l, is_cand, w, rep, chain)
        return p_beam, w, res, None

    def extra_layer(parent_ok):
        return beam_distribution(joint[G], parent_ok, *warp), None
    return _verify_layers(rand, input_ok, q, cand, cand_ok, cand_finished, budget, config, V,
                          weigh, lambda: joint[:G], lambda: (), extra_layer)


@jax.named_scope("verify")
def verify_tops(rand: Randoms, joint: jax.Array, input_ok: jax.Array, q: jax.Array,
                cand: jax.Array, cand_ok: jax.Array, cand_finished: jax.Array,
                budget: jax.Array, config, tops, q_index) -> Verdict:
    """Verify one prompt's forest on each parent row's largest entries (module ``tops``):
    ``p_beam``, ``q`` and the residuals are vectors over ``P * K`` entries instead of ``P * V``
    (``joint`` is not read); the rule, the widths and the draws are :func:`verify_dense`'s.

    Args: as :func:`verify_dense`, but ``q [gamma, m]`` holds each layer's draft joint at
    ``q_index [gamma, m]`` (``forest.Forest``), and ``tops`` is this prompt's
    ``tops.row_tops`` of ``joint`` without ``risk`` (``tops.sparse_applies`` only)."""
    G, C = cand.shape
    V = joint.shape[2]
    W_out = config.beam_width

    def weigh(parent_ok, par_ok, is_cand, m, xs):
        q_l, cand_l = xs[5], xs[6]
        v_l, f_l, qi_l = xs[9:]
        lt = layer_on_tops(v_l, f_l, parent_ok, q_l, qi_l, cand_l, par_ok, V, config)
        p_beam, q_a, index = lt.p_beam, lt.q, lt.index
        chain, emptied = residual_chain(p_beam, q_a, C)
        chain = jnp.stack(chain)       # short rows: one array, read at once
        alphas = rates_from_chain(chain[:C], q_a, emptied)
        w = layer_width(p_beam, q_a, m, config.threshold, config.min_width, W_out, C, alphas)
        res = _verify_with_replacement(xs[1], p_beam, q_a, lt.at, is_cand, w, chain, lt.q_x,
                                       lt.found)
        return p_beam, w, res, index

    def extra_layer(parent_ok):
        lp, e_index, _ = warp_layer(tops.values[G], tops.flat[G], parent_ok, config)
        return jnp.exp(lp), e_index
    return _verify_layers(rand, input_ok, q, cand, cand_ok, cand_finished, budget, config, V,
                          weigh, lambda: jnp.zeros((G,), joint.dtype),
                          lambda: (tops.values[:G], tops.flat[:G], q_index), extra_layer)


def _verify_layers(rand: Randoms, input_ok, q, cand, cand_ok, cand_finished, budget, config,
                   V: int, weigh, layer_joint, layer_tops, extra_layer) -> Verdict:
    """The layer loop both verifications share (``lax.scan`` over the ``gamma`` layers, kept a
    loop: unrolled it compiles far longer for little), then the extra layer. ``weigh`` gives a
    layer's ``(p_beam, W_L, candidate result, index)``; ``layer_joint`` / ``layer_tops`` the
    scan's per-layer inputs; ``extra_layer(parent_ok)`` the extra layer's ``(p_beam, index)``."""
    G, C = cand.shape
    P = input_ok.shape[0]
    W_out, rep = config.beam_width, config.replacement

    def layer(carry, xs):
        parent_ok, go, depth, out_flat, out_valid, last_w = carry
        l, u_acc, u_corr, g_corr, joint_l, q_l, cand_l, ok_l, fin_l = xs[:9]      # l = 1..G
        par_ok = pick(parent_ok, cand_l // V)
        is_cand = ok_l & par_ok
        m = jnp.sum(is_cand).astype(jnp.int32)
        p_beam, w, res, index = weigh(parent_ok, par_ok, is_cand, m, xs)
        verified = go & (l <= budget)
        passed = res.num_accepted >= w
        c_flat, c_valid = correct_layer(u_corr, g_corr, p_beam, res, cand_l, w, W_out, rep,
                                        index)
        a_flat, _ = compact(cand_l, res.accepted, W_out)
        a_valid = jnp.arange(W_out) < res.num_accepted
        all_fin = jnp.all(jnp.where(res.accepted, fin_l, True))
        stop_here = verified & (~passed | (l == budget) | all_fin)
        flat = jnp.where(passed, a_flat, c_flat)
        valid = jnp.where(passed, a_valid, c_valid)
        acc_pad = jnp.zeros((P,), bool).at[:C].set(res.accepted)
        carry = (jnp.where(verified, acc_pad, parent_ok),
                 go & verified & ~stop_here,
                 jnp.where(stop_here, l, depth),
                 jnp.where(stop_here, flat, out_flat),
                 jnp.where(stop_here, valid, out_valid),
                 jnp.where(verified, w, last_w))
        stats = (jnp.where(verified, w, 0), verified, verified & passed,
                 jnp.where(verified, m, 0), jnp.where(verified, res.num_accepted, 0))
        return carry, stats

    init = (input_ok, budget >= 1, jnp.zeros((), jnp.int32), jnp.zeros((W_out,), jnp.int32),
            jnp.zeros((W_out,), bool), jnp.zeros((), jnp.int32))
    xs = (jnp.arange(1, G + 1), rand.accept_u, rand.corr_u, rand.corr_g, layer_joint(), q, cand,
          cand_ok, cand_finished)
    xs = xs + layer_tops()
    (parent_ok, go, depth, flat, valid, last_w), (widths, verified, passed, m, n_acc) = \
        jax.lax.scan(layer, init, xs)

    # extra layer: every layer passed and a token is left for it.
    extra = go & (budget >= G + 1)
    w_extra = last_w if config.num_beams is None else jnp.int32(config.num_beams)
    p_beam, e_index = extra_layer(parent_ok)
    e_flat, e_valid = draw_layer(rand.extra_u, rand.extra_g, p_beam, w_extra, W_out, rep,
                                 e_index)
    depth = jnp.where(extra, G + 1, depth)
    flat = jnp.where(extra, e_flat, flat)
    valid = jnp.where(extra, e_valid, valid)
    widths = jnp.concatenate([widths, jnp.where(extra, w_extra, 0)[None]])
    return Verdict(depth, flat, valid, widths, verified, passed, m, n_acc)
