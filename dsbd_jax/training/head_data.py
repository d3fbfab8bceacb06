"""The data a draft head trains on (:mod:`dsbd_jax.training.head`): the texts (a task's prompt
and the dataset's answer), the target's own rollouts, and one target pass over each that stores
its features and, where the loss counts, its warped next-token distribution."""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.models.llama import causal_mask, convert_layout, forward
from dsbd_jax.training import rollouts as rollouts_mod

logger = logging.getLogger("dsbd_jax")


def texts_of(tokenizer, specs: List[Dict[str, Any]]) -> List[List[int]]:
    """Token ids of ``prompt (chat template) + the dataset's answer`` for each spec slice."""
    return answer_texts(tokenizer, specs)[0]


def answer_texts(tokenizer, specs: List[Dict[str, Any]]):
    """``(texts, answer_from)``: :func:`texts_of`'s token ids, and for each the index of the
    position that predicts the answer's first token (the prompt's last position: where a loss
    over the answer alone starts)."""
    from dsbd_jax.eval.datasets import chat_prompt, encode_chat, load
    texts, answer_from = [], []
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
                prompt = encode_chat(tokenizer, [messages[0]["content"]])[0]
            else:
                ids = tokenizer.encode(messages[0]["content"] + "\n" + messages[1]["content"])
                prompt = tokenizer.encode(messages[0]["content"] + "\n")
            n = len(prompt) if list(ids[:len(prompt)]) == list(prompt) else 1
            texts.append([int(t) for t in ids])
            answer_from.append(max(0, min(n, len(ids)) - 1))
    return texts, answer_from


# ---------------------------------------------------------------------------------------------
# data: one target pass per text
def warped_topk(logits, cfg):
    """The warped distribution's ``store_k`` largest entries: ``(ids, probs)`` ``[..., k]``."""
    from dsbd_jax.decoding.warping import warp_logits
    lw = warp_logits(logits, cfg.temperature, cfg.top_k, cfg.top_p)
    vals, ids = jax.lax.top_k(lw, cfg.store_k)
    return ids.astype(jnp.int32), jnp.exp(vals)


def rollout_prompts(tokenizer, specs, max_prompt_tokens: Optional[int]) -> List[List[int]]:
    """The encoded prompts of ``specs`` (task slices, sent as the benchmarks send them: chat
    template), without those longer than ``max_prompt_tokens``."""
    from dsbd_jax.eval.datasets import encode_chat
    from dsbd_jax.training.recipe import cap_prompts, prompt_texts
    prompts = cap_prompts(encode_chat(tokenizer, prompt_texts(specs)), max_prompt_tokens)
    if not prompts:
        raise ValueError(f"no prompt of {specs} is at most max_prompt_tokens="
                         f"{max_prompt_tokens} tokens long")
    return prompts


def rollouts_of(target_config, target_params, tokenizer, specs, cfg, new_tokens: int,
                batch: int, max_prompt_tokens: Optional[int], key, progress: bool = True):
    """:func:`target_rollouts` of the prompts of ``specs`` (:func:`rollout_prompts`)."""
    prompts = rollout_prompts(tokenizer, specs, max_prompt_tokens)
    return target_rollouts(target_config, target_params, prompts, cfg, new_tokens, batch, key,
                           progress)


