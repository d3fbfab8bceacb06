"""Speculative sampling (Leviathan et al. 2023; Chen et al. 2023): exact sampling from the warped
target with a small draft model.

An iteration, per row: the draft proposes ``gamma`` tokens from its warped distributions; one
target pass scores ``[pending, d_1 .. d_gamma]``; ``verify_chain`` accepts in order with the
accept test of ``rules``, draws from the residual on the first rejection, or a bonus token when
all pass. Each iteration's first draft call runs ``[prev, pending]``, so the draft cache holds the
accepted tokens without an extra call. A row never overshoots ``max_new_tokens``; EOS cuts the
emitted tokens and finishes the row. The loop, state and bookkeeping are shared with ``tree``.
Long form: docs/results/design_notes.md.
"""

from __future__ import annotations

import functools
from typing import Callable, Mapping, Sequence, Tuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.models import cache as kvc
from dsbd_jax.decoding import common, drafting
from dsbd_jax.decoding._jit import decoder, inputs, loop
from dsbd_jax.decoding._jit.inputs import with_prompt_rows
from dsbd_jax.decoding.common import GenerateOutput
from dsbd_jax.decoding.configs import SpeculativeConfig, Settings, check_config
from dsbd_jax.decoding.rules import accept_test, safe_residual
from dsbd_jax.decoding.warping import draw_from, warp_logits


# ---------------------------------------------------------------------------------------------
# The chain's verification (pure, per row; the rules are module rules').

@jax.named_scope("verify")
def verify_chain(p: jax.Array, q: jax.Array, drafts: jax.Array, uniforms: jax.Array,
                 num_verify: jax.Array) -> Tuple[jax.Array, jax.Array]:
    """Speculative-sampling verification of one row's draft chain.

    Args:
      p: ``[gamma + 1, V]`` warped target probabilities; ``p[i]`` is the distribution of the token
        after the first ``i`` drafts.
      q: ``[gamma, V]`` warped draft probabilities; ``drafts[i] ~ q[i]``.
      drafts: ``[gamma]`` int draft tokens.
      uniforms: ``[gamma]`` Uniform[0, 1) numbers.
      num_verify: scalar int in ``[0, gamma]``: only the first ``num_verify`` drafts are tested.
    Returns:
      ``(n, next_probs)``: the number of accepted drafts ``n <= num_verify`` and the distribution
      ``[V]`` of the next token: ``residual(p[n], q[n])`` after a rejection, ``p[n]`` if all
      ``num_verify`` drafts were accepted (the bonus token).
    """
    gamma = drafts.shape[0]
    i = jnp.arange(gamma)
    p_x = jnp.take_along_axis(p[:gamma], drafts[:, None], axis=1)[:, 0]
    q_x = jnp.take_along_axis(q, drafts[:, None], axis=1)[:, 0]
    ok = accept_test(uniforms, p_x, q_x) & (i < num_verify)
    n = jnp.sum(jnp.cumprod(ok.astype(jnp.int32)))
    q_pad = jnp.concatenate([q, jnp.zeros_like(q[:1])], axis=0)
    rejected = n < num_verify
    next_probs = jnp.where(rejected, safe_residual(p[n], q_pad[n]), p[n])
    return n, next_probs


# ---------------------------------------------------------------------------------------------
# Host-side checks (before the jitted core: concrete values, clear errors, never NaN).

