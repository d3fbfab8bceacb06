"""Draft distillation with optax (``dsbd distill CONFIG``): on-policy data, warped divergences,
full fine-tuning or LoRA, AdamW + warm-up + cosine, clipping, resumable checkpoints.

:func:`make_rollouts` samples each prompt's continuation once per run (from the draft or the
target, at the decoding's warping) and stores the target's warped distribution at every
continuation position (``RUN/data_{train,heldout}.npz``); :func:`make_step` is one ``jax.jit``
step over the stored sequences. The held-out acceptance ``sum_x min(p(x), q(x))`` is logged to
``RUN/log.jsonl``. Invariant: batches are a pure function of ``seed`` and the step, so a killed
run resumed from ``RUN/state.npz`` reaches the parameters of an uninterrupted one. ``RUN/model``
is the merged draft as a Hugging Face checkpoint. Each step and the memory each mode takes:
``docs/results/design_notes.md``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any, Dict, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dsbd_jax.decoding.configs import SampleConfig
from dsbd_jax.models.config import ModelConfig
from dsbd_jax.models.fused import is_fused
from dsbd_jax.models.kinds import unblock_params
from dsbd_jax.models.param_check import plain_projection
from dsbd_jax.models.llama import causal_mask, forward
from dsbd_jax.training.export import save_hf
from dsbd_jax.training.losses import DIVERGENCES, divergence, target_topk
from dsbd_jax.training.rollouts import BatchStore, fingerprint, ready, sampled_batches

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclasses.dataclass(frozen=True)
class DistillConfig:
    """Settings of one distillation run (``configs/distill_*.yaml`` holds them)."""

    steps: int = 100
    batch_size: int = 4
    learning_rate: float = 1e-4
    warmup_steps: int = 10
    end_lr_factor: float = 0.1
    weight_decay: float = 0.0
    clip_norm: float = 1.0
    loss: str = "fkl"              # "tv" has no gradient where top-p keeps one token (losses doc)
    mode: str = "lora"             # "lora" or "full"
    lora_rank: int = 8
    lora_alpha: float = 16.0
    compute_dtype: str = "float32"  # or "bfloat16"
    policy: str = "draft"          # who writes the continuations: "draft" or "target"
    max_new_tokens: int = 64
    temperature: float = 1.0
    top_k: Optional[int] = 10
    top_p: float = 0.8
    store_k: int = 16
    seed: int = 0
    eval_every: int = 20
    checkpoint_every: int = 20

    def __post_init__(self):
        if self.loss not in DIVERGENCES:
            raise ValueError(f"loss must be one of {DIVERGENCES}, got {self.loss!r}")
        if self.mode not in ("lora", "full"):
            raise ValueError(f"mode must be 'lora' or 'full', got {self.mode!r}")
        if self.policy not in ("draft", "target"):
            raise ValueError(f"policy must be 'draft' or 'target', got {self.policy!r}")
        if self.compute_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"compute_dtype must be float32 or bfloat16, got {self.compute_dtype!r}")
        for name in ("steps", "batch_size", "lora_rank", "store_k", "max_new_tokens",
                     "eval_every", "checkpoint_every"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if not 0 <= self.warmup_steps < self.steps:
            raise ValueError(f"warmup_steps must be in [0, steps), got {self.warmup_steps}")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")


# ---------------------------------------------------------------------------------------------
# data
def _logits_at(config: ModelConfig, params, tokens, total, pos):
    """Logits ``[B, T, V]`` at the indices ``pos [B, T]`` of a causal pass over ``tokens`` (only
    those rows go through the vocabulary head)."""
    B, L = tokens.shape
    positions = jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (B, L))
    return forward(config, params, tokens, positions, causal_mask(total, L), logits_at=pos)[0]


_logits_at_jit = jax.jit(_logits_at, static_argnums=0)


def make_rollouts(target, draft, prompts: Sequence[Sequence[int]], dc: DistillConfig,
                  key, eos_token_id=None, batch: int = 4, progress: bool = False,
                  store: Optional[BatchStore] = None) -> Dict[str, np.ndarray]:
    """On-policy continuations and the target's stored warped top-k (module doc, step 1).

    ``target`` / ``draft``: ``(config, params)``. Returns numpy arrays: ``tokens [n, L]``,
    ``total [n]`` (prompt + continuation length), ``pos [n, T]`` (the index whose logits predict
    continuation token ``j``), ``mask [n, T]``, ``idx`` / ``p [n, T, store_k]``. ``store``: a
    :class:`~dsbd_jax.training.rollouts.BatchStore` that keeps every finished batch, so a
    stopped run computes only the batches it lacks (batch ``b`` is the same either way: its key
    is ``fold_in(key, b's first prompt)``)."""
    (tc, tp), (dcf, dp) = target, draft
    pc, pp = (dcf, dp) if dc.policy == "draft" else (tc, tp)
    T = dc.max_new_tokens
    cfg = SampleConfig(pc, max_new_tokens=T, temperature=dc.temperature,
                       top_k=dc.top_k, top_p=dc.top_p, eos_token_id=eos_token_id)
    P = max(len(p) for p in prompts)
    keys = ("tokens", "total", "pos", "mask", "idx", "p")
    store = store if store is not None else BatchStore(None, "", "rollouts")
    done = {i: got for i in range(0, len(prompts), batch)
            for got in [store.get(f"{i:06d}")] if got is not None}
    batches = sampled_batches(pp, prompts, cfg, key, batch, P, skip=done)
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(desc=f"rollouts ({len(prompts)} prompts)", unit="batch",
                   total=-(-len(prompts) // batch), initial=len(done))
        if done:
            bar.write(f"rollouts: {len(done)} batch(es) read from {store.folder}")
    for i, n, chunk, lens, seqs, clen in batches:
        tokens = np.zeros((batch, P + T), np.int32)
        for r in range(batch):
            row = list(chunk[r]) + list(seqs[r, :clen[r]])
            tokens[r, :len(row)] = row
        total = lens + clen
        pos = np.minimum(lens[:, None] - 1 + np.arange(T)[None], P + T - 1).astype(np.int32)
        mask = np.arange(T)[None] < clen[:, None]
        # the target's pass over the rollouts under ready(): Ctrl-C stops it at once, as it
        # stops the rollouts (a blocking call held the signal for the whole pass)
        idx, p = ready(lambda *a: target_topk(_logits_at_jit(*a), dc.temperature, dc.top_k,
                                              dc.top_p, dc.store_k)[:2],
                       tc, tp, jnp.asarray(tokens), jnp.asarray(total), jnp.asarray(pos))
        done[i] = {k: np.asarray(v)[:n] for k, v in (
            ("tokens", tokens), ("total", total), ("pos", pos), ("mask", mask),
            ("idx", idx), ("p", p))}
        store.put(f"{i:06d}", done[i])
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return {k: np.concatenate([done[i][k] for i in sorted(done)]) for k in keys}


# ---------------------------------------------------------------------------------------------
# trainable trees
def _path(path) -> str:
    return "/".join(str(getattr(p, "key", p)) for p in path)


def init_lora(params, rank: int, key) -> Dict[str, Dict[str, jax.Array]]:
    """``{path of a projection kernel: {"a": [.., in, r] normal(1/in), "b": [.., r, out] 0}}``
    (B = 0: the adapted model starts as the draft). Both weight layouts; separate projections
    (``ValueError`` for fused ones: :func:`dsbd_jax.models.fused.unfuse_projections`)."""
    if is_fused(params):
        raise ValueError("init_lora adapts the separate projections; this draft's are fused: "
                         "load it with fused_projections=False or unfuse_projections(params, config)")
    out = {}
    leaves = jax.tree_util.tree_flatten_with_path(params)[0]
    for n, (path, x) in enumerate(leaves):
        if plain_projection(path) in LORA_TARGETS:
            lead, (din, dout) = x.shape[:-2], x.shape[-2:]
            a = jax.random.normal(jax.random.fold_in(key, n), lead + (din, rank), jnp.float32)
            out[_path(path)] = {"a": a / np.sqrt(din), "b": jnp.zeros(lead + (rank, dout), jnp.float32)}
    return out


def merge_lora(params, lora, scale: float):
    """``params`` with every adapted kernel replaced by ``W + A @ B * scale``."""
    def f(path, x):
        ad = lora.get(_path(path))
        if ad is None:
            return x
        delta = jnp.einsum("...ir,...ro->...io", ad["a"], ad["b"]) * scale
        return (x.astype(jnp.float32) + delta).astype(x.dtype)
    return jax.tree_util.tree_map_with_path(f, params)


def draft_params(dc: DistillConfig, base, trainable):
    """The draft's parameters for a trainable tree (LoRA merged, or the tree itself)."""
    if dc.mode == "full":
        return trainable
    return merge_lora(base, trainable, dc.lora_alpha / dc.lora_rank)


def make_optimizer(dc: DistillConfig):
    sched = optax.warmup_cosine_decay_schedule(0.0, dc.learning_rate, dc.warmup_steps,
                                               dc.steps, dc.learning_rate * dc.end_lr_factor)
    return optax.chain(optax.clip_by_global_norm(dc.clip_norm),
                       optax.adamw(sched, weight_decay=dc.weight_decay))


# ---------------------------------------------------------------------------------------------
# loss, step, evaluation
def batch_loss(dc: DistillConfig, config: ModelConfig, params, batch, kind: Optional[str] = None):
    """Mean divergence over the batch's stored positions (``kind`` default ``dc.loss``)."""
    if dc.compute_dtype == "bfloat16":
        config = config.replace(dtype="bfloat16")
        params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
    logits = _logits_at(config, params, batch["tokens"], batch["total"], batch["pos"])
    d = divergence(kind or dc.loss, logits, batch["idx"], batch["p"], dc.temperature, dc.top_k,
                   dc.top_p)
    m = batch["mask"].astype(jnp.float32)
    return jnp.sum(d * m) / jnp.maximum(jnp.sum(m), 1.0)


def make_step(dc: DistillConfig, config: ModelConfig, optimizer):
    """The jitted training step ``(trainable, opt_state, base, batch) -> (.., .., loss)``."""
    def loss_fn(trainable, base, batch):
        return batch_loss(dc, config, draft_params(dc, base, trainable), batch)

    @jax.jit
    def step(trainable, opt_state, base, batch):
        loss, grads = jax.value_and_grad(loss_fn)(trainable, base, batch)
        updates, opt_state = optimizer.update(grads, opt_state, trainable)
        return optax.apply_updates(trainable, updates), opt_state, loss
    return step


def make_acceptance(dc: DistillConfig, config: ModelConfig):
    """Jitted ``(params, batch) -> (sum of sum_x min(p, q) over positions, positions)``."""
    @jax.jit
    def acc(params, batch):
        logits = _logits_at(config, params, batch["tokens"], batch["total"], batch["pos"])
        d = divergence("tv", logits, batch["idx"], batch["p"], dc.temperature, dc.top_k, dc.top_p)
        m = batch["mask"].astype(jnp.float32)
        return jnp.sum((1.0 - d) * m), jnp.sum(m)
    return acc


def heldout_acceptance(acc_fn, params, data, batch_size: int) -> float:
    """Mean ``sum_x min(p, q)`` over the held-out positions (fixed-size batches, padded)."""
    n = data["tokens"].shape[0]
    num = den = 0.0
    for i in range(0, n, batch_size):
        idx = np.arange(i, i + batch_size) % n
        b = {k: jnp.asarray(v[idx]) for k, v in data.items()}
        keep = (np.arange(i, i + batch_size) < n)[:, None]
        b["mask"] = jnp.asarray(data["mask"][idx] & keep)
        s, c = ready(acc_fn, params, b)      # Ctrl-C stops an evaluation at once too
        num, den = num + float(s), den + float(c)
    return num / max(den, 1.0)


def batch_at(data, step: int, batch_size: int, seed: int):
    """The batch of ``step``: epoch ``e``'s permutation (a pure function of ``seed`` and ``e``)."""
    n = data["tokens"].shape[0]
    per = max(n // batch_size, 1)
    epoch, j = divmod(step, per)
    order = np.random.default_rng([seed, epoch]).permutation(n)
    idx = order[(np.arange(batch_size) + j * batch_size) % n]
    return {k: jnp.asarray(v[idx]) for k, v in data.items()}


# ---------------------------------------------------------------------------------------------
# checkpoints
def save_state(path: Path, step: int, tree) -> None:
    leaves = jax.tree.leaves(tree)
    tmp = path.with_suffix(".tmp.npz")
    with open(tmp, "wb") as f:
        np.savez(f, step=np.asarray(step), **{f"leaf_{i}": np.asarray(x)
                                              for i, x in enumerate(leaves)})
    tmp.replace(path)


def load_state(path: Path, like):
    """``(step, tree)`` with the leaves of ``path`` in the structure of ``like``."""
    leaves, treedef = jax.tree.flatten(like)
    with np.load(path) as z:
        got = [jnp.asarray(z[f"leaf_{i}"], dtype=leaves[i].dtype) for i in range(len(leaves))]
        step = int(z["step"])
    for a, b in zip(got, leaves):
        if a.shape != b.shape:
            raise ValueError(f"{path} does not match this run's trainable tree (shape {a.shape} "
                             f"vs {b.shape}); use another run directory or delete it")
    return step, jax.tree.unflatten(treedef, got)


def _save_data(path: Path, data) -> None:
    with open(path, "wb") as f:
        np.savez(f, **data)


def _load_data(path: Path):
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


def _rss_gb() -> float:
    """This process's resident memory in GB (Linux ``/proc``; elsewhere its peak)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e9
    except (OSError, ValueError, IndexError):
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6


# ---------------------------------------------------------------------------------------------
def prepare_data(target, draft, train_prompts, heldout_prompts, dc: DistillConfig, run_dir,
                 eos_token_id=None, progress: bool = True) -> Dict[str, Dict[str, np.ndarray]]:
    """The run's rollouts ``{"train": .., "heldout": ..}`` (:func:`make_rollouts`), made once and
    stored in ``run_dir/data_{train,heldout}.npz``, then read from there.

    The target is needed only to make them: once both files exist ``target`` may be ``None``
    (``run_recipe`` frees the target before training, 7 GB for the offline pair's)."""
    run = Path(run_dir)
    run.mkdir(parents=True, exist_ok=True)
    key = jax.random.key(dc.seed)
    datas = {}
    for name, prompts, k in (("train", train_prompts, 1), ("heldout", heldout_prompts, 2)):
        f = run / f"data_{name}.npz"
        if not f.exists():
            if target is None:
                raise ValueError(f"{f} does not exist: the target model is needed to make the "
                                 "rollouts (pass target=(config, params))")
            dcf, dp = draft
            # finished batches are kept in run_dir/rollouts-<name>/ until the whole set is
            # written: a stopped run resumes from its last finished batch
            parts = run / f"rollouts-{name}"
            store = BatchStore(parts, fingerprint(
                [list(map(int, q)) for q in prompts], eos_token_id, target[0], dcf,
                {f: getattr(dc, f) for f in ("policy", "max_new_tokens", "temperature",
                                             "top_k", "top_p", "store_k", "seed")}),
                f"{name} rollouts")
            _save_data(f, make_rollouts(target, (dcf, unblock_params(dp)), prompts, dc,
                                        jax.random.fold_in(key, k), eos_token_id,
                                        progress=progress, store=store))
            shutil.rmtree(parts, ignore_errors=True)
        datas[name] = _load_data(f)
    return datas


# ---------------------------------------------------------------------------------------------
def distill(target, draft, train_prompts, heldout_prompts, dc: DistillConfig, run_dir,
            eos_token_id=None, tokenizer=None, progress: bool = True,
            stop_after: Optional[int] = None) -> Dict[str, Any]:
    """Distil ``draft`` towards ``target`` (each ``(config, params)``) into ``run_dir``.

    ``target`` may be ``None`` when the run's rollouts exist (:func:`prepare_data`). Resumes
    from ``run_dir/state.npz`` when it exists. ``stop_after``: stop (with a checkpoint)
    after that many steps of this call, as a kill would (tests). Returns ``{"params": merged
    draft params, "step": steps done, "heldout_acceptance": [(step, value), ...]}``."""
    run = Path(run_dir)
    dcf, dp = draft
    dp = unblock_params(dp)  # LoRA adapters and the export need [in, out] kernels
    key = jax.random.key(dc.seed)
    datas = prepare_data(target, (dcf, dp), train_prompts, heldout_prompts, dc, run,
                         eos_token_id, progress)
    trainable = (jax.tree.map(lambda x: x.astype(jnp.float32), dp) if dc.mode == "full"
                 else init_lora(dp, dc.lora_rank, jax.random.fold_in(key, 3)))
    optimizer = make_optimizer(dc)
    opt_state = optimizer.init(trainable)
    step0 = 0
    if (run / "state.npz").exists():
        step0, (trainable, opt_state) = load_state(run / "state.npz", (trainable, opt_state))
    step_fn = make_step(dc, dcf, optimizer)
    acc_fn = make_acceptance(dc, dcf)
    log_path = run / "log.jsonl"
    history = []

    def evaluate(step):
        a = heldout_acceptance(acc_fn, draft_params(dc, dp, trainable), datas["heldout"],
                               dc.batch_size)
        history.append((step, a))
        return a

    a = evaluate(step0)
    with open(log_path, "a") as f:  # the starting point too (the base draft's, on a fresh run)
        f.write(json.dumps({"step": step0, "heldout_acceptance": a, "start": True}) + "\n")
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=dc.steps, initial=step0, desc="distill", unit="step")
    last = step0
    t0 = time.perf_counter()
    try:   # each step under ready(): Ctrl-C stops it at once, the last finished step is kept
        for step in range(step0, dc.steps):
            if stop_after is not None and step - step0 >= stop_after:
                break
            batch = batch_at(datas["train"], step, dc.batch_size, dc.seed)
            trainable, opt_state, loss = ready(step_fn, trainable, opt_state, dp, batch,
                                               fetch=False)
            last = step + 1
            rec = {"step": last, "loss": float(loss)}
            if last % dc.eval_every == 0 or last == dc.steps:
                a = evaluate(last)
                rec["heldout_acceptance"] = a
            if last % dc.checkpoint_every == 0 or last == dc.steps:
                save_state(run / "state.npz", last, (trainable, opt_state))
            rec["elapsed_s"] = round(time.perf_counter() - t0, 3)
            rec["rss_gb"] = round(_rss_gb(), 2)
            with open(log_path, "a") as f:
                f.write(json.dumps(rec) + "\n")
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{float(loss):.4f}", heldout_acc=f"{a:.4f}")
    except KeyboardInterrupt:
        if bar is not None:
            bar.close()
        if last > step0:
            save_state(run / "state.npz", last, (trainable, opt_state))
            print(f"distill: stopped; step {last} saved to {run / 'state.npz'}", flush=True)
        raise
    if bar is not None:
        bar.close()
    if last > step0:
        save_state(run / "state.npz", last, (trainable, opt_state))
    merged = draft_params(dc, dp, trainable)
    if dc.mode == "full":
        merged = jax.tree.map(lambda x, y: x.astype(y.dtype), merged, dp)
    if last == dc.steps:
        save_hf(run / "model", dcf, merged, tokenizer)
    return {"params": merged, "step": last, "heldout_acceptance": history}
