"""``dsbd distill CONFIG``: a distillation recipe in YAML (``configs/distill_qwen.yaml``).

A recipe names the models, the dtype, the run folder (resumable), the train and held-out
prompts (``task`` slices sent with the chat template, as the benchmarks send them, or a ``file``
of one prompt per line), ``DistillConfig`` fields, and ``max_prompt_tokens`` (longer prompts are
dropped: every stored sequence is padded to the longest prompt plus ``max_new_tokens``). The
result is ``RUN/model``, also registered as ``save_as`` (default ``<draft>-<name>``) under
``CACHE/models/NAME``, which ``load_model(NAME)`` and ``--draft NAME`` resolve. The recipe's
keys: ``docs/results/design_notes.md``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Dict, List

import yaml

from dsbd_jax.eval.datasets import chat_prompts, encode_chat
from dsbd_jax.loading.load import list_presets, local_model_dir
from dsbd_jax.training.distill import DistillConfig, distill, prepare_data

KEYS = ("name", "models", "target", "draft", "dtype", "run_dir", "train_prompts",
        "heldout_prompts", "distill", "raw", "save_as", "max_prompt_tokens")


def load_recipe(path) -> Dict[str, Any]:
    """The recipe with ``target`` / ``draft`` resolved and its settings checked."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no such distillation config: {path}")
    r = yaml.safe_load(path.read_text()) or {}
    unknown = sorted(set(r) - set(KEYS))
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown}; allowed: {list(KEYS)}")
    if "models" in r:
        pair = yaml.safe_load((path.parent / r["models"]).read_text())
        r.setdefault("target", pair["target"])
        r.setdefault("draft", pair["draft"])
    for k in ("target", "draft", "train_prompts", "heldout_prompts"):
        if not r.get(k):
            raise ValueError(f"{path}: '{k}' is required")
    from dsbd_jax.loading.load import check_source
    for k in ("target", "draft"):
        check_source(r[k], f"{path}: {k}")
    fields = {f.name for f in dataclasses.fields(DistillConfig)}
    bad = sorted(set(r.get("distill") or {}) - fields)
    if bad:
        raise ValueError(f"{path}: unknown distill settings {bad}")
    r["distill"] = DistillConfig(**(r.get("distill") or {}))
    r.setdefault("name", path.stem)
    r.setdefault("run_dir", f"runs/{r['name']}")
    r.setdefault("dtype", "float32")
    cap = r.get("max_prompt_tokens")
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
        raise ValueError(f"{path}: max_prompt_tokens must be a positive integer, got {cap!r}")
    r.setdefault("save_as", f"{r['draft']}-{r['name']}" if "/" not in str(r["draft"]) else r["name"])
    if local_model_dir(str(r["save_as"])) is None or r["save_as"] in list_presets():
        raise ValueError(f"{path}: save_as must be a plain name that is not a preset, got "
                         f"{r['save_as']!r}")
    return r


def register(name: str, model_dir) -> Path:
    """Make ``load_model(name)`` load ``model_dir`` (a link at ``CACHE/models/NAME``)."""
    link = local_model_dir(name)
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(Path(model_dir).resolve(), target_is_directory=True)
    return link


def prompt_texts(specs: List[Dict[str, Any]]) -> List[str]:
    out = []
    for s in specs:
        if "task" in s:
            start, stop = int(s.get("start", 0)), s.get("stop")
            out += chat_prompts(s["task"], None if stop is None else int(stop))[start:]
        elif "file" in s:
            out += [t for t in Path(s["file"]).read_text(encoding="utf-8").splitlines() if t.strip()]
        else:
            raise ValueError(f"a prompt source is {{task, start, stop}} or {{file}}, got {s}")
    return out


def cap_prompts(prompts, cap):
    """The encoded prompts of at most ``cap`` tokens (all of them when ``cap`` is None)."""
    return list(prompts) if cap is None else [p for p in prompts if len(p) <= cap]


def run_recipe(path, progress: bool = True, stop_after=None) -> Dict[str, Any]:
    """Load the models, encode the prompts, run :func:`distill` (resuming if it can)."""
    import jax.numpy as jnp

    from dsbd_jax.loading.checkpoint import choice_line, notice
    from dsbd_jax.loading.load import load_model
    r = load_recipe(path)
    dtype = jnp.dtype(r["dtype"])
    target = load_model(r["target"], dtype, progress=progress)
    draft = load_model(r["draft"], dtype, progress=progress,
                       fused_projections=False)   # LoRA adapts the separate projections
    why = f"dtype: {dtype.name} in {path}"
    for role, m in (("target", target), ("draft", draft)):
        notice(choice_line(role, r[role], m.info, why, "float: distillation trains float "
                           "weights"), progress)
    tok = draft.tokenizer or target.tokenizer
    if tok is None:
        raise ValueError("neither model has a tokenizer; cannot encode the prompts")
    raw = bool(r.get("raw", False))
    train = encode_chat(tok, prompt_texts(r["train_prompts"]), raw)
    held = encode_chat(tok, prompt_texts(r["heldout_prompts"]), raw)
    train, held = cap_prompts(train, r.get("max_prompt_tokens")), \
        cap_prompts(held, r.get("max_prompt_tokens"))
    if not train or not held:
        raise ValueError(f"{path}: no prompt is at most max_prompt_tokens="
                         f"{r.get('max_prompt_tokens')} tokens long")
    eos = target.config.eos_token_id
    prepare_data((target.config, target.params), (draft.config, draft.params), train, held,
                 r["distill"], r["run_dir"], eos, progress)
    del target  # only the rollouts need it: training runs without its parameters in memory
    res = distill(None, (draft.config, draft.params), train, held, r["distill"], r["run_dir"],
                  eos_token_id=eos, tokenizer=tok, progress=progress, stop_after=stop_after)
    if res["step"] == r["distill"].steps:
        res["name"] = r["save_as"]
        res["link"] = register(r["save_as"], Path(r["run_dir"]) / "model")
    return res
