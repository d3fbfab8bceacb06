"""Training a feature-level draft head (:mod:`dsbd_jax.models.head`) with optax.

``dsbd train-head CONFIG`` (:func:`run_recipe`) reads a YAML recipe (``configs/head_qwen.yaml``):
the target, the rollouts and texts to train on and hold out, the head's shape and
``HeadTrainConfig``. The data (the target's features and its warped next-token distribution, at
most ``store_k`` tokens, from one target pass per text) is stored once in ``RUN/data.npz``. The
loss is ``KL(p_warped || q)`` with optional feature and unrolled ("training-time test") terms;
the held-out acceptance ``mean sum_v min(p_w(v), q_w(v))`` is logged every ``eval_every`` steps.
Checkpoints let a killed run resume; the result ``RUN/head`` is registered under ``save_as``, so
``load_head(NAME)`` and ``--draft NAME`` find it. The recipe's keys and each loss term:
``docs/results/design_notes.md``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

import jax
import jax.numpy as jnp
import numpy as np
import optax
import yaml

from dsbd_jax.models import head as mhead
from dsbd_jax.loading import heads
from dsbd_jax.loading.heads import (  # noqa: F401
    cache_dir_of_heads, head_path, is_head_source, load_head, read_head_config, register,
    trained_heads)
from dsbd_jax.training.head_log import plot_log, read_log  # noqa: F401
from dsbd_jax.training.head_data import (  # noqa: F401
    prepare_data, recipe_data, rollout_data, rollouts_of, target_rollouts, texts_of, warped_topk)
from dsbd_jax.training.head_losses import head_losses, unrolled_mask, unrolled_steps  # noqa: F401,E501
from dsbd_jax.training.rollouts import ready

logger = logging.getLogger("dsbd_jax")

KEYS = ("name", "target", "dtype", "run_dir", "train_texts", "heldout_texts", "train_rollouts",
        "heldout_rollouts", "rollout_tokens", "rollout_batch", "rollout_data",
        "max_prompt_tokens", "text_loss", "head", "train", "save_as", "max_tokens")
ROLLOUT_DATA = ("own_passes", "rescore")
TEXT_LOSS = ("all", "answer")
HEAD_KEYS = ("intermediate_size", "feature_layers", "vocab_rows", "vocab_table", "init")
INITS = ("random", "target_last")
UNROLL_CONTEXTS = ("target", "own")


@dataclasses.dataclass(frozen=True)
class HeadTrainConfig:
    """Optimisation settings (the recipe's ``train:`` block)."""

    steps: int = 200
    batch_size: int = 4
    learning_rate: float = 1e-3
    warmup_steps: int = 10
    end_lr_factor: float = 0.1
    weight_decay: float = 0.0
    clip_norm: float = 1.0
    feature_weight: float = 0.1
    unroll: int = 2
    temperature: float = 1.0
    top_k: int = 10
    top_p: float = 0.8
    store_k: int = 16
    eval_every: int = 25
    checkpoint_every: int = 25
    seed: int = 0
    unroll_context: str = "target"

    def __post_init__(self):
        for name in ("steps", "batch_size", "unroll", "store_k", "eval_every",
                     "checkpoint_every"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"train.{name} must be a positive int, got {v!r}")
        if self.unroll_context not in UNROLL_CONTEXTS:
            raise ValueError(f"train.unroll_context must be one of {UNROLL_CONTEXTS}, got "
                             f"{self.unroll_context!r}")
        if not self.learning_rate > 0:
            raise ValueError(f"train.learning_rate must be positive, got {self.learning_rate!r}")


# ---------------------------------------------------------------------------------------------
# recipe
def load_recipe(path) -> Dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no such head-training config: {path}")
    r = yaml.safe_load(path.read_text()) or {}
    unknown = sorted(set(r) - set(KEYS))
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown}; allowed: {list(KEYS)}")
    if not r.get("target"):
        raise ValueError(f"{path}: 'target' is required")
    from dsbd_jax.loading.load import check_source
    check_source(r["target"], f"{path}: target")
    for part in ("train", "heldout"):
        if not (r.get(f"{part}_texts") or r.get(f"{part}_rollouts")):
            raise ValueError(f"{path}: '{part}_texts' or '{part}_rollouts' is required")
    for k, default in (("rollout_tokens", 96), ("rollout_batch", 4), ("max_prompt_tokens", None)):
        v = r.setdefault(k, default)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{path}: {k} must be a positive integer, got {v!r}")
    for k, allowed in (("rollout_data", ROLLOUT_DATA), ("text_loss", TEXT_LOSS)):
        if r.setdefault(k, allowed[0]) not in allowed:   # the first is the default
            raise ValueError(f"{path}: {k} must be one of {allowed}, got {r[k]!r}")
    head = dict(r.get("head") or {})
    bad = sorted(set(head) - set(HEAD_KEYS))
    if bad:
        raise ValueError(f"{path}: unknown head settings {bad}; allowed: {list(HEAD_KEYS)}")
    if head.get("init", "target_last") not in INITS:
        raise ValueError(f"{path}: head.init must be one of {INITS}, got {head['init']!r}")
    r["head"] = head
    fields = {f.name for f in dataclasses.fields(HeadTrainConfig)}
    bad = sorted(set(r.get("train") or {}) - fields)
    if bad:
        raise ValueError(f"{path}: unknown train settings {bad}")
    r["train"] = HeadTrainConfig(**(r.get("train") or {}))
    r.setdefault("name", path.stem)
    r.setdefault("run_dir", f"runs/{r['name']}")
    r.setdefault("dtype", "float32")
    r.setdefault("save_as", r["name"])
    r.setdefault("max_tokens", 320)
    if "/" in str(r["save_as"]) or not str(r["save_as"]).strip():
        raise ValueError(f"{path}: save_as must be a plain name, got {r['save_as']!r}")
    return r