def target_rollouts(target_config, target_params, prompts, cfg, new_tokens: int, batch: int,
                    key, progress: bool = True, store=None):
    """The target's own continuations of ``prompts`` (token lists): ``new_tokens`` tokens
    sampled with the warping of ``cfg`` (a :class:`~dsbd_jax.training.head.HeadTrainConfig`),
    ``batch`` prompts at a time (one compiled program). Returns ``(texts, loss_from)``: prompt
    plus continuation, and the index of the position that predicts the first continuation token
    (the loss and the acceptance count from there). ``store``: a
    :class:`~dsbd_jax.training.rollouts.BatchStore` keeping every finished batch (a stopped run
    samples only the batches it lacks)."""
    from dsbd_jax.decoding.common import bucket_length
    from dsbd_jax.decoding.configs import SampleConfig
    from dsbd_jax.training.rollouts import BatchStore, batch_line, sampled_batches
    store = store if store is not None else BatchStore(None, "", "rollouts")
    dc = SampleConfig(target_config, max_new_tokens=new_tokens,
                      temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                      eos_token_id=target_config.eos_token_id)
    P = bucket_length(max(len(p) for p in prompts))
    done = {i: got for i in range(0, len(prompts), batch)
            for got in [store.get(f"{i:06d}")] if got is not None}
    if progress:
        _start_line(len(prompts), batch, new_tokens, len(done), store)
    t0 = time.perf_counter()
    beat = (lambda i, s: batch_line("target rollouts", i, batch, len(prompts), batch,
                                    new_tokens)(s)) if progress else None
    for i, n, chunk, _, seqs, clen in sampled_batches(target_params, prompts, dc, key, batch, P,
                                                      skip=done, heartbeat=beat):
        rows = [list(chunk[r]) + [int(t) for t in seqs[r, :clen[r]]] for r in range(n)]
        done[i] = {"tokens": np.array(sum(rows, []), np.int32),
                   "lengths": np.array([len(t) for t in rows], np.int32),
                   "loss_from": np.array([len(chunk[r]) - 1 for r in range(n)], np.int32)}
        store.put(f"{i:06d}", done[i])
        if progress:
            print(f"train-head: target rollouts {min(i + batch, len(prompts))}/{len(prompts)} "
                  f"({time.perf_counter() - t0:.0f} s)", flush=True)
    texts, loss_from = [], []
    for i in sorted(done):
        ends = np.cumsum(done[i]["lengths"])
        texts += [[int(t) for t in row] for row in np.split(done[i]["tokens"], ends[:-1])]
        loss_from += [int(f) for f in done[i]["loss_from"]]
    return texts, loss_from


