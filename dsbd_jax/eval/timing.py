"""Measurement helpers shared by the benchmark scripts and the CLI.

Timings are wall clock around calls that end in ``jax.block_until_ready``; the first call of a
compiled shape is reported apart as compile time and never counted in a speed.
"""

from __future__ import annotations

import json
import os
import platform
import re
import resource
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Sequence, Tuple

import jax
import numpy as np

from dsbd_jax.host import cpu_options


def timed(fn: Callable, *args, **kwargs) -> Tuple[Any, float]:
    """Run ``fn`` and wait for its device results; returns ``(result, wall seconds)``."""
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn(*args, **kwargs))
    return out, time.perf_counter() - t0


def compile_and_run(fn: Callable, *args, repeats: int = 1, **kwargs) -> Dict[str, Any]:
    """First call (compile + run) timed apart, then ``repeats`` timed runs on the same inputs.

    Returns ``{"output", "first_call_s", "run_s" (mean of the repeats), "runs_s"}``.
    """
    out, first = timed(fn, *args, **kwargs)
    runs = []
    for _ in range(repeats):
        out, t = timed(fn, *args, **kwargs)
        runs.append(t)
    return {"output": out, "first_call_s": first, "run_s": float(np.mean(runs)), "runs_s": runs}


def peak_rss_gb() -> float:
    """Peak resident memory of this process (GB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2


def machine_info() -> Dict[str, Any]:
    """The host of a figure: device, CPU model and cores, versions, ``XLA_FLAGS`` and the
    XLA:CPU compiler options the library's jits use on this host (``models.cpu_options``)."""
    dev = jax.devices()[0]
    return {
        "platform": dev.platform,
        "device": getattr(dev, "device_kind", str(dev)),
        "cpu_model": cpu_options.cpu_model(),
        "cpu_flags": list(cpu_options.cpu_flags()),
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": _version("jaxlib"),
        # where a dump went is no setting of the run, and a path of the measuring machine
        "xla_flags": re.sub(r"(--xla_dump_to=)\S+", r"\1<dir>", os.environ.get("XLA_FLAGS", "")),
        "cpu_options": cpu_options.choice(),
        "compiler_options": cpu_options.compiler_options(),
        # programs whose projection kernels are transposed run under their own form's choice
        "cpu_options_transposed": cpu_options.choice("transposed"),
    }


# the host fields every result JSON's "machine" block carries (tests/test_results_hosts.py)
HOST_KEYS = ("cpu_model", "cpu_flags", "cpu_count", "jax", "jaxlib", "xla_flags")


def portable_path(path, root=None) -> str:
    """``path`` as a result JSON records it: relative to ``root`` (default: the current
    directory; the benchmarks pass the checkout) where it lies inside it, else its name only.
    A result never names an absolute path of the measuring machine."""
    p = Path(os.path.abspath(os.fspath(path)))
    base = Path(os.path.abspath(os.fspath(root) if root is not None else os.getcwd()))
    try:
        return p.relative_to(base).as_posix()
    except ValueError:
        return p.name


def portable_settings(settings, root=None) -> Dict[str, Any]:
    """A benchmark's settings (``vars(args)``, a bench config) as a result JSON records them:
    every string that is an absolute path, in lists and nested dicts too, through
    :func:`portable_path`."""
    def one(v):
        if isinstance(v, str) and os.path.isabs(v):
            return portable_path(v, root)
        if isinstance(v, (list, tuple)):
            return [one(x) for x in v]
        if isinstance(v, dict):
            return {k: one(x) for k, x in v.items()}
        return v
    return {k: one(v) for k, v in dict(settings).items()}


def _version(package: str):
    try:
        from importlib.metadata import version
        return version(package)
    except Exception:  # not installed as a distribution
        return None


def write_json(path: str, payload: Any) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=2, default=_to_builtin)


def _to_builtin(x):
    if isinstance(x, (np.generic,)):
        return x.item()
    if hasattr(x, "tolist"):
        return np.asarray(x).tolist()
    raise TypeError(f"not JSON serialisable: {type(x)}")


def print_table(rows: Sequence[Dict[str, Any]], columns: List[str]) -> None:
    """A plain fixed-width table on stdout."""
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3f}" if abs(v) < 1000 else f"{v:.0f}"
        return str(v)
    cells = [[fmt(r.get(c, "")) for c in columns] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(columns)]
    print("  ".join(c.ljust(w) for c, w in zip(columns, widths)))
    for row in cells:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))


def best_beam(out, row: int = 0) -> Dict[str, Any]:
    """Figures of one prompt's best beam in a ``GenerateOutput``: ``new_tokens``, ``token_ids``,
    ``loglik`` (unwarped target log-likelihood), ``target_calls`` / ``draft_calls`` /
    ``iterations`` (whole batch) and ``stats`` (every stat as a numpy array)."""
    stats = {k: np.asarray(v) for k, v in out.stats.items()}
    b = int(np.asarray(out.best)[row])
    n = int(np.asarray(out.lengths)[row, b])
    return {"new_tokens": n, "token_ids": np.asarray(out.sequences)[row, b, :n].tolist(),
            "loglik": float(np.asarray(out.log_likelihoods)[row, b]),
            "target_calls": int(stats.get("target_calls", 0)),
            "draft_calls": int(stats.get("draft_calls", 0)),
            "iterations": int(stats.get("iterations", 0)), "stats": stats}


def run_over_prompts(fn, params, config, prompts, length: int, seed: int = 0,
                     takes_key: bool = True, label: str = "", log=print) -> Dict[str, Any]:
    """Run one decoder over prompts one at a time (batch 1, all padded to ``length``).

    The first call compiles; it is timed apart (``compile_s`` = first call minus a warm call)
    and never counted in a speed. Per prompt: wall seconds, tokens of the best beam, target and
    draft calls, and the best beam's target log-likelihood per token.
    """
    from dsbd_jax.decoding.common import pad_prompts
    per_prompt, compile_s = [], None
    for i, p in enumerate(prompts):
        ids, lens = pad_prompts([p], length=length)
        key = jax.random.PRNGKey(seed + i)
        args = (params, ids, key, config) if takes_key else (params, ids, config)
        if compile_s is None:
            _, first = timed(fn, *args, prompt_lengths=lens)
        out, t = timed(fn, *args, prompt_lengths=lens)
        if compile_s is None:
            compile_s = max(first - t, 0.0)
        bb = best_beam(out)
        n_tok = bb["new_tokens"]
        rec = {"seconds": t, "tokens": n_tok,
               **{k: bb[k] for k in ("target_calls", "draft_calls", "iterations")},
               "loglik_per_token": bb["loglik"] / max(n_tok, 1)}
        for k, v in bb["stats"].items():
            if k not in rec and v.size == 1:
                rec[k] = float(v.reshape(()))
        per_prompt.append(rec)
        log(f"  {label} prompt {i}: {n_tok} tokens in {t:.2f} s")
    tok = sum(r["tokens"] for r in per_prompt)
    sec = sum(r["seconds"] for r in per_prompt)
    calls = sum(r["target_calls"] for r in per_prompt)
    summary = {"tokens_per_s": tok / sec, "compile_s": compile_s,
               "target_calls_per_token": calls / tok,
               "draft_calls_per_token": sum(r["draft_calls"] for r in per_prompt) / tok,
               "tokens_per_target_call": tok / max(calls, 1),
               "loglik_per_token": float(np.mean([r["loglik_per_token"] for r in per_prompt])),
               "prompts": per_prompt}
    return summary