def _optimizer(cfg: HeadTrainConfig):
    sched = optax.warmup_cosine_decay_schedule(0.0, cfg.learning_rate, cfg.warmup_steps,
                                               max(cfg.steps, cfg.warmup_steps + 1),
                                               cfg.learning_rate * cfg.end_lr_factor)
    return optax.chain(optax.clip_by_global_norm(cfg.clip_norm),
                       optax.adamw(sched, weight_decay=cfg.weight_decay))


def _batches(data, idx):
    return {k: jnp.asarray(v[idx]) for k, v in data.items()}


def train(hc: mhead.HeadConfig, params, target_params, train_data, heldout_data,
          cfg: HeadTrainConfig, run_dir, progress: bool = True, stop_after: Optional[int] = None,
          stop_at: Optional[int] = None):
    """Train ``params`` (resuming from ``RUN/checkpoint.msgpack``); returns
    ``{"params", "step", "log"}``. ``stop_after``: stop after that many steps of this call;
    ``stop_at``: stop at that step (the schedule stays ``cfg.steps``' long: the first steps of
    a full run, resumable)."""
    from flax import serialization
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    opt = _optimizer(cfg)
    trainable = {k: v for k, v in params.items() if k != mhead.VOCAB_HEAD}
    frozen = {k: v for k, v in params.items() if k == mhead.VOCAB_HEAD}
    state = {"params": trainable, "opt": opt.init(trainable), "step": 0}
    ckpt = run_dir / "checkpoint.msgpack"
    if ckpt.is_file():
        state = serialization.from_bytes(state, ckpt.read_bytes())
        state["step"] = int(state["step"])
        print(f"train-head: resuming at step {state['step']} from {ckpt}", flush=True)
    log_path = run_dir / "log.jsonl"

    # the frozen weights (the target's embedding and head, a truncated head's rows) are
    # arguments, not constants captured by the programs
    def loss_fn(p, fixed, batch):
        return head_losses(hc, {**p, **fixed["head"]}, fixed["target"], batch, cfg)

    fixed = {"head": frozen, "target": target_params}

    @jax.jit
    def step_fn(p, o, fixed, batch):
        (loss, m), g = jax.value_and_grad(loss_fn, has_aux=True)(p, fixed, batch)
        updates, o = opt.update(g, o, p)
        return optax.apply_updates(p, updates), o, m

    @jax.jit
    def eval_fn(p, fixed, batch):  # counted as decoding drafts, whatever the training
        return head_losses(hc, {**p, **fixed["head"]}, fixed["target"], batch, cfg,
                           context="target")[1]

    def evaluate(p):
        n = heldout_data["tokens"].shape[0]
        ms = []
        for i in range(0, n, cfg.batch_size):
            idx = np.arange(i, min(i + cfg.batch_size, n))
            idx = np.concatenate([idx, np.full(cfg.batch_size - len(idx), idx[-1])])
            ms.append(ready(eval_fn, p, fixed, _batches(heldout_data, idx)))
        return {f"heldout_{k}": float(np.mean([m[k] for m in ms])) for k in ms[0]}

    rng = np.random.default_rng(cfg.seed)
    n_train = train_data["tokens"].shape[0]
    order = [rng.permutation(n_train) for _ in range(cfg.steps * cfg.batch_size // n_train + 2)]
    order = np.concatenate(order)
    p, o = state["params"], state["opt"]
    t0 = time.perf_counter()
    if state["step"] == 0:
        rec = {"step": 0, **evaluate(p)}
        with log_path.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        if progress:
            print(f"train-head: step 0 held-out acceptance "
                  f"{rec['heldout_acceptance_1']:.3f}", flush=True)
    last = cfg.steps if stop_at is None else min(int(stop_at), cfg.steps)
    s1 = state["step"]
    done_here = 0
    try:   # each step under ready(): Ctrl-C stops it at once, the last finished step is kept
        for s in range(state["step"], last):
            idx = order[s * cfg.batch_size:(s + 1) * cfg.batch_size]
            p, o, m = ready(step_fn, p, o, fixed, _batches(train_data, idx), fetch=False)
            s1 = s + 1
            if s1 % cfg.eval_every == 0 or s1 == cfg.steps:
                rec = {"step": s1, "seconds": time.perf_counter() - t0,
                       **{k: float(v) for k, v in jax.device_get(m).items()}, **evaluate(p)}
                with log_path.open("a") as f:
                    f.write(json.dumps(rec) + "\n")
                if progress:
                    print(f"train-head: step {s1}/{cfg.steps} loss {rec['loss']:.3f} held-out "
                          f"acceptance {rec['heldout_acceptance_1']:.3f} / "
                          f"{rec.get('heldout_acceptance_2', float('nan')):.3f} "
                          f"({rec['seconds']:.0f} s)", flush=True)
            if s1 % cfg.checkpoint_every == 0 or s1 == last:
                ckpt.write_bytes(serialization.to_bytes({"params": p, "opt": o, "step": s1}))
            done_here += 1
            if stop_after is not None and done_here >= stop_after:
                return {"params": {**p, **frozen}, "step": s1, "log": read_log(run_dir)}
    except KeyboardInterrupt:
        if s1 > state["step"]:
            ckpt.write_bytes(serialization.to_bytes({"params": p, "opt": o, "step": s1}))
            print(f"train-head: stopped; step {s1} saved to {ckpt}", flush=True)
        raise
    return {"params": {**p, **frozen}, "step": max(last, state["step"]),
            "log": read_log(run_dir)}


def heldout_metrics(hc: mhead.HeadConfig, params, target_params, held,
                    cfg: HeadTrainConfig) -> Dict[str, float]:
    """:func:`head_losses`' metrics over held-out data, one text at a time so that every counted
    position weighs the same, the unrolled steps attending as draft tokens do (``cfg.unroll``
    steps: a second draft token's acceptance needs 2)."""
    fn = jax.jit(lambda p, b: head_losses(hc, p, target_params, b, cfg, context="target")[1])
    sums, count = {}, 0.0
    for i in range(held["tokens"].shape[0]):
        w = float(held["mask"][i].sum())
        if w == 0:
            continue
        m = jax.device_get(fn(params, {k: jnp.asarray(v[i:i + 1]) for k, v in held.items()}))
        for k, v in m.items():
            sums[k] = sums.get(k, 0.0) + float(v) * w
        count += w
    return {k: v / count for k, v in sums.items()}


def head_config(target_config, head: Dict[str, Any]) -> mhead.HeadConfig:
    """A recipe's ``head:`` settings as the head's config, bound to the target's."""
    return mhead.HeadConfig(target_config, intermediate_size=head.get("intermediate_size"),
                            feature_layers=tuple(head.get("feature_layers") or ()))


def initial_params(hc: mhead.HeadConfig, head: Dict[str, Any], target, seed: int,
                   target_name) -> Dict[str, Any]:
    """A recipe's ``head:`` settings as the head's starting parameters: random or the target's
    last layer (``init``), truncated to the ``vocab_rows`` most frequent tokens of
    ``vocab_table`` (default: the target's own table)."""
    params = mhead.init_params(hc, jax.random.PRNGKey(seed), target.params
                               if head.get("init", "target_last") == "target_last" else None)
    if head.get("vocab_rows"):
        rows = _vocab_rows(head.get("vocab_table", target_name), int(head["vocab_rows"]),
                           target.config.vocab_size)
        params = mhead.truncate(hc, params, target.params, rows)
    return params


def recipes_for(target_source, configs_dir=None) -> List[Path]:
    """The head-training recipes (``configs/head_*.yaml`` of the checkout) whose ``target`` is
    ``target_source``."""
    root = Path(configs_dir) if configs_dir else Path(__file__).resolve().parents[2] / "configs"
    out = []
    for p in sorted(root.glob("head_*.yaml")) if root.is_dir() else []:
        try:
            r = yaml.safe_load(p.read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        if str(r.get("target")) == str(target_source):
            out.append(p)
    return out


def _vocab_rows(table_source, n: int, vocab_size: int) -> np.ndarray:
    """The ``n`` most frequent token ids of a vocabulary frequency table (the truncated-draft
    tables of :mod:`dsbd_jax.models.vocab`: a preset's name, a model or a table path)."""
    from dsbd_jax.models import vocab as mv
    src = Path(str(table_source)).expanduser()
    table = src if src.suffix == ".npz" and src.is_file() else mv.find_table(table_source)
    counts, _ = mv.load_table(table)
    if counts.shape[0] != vocab_size:
        raise ValueError(f"the vocabulary table {table} has {counts.shape[0]} tokens, the target "
                         f"{vocab_size}")
    return mv.top_rows(counts, n)


def target_origin(info) -> str:
    """Where a loaded target came from, in words: read from the library's cache, or converted
    now and cached for every later run (a resumed run then only reads it)."""
    dtype = info.get("dtype", "")
    if info.get("host_form_cache") and not info.get("convert_s"):
        return f"{dtype}, read from its cache {info['host_form_cache']}"
    if info.get("host_form_cache"):
        return (f"{dtype}, converted now and cached in {info['host_form_cache']}: later runs, "
                f"a resumed one too, read it")
    if info.get("built_cache"):
        return (f"{dtype}, converted now and cached in {info.get('cache_dir')}: later runs read "
                f"it")
    if info.get("cache_dir"):
        return f"{dtype}, read from its cache {info['cache_dir']}"
    return f"{dtype}, read from {info.get('source', 'its files')}"


def run_recipe(path, progress: bool = True, stop_after: Optional[int] = None) -> Dict[str, Any]:
    """Load the target, score the texts once, train the head (resuming), save and register it."""
    from dsbd_jax.loading.checkpoint import choice_line
    from dsbd_jax.loading.load import load_model
    r = load_recipe(path)
    cfg: HeadTrainConfig = r["train"]
    run_dir = Path(r["run_dir"])
    run_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    target = load_model(r["target"], jnp.dtype(r["dtype"]), progress=progress)
    if target.tokenizer is None:
        raise ValueError(f"{path}: the target has no tokenizer; cannot encode the texts")
    if progress:
        print(f"train-head: target {r['target']} ready in {time.perf_counter() - t_start:.0f} "
              f"s ({target_origin(target.info)})", flush=True)
        print("train-head: " + choice_line("target", r["target"], target.info,
                                           f"dtype: {r['dtype']} in {path}",
                                           "float: the head learns from float features"),
              flush=True)
    h = r["head"]
    hc = head_config(target.config, h)
    data_path = run_dir / "data.npz"
    if data_path.is_file():
        z = np.load(data_path)
        train_data = {k[6:]: z[k] for k in z.files if k.startswith("train_")}
        held_data = {k[5:]: z[k] for k in z.files if k.startswith("held_")}
        if "pos" not in train_data:
            raise ValueError(f"{data_path} was written by an older dsbd-jax (no 'pos'): delete "
                             f"it, and {run_dir / 'checkpoint.msgpack'}, to score the data again")
    else:
        # every finished batch is kept under RUN/data-parts/ until data.npz is written whole
        train_data, held_data = recipe_data(r, target, hc.feature_layers, cfg, progress)
        tmp = run_dir / "data.tmp.npz"
        np.savez(tmp, **{f"train_{k}": v for k, v in train_data.items()},
                 **{f"held_{k}": v for k, v in held_data.items()})
        os.replace(tmp, data_path)
        shutil.rmtree(run_dir / "data-parts", ignore_errors=True)
    params = initial_params(hc, h, target, cfg.seed, r["target"])
    # training reads only the target's embedding and vocabulary head: free its layers
    shared = {k: v for k, v in target.params.items() if k in ("embed", "lm_head")}
    del target
    from dsbd_jax.loading.load import release_freed_memory
    release_freed_memory()
    res = train(hc, params, shared, train_data, held_data, cfg, run_dir, progress, stop_after)
    out = {"step": res["step"], "run_dir": str(run_dir), "log": res["log"],
           "num_params": mhead.num_params({k: v for k, v in res["params"].items()
                                           if k != mhead.VOCAB_HEAD})}
    if res["step"] == cfg.steps:
        last = res["log"][-1] if res["log"] else {}
        meta = {"recipe": r["name"], "target": str(r["target"]), "steps": cfg.steps,
                "data": {k: r.get(k) for k in ("train_texts", "heldout_texts", "train_rollouts",
                                               "heldout_rollouts", "rollout_tokens")
                         if r.get(k) is not None},
                "heldout_acceptance_1": last.get("heldout_acceptance_1"),
                "heldout_acceptance_2": last.get("heldout_acceptance_2"),
                "wall_s_this_run": time.perf_counter() - t_start}
        head_dir = heads.save(run_dir / "head", hc, res["params"], meta)
        out["head_dir"] = str(head_dir)
        out["link"] = str(register(str(r["save_as"]), head_dir))
        out["plot"] = str(plot_log(run_dir))
    return out
