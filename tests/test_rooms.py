"""The rooms of the package: no sub-package (nested ones included) grows past 15 modules or about
3,500 lines, the model's room holds none of the host's machinery, and the paths 0.3.0 removed
are gone (no finder serves them)."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "dsbd_jax"
MAX_MODULES, MAX_LINES = 15, 3500
# rooms known to be over the limits, with why; the list only shrinks (a room that fits is removed)
OVER: dict = {}


def _rooms():
    return sorted(p.parent for p in PKG.rglob("__init__.py") if p.parent != PKG)


def test_no_room_holds_more_than_15_modules_or_3500_lines():
    sizes = {}
    for room in _rooms():
        mods = sorted(room.glob("*.py"))
        sizes[str(room.relative_to(PKG))] = (len(mods), sum(len(m.read_text().splitlines()) for m in mods))
    assert {"models", "host", "loading", "decoding", "decoding/dsbd", "decoding/_jit"} <= set(sizes)
    big = {k: v for k, v in sizes.items() if v[0] > MAX_MODULES or v[1] > MAX_LINES}
    assert set(big) == set(OVER), (big, OVER)


def test_the_model_room_holds_no_host_machinery():
    """What measures the host, sets compiler options or reads weights files lives elsewhere."""
    names = {p.stem for p in (PKG / "models").glob("*.py")}
    host = {"host", "cpu_options", "pass_probe", "forest_budget", "compilation_cache", "budget",
            "loading", "presets", "gguf", "hf", "hub", "checkpoint", "head_registry", "kernels"}
    assert not names & host, names & host
    for p in (PKG / "models").glob("*.py"):
        src = p.read_text()
        for word in ("compiler_options", "perf_counter", "cpu_flags", "host_plan", "load_file",
                     "save_file", "gguf"):
            assert word not in src, f"{p.name} uses {word}"


# 0.3.0 removed the paths 0.2.0 kept (CHANGELOG.md gives the table): each is gone, not served
OLD_MODULES = [
    "dsbd_jax.models.loading",
    "dsbd_jax.models.load_args",
    "dsbd_jax.models.presets",
    "dsbd_jax.models.gguf",
    "dsbd_jax.models.hf",
    "dsbd_jax.models.checkpoint",
    "dsbd_jax.models.hub",
    "dsbd_jax.models.budget",
    "dsbd_jax.models.head_registry",
    "dsbd_jax.models.host",
    "dsbd_jax.models.cpu_options",
    "dsbd_jax.models.pass_probe",
    "dsbd_jax.models.forest_budget",
    "dsbd_jax.models.compilation_cache",
    "dsbd_jax.models.kernels",
    "dsbd_jax.decoding.calls",
    "dsbd_jax.decoding.programs",
    "dsbd_jax.decoding.compiles",
    "dsbd_jax.decoding.inputs",
    "dsbd_jax.decoding.forest",
    "dsbd_jax.decoding.verify",
    "dsbd_jax.decoding.width",
    "dsbd_jax.decoding.tops",
    "dsbd_jax._moved"]
OLD_NAMES = [("dsbd_jax.models", "load_model"), ("dsbd_jax.models", "LoadedModel"),
             ("dsbd_jax.models", "list_presets"), ("dsbd_jax.models.head", "load"),
             ("dsbd_jax.models.head", "save"), ("dsbd_jax", "DecodeConfig"),
             ("dsbd_jax.decoding", "DecodeConfig"), ("dsbd_jax.decoding.configs", "DecodeConfig")]


@pytest.mark.parametrize("old", OLD_MODULES)
def test_an_old_module_path_is_gone(old):
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module(old)


@pytest.mark.parametrize("module, name", OLD_NAMES)
def test_an_old_name_is_gone(module, name):
    assert not hasattr(importlib.import_module(module), name)


def test_the_library_itself_uses_no_old_path():
    """Importing every module of the package raises no DeprecationWarning (turned into errors)."""
    code = ("import importlib, pkgutil, dsbd_jax\n"
            "for m in pkgutil.walk_packages(dsbd_jax.__path__, 'dsbd_jax.'):\n"
            "    if m.name != 'dsbd_jax.__main__':\n"
            "        importlib.import_module(m.name)\n")
    proc = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
