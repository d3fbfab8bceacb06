"""Pieces shared by every decoder: the output type, prompt batches, prefill, one-token steps
and EOS handling.

Prompts are right-padded ``prompt_ids [B, P]`` with ``prompt_lengths [B]`` (each >= 1); a token at
cache slot ``s`` has RoPE position ``s``, so masks follow from the lengths alone, and
``pad_prompts`` pads to a length bucket so one bucket shares one program. A row that emitted EOS
is finished and keeps emitting pad at log-probability 0 (absorbing), so shapes stay fixed;
``lengths`` counts new tokens up to and including the EOS.
"""

from __future__ import annotations

import logging
from typing import Dict, Optional, Sequence, Tuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.decoding.configs import eos_tuple
from dsbd_jax.models import cache as kvc
from dsbd_jax.models.config import ModelConfig
from dsbd_jax.models.llama import forward

logger = logging.getLogger("dsbd_jax")


def note_trace(name: str, **shapes) -> None:
    """Log (DEBUG) that decoder ``name`` is being traced for ``shapes``; the INFO line comes
    with the compilation itself (``compiles.py``)."""
    logger.debug("tracing %s for %s", name, shapes)


# ---------------------------------------------------------------------------------------------
@flax.struct.dataclass
class GenerateOutput:
    """What every decoder returns.

    Attributes:
        sequences:       [B, W, N] int32 new tokens (``pad_token_id`` after EOS / past lengths)
        lengths:         [B, W] int32 new tokens up to and including EOS (N if none)
        log_likelihoods: [B, W] float32 unwarped target log p(new tokens | prompt)
        best:            [B] int32 index of the beam with the highest log-likelihood
        stats:           dict of arrays: ``target_calls``, ``draft_calls``, ``iterations`` (scalars
                         for the whole batch), ``generated_tokens`` ([B]) and method-specific ones.
        invalid:         [B] bool, True for a prompt that failed a value check inside a jit (ids
                         outside the vocabulary, length outside ``[1, P]``): its beams are empty
                         (sequences pad, lengths 0, log-likelihoods -inf, best 0,
                         ``generated_tokens`` 0). A direct call raises instead (see README).
    """

    sequences: jax.Array
    lengths: jax.Array
    log_likelihoods: jax.Array
    best: jax.Array
    stats: Dict[str, jax.Array]
    invalid: Optional[jax.Array] = None


def bucket_length(n: int, minimum: int = 16, maximum: Optional[int] = None) -> int:
    """The padded length for a prompt of ``n`` tokens: the next power of two >= minimum, but
    never more than ``maximum`` (the longest padded prompt the models allow, see
    :func:`max_prompt_length`) when ``n`` itself fits. ``ValueError`` if ``n > maximum``."""
    if maximum is not None and n > maximum:
        raise ValueError(f"prompt too long: {n} tokens, but at most {maximum} fit (the models' "
                         f"max_position_embeddings minus max_new_tokens and the look-ahead)")
    b = minimum
    while b < n:
        b *= 2
    return b if maximum is None else min(b, maximum)


def max_prompt_length(config) -> int:
    """The longest (padded) prompt a decoder with ``config`` (any decoder's config,
    :mod:`dsbd_jax.decoding.configs`) accepts: the smallest ``max_position_embeddings`` of its models minus
    ``max_new_tokens`` and, for the speculative methods (those with a draft), the ``gamma + 1``
    positions of the look-ahead; what :func:`check_positions` enforces."""
    draft = getattr(config, "draft", None)
    models = [config.target] + ([draft] if draft is not None else [])
    lookahead = config.gamma + 1 if draft is not None else 0
    return min(m.max_position_embeddings for m in models) - config.max_new_tokens - lookahead


