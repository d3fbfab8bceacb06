"""Token-tree speculative sampling (SpecInfer; MCSD, Yang et al. 2024): exact sampling from the
warped target with a draft tree verified in one target pass.

The tree has ``tree_widths = (k_1 .. k_gamma)`` children per level, drawn from the draft's warped
distribution (i.i.d., or without replacement); one target pass over every node with a tree mask;
then the walk from the root verifies each node's children in draw order with the MCSD rules
(``rules``), draws from the residual when all are rejected, and a bonus token after the deepest
accepted node. The accepted path is copied into contiguous cache slots. The loop, state and
bookkeeping are ``speculative``'s. Long form: docs/results/design_notes.md.
"""

from __future__ import annotations

import functools
from typing import Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.models import cache as kvc
from dsbd_jax.decoding import common, drafting, speculative as spec
from dsbd_jax.decoding._jit import decoder
from dsbd_jax.decoding._jit.inputs import with_prompt_rows
from dsbd_jax.decoding.common import GenerateOutput
from dsbd_jax.decoding.configs import TreeConfig, check_config
from dsbd_jax.decoding.warping import draw_from
from dsbd_jax.decoding.rules import accept_test, remove, safe_residual


# ---------------------------------------------------------------------------------------------
# Tree structure.

def tree_widths(config: TreeConfig) -> Tuple[int, ...]:
    return tuple(config.tree_widths) if config.tree_widths is not None else (2,) * config.gamma


def draft_extra_slots(config: TreeConfig) -> int:
    """Draft-cache slots beyond the chain's for the tree's non-root nodes' scratch K/V."""
    return tree_structure(tree_widths(config))[2][config.gamma] - 1


