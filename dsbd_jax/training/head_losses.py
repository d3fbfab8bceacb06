"""A draft head's training losses (:mod:`dsbd_jax.training.head`): the token KL to the target's
warped distribution, the feature regression, and the unrolled draft steps, each attending as a
draft forest does (``unrolled_mask``, ``unrolled_steps``; ``tests/training/test_head_unroll.py``).
``cfg`` is a :class:`~dsbd_jax.training.head.HeadTrainConfig`."""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from dsbd_jax.models import head as mhead
from dsbd_jax.models.llama import causal_mask


def _smooth_l1(x):
    a = jnp.abs(x)
    return jnp.where(a < 1.0, 0.5 * x * x, a - 0.5)


def unrolled_mask(query_pos: jax.Array, lengths: jax.Array, T: int, k: int) -> jax.Array:
    """The mask ``[B, M, T + (k - 1) * M + M]`` of unrolled step ``k + 1`` over its cache (the
    keys step 1 made from the target's features at every position ``0 .. T - 1``, then steps
    ``2 .. k``'s keys at the ``M`` query positions) and its own keys.

    ``query_pos [B, M]``: consecutive positions (negative or past ``lengths``: not a query).
    Step ``k + 1``'s query at ``j`` is the ``(k + 1)``-th draft token of a chain rooted at
    ``r = j - k``: while decoding it sees the target's keys up to the root (to ``j - 1`` for
    step 1), the chain's deeper tokens (step ``s``'s key at ``r + s - 1``) and itself. A padding
    query sees itself only."""
    M = query_pos.shape[1]
    q = query_pos[:, :, None]
    live = (q >= 0) & (q < lengths[:, None, None])                         # [B, M, 1]
    i = jnp.arange(T)[None, None, :]
    blocks = [live & (i <= q - max(k, 1)) & (i < lengths[:, None, None])]
    g, m = jnp.arange(M)[None, :], jnp.arange(M)[:, None]
    blocks += [live & (g == m - k + s - 1)[None] for s in range(2, k + 1)]
    blocks.append(jnp.broadcast_to(jnp.eye(M, dtype=bool)[None], live.shape[:2] + (M,)))
    return jnp.concatenate(blocks, axis=-1)


def unrolled_steps(hc: mhead.HeadConfig, params, target_params, batch, unroll: int,
                   context: str = "target"):
    """The head's logits and outputs at the counted positions ``batch["pos"] [B, N]`` for each
    of ``unroll`` steps: ``[(logits [B, N, V], out [B, N, d]), ...]``.

    ``context="target"``: step ``k + 1`` attends as a depth-``k + 1`` draft token does
    (:func:`unrolled_mask`). The head runs its whole block only at the ``N + unroll - 1``
    positions that end at the counted ones; elsewhere it makes step 1's keys alone (the rest of
    that pass is never read, and XLA drops it). ``"own"``: every step runs over all ``T``
    positions, step ``k + 1`` over the head's step-``k`` outputs alone."""
    from dsbd_jax.models.cache import KVCache
    tokens = batch["tokens"]
    B, T = tokens.shape
    at = batch["pos"]
    N = at.shape[1]
    pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    tfeat = mhead.target_features(hc, params, batch["feats"])             # [B, T, d]
    feats = mhead.features_of_prompt(tfeat)
    steps = []
    if context == "own":
        mask = causal_mask(batch["lengths"], T)
        for _ in range(unroll):
            logits, _, out = mhead.forward(hc, params, target_params, tokens, feats, pos, mask,
                                           logits_at=at)
            steps.append((logits, jnp.take_along_axis(out, at[..., None], axis=1)))
            feats = mhead.features_of_prompt(out)
        return steps
    # step 1's keys at every position (only the keys are read: the rest is dead code)
    _, kv1, _ = mhead.forward(hc, params, target_params, tokens, feats, pos,
                              causal_mask(batch["lengths"], T))
    M = N + unroll - 1
    q = at[:, :1] - (unroll - 1) + jnp.arange(M, dtype=jnp.int32)[None]     # [B, M]
    qc = jnp.clip(q, 0, T - 1)
    q_tokens = jnp.take_along_axis(tokens, qc, axis=1)
    f = jnp.take_along_axis(feats, qc[..., None], axis=1)
    counted = jnp.broadcast_to(jnp.arange(unroll - 1, M, dtype=jnp.int32)[None], (B, N))
    keys, values = [kv1.k], [kv1.v]
    for k in range(unroll):
        cache = KVCache(jnp.concatenate(keys, axis=2), jnp.concatenate(values, axis=2))
        logits, kv, out = mhead.forward(hc, params, target_params, q_tokens, f, qc,
                                        unrolled_mask(q, batch["lengths"], T, k), cache,
                                        logits_at=counted)
        steps.append((logits, out[:, unroll - 1:]))
        if k > 0:   # step 1's keys are in the cache already, at every position
            keys.append(kv.k)
            values.append(kv.v)
        f = mhead.features_of_prompt(out)   # query m reads step k's output at m - 1
    return steps


def head_losses(hc: mhead.HeadConfig, params, target_params, batch, cfg,
                context: Optional[str] = None):
    """``(total, metrics)`` over a batch (module doc): tokens, lengths, feats, ids, probs
    (``[B, T, ...]``); ``context``: how unrolled steps attend (default ``cfg.unroll_context``)."""
    from dsbd_jax.decoding.warping import warp_logits
    at = batch["pos"]                                  # [B, N]: the positions that count
    valid = batch["mask"].astype(jnp.float32)
    n = jnp.maximum(jnp.sum(valid), 1.0)
    tfeat_at = jnp.take_along_axis(mhead.target_features(hc, params, batch["feats"]),
                                   at[..., None], axis=1)
    total = 0.0
    metrics = {}
    p = batch["probs"]
    steps = unrolled_steps(hc, params, target_params, batch, cfg.unroll,
                           context or cfg.unroll_context)
    for k, (logits, out_at) in enumerate(steps):
        logq = jax.nn.log_softmax(logits, axis=-1)
        logq_t = jnp.maximum(jnp.take_along_axis(logq, batch["ids"], axis=-1), -30.0)
        kl = jnp.sum(p * (jnp.log(jnp.maximum(p, 1e-30)) - logq_t), axis=-1)
        kl = jnp.sum(kl * valid) / n
        loss = kl
        if not hc.feature_layers and cfg.feature_weight:
            fl = jnp.sum(jnp.mean(_smooth_l1(out_at - tfeat_at), axis=-1) * valid) / n
            loss = loss + cfg.feature_weight * fl
            metrics[f"feature_{k + 1}"] = fl
        lw = warp_logits(logits, cfg.temperature, cfg.top_k, cfg.top_p)
        qw = jnp.take_along_axis(jnp.exp(lw), batch["ids"], axis=-1)
        acc = jnp.sum(jnp.sum(jnp.minimum(p, qw), axis=-1) * valid) / n
        metrics[f"kl_{k + 1}"] = kl
        metrics[f"acceptance_{k + 1}"] = acc
        total = total + loss
    metrics["loss"] = total
    return total, metrics


# ---------------------------------------------------------------------------------------------