def check_inputs(params, prompt_ids, config: Settings, prompt_lengths, key=None) -> None:
    """Raise ``ValueError`` for anything the speculative decoders cannot run (``key`` required;
    the config's type is each decoder's own check, ``configs.check_config``, and its settings
    the config's own checks: ``gamma``, the draft's vocabulary, ``tree_widths``)."""
    if getattr(config, "draft", None) is None:
        raise ValueError(f"speculative decoding needs a draft model: set "
                         f"{type(config).__name__}.draft")
    if not isinstance(params, Mapping) or "target" not in params or "draft" not in params:
        raise ValueError('params must be a dict {"target": ..., "draft": ...}')
    for name, mc in (("target", config.target), ("draft", config.draft)):
        tree = params[name]
        embed = tree.get("embed", {}).get("embedding") if hasattr(tree, "get") else None
        if embed is not None and embed.shape[0] != mc.vocab_size:
            raise ValueError(f"{name} parameters have a vocabulary of {embed.shape[0]}, the config "
                             f"says {mc.vocab_size}")
    inputs.check_prompt_batch(prompt_ids, prompt_lengths, config.target.vocab_size)
    B, P = np.shape(prompt_ids)
    inputs.check_positions({"target": config.target, "draft": config.draft}, P,
                           config.max_new_tokens, config.gamma + 1)
    inputs.check_key(key, B)


row_keys = inputs.row_keys


@jax.named_scope("random")
def iteration_uniforms(keys: jax.Array, row_iter: jax.Array, sizes: Sequence[int]):
    """All the randomness of one iteration: row b draws ``sum(sizes)`` Uniform(0, 1) numbers from
    ``fold_in(keys[b], row_iter[b])`` (one random-bits call for everything: far less to compile
    than one call per draw), returned split into ``[B, size]`` parts."""
    tiny = jnp.finfo(jnp.float32).tiny
    u = jax.vmap(lambda k, i: jax.random.uniform(jax.random.fold_in(k, i), (sum(sizes),),
                                                 minval=tiny, maxval=1.0))(keys, row_iter)
    cuts = np.cumsum(sizes)[:-1].tolist()
    return jnp.split(u, cuts, axis=1)


def draw_token(probs: jax.Array, u: jax.Array) -> jax.Array:
    """One draw from probabilities ``probs [..., V]`` with one uniform ``u [...]`` per draw
    (inverse CDF, :func:`dsbd_jax.decoding.warping.draw_from`); zero-probability entries are never drawn."""
    return draw_from(probs, u[..., None])[..., 0]


def warp(config: Settings, logits: jax.Array) -> jax.Array:
    """Warped log-probabilities (temperature, top-k, top-p of ``config``) over the last axis."""
    return warp_logits(logits, config.temperature, config.top_k, config.top_p)


# ---------------------------------------------------------------------------------------------
# Decode state and the shared loop.

@flax.struct.dataclass
class DecodeState:
    """Everything that changes between iterations (B rows, N = max_new_tokens)."""

    target_cache: kvc.KVCache   # [L, B, S, K, D]
    draft_cache: kvc.KVCache    # [L, B, S + extra, K, D] (extra: tree scratch slots)
    keys: jax.Array             # [B] per-row PRNG keys
    length: jax.Array           # [B] committed slots; the pending token's slot
    pending: jax.Array          # [B] last emitted token, not yet fed to the models
    prev: jax.Array             # [B] token at slot length - 1 (the last committed one)
    generated: jax.Array        # [B] tokens emitted so far
    done: jax.Array             # [B] bool: EOS emitted or max_new_tokens reached
    row_iter: jax.Array         # [B] iterations this row took part in
    sequences: jax.Array        # [B, N] emitted tokens (pad elsewhere)
    loglik: jax.Array           # [B] unwarped target log-likelihood of the emitted tokens
    accepted: jax.Array         # [B] draft tokens accepted by the verification rule
    verified: jax.Array         # [B] levels of drafts tested (at most gamma per iteration)
    iterations: jax.Array       # scalar
    target_calls: jax.Array     # scalar
    draft_calls: jax.Array      # scalar
    feat_prev: jax.Array        # [B, d] draft-head feature read with prev (d = 0: a draft model)
    feat_pend: jax.Array        # [B, d] draft-head feature read with pending