def tree_structure(widths: Sequence[int]):
    """Static layout of the full tree with ``widths[l-1]`` children per level-``l-1`` node.

    Returns ``(parents [T] int32, depths [T] int32, offsets)`` (numpy; nodes level by level, root
    = node 0; ``offsets[l]`` = index of the first level-``l`` node, ``offsets[-1] = T``). The
    children of the ``j``-th node of level ``l - 1`` are ``offsets[l] + j * widths[l-1] + c``.
    """
    parents, depths, offsets = [0], [0], [0, 1]
    size = 1
    for l, k in enumerate(widths, start=1):
        parents += [offsets[l - 1] + j // k for j in range(size * k)]
        depths += [l] * (size * k)
        size *= k
        offsets.append(offsets[-1] + size)
    return np.asarray(parents, np.int32), np.asarray(depths, np.int32), tuple(offsets)


def ancestor_mask(parents: jax.Array, max_depth: int) -> jax.Array:
    """``[T, T]`` bool, ``[i, j]`` = node j is node i or one of its ancestors (root: parent 0)."""
    T = parents.shape[0]
    ids = jnp.arange(T)
    anc = ids[:, None] == ids[None, :]
    cur = ids
    for _ in range(max_depth):
        cur = parents[cur]
        anc = anc | (cur[:, None] == ids[None, :])
    return anc


# ---------------------------------------------------------------------------------------------
# The verification rules (pure, per row).

def verify_siblings(p: jax.Array, q: jax.Array, candidates: jax.Array, uniforms: jax.Array,
                    replacement: bool) -> Tuple[jax.Array, jax.Array]:
    """MCSD multi-candidate verification of the children of one node.

    Args:
      p: ``[V]`` warped target probabilities at the node; q: ``[V]`` the draft distribution the
        children were drawn from; candidates: ``[k]`` child tokens in draw order; uniforms: ``[k]``.
      replacement: True: children i.i.d. from q (Algorithm 1); False: successive draws without
        replacement (Algorithm 2).
    Returns:
      ``(accepted, p_final)``: index of the accepted child (``-1`` if all were rejected) and the
      residual distribution ``[V]`` to sample from when all were rejected.
      A candidate the current q gives probability 0 (only possible without replacement, when
      ``k`` exceeds q's support) is skipped: it was not a draw from q.
    """
    def step(carry, xs):
        p, q, acc = carry
        x, u, i = xs
        q_x = q[x]
        live = (acc < 0) & (q_x > 0)
        accept = live & accept_test(u, p[x], q_x)
        reject = live & ~accept
        p_next = jnp.where(reject, safe_residual(p, q), p)
        q_next = q if replacement else jnp.where(reject, remove(q, x), q)
        return (p_next, q_next, jnp.where(accept, i, acc)), None

    k = candidates.shape[0]
    (p, _, acc), _ = jax.lax.scan(step, (p, q, jnp.int32(-1)),
                                  (candidates, uniforms, jnp.arange(k, dtype=jnp.int32)))
    return acc, p


@jax.named_scope("verify")
def walk_tree(p_nodes: jax.Array, q_nodes: jax.Array, tokens: jax.Array, uniforms: jax.Array,
              num_verify: jax.Array, widths: Tuple[int, ...], replacement: bool):
    """Verify one row's tree from the root down.

    Args:
      p_nodes: ``[T, V]`` warped target probabilities at every node.
      q_nodes: ``[offsets[gamma], V]`` warped draft probabilities at every internal node.
      tokens: ``[T]`` node tokens; uniforms: ``[gamma, max(widths)]``.
      num_verify: scalar: at most this many levels are verified (token budget).
    Returns:
      ``(n, path [gamma], next_probs [V])``: accepted levels, the accepted node ids (first ``n``
      valid) and the distribution of the next token (residual after a rejection, else the target
      at the last accepted node: the bonus token).
    """
    _, _, offsets = tree_structure(widths)
    gamma = len(widths)
    T = tokens.shape[0]
    cur = jnp.int32(0)
    n = jnp.int32(0)
    stopped = jnp.bool_(False)
    rejected = jnp.bool_(False)
    residual_p = jnp.zeros_like(p_nodes[0])
    path = jnp.zeros((gamma,), jnp.int32)
    for l in range(1, gamma + 1):
        k = widths[l - 1]
        children = jnp.clip(offsets[l] + (cur - offsets[l - 1]) * k + jnp.arange(k), 0, T - 1)
        acc, p_res = verify_siblings(p_nodes[cur], q_nodes[jnp.minimum(cur, q_nodes.shape[0] - 1)],
                                     tokens[children], uniforms[l - 1, :k], replacement)
        live = ~stopped & (l <= num_verify)
        took = live & (acc >= 0)
        rej = live & (acc < 0)
        child = children[jnp.maximum(acc, 0)]
        residual_p = jnp.where(rej, p_res, residual_p)
        rejected = rejected | rej
        path = path.at[l - 1].set(jnp.where(took, child, 0))
        cur = jnp.where(took, child, cur)
        n = n + took.astype(jnp.int32)
        stopped = stopped | ~took
    next_probs = jnp.where(rejected, residual_p, p_nodes[cur])
    return n, path, next_probs


# ---------------------------------------------------------------------------------------------
def draw_children(logq: jax.Array, u: jax.Array, k: int, replacement: bool) -> jax.Array:
    """``k`` children per node from warped draft log-probs ``logq [B, n, V]``: ``[B, n * k]`` in
    draw order. ``u``: ``[B, children_uniforms(n, k, V, replacement)]`` Uniform(0, 1) numbers.
    With replacement: k independent inverse-CDF draws (one uniform each); without: Gumbel-top-k
    (successive draws without replacement, one uniform per vocabulary entry).
    """
    B, n, V = logq.shape
    if replacement:
        kids = draw_from(jnp.exp(logq), u.reshape(B, n, k))
    else:
        g = -jnp.log(-jnp.log(u))
        kids = jax.lax.top_k(logq + g.reshape(B, n, V), k)[1]
    return kids.reshape(B, n * k).astype(jnp.int32)


def children_uniforms(n: int, k: int, V: int, replacement: bool) -> int:
    """How many uniforms ``draw_children`` needs for ``n`` nodes of ``k`` children."""
    return n * k if replacement else n * V


def tree_iteration(config: TreeConfig, params, state: spec.DecodeState) -> spec.DecodeState:
    """One token-tree iteration for every row (see module doc)."""
    widths = tree_widths(config)
    gamma = config.gamma
    parents_np, depths_np, offsets = tree_structure(widths)
    num_scratch = offsets[gamma] - 1          # nodes 1 .. offsets[gamma]-1 are fed to the draft
    B = state.length.shape[0]
    active = ~state.done
    V = config.target.vocab_size
    kmax = max(widths)
    level_sizes = [children_uniforms(offsets[l] - offsets[l - 1], widths[l - 1], V,
                                     config.replacement) for l in range(1, gamma + 1)]
    *u_levels, u_accept, u_final = spec.iteration_uniforms(
        state.keys, state.row_iter, (*level_sizes, gamma * kmax, 1))
    remaining = config.max_new_tokens - state.generated
    num_verify = jnp.clip(remaining - 1, 0, gamma)
    parents = jnp.asarray(parents_np)
    anc = ancestor_mask(parents, gamma)                                   # [T, T]

    # 1. draft the tree level by level.
    root_logits, dcache, feat = spec.draft_root_call(config, params, state)
    feat = None if feat is None else feat[:, None]                       # [B, 1, d] per node
    S = dcache.num_slots - num_scratch
    # RoPE positions of the draft cache's slots (sliding-window models read them): slot s of
    # the main part holds position s, scratch slot S + j - 1 holds node j (depth depths_np[j])
    key_pos = jnp.concatenate([jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32), (B, S)),
                               state.length[:, None] + jnp.asarray(depths_np[1:offsets[gamma]],
                                                                   jnp.int32)[None]], axis=1)
    logq_levels = [spec.warp(config, root_logits)[:, None, :]]           # [B, 1, V]
    node_tokens = [state.pending[:, None]]
    for l in range(1, gamma + 1):
        kids = draw_children(logq_levels[-1], u_levels[l - 1], widths[l - 1], config.replacement)
        node_tokens.append(kids)                                          # [B, n_l]
        if l == gamma:
            break
        # a head's kids read their parent's feature (kids are parent-major, draw_children)
        kid_feat = None if feat is None else jnp.repeat(feat, widths[l - 1], axis=1)
        lo, hi = offsets[l], offsets[l + 1]
        n_l = hi - lo
        main = jnp.arange(S)[None, None, :] <= state.length[:, None, None]         # [B, 1, S]
        scratch = anc[lo:hi, 1:offsets[gamma]] & (jnp.arange(lo, hi)[:, None]
                                                  != jnp.arange(1, offsets[gamma])[None, :])
        mask = jnp.concatenate([jnp.broadcast_to(main, (B, n_l, S)),
                                jnp.broadcast_to(scratch[None], (B, n_l, num_scratch)),
                                jnp.broadcast_to(jnp.eye(n_l, dtype=bool)[None], (B, n_l, n_l))],
                               axis=-1)
        positions = jnp.broadcast_to(state.length[:, None] + l, (B, n_l))
        logits, new_kv, feat = drafting.draft_forward(config, params, kids, kid_feat, positions,
                                                      mask, dcache, key_positions=key_pos)
        dcache = kvc.write(dcache, new_kv, jnp.full((B,), S + lo - 1, jnp.int32))
        logq_levels.append(spec.warp(config, logits))
    tokens = jnp.concatenate(node_tokens, axis=1)                         # [B, T]
    q_nodes = jnp.exp(jnp.concatenate(logq_levels, axis=1))               # [B, offsets[gamma], V]

    # 2. one target pass over the whole tree.
    positions = state.length[:, None] + jnp.asarray(depths_np)[None, :]
    Sx = state.target_cache.num_slots
    logits, new_kv, tfeats = drafting.target_forward(config, params, tokens, positions,
                                                     spec.target_mask(state.length, Sx, anc),
                                                     state.target_cache)
    p_nodes = jnp.exp(spec.warp(config, logits))

    # 3. walk down the tree, then draw the next token.
    walk = functools.partial(walk_tree, widths=widths, replacement=config.replacement)
    n, path, next_probs = jax.vmap(walk)(p_nodes, q_nodes, tokens,
                                         u_accept.reshape(B, gamma, kmax), num_verify)
    t = spec.draw_token(next_probs, u_final[:, 0])

    j = jnp.arange(gamma + 1)[None, :]
    path_pad = jnp.concatenate([path, jnp.zeros((B, 1), jnp.int32)], axis=1)
    emitted = jnp.where(j < n[:, None], jnp.take_along_axis(tokens, path_pad, axis=1), t[:, None])
    select = jnp.concatenate([jnp.zeros((B, 1), jnp.int32), path], axis=1)   # node before each
    logits_path = jnp.take_along_axis(logits, select[:, :, None], axis=1)     # [B, gamma+1, V]
    emitted_logp = spec.gather_logp(logits_path, emitted)

    # 4. commit the accepted path.
    tcache = kvc.write_selected(state.target_cache, new_kv, select, state.length,
                                jnp.where(active, n + 1, 0))
    if num_scratch > 0:
        scratch_kv = jax.tree.map(lambda x: x[:, :, S:], dcache)
        dcache = kvc.write_selected(dcache, scratch_kv, jnp.clip(path - 1, 0, num_scratch - 1),
                                    state.length + 1,
                                    jnp.where(active, jnp.minimum(n, gamma - 1), 0))
    if tfeats is not None:  # the features along the accepted path, node before each token
        state = spec.advance_features(
            state, jnp.take_along_axis(tfeats, select[:, :, None], axis=1), n)
    return spec.commit_iteration(config, state, tcache, dcache, emitted, n, num_verify,
                                 emitted_logp, draft_calls=gamma)


