"""The data a draft head trains on (:mod:`dsbd_jax.training.head`): the texts (a task's prompt
and the dataset's answer), the target's own rollouts, and one target pass over each that stores
its features and, where the loss counts, its warped next-token distribution."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.models.llama import causal_mask, convert_layout, forward


def texts_of(tokenizer, specs: List[Dict[str, Any]]) -> List[List[int]]:
    """Token ids of ``prompt (chat template) + the dataset's answer`` for each spec slice."""
    from dsbd_jax.eval.datasets import chat_prompt, load
    out = []
    for s in specs:
        if "task" not in s:
            raise ValueError(f"a text source is {{task, start, stop}}, got {s}")
        task, start, stop = s["task"], int(s.get("start", 0)), s.get("stop")
        field = {"gsm8k": "answer", "humaneval": "canonical_solution"}.get(task)
        if field is None:
            raise ValueError(f"head training texts come from gsm8k or humaneval, got {task!r}")
        records = load(task, None if stop is None else int(stop))[start:]
        for rec in records:
            messages = [{"role": "user", "content": chat_prompt(task, rec)},
                        {"role": "assistant", "content": rec[field]}]
            if getattr(tokenizer, "chat_template", None):
                ids = tokenizer.apply_chat_template(messages, tokenize=True)
                ids = list(ids["input_ids"] if hasattr(ids, "keys") else ids)
            else:
                ids = tokenizer.encode(messages[0]["content"] + "\n" + messages[1]["content"])
            out.append([int(t) for t in ids])
    return out


# ---------------------------------------------------------------------------------------------
# data: one target pass per text
def warped_topk(logits, cfg):
    """The warped distribution's ``store_k`` largest entries: ``(ids, probs)`` ``[..., k]``."""
    from dsbd_jax.decoding.warping import warp_logits
    lw = warp_logits(logits, cfg.temperature, cfg.top_k, cfg.top_p)
    vals, ids = jax.lax.top_k(lw, cfg.store_k)
    return ids.astype(jnp.int32), jnp.exp(vals)


def rollouts_of(target_config, target_params, tokenizer, specs, cfg, new_tokens: int,
                batch: int, max_prompt_tokens: Optional[int], key, progress: bool = True):
    """:func:`target_rollouts` of the prompts of ``specs`` (task slices, sent as the benchmarks
    send them: chat template), dropping those longer than ``max_prompt_tokens``."""
    from dsbd_jax.eval.datasets import encode_chat
    from dsbd_jax.training.recipe import cap_prompts, prompt_texts
    prompts = cap_prompts(encode_chat(tokenizer, prompt_texts(specs)), max_prompt_tokens)
    if not prompts:
        raise ValueError(f"no prompt of {specs} is at most max_prompt_tokens="
                         f"{max_prompt_tokens} tokens long")
    return target_rollouts(target_config, target_params, prompts, cfg, new_tokens, batch, key,
                           progress)


def target_rollouts(target_config, target_params, prompts, cfg, new_tokens: int, batch: int,
                    key, progress: bool = True):
    """The target's own continuations of ``prompts`` (token lists): ``new_tokens`` tokens
    sampled with the warping of ``cfg`` (a :class:`~dsbd_jax.training.head.HeadTrainConfig`),
    ``batch`` prompts at a time (one compiled program). Returns ``(texts, loss_from)``: prompt
    plus continuation, and the index of the position that predicts the first continuation token
    (the loss and the acceptance count from there)."""
    from dsbd_jax.decoding.common import DecodeConfig, bucket_length
    from dsbd_jax.training.rollouts import sampled_batches
    dc = DecodeConfig(target=target_config, max_new_tokens=new_tokens,
                      temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                      eos_token_id=target_config.eos_token_id)
    P = bucket_length(max(len(p) for p in prompts))
    texts, loss_from = [], []
    t0 = time.perf_counter()
    for i, n, chunk, _, seqs, clen in sampled_batches(target_params, prompts, dc, key, batch, P):
        for r in range(n):
            texts.append([int(t) for t in chunk[r]] + [int(t) for t in seqs[r, :clen[r]]])
            loss_from.append(len(chunk[r]) - 1)
        if progress:
            print(f"train-head: target rollouts {min(i + batch, len(prompts))}/{len(prompts)} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    return texts, loss_from


def prepare_data(target_config, target_params, texts: List[List[int]], feature_layers,
                 cfg, max_tokens: int, progress: bool = True,
                 loss_from: Optional[List[int]] = None) -> Dict[str, np.ndarray]:
    """The target's features and warped top-k for every text, from one pass each (float32
    features): ``tokens [n, T]``, ``lengths [n]``, ``feats [n, T, F]``; and at the ``N``
    positions whose predictions count (from ``loss_from[i]``, default 0, to the text's end):
    ``pos [n, N]`` (indices into ``T``), ``mask [n, N]`` and the target's ``ids`` / ``probs
    [n, N, k]``. Texts are cut to ``max_tokens``."""
    T = max(8, min(max_tokens, max(len(t) for t in texts)))
    texts = [t[:T] for t in texts]
    loss_from = [0] * len(texts) if loss_from is None else [min(int(f), T - 1) for f in loss_from]
    N = max(1, max(len(t) - 1 - f for t, f in zip(texts, loss_from)))
    params = target_params if not feature_layers else convert_layout(target_params, "per_layer")

    @jax.jit
    def one(params, tokens, length):
        tokens = tokens[None]
        pos = jnp.arange(T, dtype=jnp.int32)[None]
        logits, _, feats = forward(target_config, params, tokens, pos,
                                   causal_mask(length[None], T), None,
                                   feature_layers=tuple(feature_layers))
        ids, probs = warped_topk(logits[0], cfg)
        return feats[0], ids, probs

    n = len(texts)
    out = {"tokens": np.zeros((n, T), np.int32), "lengths": np.zeros((n,), np.int32),
           "pos": np.zeros((n, N), np.int32), "mask": np.zeros((n, N), bool)}
    t0 = time.perf_counter()
    for i, (t, f0) in enumerate(zip(texts, loss_from)):
        toks = np.zeros((T,), np.int32)
        toks[:len(t)] = t
        f, ids, probs = jax.device_get(one(params, jnp.asarray(toks), jnp.int32(len(t))))
        if i == 0:
            out["feats"] = np.zeros((n, T, f.shape[-1]), np.float32)
            out["ids"] = np.zeros((n, N, cfg.store_k), np.int32)
            out["probs"] = np.zeros((n, N, cfg.store_k), np.float32)
        j = f0 + np.arange(N)
        # position j predicts token j + 1: it counts where j + 1 < length
        out["mask"][i] = j < len(t) - 1
        out["pos"][i] = np.minimum(j, T - 1)
        out["tokens"][i], out["lengths"][i] = toks, len(t)
        out["feats"][i] = f
        out["ids"][i], out["probs"][i] = ids[out["pos"][i]], probs[out["pos"][i]]
        if progress and (i + 1) % max(1, n // 10) == 0:
            print(f"train-head: target passes {i + 1}/{n} ({time.perf_counter() - t0:.0f} s)",
                  flush=True)
    return out