def num_slots(config: Settings, prompt_len: int) -> int:
    """Cache slots: prompt + max_new_tokens + look-ahead slack (gamma + 1)."""
    return prompt_len + config.max_new_tokens + config.gamma + 1


def init_state(config: Settings, params, prompt_ids, prompt_lengths, keys,
               draft_extra_slots: int = 0) -> DecodeState:
    """Prefill both models; the last prompt token becomes the pending token. ``keys``: ``[B]``."""
    B, P = prompt_ids.shape
    S = num_slots(config, P)
    target_cache, draft_cache, feats = drafting.prefill_pair(config, params, prompt_ids,
                                                             prompt_lengths, S,
                                                             S + draft_extra_slots)
    if feats is None:
        feat_prev = feat_pend = drafting.empty_features((B,))
    else:
        feat_prev, feat_pend = drafting.prompt_features(feats, prompt_lengths)
    rows = jnp.arange(B)
    zeros = jnp.zeros((B,), jnp.int32)
    return DecodeState(
        target_cache=target_cache, draft_cache=draft_cache, keys=keys,
        length=prompt_lengths - 1,
        pending=prompt_ids[rows, prompt_lengths - 1],
        prev=prompt_ids[rows, jnp.maximum(prompt_lengths - 2, 0)],
        generated=zeros, done=jnp.zeros((B,), bool), row_iter=zeros,
        sequences=jnp.full((B, config.max_new_tokens), config.pad_id, jnp.int32),
        loglik=jnp.zeros((B,), jnp.float32), accepted=zeros, verified=zeros,
        iterations=jnp.int32(0), target_calls=jnp.int32(0), draft_calls=jnp.int32(0),
        feat_prev=feat_prev, feat_pend=feat_pend)


def draft_root_call(config: Settings, params, state: DecodeState):
    """Draft forward over ``[prev, pending]`` at slots ``length - 1, length``; commits both.

    Returns ``(logits [B, V] after pending, draft cache, feature [B, d] after pending or None)``
    (``params``: both models'; a head reads ``state.feat_prev`` / ``feat_pend``). A row with
    ``length == 0`` (one-token prompt) has no ``prev``: that query is masked out and not written.
    """
    cache = state.draft_cache
    B = state.length.shape[0]
    S = cache.num_slots
    length = state.length
    has_prev = length >= 1
    tokens = jnp.stack([state.prev, state.pending], axis=1)
    positions = jnp.stack([jnp.maximum(length - 1, 0), length], axis=1)
    in_cache = jnp.arange(S)[None, :] < (length - 1)[:, None]                     # [B, S]
    new = jnp.stack([jnp.stack([jnp.ones((B,), bool), jnp.zeros((B,), bool)], 1),
                     jnp.stack([has_prev, jnp.ones((B,), bool)], 1)], axis=1)   # [B, 2, 2]
    mask = jnp.concatenate([jnp.broadcast_to(in_cache[:, None, :], (B, 2, S)), new], axis=-1)
    feats = jnp.stack([state.feat_prev, state.feat_pend], axis=1)
    logits, new_kv, out_feats = drafting.draft_forward(config, params, tokens, feats, positions,
                                                       mask, cache,
                                                       logits_at=jnp.ones((B, 1), jnp.int32))
    select = jnp.where(has_prev[:, None], jnp.array([[0, 1]]), jnp.array([[1, 1]]))
    start = jnp.where(has_prev, length - 1, length)
    count = jnp.where(state.done, 0, jnp.where(has_prev, 2, 1))
    cache = kvc.write_selected(cache, new_kv, select, start, count)
    return logits[:, 0], cache, None if out_feats is None else out_feats[:, 1]