def _tree_core(params, prompt_ids, prompt_lengths, keys, config: TreeConfig):
    params = with_prompt_rows(params, prompt_ids)
    state = spec.init_state(config, params, prompt_ids, prompt_lengths, keys,
                            draft_extra_slots=draft_extra_slots(config))
    state = spec.decode_loop(config, state, functools.partial(tree_iteration, config, params))
    return spec.to_output(config, state)


@decoder(_tree_core)
def tree_speculative_sample(params, prompt_ids, key, config: TreeConfig,
                            prompt_lengths=None) -> GenerateOutput:
    """Token-tree speculative sampling (SpecInfer / MCSD): exact samples from the warped target.

    Same arguments, output and stats as ``speculative.speculative_sample``; the tree shape is
    ``config.tree_widths`` (default ``(2,) * gamma``) and ``config.replacement`` chooses i.i.d.
    children (MCSD Algorithm 1) or children without replacement (Algorithm 2).
    ``verified_tokens`` counts verified tree levels.
    """
    check_config("tree_speculative_sample", config)
    spec.check_inputs(params, prompt_ids, config, prompt_lengths, key=key)
    prompt_ids = jnp.asarray(prompt_ids, jnp.int32)
    lengths = common.prompt_lengths_or_full(prompt_ids, prompt_lengths)
    keys = spec.row_keys(key, prompt_ids.shape[0])
    return (params, prompt_ids, lengths, keys), config
