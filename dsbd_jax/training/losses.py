"""Distillation targets and divergences on **warped** distributions (DistillSpec, Zhou et al. 2024).

:func:`target_topk` stores the target's warped distribution (the decoding's temperature, top-k
and top-p) per position as its ``store_k`` largest entries (``idx``, ``p``; ``dropped_mass``
reports what fell outside). :func:`divergence` compares the draft's ``q`` with it: ``"tv"``
(one minus the speculative acceptance, against the warped draft), ``"fkl"`` (forward KL against
the draft at the temperature only, so every logit gets a gradient and ``q_T = p`` minimises it)
or ``"rkl"`` (reverse KL on ``p``'s stored support). ``"tv"`` is sound only where the draft's
warping keeps every token. What each gradient can and cannot do: ``docs/results/design_notes.md``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dsbd_jax.decoding.warping import warp_logits

DIVERGENCES = ("tv", "fkl", "rkl")


def target_topk(logits, temperature: float, top_k, top_p: float, store_k: int):
    """``(idx [.., k] int32, p [.., k] float32, dropped_mass [..])`` of the warped target."""
    logp = warp_logits(logits, temperature, top_k, top_p)
    k = min(store_k, logits.shape[-1])
    lp, idx = jax.lax.top_k(logp, k)
    p = jnp.exp(lp)
    return idx.astype(jnp.int32), p, jnp.maximum(1.0 - jnp.sum(p, -1), 0.0)


def divergence(kind: str, draft_logits, idx, p, temperature: float, top_k, top_p: float):
    """Per-position divergence ``[..]`` between the stored warped target (``idx``, ``p``) and
    the draft's logits ``[.., V]`` (module doc)."""
    if kind == "tv":
        q = jnp.exp(warp_logits(draft_logits, temperature, top_k, top_p))
        q_at = jnp.take_along_axis(q, idx, axis=-1)
        return 1.0 - jnp.sum(jnp.minimum(p, q_at), axis=-1)
    t = temperature if temperature > 0 else 1.0
    logq = jax.nn.log_softmax(draft_logits.astype(jnp.float32) / t, axis=-1)
    logq_at = jnp.take_along_axis(logq, idx, axis=-1)
    logp = jnp.log(jnp.maximum(p, 1e-30))
    live = p > 0
    if kind == "fkl":
        return jnp.sum(jnp.where(live, p * (logp - logq_at), 0.0), axis=-1)
    if kind == "rkl":
        logq_s = jnp.where(live, logq_at, -jnp.inf)
        logq_s = logq_s - jax.nn.logsumexp(logq_s, axis=-1, keepdims=True)
        return jnp.sum(jnp.where(live, jnp.exp(logq_s) * (logq_s - logp), 0.0), axis=-1)
    raise ValueError(f"divergence must be one of {DIVERGENCES}, got {kind!r}")
