"""Distillation targets and divergences on **warped** distributions (DistillSpec, Zhou et al. 2024).

What is stored per position (:func:`target_topk`): the target's warped distribution (the
decoding's temperature / top-k / top-p, :func:`dsbd_jax.decoding.warping.warp_logits`) as its
``store_k`` largest entries, ``idx [.., k]`` int32 and ``p [.., k]`` float32 (zero where the
warping removed a token). With top-k warping at ``top_k <= store_k`` this is the whole warped
distribution (boundary ties kept by HF rules can add entries; ``dropped_mass`` reports what
fell outside, zero in that case).

Divergences (per position, :func:`divergence`), ``q`` the draft's distribution:

* ``"tv"``: total variation between the warped target and the **warped** draft,
  ``1 - sum_x min(p(x), q(x))``: one minus the speculative acceptance probability of a
  draft token at that position (only ``p``'s support contributes to the sum);
* ``"fkl"``: forward KL ``sum_x p(x) log(p(x) / q_T(x))`` with ``q_T`` the draft at the
  temperature only (the warped draft can be zero where ``p`` is not, making it infinite);
* ``"rkl"``: reverse KL ``KL(q_S || p)`` with ``q_S`` the draft at the temperature restricted to
  ``p``'s stored support and renormalised (outside it ``p`` is zero).

What each gradient can do (how much of it shows on the offline pair: ``benchmarks/probes/distill_losses.py``,
``docs/results/draft.md``): ``"tv"`` is the quantity acceptance is one minus, but its gradient passes
through the draft's warping. Top-k / top-p make the warped ``q`` constant outside the draft's
kept tokens, so nothing pushes ``q`` towards a token the target keeps and the draft cut, and
where the draft keeps one token (common at top-p 0.8) ``q`` is 1 whatever its logits: no
gradient at all. What gradient it
has raises kept tokens with no view of the top-p boundary. ``"fkl"`` compares the draft at the
temperature only, so every logit gets a gradient, and ``q_T = p`` minimises it, which also makes
the warped draft equal the warped target (``"rkl"`` sees only ``p``'s support). ``"tv"`` is sound
where the draft's warping keeps every token (temperature only).
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
