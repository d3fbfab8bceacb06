"""DSBD's loop state, its statistics and its outputs (module ``generate`` runs the loop).

``DSBDState`` is what the next iteration reads: the per-beam caches, the beams, their scores and
pending tokens, per prompt; ``DSBDStats`` is what the iterations counted, read only by
``to_output``. Both are plain pytrees with the batch as their leading axis (the per-layer sums
are over the batch). Flattened, the state's leaves keep one order: the loop's program depends
on it.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from dsbd_jax.decoding import common, drafting
from dsbd_jax.decoding._jit import inputs
from dsbd_jax.decoding.common import GenerateOutput
from dsbd_jax.decoding.configs import DSBDConfig
from dsbd_jax.decoding.dsbd.forest import Layout
from dsbd_jax.models.cache import KVCache

NEG_INF = -jnp.inf


def num_slots(config: DSBDConfig, prompt_len: int) -> int:
    """Cache slots per beam: prompt + max_new_tokens + gamma + 1."""
    return prompt_len + config.max_new_tokens + config.gamma + 1


def layout(config: DSBDConfig, prompt_len: int) -> Layout:
    return Layout(Wc=config.cache_rows, C=config.layer_width, G=config.gamma,
                  S=num_slots(config, prompt_len), V=config.target.vocab_size)


@flax.struct.dataclass
class DSBDStats:
    """What the iterations counted (``G = gamma``; ``[gamma]`` sums run over prompts)."""

    step_widths: jax.Array       # [B, N] beams at each generated step
    depth_hist: jax.Array        # [B, G + 2] full-budget iterations by the depth they reached
    accepted_layers: jax.Array   # [B] verified layers that passed
    layer_verified: jax.Array    # [G]
    layer_passed: jax.Array      # [G]
    layer_width: jax.Array       # [G] sum of W_L
    layer_candidates: jax.Array  # [G]
    layer_accepted: jax.Array    # [G]
    iterations: jax.Array        # loop trips
    target_calls: jax.Array      # target passes after the prefills
    draft_calls: jax.Array       # draft passes after the prefills


@flax.struct.dataclass
class DSBDState:
    """Decode state between iterations (B prompts, W = max_width, N = max_new_tokens)."""

    target_cache: KVCache   # [L, B, Wc * S, K, D]
    draft_cache: KVCache    # [L, B, Wc * S + Td, K, D]
    keys: jax.Array         # [B] row keys
    row_iter: jax.Array     # [B] the prompt's iterations (its random numbers' index)
    generated: jax.Array    # [B] new tokens so far (same for every beam of a prompt)
    done: jax.Array         # [B]
    anchor: jax.Array       # [B] single-beam mode: the beam whose path is in cache row 0
    sequences: jax.Array    # [B, W, N]
    scores: jax.Array       # [B, W] unwarped target log-likelihoods (-inf: dead / unused)
    finished: jax.Array     # [B, W]
    live: jax.Array         # [B, W]
    pending: jax.Array      # [B, W] last token (slot base), not yet run through the models
    prev: jax.Array         # [B, W] token at slot base - 1
    stats: DSBDStats        # here, so that the leaves keep the loop's order
    feat: jax.Array         # [B, W, 2, d] a draft head's features read with prev, pending


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
        stats=DSBDStats(
            step_widths=jnp.zeros((B, N), jnp.int32), depth_hist=jnp.zeros((B, G + 2), jnp.int32),
            accepted_layers=zi, layer_verified=zg, layer_passed=zg, layer_width=zg,
            layer_candidates=zg, layer_accepted=zg, iterations=jnp.int32(0),
            target_calls=jnp.int32(0), draft_calls=jnp.int32(0)),
        feat=feat)


def to_output(config: DSBDConfig, state: DSBDState) -> GenerateOutput:
    """The beams of the last iteration and the statistics (``dsbd_generate``'s doc)."""
    st = state.stats
    loglik = jnp.where(state.live, state.scores, NEG_INF)
    lengths, best = common.best_and_lengths(state.sequences, loglik, config.eos_ids)
    lengths = jnp.where(state.live, lengths, 0)
    f = lambda x: x.astype(jnp.float32)  # noqa: E731
    ratio = lambda a, b: f(a) / jnp.maximum(f(b), 1.0)  # noqa: E731
    stats = dict(
        iterations=st.iterations, target_calls=st.target_calls,
        draft_calls=st.draft_calls, generated_tokens=state.generated,
        row_iterations=state.row_iter, accepted_layers=st.accepted_layers,
        mean_layers_per_iteration=ratio(state.generated, state.row_iter),
        mean_accepted_layers=ratio(st.accepted_layers, state.row_iter),
        depth_hist=st.depth_hist, step_widths=st.step_widths,
        layer_verified=st.layer_verified, layer_passed=st.layer_passed,
        layer_candidates=st.layer_candidates, layer_accepted=st.layer_accepted,
        layer_width_sum=st.layer_width,
        layer_acceptance_rate=ratio(st.layer_passed, st.layer_verified),
        candidate_acceptance_rate=ratio(st.layer_accepted, st.layer_candidates),
        mean_layer_width=ratio(st.layer_width, st.layer_verified),
        mean_accepted_width=ratio(jnp.sum(st.layer_accepted), jnp.sum(st.layer_verified)),
        num_beams_out=jnp.sum(state.live, axis=1).astype(jnp.int32))
    return GenerateOutput(sequences=state.sequences, lengths=lengths, log_likelihoods=loglik,
                          best=best, stats=stats)