def draft_step(config: Settings, params, cache: kvc.KVCache, tokens, feats, lengths):
    """One draft token per row at slot ``lengths`` (a head also reads ``feats [B, d]``).
    Returns ``(logits [B, V], cache, feature [B, d] or None)``."""
    if not drafting.uses_head(config):
        logits, cache = common.decode_step(config.draft, params["draft"], cache, tokens, lengths)
        return logits, cache, None
    S = cache.num_slots
    R = tokens.shape[0]
    slot_ok = jnp.arange(S)[None, :] < lengths[:, None]
    mask = jnp.concatenate([slot_ok, jnp.ones((R, 1), bool)], axis=-1)[:, None, :]
    logits, new, out = drafting.draft_forward(config, params, tokens[:, None], feats[:, None],
                                              lengths[:, None], mask, cache)
    return logits[:, 0], kvc.write(cache, new, lengths), out[:, 0]


def advance_features(state: DecodeState, feats, n: jax.Array) -> DecodeState:
    """After a target pass over ``[pending, d_1 ..]`` with features ``feats [B, T, d]`` (None: a
    draft model) and ``n`` accepted drafts: the features of the new ``prev`` and ``pending``
    (the target's at the new pending's two positions before; the old pending's when ``n = 0``)."""
    if feats is None:
        return state
    active = (~state.done)[:, None]
    pend = jnp.take_along_axis(feats, n[:, None, None], axis=1)[:, 0]
    prev = jnp.take_along_axis(feats, jnp.maximum(n - 1, 0)[:, None, None], axis=1)[:, 0]
    prev = jnp.where((n >= 1)[:, None], prev, state.feat_pend)
    return state.replace(feat_prev=jnp.where(active, prev, state.feat_prev),
                         feat_pend=jnp.where(active, pend, state.feat_pend))


def commit_iteration(config: Settings, state: DecodeState, target_cache, draft_cache,
                     emitted: jax.Array, num_accepted: jax.Array, num_verify: jax.Array,
                     emitted_logp: jax.Array, draft_calls: int) -> DecodeState:
    """Write one iteration's output for the active rows and advance the counters.

    ``emitted [B, gamma + 1]``: the accepted drafts then the resampled/bonus token at index
    ``num_accepted``; ``emitted_logp [B, gamma + 1]``: their unwarped target log-probs. The output
    is cut after the first EOS (the row is then finished). ``target_cache`` / ``draft_cache`` must
    already hold the committed path (``pending`` + accepted drafts at slots ``length ..``).
    """
    active = ~state.done
    N = config.max_new_tokens
    n = num_accepted
    j = jnp.arange(emitted.shape[1])[None, :]
    eos_hit = common.is_eos(emitted, config.eos_ids) & (j <= n[:, None])
    hit_any = jnp.any(eos_hit, axis=1)
    n_emit = jnp.where(hit_any, jnp.argmax(eos_hit, axis=1) + 1, n + 1)
    n_emit = jnp.where(active, n_emit, 0)
    keep = j < n_emit[:, None]
    dest = jnp.where(keep, state.generated[:, None] + j, N)
    rows = jnp.arange(emitted.shape[0])[:, None]
    sequences = state.sequences.at[rows, dest].set(emitted, mode="drop")
    loglik = state.loglik + jnp.sum(jnp.where(keep, emitted_logp, 0.0), axis=1)
    generated = state.generated + n_emit
    last = jnp.take_along_axis(emitted, n[:, None], axis=1)[:, 0]
    before_last = jnp.take_along_axis(emitted, jnp.maximum(n - 1, 0)[:, None], axis=1)[:, 0]
    upd = lambda new, old: jnp.where(active, new, old)  # noqa: E731
    return state.replace(
        target_cache=target_cache, draft_cache=draft_cache,
        length=upd(state.length + n + 1, state.length),
        pending=upd(last, state.pending),
        prev=upd(jnp.where(n >= 1, before_last, state.pending), state.prev),
        generated=generated,
        done=state.done | (active & (hit_any | (generated >= N))),
        row_iter=state.row_iter + active.astype(jnp.int32),
        sequences=sequences, loglik=loglik,
        accepted=state.accepted + jnp.where(active, n, 0),
        verified=state.verified + jnp.where(active, num_verify, 0),
        iterations=state.iterations + 1, target_calls=state.target_calls + 1,
        draft_calls=state.draft_calls + draft_calls)


