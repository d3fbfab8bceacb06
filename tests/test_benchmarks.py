"""``benchmarks/`` is a package of at most eight maintained entry points, each run as
``python -m benchmarks.NAME`` from the repository root with nothing put on ``sys.path`` by hand,
each listed in benchmarks/README.md; ``--help`` of each works from a checkout."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENTRY_POINTS = ["speed", "draft_terms", "llama_cpp", "pass_floor", "quality_report",
                "accelerator", "head_training", "render"]
PENDING: list = []


def modules():
    return sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py")
                  if not p.stem.startswith("_"))


def test_at_most_eight_entry_points_and_nothing_else():
    assert len(ENTRY_POINTS) <= 8
    assert modules() == sorted(ENTRY_POINTS + PENDING)
    # no sub-folder but the render command's templates, one module per page (probes retired)
    assert sorted(p.name for p in (ROOT / "benchmarks").iterdir() if p.is_dir()
                  and p.name != "__pycache__") == ["_pages"]


def test_no_benchmark_edits_sys_path():
    found = [f"{p.name}:{n}" for p in sorted((ROOT / "benchmarks").rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"sys\.path\.(insert|append)|sys\.path\s*=", line)]
    assert not found, found


def test_the_readme_lists_every_entry_point():
    text = (ROOT / "benchmarks" / "README.md").read_text()
    for name in ENTRY_POINTS:
        assert f"| `{name}` |" in text, name


@pytest.mark.parametrize("name", ENTRY_POINTS + PENDING)
def test_help(name):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}", "--help"], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "usage:" in proc.stdout
