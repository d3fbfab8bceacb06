"""Beam sampling (the exact target of DSBD) and deterministic beam search.

Beam sampling (docs/algorithm.md, Theorem 3.1): the joint over (beam, token) has log-weights
``s_i + log p(v | x^i)`` with UNWARPED cumulative scores; it is warped as one distribution and
the next W beams are W draws from it (i.i.d., or without replacement). Beam search keeps the W
best entries of the unwarped joint with Hugging Face's bookkeeping (``length_penalty``,
``early_stopping``).

Invariants: a finished beam is absorbing (pad at log-probability 0) and a row stops once all its
beams are finished, so a row's result never depends on its batch mates; beams live in the batch
axis (row ``b * W + w``) of one ``lax.while_loop``. Long form: docs/results/design_notes.md.
"""

from __future__ import annotations

from typing import Tuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.models import cache as kvc
from dsbd_jax.decoding import common
from dsbd_jax.decoding._jit import decoder, loop, step_progress
from dsbd_jax.decoding.common import GenerateOutput
from dsbd_jax.decoding.configs import BeamSampleConfig, BeamSearchConfig, check_config
from dsbd_jax.decoding.sampling import (as_array, check_inputs, keyed_arguments, row_keys,
                                       step_keys, target_params)
from dsbd_jax.decoding.rules import sample_without_replacement
from dsbd_jax.decoding.warping import draw_from, warp_logits

NEG_INF = -jnp.inf
_HF_NEG = -1.0e9  # Hugging Face's "minus infinity" in beam search bookkeeping


# ---------------------------------------------------------------------------------------------
# reusable pieces
def joint_logprobs(beam_scores: jax.Array, token_logprobs: jax.Array) -> jax.Array:
    """Unwarped joint log-weights over (beam, token): ``[..., W] , [..., W, V] -> [..., W * V]``.

    Entry ``w * V + v`` is ``beam_scores[w] + token_logprobs[w, v]`` (not normalised; warping
    normalises). ``-inf`` scores (empty / dead beams) give ``-inf`` entries.
    """
    joint = beam_scores[..., None] + token_logprobs
    return joint.reshape(joint.shape[:-2] + (joint.shape[-2] * joint.shape[-1],))


@jax.named_scope("random")
def draw_beams(key: jax.Array, joint_warped_logprobs: jax.Array, W: int,
               replacement: bool = True) -> jax.Array:
    """Draw W flat indices from warped joint log-probabilities ``[..., N] -> [..., W]``.

    ``replacement=True``: W i.i.d. draws. ``replacement=False``: W successive draws without
    replacement (Gumbel-top-k, in draw order); if fewer than W entries have positive probability,
    the surplus indices point at zero-probability entries (callers mark those beams dead).
    """
    lw = joint_warped_logprobs
    if replacement:  # inverse-CDF draws: W uniforms, not W x N Gumbel noise
        u = jax.random.uniform(key, lw.shape[:-1] + (W,), jnp.float32)
        return draw_from(jnp.exp(lw), u)
    return sample_without_replacement(key, lw, W).astype(jnp.int32)


def split_flat(idx: jax.Array, V: int) -> Tuple[jax.Array, jax.Array]:
    """Flat joint index -> ``(beam, token)`` = ``(idx // V, idx % V)``."""
    return idx // V, idx % V


def initial_beam_scores(batch: int, W: int) -> jax.Array:
    """``[B, W]``: 0 for copy 0 of the prompt, ``-inf`` for the empty copies 1..W-1."""
    return jnp.where(jnp.arange(W) == 0, 0.0, NEG_INF)[None, :].repeat(batch, 0).astype(jnp.float32)


def flat_rows(beam: jax.Array) -> jax.Array:
    """Beam indices ``[B, W]`` within each prompt -> flat batch rows ``[B * W]`` (``b * W + w``)."""
    B, W = beam.shape
    return (jnp.arange(B)[:, None] * W + beam).reshape(B * W)


def beam_sample_step(key_rows: jax.Array, scores: jax.Array, logp: jax.Array,
                     config: BeamSampleConfig, W: int):
    """One beam-sampling step for every row.

    Args:
      key_rows: ``[B]`` keys of this step.
      scores: ``[B, W_in]`` unwarped beam log-likelihoods (``-inf``: empty/dead).
      logp: ``[B, W_in, V]`` next-token log-probs (EOS-absorbed rows already point masses).
      W: number of beams to draw.
    Returns:
      ``(beam [B, W], token [B, W], new_scores [B, W], dead [B, W])``.
    """
    V = logp.shape[-1]
    joint = joint_logprobs(scores, logp)
    warped = warp_logits(joint, config.temperature, config.top_k, config.top_p)
    idx = jax.vmap(lambda k, lw: draw_beams(k, lw, W, config.replacement))(key_rows, warped)
    beam, tok = split_flat(idx, V)
    dead = jnp.take_along_axis(warped, idx, axis=-1) == NEG_INF
    new_scores = jnp.where(dead, NEG_INF, jnp.take_along_axis(joint, idx, axis=-1))
    return beam, tok.astype(jnp.int32), new_scores, dead