def decode_loop(config: Settings, state: DecodeState,
                iteration: Callable[[DecodeState], DecodeState]) -> DecodeState:
    """``lax.while_loop`` of ``iteration`` until every row is done."""
    return loop(config, lambda s: jnp.any(~s.done), iteration, state, lambda s: dict(
        iterations=s.iterations, generated=s.generated, done=s.done, target_calls=s.target_calls,
        accepted=jnp.sum(s.accepted), verified=jnp.sum(s.verified)))


def to_output(config: Settings, state: DecodeState) -> GenerateOutput:
    sequences = state.sequences[:, None, :]
    loglik = state.loglik[:, None]
    lengths, best = common.best_and_lengths(sequences, loglik, config.eos_ids)
    calls = jnp.maximum(jnp.sum(state.row_iter), 1)
    stats = dict(
        target_calls=state.target_calls, draft_calls=state.draft_calls,
        iterations=state.iterations, generated_tokens=state.generated,
        accepted_tokens=state.accepted, verified_tokens=state.verified,
        row_iterations=state.row_iter,
        mean_accepted=jnp.sum(state.accepted) / calls,
        acceptance_rate=jnp.sum(state.accepted) / jnp.maximum(jnp.sum(state.verified), 1))
    return GenerateOutput(sequences=sequences, lengths=lengths, log_likelihoods=loglik, best=best,
                          stats=stats)


def target_mask(length: jax.Array, num_slots_: int, tree_mask: jax.Array) -> jax.Array:
    """``[B, T, S + T]``: committed slots ``< length``, then ``tree_mask [T, T]`` among the new
    tokens (causal for a chain, ancestor-or-self for a tree)."""
    B = length.shape[0]
    T = tree_mask.shape[0]
    in_cache = jnp.arange(num_slots_)[None, None, :] < length[:, None, None]
    return jnp.concatenate([jnp.broadcast_to(in_cache, (B, T, num_slots_)),
                            jnp.broadcast_to(tree_mask[None], (B, T, T))], axis=-1)


