"""``scripts/newest_jax.sh --which``: the interpreter the newest-JAX lane picks, with fake
interpreters (shell scripts answering the version check) on PATH and in a fake pyenv."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def fake_python(path: Path, new_enough: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\nexit {0 if new_enough else 1}\n")   # sys.exit(version < 3.12)
    path.chmod(0o755)
    return path


def which(tmp_path, bin_dir, **env):
    e = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path / "home"), **env}
    out = subprocess.run(["bash", str(ROOT / "scripts" / "newest_jax.sh"), "--which"], env=e,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_lane_finds_any_python_312_or_newer(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    assert which(tmp_path, bin_dir) == "none"
    pyenv = fake_python(tmp_path / "home/.pyenv/versions/3.13.1/bin/python", True)
    assert which(tmp_path, bin_dir) == str(pyenv)                 # pyenv, any 3.1[2-9]
    p312 = fake_python(bin_dir / "python3.12", True)
    assert which(tmp_path, bin_dir) == str(p312)                  # PATH before pyenv
    p313 = fake_python(bin_dir / "python3.13", True)
    assert which(tmp_path, bin_dir) == str(p313)                  # the newer name first
    fake_python(p313, False)                                      # says it is older than 3.12
    assert which(tmp_path, bin_dir) == str(p312)
    given = fake_python(tmp_path / "given/python", True)
    assert which(tmp_path, bin_dir, DSBD_PY312=str(given)) == str(given)   # $DSBD_PY312 first
    assert which(tmp_path, bin_dir, DSBD_PY312=str(tmp_path / "missing")) == "none"