# ---------------------------------------------------------------------------------------------
@flax.struct.dataclass
class BeamState:
    step: jax.Array          # scalar int32
    cache: kvc.KVCache       # [L, B*W, S, K, D]
    logits: jax.Array        # [B*W, V]
    sequences: jax.Array     # [B*W, N]
    scores: jax.Array        # [B, W] unwarped log-likelihoods
    finished: jax.Array      # [B*W] bool (EOS emitted or dead)
    target_calls: jax.Array  # scalar int32


def _beam_sample_core(params, prompt_ids, prompt_lengths, key, config: BeamSampleConfig):
    B, P = prompt_ids.shape
    W, N = config.num_beams, config.max_new_tokens
    V = config.target.vocab_size
    pad = config.pad_id
    keys = row_keys(key, B)
    cache, logits = common.prefill(config.target, params, prompt_ids, prompt_lengths, P + N)
    row_len = jnp.repeat(prompt_lengths, W)
    state = BeamState(
        step=jnp.zeros((), jnp.int32), cache=kvc.repeat_rows(cache, W),
        logits=jnp.repeat(logits, W, axis=0), sequences=jnp.full((B * W, N), pad, jnp.int32),
        scores=initial_beam_scores(B, W), finished=jnp.zeros((B * W,), bool),
        target_calls=jnp.ones((), jnp.int32))

    def cond(s: BeamState):
        return (s.step < N) & ~jnp.all(s.finished)

    def body(s: BeamState):
        t = s.step
        logp = jax.nn.log_softmax(s.logits, axis=-1)
        logp = common.absorb_finished(logp, s.finished, pad).reshape(B, W, V)
        beam, tok, scores, dead = beam_sample_step(step_keys(keys, t), s.scores, logp, config, W)
        done = jnp.all(s.finished.reshape(B, W), axis=-1, keepdims=True)  # [B, 1] row stopped
        beam = jnp.where(done, jnp.arange(W)[None, :], beam)
        scores = jnp.where(done, s.scores, scores)
        dead = dead & ~done
        tok = jnp.where(dead | done, pad, tok).reshape(B * W)
        rows = flat_rows(beam)
        dead = dead.reshape(B * W)
        seqs = s.sequences[rows].at[:, t].set(tok)
        seqs = jnp.where(dead[:, None], pad, seqs)  # a dead beam has no tokens
        finished = s.finished[rows] | common.is_eos(tok, config.eos_ids) | dead

        def advance(c):
            c = kvc.gather_rows(c, rows)
            lg, c = common.decode_step(config.target, params, c, tok, row_len + t)
            return lg, c, s.target_calls + 1

        more = (t + 1 < N) & ~jnp.all(finished)
        logits, cache, calls = jax.lax.cond(more, advance,
                                            lambda c: (s.logits, c, s.target_calls), s.cache)
        return BeamState(step=t + 1, cache=cache, logits=logits, sequences=seqs, scores=scores,
                         finished=finished, target_calls=calls)

    s = loop(config, cond, body, state, step_progress(
        B, N, lambda s: jnp.all(s.finished.reshape(B, W), axis=-1)))
    sequences = s.sequences.reshape(B, W, N)
    lengths, best = common.best_and_lengths(sequences, s.scores, config.eos_ids)
    stats = dict(target_calls=s.target_calls, draft_calls=jnp.zeros((), jnp.int32),
                 iterations=s.step, generated_tokens=jnp.max(lengths, axis=-1))
    return GenerateOutput(sequences=sequences, lengths=lengths, log_likelihoods=s.scores,
                          best=best, stats=stats)


@decoder(_beam_sample_core)
def beam_sample(params, prompt_ids, key, config: BeamSampleConfig, prompt_lengths=None
                ) -> GenerateOutput:
    """Beam sampling of width ``W = config.num_beams`` from the warped joint (module doc).

    Args:
      params: the target's parameter tree (or ``{"target": tree}``).
      prompt_ids: ``[B, P]`` int, right-padded; ``prompt_lengths``: ``[B]`` (None: all full).
      key: one PRNG key (row b uses ``fold_in(key, b)``) or ``[B]`` keys (row b uses ``key[b]``);
        step t of row b uses ``fold_in(row_key, t)``.
      config: ``BeamSampleConfig`` (``num_beams``, warping, ``replacement``, EOS,
        ``max_new_tokens``).
    Returns:
      ``GenerateOutput``: sequences ``[B, W, N]`` in draw order (pad after EOS and for dead
      beams), log_likelihoods ``[B, W]`` unwarped (``-inf`` for dead beams), best = the most
      likely beam; stats ``target_calls``, ``draft_calls`` (0), ``iterations``,
      ``generated_tokens [B]`` (the longest beam's length).
    """
    return keyed_arguments("beam_sample", params, prompt_ids, key, config, prompt_lengths)