def gather_logp(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """Unwarped log p(tokens): ``logits [B, T, V]``, ``tokens [B, T]`` -> ``[B, T]``."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    return jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]


# ---------------------------------------------------------------------------------------------
def chain_iteration(config: Settings, params, state: DecodeState) -> DecodeState:
    """One speculative-sampling iteration for every row (see module doc)."""
    gamma = config.gamma
    B = state.length.shape[0]
    active = ~state.done
    u_draft, u_accept, u_final = iteration_uniforms(state.keys, state.row_iter,
                                                    (gamma, gamma, 1))
    remaining = config.max_new_tokens - state.generated
    num_verify = jnp.clip(remaining - 1, 0, gamma)

    # 1. draft: gamma tokens, the first from the [prev, pending] call, then one token per call.
    root_logits, dcache, f0 = draft_root_call(config, params, state)
    logq0 = warp(config, root_logits)                                           # [B, V]
    d0 = draw_token(jnp.exp(logq0), u_draft[:, 0])
    f0 = drafting.empty_features((B,)) if f0 is None else f0

    def step(carry, i):
        dcache, tok, feat = carry
        logits, dcache, feat2 = draft_step(config, params, dcache, tok, feat, state.length + i)
        logq = warp(config, logits)
        tok = draw_token(jnp.exp(logq), u_draft[:, i])
        return (dcache, tok, feat if feat2 is None else feat2), (logq, tok)

    (dcache, _, _), (logq_rest, d_rest) = jax.lax.scan(step, (dcache, d0, f0),
                                                       jnp.arange(1, gamma))
    logq = jnp.concatenate([logq0[:, None], jnp.moveaxis(logq_rest, 0, 1)], axis=1)  # [B, g, V]
    drafts = jnp.concatenate([d0[:, None], jnp.moveaxis(d_rest, 0, 1)], axis=1)     # [B, g]

    # 2. one target pass over [pending, d_1 .. d_gamma].
    tokens = jnp.concatenate([state.pending[:, None], drafts], axis=1)              # [B, g+1]
    positions = state.length[:, None] + jnp.arange(gamma + 1)[None, :]
    S = state.target_cache.num_slots
    mask = target_mask(state.length, S, jnp.tril(jnp.ones((gamma + 1, gamma + 1), bool)))
    logits, new_kv, tfeats = drafting.target_forward(config, params, tokens, positions, mask,
                                                     state.target_cache)
    p = jnp.exp(warp(config, logits))

    # 3. verify, then draw the next token.
    n, next_probs = jax.vmap(verify_chain)(p, jnp.exp(logq), drafts, u_accept, num_verify)
    t = draw_token(next_probs, u_final[:, 0])

    j = jnp.arange(gamma + 1)[None, :]
    drafts_pad = jnp.concatenate([drafts, jnp.full((B, 1), config.pad_id, jnp.int32)], axis=1)
    emitted = jnp.where(j < n[:, None], drafts_pad, t[:, None])
    emitted_logp = gather_logp(logits, emitted)
    # commit pending + accepted drafts (the draft cache already holds them, see draft_root_call).
    tcache = kvc.write_selected(state.target_cache, new_kv,
                                jnp.broadcast_to(jnp.arange(gamma + 1), (B, gamma + 1)),
                                state.length, jnp.where(active, n + 1, 0))
    state = advance_features(state, tfeats, n)
    return commit_iteration(config, state, tcache, dcache, emitted, n, num_verify, emitted_logp,
                            draft_calls=gamma)


def _speculative_core(params, prompt_ids, prompt_lengths, keys, config: SpeculativeConfig):
    params = with_prompt_rows(params, prompt_ids)
    state = init_state(config, params, prompt_ids, prompt_lengths, keys)
    state = decode_loop(config, state, functools.partial(chain_iteration, config, params))
    return to_output(config, state)


@decoder(_speculative_core)
def speculative_sample(params, prompt_ids, key, config: SpeculativeConfig,
                       prompt_lengths=None) -> GenerateOutput:
    """Speculative sampling: exact samples from the warped target, ``gamma`` drafts per target call.

    Args:
      params: ``{"target": target params, "draft": draft params}``.
      prompt_ids: ``[B, P]`` int, right-padded; ``prompt_lengths [B]`` (None: all ``P``).
      key: one PRNG key (row b uses ``fold_in(key, b)``) or ``[B]`` keys (row b uses ``key[b]``).
      config: ``SpeculativeConfig`` with ``draft``, ``gamma``, warping, EOS, ``max_new_tokens``
        (one sequence per prompt).
    Returns:
      ``GenerateOutput`` with ``sequences [B, 1, N]``, unwarped target ``log_likelihoods [B, 1]``
      and stats ``target_calls``, ``draft_calls``, ``iterations`` (target/draft forward passes
      after the prefill; loop iterations), ``generated_tokens [B]``, ``accepted_tokens [B]``,
      ``verified_tokens [B]``, ``row_iterations [B]``, ``mean_accepted`` (accepted drafts per
      target call, per row) and ``acceptance_rate`` (accepted / verified drafts).
    """
    check_config("speculative_sample", config)
    check_inputs(params, prompt_ids, config, prompt_lengths, key=key)
    prompt_ids = jnp.asarray(prompt_ids, jnp.int32)
    lengths = common.prompt_lengths_or_full(prompt_ids, prompt_lengths)
    keys = row_keys(key, prompt_ids.shape[0])
    return (params, prompt_ids, lengths, keys), config
