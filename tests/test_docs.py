"""The documentation site builds with warnings as errors, and the examples of its pages run.

Runs what ``bash scripts/docs.sh`` runs (``sphinx-build -W --keep-going -b html`` and ``-b
doctest``) in a subprocess, into a temporary directory. Skipped only when Sphinx or MyST is not
installed (the ``docs`` extra, part of ``test``; Sphinx 9 needs Python >= 3.11). About a minute.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _missing():
    for mod in ("sphinx", "myst_parser", "furo"):
        try:
            __import__(mod)
        except ImportError:
            return mod
    return None


@pytest.mark.skipif(_missing() is not None,
                    reason=f"the docs extra is not installed ({_missing()} missing): "
                           "pip install -e '.[docs]'")
@pytest.mark.parametrize("builder", ["html", "doctest"])
def test_docs_build(builder, tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = tmp_path / builder
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", builder,
         "-d", str(tmp_path / "doctrees"), str(ROOT / "docs"), str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"sphinx -b {builder} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    if builder == "doctest":
        report = (out / "output.txt").read_text()
        assert "0 failures in tests" in report, report[-2000:]
