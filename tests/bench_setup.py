"""The tiny-pair bench set-up the harness, CLI, install and sharding tests share: a GSM8K-format
JSON-lines file and a bench config over it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Sequence

ONE_PROBLEM = [{"question": "1+1?", "answer": "#### 2"}]


def write_gsm(path, rows: Sequence[Dict[str, str]] = ONE_PROBLEM) -> Path:
    """``rows`` as a local GSM8K JSON-lines file at ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def bench_config(target, draft, gsm, methods, *, limit: int = 1, max_new_tokens: int = 4,
                 name: str = "t", **extra) -> Dict[str, Any]:
    """A bench config dict: ``methods`` over the first ``limit`` problems of the GSM8K file."""
    return {"name": name, "target": str(target), "draft": str(draft),
            "datasets": [{"task": "gsm8k", "path": str(gsm), "limit": limit}],
            "max_new_tokens": max_new_tokens, "eos": False, "methods": list(methods), **extra}


def write_bench_config(path, *args, **kwargs) -> Path:
    """:func:`bench_config` written as YAML to ``path``."""
    import yaml
    path = Path(path)
    path.write_text(yaml.safe_dump(bench_config(*args, **kwargs)))
    return path


def load_bench(name: str):
    """``benchmarks/<name>.py`` (or, for a probe, ``benchmarks/probes/<name>.py``) imported as a
    module (the scripts are not a package)."""
    import importlib.util
    shelf = Path(__file__).resolve().parents[1] / "benchmarks"
    script = shelf / f"{name}.py"
    if not script.exists():
        script = shelf / "probes" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_bench", script)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