def pad_prompts(prompts: Sequence[Sequence[int]], pad_id: int = 0, length: Optional[int] = None,
                max_length: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Right-pad token lists to ``length`` (default: the bucket of the longest, capped at
    ``max_length``; pass ``max_prompt_length(config)`` so a prompt that fits is never padded
    past what the models allow).

    Returns ``(prompt_ids [B, P] int32, prompt_lengths [B] int32)``.
    """
    if len(prompts) == 0:
        raise ValueError("pad_prompts needs at least one prompt")
    lens = [len(p) for p in prompts]
    if min(lens) < 1:
        raise ValueError("every prompt needs at least one token")
    P = bucket_length(max(lens), maximum=max_length) if length is None else length
    if P < max(lens):
        raise ValueError(f"length {P} is shorter than the longest prompt ({max(lens)} tokens)")
    ids = np.full((len(prompts), P), pad_id, np.int32)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = np.asarray(p, np.int32)
    return ids, np.asarray(lens, np.int32)


def prompt_lengths_or_full(prompt_ids, prompt_lengths) -> jax.Array:
    """``prompt_lengths`` as an int32 array, or every row full length if it is None."""
    B, P = prompt_ids.shape
    if prompt_lengths is None:
        return jnp.full((B,), P, jnp.int32)
    return jnp.asarray(prompt_lengths, jnp.int32)


# The value checks' messages: raised on the host by a direct call, and by ``checkify`` (same
# text) inside a user's jit (``guard_prompts``).
LENGTHS_MSG = "prompt_lengths must be in [1, {}], got range [{}, {}]"
IDS_MSG = "prompt token ids must be in [0, {}), got range [{}, {}]"


def check_prompt_lengths(prompt_ids, prompt_lengths) -> None:
    """Host-side check (call outside jit, where the values are concrete)."""
    if prompt_ids.ndim != 2:
        raise ValueError(f"prompt_ids must be [batch, length], got shape {tuple(prompt_ids.shape)}")
    if prompt_lengths is None or isinstance(prompt_lengths, jax.core.Tracer):
        return
    lens = np.asarray(prompt_lengths)
    if lens.shape != (prompt_ids.shape[0],):
        raise ValueError(f"prompt_lengths must have shape [{prompt_ids.shape[0]}], got {lens.shape}")
    if lens.min() < 1 or lens.max() > prompt_ids.shape[1]:
        raise ValueError(LENGTHS_MSG.format(prompt_ids.shape[1], lens.min(), lens.max()))


# ---------------------------------------------------------------------------------------------
# On the CPU, a float32 model's prompt pass over a bucket longer than this runs in chunks of
# this many tokens, up to the longest prompt of the batch (a loop with a traced trip count: one
# program per bucket), so a 158-token prompt in the 256 bucket costs 160 rows of products, not
# 256. Where products are flat in rows (16-bit and int8 kernels on the CPU, accelerators) one
# pass over the bucket is faster (results/prefill_*.json).
PREFILL_CHUNK = 32


def prefill_chunk(config: ModelConfig, params) -> int:
    """The prompt pass's chunk for a model: ``PREFILL_CHUNK`` for float32 kernels on the CPU,
    whose products cost in proportion to their rows; ``0`` (one pass) elsewhere."""
    from dsbd_jax.models.kinds import is_int8
    float32 = jnp.dtype(config.jnp_dtype) == jnp.float32 and not is_int8(params)
    return PREFILL_CHUNK if float32 and jax.default_backend() == "cpu" else 0


@jax.named_scope("prefill")
def prefill(config: ModelConfig, params, prompt_ids, prompt_lengths, slots: int,
            feature_layers=None, chunk: Optional[int] = None):
    """Run the prompts once. Returns ``(cache [L, B, slots, K, D], last_logits [B, V])``, and
    with ``feature_layers`` (a draft head's, :mod:`dsbd_jax.models.head`) the target's features
    of every prompt position ``[B, P, F]`` as a third element.

    Slots ``0 .. len-1`` of each row hold the prompt. A bucket ``P`` over ``chunk`` (that
    ``chunk`` divides; ``None``: :func:`prefill_chunk`) runs in chunks up to the batch's longest
    prompt (:func:`_chunked`); ``0`` runs the bucket in one pass.
    """
    B, P = prompt_ids.shape
    if chunk is None:
        chunk = prefill_chunk(config, params)
    if slots < P:
        raise ValueError(f"cache of {slots} slots cannot hold a prompt of {P} tokens")
    if chunk and P > chunk and P % chunk == 0:
        return _chunked(config, params, prompt_ids, prompt_lengths, slots, feature_layers, chunk)
    from dsbd_jax.models.llama import causal_mask
    positions = jnp.broadcast_to(jnp.arange(P, dtype=jnp.int32), (B, P))
    mask = causal_mask(prompt_lengths, P)
    out = forward(config, params, prompt_ids, positions, mask, None,
                  logits_at=(prompt_lengths - 1)[:, None], feature_layers=feature_layers)
    cache = kvc.empty_cache(config, B, slots)
    cache = kvc.write(cache, out[1], jnp.zeros((B,), jnp.int32))
    return (cache, out[0][:, 0]) + tuple(out[2:])


def _chunked(config: ModelConfig, params, prompt_ids, prompt_lengths, slots: int,
             feature_layers, chunk: int):
    """:func:`prefill` in chunks of ``chunk`` tokens: chunk ``k`` attends to the cache slots
    before it and causally within itself, writes its keys and values at slot ``k * chunk``;
    the loop stops after the chunk holding the longest prompt's last token. Every row's logits
    come from the chunk holding its last token."""
    B, P = prompt_ids.shape
    lengths = jnp.asarray(prompt_lengths, jnp.int32)
    trips = (jnp.max(lengths) + chunk - 1) // chunk
    j = jnp.arange(chunk, dtype=jnp.int32)
    within = j[None, :] <= j[:, None]                                        # [C, C]
    last = lengths - 1

    def body(k, carry):
        cache, logits, feats = carry
        start = k * chunk
        tokens = jax.lax.dynamic_slice_in_dim(prompt_ids, start, chunk, axis=1)
        positions = jnp.broadcast_to(start + j, (B, chunk))
        seen = (jnp.arange(slots)[None, :] < jnp.minimum(start, lengths)[:, None])  # [B, S]
        new_ok = within[None] & ((start + j)[None, None, :] < lengths[:, None, None])
        mask = jnp.concatenate([jnp.broadcast_to(seen[:, None, :], (B, chunk, slots)),
                                new_ok], axis=-1)
        at = jnp.clip(last - start, 0, chunk - 1)[:, None]
        out = forward(config, params, tokens, positions, mask, cache, logits_at=at,
                      feature_layers=feature_layers)
        cache = kvc.write(cache, out[1], jnp.full((B,), start, jnp.int32))
        here = (last >= start) & (last < start + chunk)
        logits = jnp.where(here[:, None], out[0][:, 0], logits)
        if feature_layers is not None:
            feats = jax.lax.dynamic_update_slice_in_dim(feats, out[2].astype(feats.dtype),
                                                        start, axis=1)
        return cache, logits, feats

    # the carries' shapes from one chunk's abstract pass (no computation)
    probe = jax.eval_shape(lambda: forward(
        config, params, prompt_ids[:, :chunk], jnp.zeros((B, chunk), jnp.int32),
        jnp.ones((B, chunk, slots + chunk), bool), kvc.empty_cache(config, B, slots),
        logits_at=jnp.zeros((B, 1), jnp.int32), feature_layers=feature_layers))
    logits = jnp.zeros(probe[0].shape[:1] + probe[0].shape[2:], probe[0].dtype)
    feats = (jnp.zeros((B, P) + probe[2].shape[2:], probe[2].dtype)
             if feature_layers is not None else jnp.zeros((), jnp.float32))
    cache, logits, feats = jax.lax.fori_loop(
        0, trips, body, (kvc.empty_cache(config, B, slots), logits, feats))
    return (cache, logits) + ((feats,) if feature_layers is not None else ())


def decode_step(config: ModelConfig, params, cache: kvc.KVCache, tokens, lengths,
                feature_layers=None):
    """Feed one token per row at slot ``lengths[r]``; returns ``(logits [R, V], cache)``, and
    the token's features ``[R, F]`` third with ``feature_layers`` (as
    :func:`dsbd_jax.models.llama.forward`'s).

    ``lengths`` is the number of filled slots before this token (the token's position).
    """
    R = tokens.shape[0]
    S = cache.num_slots
    slot_ok = jnp.arange(S)[None, :] < lengths[:, None]
    mask = jnp.concatenate([slot_ok, jnp.ones((R, 1), bool)], axis=-1)[:, None, :]
    out = forward(config, params, tokens[:, None], lengths[:, None], mask, cache,
                  feature_layers=feature_layers)
    step = (out[0][:, 0], kvc.write(cache, out[1], lengths))
    return step if feature_layers is None else step + (out[2][:, 0],)


# ---------------------------------------------------------------------------------------------
def eos_array(eos_token_id) -> jax.Array:
    ids = eos_tuple(eos_token_id)
    return jnp.asarray(ids if ids else (-1,), jnp.int32)


def is_eos(tokens, eos_token_id) -> jax.Array:
    """Boolean array: tokens that are one of the EOS ids (never true if there is none)."""
    return jnp.any(tokens[..., None] == eos_array(eos_token_id), axis=-1)


def absorb_finished(logprobs: jax.Array, finished: jax.Array, pad_token_id: int) -> jax.Array:
    """Finished rows become a point mass on ``pad_token_id`` (log-prob 0): ``[..., V]``."""
    V = logprobs.shape[-1]
    point = jnp.where(jnp.arange(V) == pad_token_id, 0.0, -jnp.inf)
    return jnp.where(finished[..., None], point, logprobs)


def best_and_lengths(sequences, log_likelihoods, eos_token_id):
    """``lengths [B, W]`` (up to and including the first EOS) and ``best [B]``."""
    N = sequences.shape[-1]
    eos = is_eos(sequences, eos_token_id)
    first = jnp.argmax(eos, axis=-1)
    lengths = jnp.where(jnp.any(eos, axis=-1), first + 1, N).astype(jnp.int32)
    best = jnp.argmax(log_likelihoods, axis=-1).astype(jnp.int32)
    return lengths, best


def take_rows(x: jax.Array, idx: jax.Array) -> jax.Array:
    """Per-row gather: ``x [B, K, ...]``, ``idx [B, J, ...]`` -> ``[B, J, ...]`` (``x[b][idx[b]]``)."""
    return jax.vmap(lambda a, i: a[i])(x, idx)