# ---------------------------------------------------------------------------------------------
@flax.struct.dataclass
class SearchState:
    step: jax.Array            # scalar int32
    cache: kvc.KVCache         # [L, B*W, S, K, D] running beams
    logits: jax.Array          # [B*W, V]
    running_seqs: jax.Array    # [B, W, N]
    running_scores: jax.Array  # [B, W] cumulative log-probs (HF -1e9 for empty)
    done_seqs: jax.Array       # [B, W, N] finished hypotheses, best first
    done_scores: jax.Array     # [B, W] length-penalised scores (-1e9 = empty slot)
    done_logprobs: jax.Array   # [B, W] their cumulative log-probs
    done_flags: jax.Array      # [B, W] bool: slot holds a finished hypothesis
    improvable: jax.Array      # [B] bool: HF's is_early_stop_heuristic_unsatisfied
    target_calls: jax.Array


def _beam_search_core(params, prompt_ids, prompt_lengths, length_penalty, stop_when_full,
                      best_at_max_length, config: BeamSearchConfig):
    B, P = prompt_ids.shape
    W, N = config.num_beams, config.max_new_tokens
    V = config.target.vocab_size
    pad = config.pad_id
    lp_exp = length_penalty  # scalar arrays: other settings reuse the compiled program
    n_eos = len(config.eos_ids)
    K = min(max(2, 1 + n_eos) * W, W * V)  # candidates kept per step (HF: beams_to_keep)
    cache, logits = common.prefill(config.target, params, prompt_ids, prompt_lengths, P + N)
    row_len = jnp.repeat(prompt_lengths, W)
    state = SearchState(
        step=jnp.zeros((), jnp.int32), cache=kvc.repeat_rows(cache, W),
        logits=jnp.repeat(logits, W, axis=0),
        running_seqs=jnp.full((B, W, N), pad, jnp.int32),
        running_scores=jnp.where(jnp.arange(W) == 0, 0.0, _HF_NEG)[None].repeat(B, 0),
        done_seqs=jnp.full((B, W, N), pad, jnp.int32),
        done_scores=jnp.full((B, W), _HF_NEG, jnp.float32),
        done_logprobs=jnp.full((B, W), _HF_NEG, jnp.float32),
        done_flags=jnp.zeros((B, W), bool), improvable=jnp.ones((B,), bool),
        target_calls=jnp.ones((), jnp.int32))

    def cond(s: SearchState):
        open_beam = ~(jnp.all(s.done_flags) & stop_when_full)
        return (s.step < N) & jnp.any(s.improvable) & open_beam

    def body(s: SearchState):
        t = s.step
        logp = jax.nn.log_softmax(s.logits, axis=-1).reshape(B, W, V)
        joint = joint_logprobs(s.running_scores, logp)  # [B, W*V]
        cand_lp, cand_idx = jax.lax.top_k(joint, K)     # sorted, best first
        cand_beam, cand_tok = split_flat(cand_idx, V)
        cand_seqs = common.take_rows(s.running_seqs, cand_beam).at[:, :, t].set(cand_tok)
        last = t + 1 >= N
        hits = common.is_eos(cand_tok, config.eos_ids) | last  # [B, K]
        # running beams for the next step: best W candidates that did not stop
        run_lp = cand_lp + jnp.where(hits, _HF_NEG, 0.0)
        _, nxt = jax.lax.top_k(run_lp, W)
        run_seqs = common.take_rows(cand_seqs, nxt)
        run_scores = common.take_rows(run_lp, nxt)
        run_beam = common.take_rows(cand_beam, nxt)
        run_tok = common.take_rows(cand_tok, nxt)
        # finished hypotheses: top-W candidates that stopped, merged with the old ones
        just_done = hits & (jnp.arange(K) < W)[None, :]
        gen_len = (t + 1).astype(jnp.float32)
        pen = cand_lp / gen_len ** lp_exp
        full = jnp.all(s.done_flags, axis=-1, keepdims=True) & stop_when_full
        pen = pen + jnp.where(full, _HF_NEG, 0.0) + jnp.where(s.improvable[:, None], 0.0, _HF_NEG)
        pen = pen + jnp.where(just_done, 0.0, _HF_NEG)
        m_scores = jnp.concatenate([s.done_scores, pen], axis=1)
        m_seqs = jnp.concatenate([s.done_seqs, cand_seqs], axis=1)
        m_lp = jnp.concatenate([s.done_logprobs, cand_lp], axis=1)
        m_flags = jnp.concatenate([s.done_flags, just_done], axis=1)
        done_scores, keep = jax.lax.top_k(m_scores, W)
        done_seqs, done_lp, done_flags = (common.take_rows(m_seqs, keep), common.take_rows(m_lp, keep),
                                          common.take_rows(m_flags, keep))
        # HF's early-stop heuristic, evaluated with cur_len - prompt_len = t + 1
        hyp_len = jnp.where(best_at_max_length, jnp.float32(N), gen_len)
        best_running = run_scores[:, 0] / hyp_len ** lp_exp
        worst_done = jnp.where(done_flags, jnp.min(done_scores, axis=-1, keepdims=True), _HF_NEG)
        improvable = s.improvable & jnp.any(best_running[:, None] > worst_done, axis=-1)

        def advance(c):
            rows = flat_rows(run_beam)
            c = kvc.gather_rows(c, rows)
            lg, c = common.decode_step(config.target, params, c, run_tok.reshape(-1), row_len + t)
            return lg, c, s.target_calls + 1

        nxt_state = SearchState(
            step=t + 1, cache=s.cache, logits=s.logits, running_seqs=run_seqs,
            running_scores=run_scores, done_seqs=done_seqs, done_scores=done_scores,
            done_logprobs=done_lp, done_flags=done_flags, improvable=improvable,
            target_calls=s.target_calls)
        more = cond(nxt_state)
        logits, cache, calls = jax.lax.cond(more, advance,
                                            lambda c: (s.logits, c, s.target_calls), s.cache)
        return nxt_state.replace(cache=cache, logits=logits, target_calls=calls)

    s = loop(config, cond, body, state, step_progress(B, N, lambda s: ~s.improvable | (
        jnp.all(s.done_flags, axis=-1) & stop_when_full)))
    lengths, _ = common.best_and_lengths(s.done_seqs, s.done_logprobs, config.eos_ids)
    stats = dict(target_calls=s.target_calls, draft_calls=jnp.zeros((), jnp.int32),
                 iterations=s.step, generated_tokens=jnp.max(lengths, axis=-1),
                 scores=s.done_scores)
    return GenerateOutput(sequences=s.done_seqs, lengths=lengths, log_likelihoods=s.done_logprobs,
                          best=jnp.zeros((B,), jnp.int32), stats=stats)


