"""One interface over the two kinds of draft: a full draft model and a feature-level draft head
(:mod:`dsbd_jax.models.head`).

Every drafted decoder calls the draft through :func:`draft_forward` and prefills through
:func:`prefill_pair`. A full model ignores features; a head reads, with every token, the feature
of the position before it and returns its own guess of the next one. The decoders carry those
features beside their tokens: the roots of a draft (the pending token and the token before it)
read the target's features from the last target pass, deeper draft tokens the head's own.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dsbd_jax.models import cache as kvc
from dsbd_jax.models import head as mhead
from dsbd_jax.models.llama import causal_mask, forward


def uses_head(config) -> bool:
    """Whether ``config.draft`` is a draft head."""
    return mhead.is_head(getattr(config, "draft", None))


def feature_layers(config):
    """What the target's passes return for the draft: ``None`` for a full draft model, else the
    head's ``feature_layers`` (``()``: the final hidden state)."""
    return config.draft.feature_layers if uses_head(config) else None


def feature_size(config) -> int:
    """Size ``d`` of the features a decoder carries per token (0 for a full draft model)."""
    return config.draft.hidden_size if uses_head(config) else 0


def draft_forward(config, params, tokens, feats, positions, mask, cache, logits_at=None,
                  key_positions=None):
    """The draft over new tokens. ``params``: ``{"target": .., "draft": ..}``; ``feats``:
    ``[B, T, d]`` (ignored, may be ``None``, for a full model). Returns ``(logits, new
    keys/values, features [B, T, d] or None)``."""
    if uses_head(config):
        return mhead.forward(config.draft, params["draft"], params["target"], tokens, feats,
                             positions, mask, cache, logits_at=logits_at)
    logits, kv = forward(config.draft, params["draft"], tokens, positions, mask, cache,
                         logits_at=logits_at, key_positions=key_positions)
    return logits, kv, None


def target_forward(config, params, tokens, positions, mask, cache, key_positions=None):
    """The target's pass: ``(logits, new keys/values, features [B, T, d] or None)``; the features
    (mapped for the head, :func:`dsbd_jax.models.head.target_features`) only with a head."""
    fl = feature_layers(config)
    out = forward(config.target, params["target"], tokens, positions, mask, cache,
                  key_positions=key_positions, feature_layers=fl)
    if fl is None:
        return out[0], out[1], None
    return out[0], out[1], mhead.target_features(config.draft, params["draft"], out[2])


def prefill_pair(config, params, prompt_ids, prompt_lengths, target_slots: int,
                 draft_slots: int):
    """Prefill the target and the draft. Returns ``(target cache, draft cache, features)``:
    ``features [B, P, d]`` are the target's features of every prompt position for a head (the
    head's cache is filled from them), else ``None``."""
    from dsbd_jax.decoding import common
    if not uses_head(config):
        tcache, _ = common.prefill(config.target, params["target"], prompt_ids, prompt_lengths,
                                   target_slots)
        dcache, _ = common.prefill(config.draft, params["draft"], prompt_ids, prompt_lengths,
                                   draft_slots)
        return tcache, dcache, None
    tcache, _, raw = common.prefill(config.target, params["target"], prompt_ids, prompt_lengths,
                                    target_slots, feature_layers=feature_layers(config))
    feats = mhead.target_features(config.draft, params["draft"], raw)
    B, P = prompt_ids.shape
    positions = jnp.broadcast_to(jnp.arange(P, dtype=jnp.int32), (B, P))
    _, new, _ = mhead.forward(config.draft, params["draft"], params["target"], prompt_ids,
                              mhead.features_of_prompt(feats), positions,
                              causal_mask(prompt_lengths, P), None,
                              logits_at=jnp.zeros((B, 1), jnp.int32))
    dcache = kvc.write(kvc.empty_cache(config.draft, B, draft_slots), new,
                       jnp.zeros((B,), jnp.int32))
    return tcache, dcache, feats


def prompt_features(feats, prompt_lengths):
    """``(feature of prev, feature of pending)`` ``[B, d]`` each after a prefill: the target's
    features at positions ``len - 3`` and ``len - 2`` (zeros before the prompt)."""
    B = feats.shape[0]
    rows = jnp.arange(B)

    def at(i):
        return jnp.where((i >= 0)[:, None], feats[rows, jnp.maximum(i, 0)], 0.0)

    return at(prompt_lengths - 3), at(prompt_lengths - 2)


def empty_features(batch_shape) -> jax.Array:
    """The features a decoder carries with a full draft model: ``[..., 0]``."""
    return jnp.zeros(tuple(batch_shape) + (0,), jnp.float32)