def prepare_data(target_config, target_params, texts: List[List[int]], feature_layers,
                 cfg, max_tokens: int, progress: bool = True,
                 loss_from: Optional[List[int]] = None, store=None) -> Dict[str, np.ndarray]:
    """The target's features and warped top-k for every text, from one pass each (float32
    features): ``tokens [n, T]``, ``lengths [n]``, ``feats [n, T, F]``; and at the ``N``
    positions whose predictions count (from ``loss_from[i]``, default 0, to the text's end):
    ``pos [n, N]`` (indices into ``T``), ``mask [n, N]`` and the target's ``ids`` / ``probs
    [n, N, k]``. Texts are cut to ``max_tokens``. ``store``: a
    :class:`~dsbd_jax.training.rollouts.BatchStore` keeping every finished group of
    ``PASS_GROUP`` texts (a stopped run scores only the groups it lacks)."""
    from dsbd_jax.training.rollouts import BatchStore, ready
    store = store if store is not None else BatchStore(None, "", "target passes")
    T = max(8, min(max_tokens, max(len(t) for t in texts)))
    texts = [t[:T] for t in texts]
    loss_from = [0] * len(texts) if loss_from is None else [min(int(f), T - 1) for f in loss_from]
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
    rows = []
    t0 = time.perf_counter()
    read = 0
    for g in range(0, n, PASS_GROUP):
        got = store.get(f"{g:06d}")
        if got is None:
            got = {}
            for j, (t, f0) in enumerate(zip(texts[g:g + PASS_GROUP],
                                            loss_from[g:g + PASS_GROUP])):
                toks = np.zeros((T,), np.int32)
                toks[:len(t)] = t
                f, ids, probs = ready(one, params, jnp.asarray(toks), jnp.int32(len(t)))
                # position j predicts token j + 1: the counted positions are f0 .. len - 2
                c = slice(f0, max(f0, len(t) - 1))
                for k, v in (("feats", f[:len(t)]), ("ids", ids[c]), ("probs", probs[c])):
                    got[f"{k}_{j}"] = v
            store.put(f"{g:06d}", got)
        else:
            read += 1
        for j, (t, f0) in enumerate(zip(texts[g:g + PASS_GROUP], loss_from[g:g + PASS_GROUP])):
            rows.append((t, got[f"feats_{j}"], got[f"ids_{j}"], got[f"probs_{j}"], f0))
        done = min(g + PASS_GROUP, n)
        if progress and (done == n or done // max(1, n // 10) > g // max(1, n // 10)):
            print(f"train-head: target passes {done}/{n} ({time.perf_counter() - t0:.0f} s"
                  + (f"; {read} group(s) of {PASS_GROUP} read from {store.folder}" if read
                     else "") + ")", flush=True)
    return _pack(rows, cfg.store_k, T)


def layer_features(target_config, target_params, tokens: np.ndarray, lengths: np.ndarray,
                   feature_layers, progress: bool = True) -> np.ndarray:
    """The features of other target layers for texts already in :func:`prepare_data`'s layout
    (``tokens [n, T]``, ``lengths [n]``): the outputs of ``feature_layers``, concatenated, from
    one pass per text, ``[n, T, F]`` float32 (zeros past each text). A recipe's data then serve
    a head that reads other layers, the continuations and their distributions unchanged."""
    if not feature_layers:
        raise ValueError("layer_features needs the layers to fuse (feature_layers)")
    n, T = tokens.shape
    params = convert_layout(target_params, "per_layer")

    @jax.jit
    def one(params, toks, length):
        pos = jnp.arange(T, dtype=jnp.int32)[None]
        _, _, f = forward(target_config, params, toks[None], pos, causal_mask(length[None], T),
                          None, feature_layers=tuple(feature_layers))
        return f[0]

    out = None
    t0 = time.perf_counter()
    for i in range(n):
        L = int(lengths[i])
        f = np.asarray(jax.device_get(one(params, jnp.asarray(tokens[i]), jnp.int32(L))))
        if out is None:
            out = np.zeros((n, T, f.shape[-1]), np.float32)
        out[i, :L] = f[:L]
        if progress and (i + 1) % max(1, n // 10) == 0:
            print(f"train-head: layer features {i + 1}/{n} ({time.perf_counter() - t0:.0f} s)",
                  flush=True)
    return out


# ---------------------------------------------------------------------------------------------
PASS_GROUP = 8   # texts per stored group of prepare_data's passes (the unit a stopped run keeps)


# data from the rollouts' own passes: no second pass over the texts
ROLLOUT_BUCKET = 64   # prompts sorted by length, each batch padded to a multiple of this


@functools.partial(jax.jit, static_argnames=("config", "new_tokens", "warp", "store_k",
                                             "feature_layers"))
def _rollout_passes(params, prompt_ids, prompt_lengths, keys, config, new_tokens: int, warp,
                    store_k: int, feature_layers):
    """One batch of rollouts with what the head trains on, from the passes that sample them:
    the prompt pass's features ``[B, P, F]``, and per step ``t`` the token drawn, whether the
    row was still live (before EOS), the token's features and the warped top-``store_k`` of the
    distribution it was drawn from (``[B, N, ...]``)."""
    from dsbd_jax.decoding import common
    from dsbd_jax.decoding.warping import draw_from, warp_logits
    B, P = prompt_ids.shape
    temperature, top_k, top_p, eos = warp
    cache, logits, feats = common.prefill(config, params, prompt_ids, prompt_lengths,
                                          P + new_tokens, feature_layers=feature_layers)

    def step(carry, t):
        cache, logits, finished = carry
        warped = warp_logits(jax.nn.log_softmax(logits, axis=-1), temperature, top_k, top_p)
        vals, ids = jax.lax.top_k(warped, store_k)
        u = jax.vmap(lambda k: jax.random.uniform(jax.random.fold_in(k, t), (1,)))(keys)
        tok = jnp.where(finished, 0, draw_from(jnp.exp(warped), u)[:, 0]).astype(jnp.int32)
        lg, cache, f = common.decode_step(config, params, cache, tok, prompt_lengths + t,
                                          feature_layers)
        out = (tok, ~finished, f, ids.astype(jnp.int32), jnp.exp(vals))
        finished = finished | common.is_eos(tok, eos)
        return (cache, lg, finished), out

    _, outs = jax.lax.scan(step, (cache, logits, jnp.zeros((B,), bool)),
                           jnp.arange(new_tokens, dtype=jnp.int32))
    return (feats,) + tuple(jnp.swapaxes(o, 0, 1) for o in outs)


def rollout_data(target_config, target_params, prompts, feature_layers, cfg, new_tokens: int,
                 batch: int, max_tokens: int, key, progress: bool = True,
                 store=None) -> Dict[str, np.ndarray]:
    """:func:`prepare_data`'s arrays for the target's own continuations of ``prompts`` (token
    lists), taken from the passes that sample them (the prompt pass and one pass per new token),
    with no second pass over the texts. The prompts run sorted by length, ``batch`` at a time
    (a shorter last batch in rows rounded up to a multiple of 8), each batch padded to a multiple
    of ``ROLLOUT_BUCKET`` (one compiled program per padded shape); the continuations are ``new_tokens`` tokens drawn with the warping of ``cfg``
    (stopping at the target's EOS), and the loss counts from the position that predicts the
    first of them. ``store``: a :class:`~dsbd_jax.training.rollouts.BatchStore` keeping every
    finished batch (a stopped run computes only the batches it lacks; each batch's key is
    ``fold_in(key, its start)``, so the data is the same either way)."""
    from dsbd_jax.decoding._jit import inputs
    from dsbd_jax.training.rollouts import BatchStore, batch_line, ready
    store = store if store is not None else BatchStore(None, "", "rollouts")
    if progress:
        stored = sum(store.get(f"{i:06d}") is not None for i in range(0, len(prompts), batch))
        _start_line(len(prompts), batch, new_tokens, stored, store)
    fl = tuple(feature_layers) if feature_layers else None
    params = target_params if not fl else convert_layout(target_params, "per_layer")
    eos = target_config.eos_token_id
    eos = tuple(np.atleast_1d(eos).tolist()) if eos is not None else None
    warp = (float(cfg.temperature), int(cfg.top_k), float(cfg.top_p), eos)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    rows: Dict[int, tuple] = {}
    t0 = time.perf_counter()
    read = 0
    for start in range(0, len(order), batch):
        idx = order[start:start + batch]
        got = store.get(f"{start:06d}")
        if got is not None:
            read += 1
            for r, i in enumerate(idx):
                rows[i] = (got[f"tokens_{r}"].tolist(), got[f"feats_{r}"], got[f"ids_{r}"],
                           got[f"probs_{r}"], int(got["loss_from"][r]))
            continue
        b = min(batch, -(-len(idx) // 8) * 8)   # a short last batch: rows to a multiple of 8
        chunk = [list(prompts[i]) for i in idx]
        chunk += [chunk[-1]] * (b - len(chunk))
        P = -(-max(len(p) for p in chunk) // ROLLOUT_BUCKET) * ROLLOUT_BUCKET
        ids = np.zeros((b, P), np.int32)
        for r, p in enumerate(chunk):
            ids[r, :len(p)] = p
        lens = np.array([len(p) for p in chunk], np.int32)
        keys = inputs.row_keys(jax.random.fold_in(key, start), b)
        beat = (batch_line("target rollouts with their features", start, batch, len(order),
                           len(idx), new_tokens) if progress else None)
        out = ready(functools.partial(
            _rollout_passes, config=target_config, new_tokens=new_tokens, warp=warp,
            store_k=cfg.store_k, feature_layers=() if fl is None else fl),
            params, jnp.asarray(ids), jnp.asarray(lens), keys, heartbeat=beat,
            every_s=rollouts_mod.HEARTBEAT_S)
        feats, toks, live, f_new, top_ids, top_probs = out
        kept = {"loss_from": np.array([int(lens[r]) - 1 for r in range(len(idx))], np.int32)}
        for r, i in enumerate(idx):
            n, c = int(lens[r]), int(live[r].sum())
            rows[i] = (list(chunk[r]) + [int(t) for t in toks[r, :c]],
                       np.concatenate([feats[r, :n], f_new[r, :c]]), top_ids[r, :c],
                       top_probs[r, :c], n - 1)
            kept.update({f"tokens_{r}": np.array(rows[i][0], np.int32), f"feats_{r}": rows[i][1],
                         f"ids_{r}": rows[i][2], f"probs_{r}": rows[i][3]})
        store.put(f"{start:06d}", kept)
        if progress:
            print(f"train-head: target rollouts {min(start + batch, len(order))}/{len(order)} "
                  f"with their features ({time.perf_counter() - t0:.0f} s"
                  + (f"; {read} batch(es) read from {store.folder}" if read else "") + ")",
                  flush=True)
    return _pack([rows[i] for i in range(len(prompts))], cfg.store_k, max_tokens)


def _start_line(n: int, batch: int, new_tokens: int, stored: int, store) -> None:
    """The first rollout line, printed at once: the work ahead, and what a stop keeps."""
    batches = -(-n // batch)
    kept = (f"; {stored} of them finished earlier, read from {store.folder}" if stored else "")
    where = (f"each finished batch is kept in {store.folder} (a stopped run resumes from "
             f"there)" if store.folder is not None else "nothing is kept if it stops")
    print(f"train-head: target rollouts: {n} prompts in {batches} batch(es) of up to {batch}, "
          f"{new_tokens} new tokens each{kept}; {where}", flush=True)


def _pack(rows, store_k: int, max_tokens: int) -> Dict[str, np.ndarray]:
    """:func:`prepare_data`'s layout from per-text ``(tokens, feats [len, F], ids [c, k],
    probs [c, k], loss_from)``, texts cut to ``max_tokens``."""
    T = max(8, min(max_tokens, max(len(r[0]) for r in rows)))
    N = max(1, max(min(len(r[2]), T - 1 - r[4]) for r in rows))
    n, F = len(rows), rows[0][1].shape[-1]
    out = {"tokens": np.zeros((n, T), np.int32), "lengths": np.zeros((n,), np.int32),
           "feats": np.zeros((n, T, F), np.float32), "pos": np.zeros((n, N), np.int32),
           "mask": np.zeros((n, N), bool), "ids": np.zeros((n, N, store_k), np.int32),
           "probs": np.zeros((n, N, store_k), np.float32)}
    for i, (toks, feats, ids, probs, f0) in enumerate(rows):
        L = min(len(toks), T)
        out["tokens"][i, :L], out["lengths"][i] = toks[:L], L
        out["feats"][i, :L] = feats[:L]
        j = f0 + np.arange(N)
        out["mask"][i] = j < L - 1
        out["pos"][i] = np.minimum(j, T - 1)
        c = min(len(ids), N)
        out["ids"][i, :c], out["probs"][i, :c] = ids[:c], probs[:c]
    return out


def concat_data(a: Dict[str, np.ndarray], b: Dict[str, np.ndarray]) -> Dict[str, np.ndarray]:
    """Two data sets of :func:`prepare_data`'s layout as one (padded to the longer texts and
    the more counted positions; padding is masked)."""
    out = {}
    for k in a:
        x, y = a[k], b[k]
        if x.ndim > 1 and x.shape[1] != y.shape[1]:
            m = max(x.shape[1], y.shape[1])
            pad = lambda z: np.pad(z, [(0, 0), (0, m - z.shape[1])] + [(0, 0)] * (z.ndim - 2))
            x, y = pad(x), pad(y)
        out[k] = np.concatenate([x, y])
    return out


def recipe_data(r: Dict[str, Any], target, feature_layers, cfg, progress: bool = True):
    """``(train data, held-out data)`` of a head recipe (:mod:`dsbd_jax.training.head`): its
    texts scored by one target pass each, and its rollouts, with their features and the
    target's distributions from the rollouts' own passes (``rollout_data: own_passes``, the
    default) or from one more pass over each finished text (``rescore``).

    Every finished batch of every phase is kept under ``RUN/data-parts/<part>-<phase>/``
    (:class:`~dsbd_jax.training.rollouts.BatchStore`, tagged with the data and settings it
    comes from): a stopped run computes only what it lacks. ``run_recipe`` removes the folder
    once ``RUN/data.npz`` is written."""
    from pathlib import Path

    from dsbd_jax.training.rollouts import BatchStore, fingerprint
    tok = target.tokenizer
    parts = []
    root = Path(r["run_dir"]) / "data-parts"
    settings = (str(r["target"]), str(r["dtype"]), tuple(feature_layers or ()),
                float(cfg.temperature), int(cfg.top_k), float(cfg.top_p), int(cfg.store_k),
                int(cfg.seed), r["rollout_tokens"], r["rollout_batch"], r["max_tokens"],
                r["rollout_data"])

    def store(part, phase, data):
        return BatchStore(root / f"{part}-{phase}", fingerprint(data, settings),
                          f"{part} {phase}")

    for part in ("train", "heldout"):
        key = jax.random.PRNGKey(cfg.seed + (part == "heldout"))
        texts, answer_from = answer_texts(tok, r.get(f"{part}_texts") or [])
        loss_from = answer_from if r.get("text_loss") == "answer" else [0] * len(texts)
        cut = sum(f >= r["max_tokens"] - 1 for f in loss_from)
        if cut:
            logger.warning("%d of the %s texts count no position: their prompts fill "
                           "max_tokens=%d", cut, part, r["max_tokens"])
        own = None
        if r.get(f"{part}_rollouts"):
            prompts = rollout_prompts(tok, r[f"{part}_rollouts"], r["max_prompt_tokens"])
            if r["rollout_data"] == "rescore":
                ro, lf = target_rollouts(target.config, target.params, prompts, cfg,
                                         r["rollout_tokens"], r["rollout_batch"], key, progress,
                                         store(part, "rollouts", prompts))
                texts, loss_from = texts + ro, loss_from + lf
            else:
                own = rollout_data(target.config, target.params, prompts, feature_layers, cfg,
                                   r["rollout_tokens"], r["rollout_batch"], r["max_tokens"], key,
                                   progress, store(part, "rollouts", prompts))
        data = None
        if texts:
            if progress:
                print(f"train-head: {len(texts)} {part} texts; one target pass each", flush=True)
            data = prepare_data(target.config, target.params, texts, feature_layers, cfg,
                                r["max_tokens"], progress, loss_from,
                                store(part, "passes", (texts, loss_from)))
        parts.append(own if data is None else data if own is None else concat_data(data, own))
    return tuple(parts)