@decoder(_beam_search_core)
def beam_search(params, prompt_ids, config: BeamSearchConfig, prompt_lengths=None) -> GenerateOutput:
    """Deterministic beam search of width ``config.num_beams`` (Hugging Face semantics).

    Warping settings are ignored (the W best entries of the unwarped joint are kept).
    ``config.length_penalty`` and ``config.early_stopping`` (True, False or ``"never"``) act as in
    ``transformers`` ``generate(num_beams=W, do_sample=False)``.

    Returns:
      ``GenerateOutput`` with the W finished hypotheses sorted by final score (best first):
      sequences ``[B, W, N]`` (pad after EOS), log_likelihoods = their unpenalised target
      log-probs, ``best`` = 0 (the top hypothesis by score), ``stats["scores"] [B, W]`` = HF's
      ``sequences_scores`` (``sum_logprobs / generated_len ** length_penalty``), plus
      ``target_calls``, ``draft_calls`` (0), ``iterations`` and ``generated_tokens [B]``.
    """
    check_config("beam_search", config)
    prompt_ids = as_array(prompt_ids)
    check_inputs(params, prompt_ids, config, prompt_lengths)
    if not (isinstance(config.length_penalty, (int, float)) and
            np.isfinite(config.length_penalty)):
        raise ValueError(f"length_penalty must be a finite number, got {config.length_penalty!r}")
    if config.early_stopping not in (True, False, "never"):
        raise ValueError(f"early_stopping must be True, False or 'never', got "
                         f"{config.early_stopping!r}")
    lengths = common.prompt_lengths_or_full(prompt_ids, prompt_lengths)
    # length_penalty / early_stopping travel as arrays (no recompilation when they change)
    lp = float(config.length_penalty)
    stop_when_full = jnp.asarray(config.early_stopping is True)
    best_at_max = jnp.asarray(config.early_stopping == "never" and lp > 0.0)
    static = config.replace(length_penalty=1.0, early_stopping=False)
    return (target_params(params), jnp.asarray(prompt_ids, jnp.int32), lengths,
            jnp.float32(lp), stop_when_full, best_at_max), static
