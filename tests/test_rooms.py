"""The rooms of the package: no sub-package grows past 15 modules or about 3,500 lines, the model's
room holds none of the host's machinery, and the import paths that moved in 0.3.0 (the split of
``dsbd_jax/models`` into ``models``, ``host`` and ``loading``) still work with a
``DeprecationWarning`` that names the new path and points at the caller's line."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from dsbd_jax import _moved

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "dsbd_jax"
MAX_MODULES, MAX_LINES = 15, 3500
# rooms known to be over the limits, with why; the list only shrinks (a room that fits is removed)
OVER = {"decoding": "every decoder beside DSBD's own forest, verify and width modules: DSBD's "
                    "modules are the next room to split off"}


def _rooms():
    return sorted(p for p in PKG.iterdir() if p.is_dir() and (p / "__init__.py").exists())


def test_no_room_holds_more_than_15_modules_or_3500_lines():
    sizes = {}
    for room in _rooms():
        mods = sorted(room.glob("*.py"))
        sizes[room.name] = (len(mods), sum(len(m.read_text().splitlines()) for m in mods))
    assert {"models", "host", "loading"} <= set(sizes), sizes
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


def _fresh(old: str):
    """Forget ``old`` so that importing it runs the finder again."""
    sys.modules.pop(old, None)
    parent, _, child = old.rpartition(".")
    if parent in sys.modules and child in vars(sys.modules[parent]):
        delattr(sys.modules[parent], child)


@pytest.mark.parametrize("old", sorted(k for k, v in _moved.MODULES.items() if isinstance(v, str)))
def test_an_old_module_path_is_the_new_module_with_a_warning(old):
    new = _moved.MODULES[old]
    _fresh(old)
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to {new} in 0\.3\.0") as rec:
        got = importlib.import_module(old)
    assert got is importlib.import_module(new)
    assert got.__spec__.name == new  # the new module keeps its own spec
    assert rec[0].filename == __file__  # the warning points at the importing line


def test_from_import_of_an_old_path_and_monkeypatch_through_it(monkeypatch):
    _fresh("dsbd_jax.models.cpu_options")
    with pytest.warns(DeprecationWarning, match="dsbd_jax.host.cpu_options") as rec:
        from dsbd_jax.models import cpu_options as old  # noqa: F401
    assert rec[0].filename == __file__
    from dsbd_jax.host import cpu_options
    monkeypatch.setattr(old, "PLAN_FILE", "elsewhere.json")
    assert cpu_options.PLAN_FILE == "elsewhere.json"  # one module: the patch reaches the library


def test_the_split_kernels_module_reads_both_new_modules():
    _fresh("dsbd_jax.models.kernels")
    with pytest.warns(DeprecationWarning, match="dsbd_jax.models.kinds and dsbd_jax.host.forms"):
        from dsbd_jax.models import kernels
    from dsbd_jax.host import forms
    from dsbd_jax.models import kinds
    assert kernels.transpose_params is kinds.transpose_params
    assert kernels.int8_params is kinds.int8_params
    assert kernels.choose_form is forms.choose_form
    assert kernels.MIN_ELEMENTS == forms.MIN_ELEMENTS
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        kernels.nothing_here


@pytest.mark.parametrize("module, name", sorted(_moved.NAMES))
def test_a_moved_name_resolves_with_a_warning(module, name):
    new = _moved.NAMES[(module, name)]
    with pytest.warns(DeprecationWarning, match=rf"{module}.{name} moved to {new}.{name}") as rec:
        got = getattr(importlib.import_module(module), name)
    assert got is getattr(importlib.import_module(new), name)
    assert rec[0].filename == __file__


def test_unknown_names_still_fail():
    import dsbd_jax.models
    with pytest.raises(AttributeError, match="no attribute 'not_a_thing'"):
        dsbd_jax.models.not_a_thing
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("dsbd_jax.models.not_a_module")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not hasattr(dsbd_jax.models, "not_a_thing")


def test_the_library_itself_uses_no_old_path():
    """Importing every module of the package raises no DeprecationWarning (turned into errors)."""
    code = ("import importlib, pkgutil, dsbd_jax\n"
            "for m in pkgutil.walk_packages(dsbd_jax.__path__, 'dsbd_jax.'):\n"
            "    if m.name != 'dsbd_jax.__main__':\n"
            "        importlib.import_module(m.name)\n")
    proc = subprocess.run([sys.executable, "-W", "error::DeprecationWarning", "-c", code],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
