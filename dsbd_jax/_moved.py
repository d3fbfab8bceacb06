"""Import paths that moved in 0.3.0, kept working with a ``DeprecationWarning`` until 0.4.0.

0.3.0 split ``dsbd_jax/models`` into three rooms: :mod:`dsbd_jax.models` (what a model is),
:mod:`dsbd_jax.loading` (where its weights come from) and :mod:`dsbd_jax.host` (how this host
runs it); ``docs/design.md`` draws them. Code that imports an old path, such as
``from dsbd_jax.models.loading import load_model`` or ``dsbd_jax.models.kernels.choose_form``,
gets the object from its new module and one ``DeprecationWarning`` naming the new path:

* :data:`MODULES`: old module path -> new module path. The old path is served by
  :class:`MovedFinder` on ``sys.meta_path`` (installed by ``import dsbd_jax``), which answers
  only these names, with the new module itself (so ``monkeypatch.setattr`` on an old path
  patches the module the library reads). ``dsbd_jax.models.kernels``, split in two, is served
  as a read-only view of :mod:`dsbd_jax.models.kinds` and :mod:`dsbd_jax.host.forms`.
* :data:`NAMES`: ``(old module, name)`` -> the module that holds ``name`` now, for names that
  left a module which stayed (``dsbd_jax.models.load_model``, ``dsbd_jax.models.head.load``);
  the old module's ``__getattr__`` calls :func:`moved_name`.

The table maps names to names and imports the new module only when an old path is used, so
the model's room does not import the loading or host rooms (``pyproject.toml``'s layer
contract holds for the library's own imports).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import os
import sys
import types
import warnings

REMOVED_IN = "0.4.0"

MODULES = {
    "dsbd_jax.models.loading": "dsbd_jax.loading.load",
    "dsbd_jax.models.load_args": "dsbd_jax.loading.load_args",
    "dsbd_jax.models.presets": "dsbd_jax.loading.presets",
    "dsbd_jax.models.gguf": "dsbd_jax.loading.gguf",
    "dsbd_jax.models.hf": "dsbd_jax.loading.hf",
    "dsbd_jax.models.checkpoint": "dsbd_jax.loading.checkpoint",
    "dsbd_jax.models.hub": "dsbd_jax.loading.hub",
    "dsbd_jax.models.budget": "dsbd_jax.loading.budget",
    "dsbd_jax.models.head_registry": "dsbd_jax.loading.heads",
    "dsbd_jax.models.host": "dsbd_jax.host.plan",
    "dsbd_jax.models.cpu_options": "dsbd_jax.host.cpu_options",
    "dsbd_jax.models.pass_probe": "dsbd_jax.host.pass_probe",
    "dsbd_jax.models.forest_budget": "dsbd_jax.host.forest_budget",
    "dsbd_jax.models.compilation_cache": "dsbd_jax.host.compilation_cache",
    "dsbd_jax.models.kernels": ("dsbd_jax.models.kinds", "dsbd_jax.host.forms"),
}

NAMES = {
    ("dsbd_jax.models", "load_model"): "dsbd_jax.loading.load",
    ("dsbd_jax.models", "LoadedModel"): "dsbd_jax.loading.load",
    ("dsbd_jax.models", "list_presets"): "dsbd_jax.loading.load",
    ("dsbd_jax.models.head", "save"): "dsbd_jax.loading.heads",
    ("dsbd_jax.models.head", "load"): "dsbd_jax.loading.heads",
    ("dsbd_jax.models.head", "is_head_dir"): "dsbd_jax.loading.heads",
    ("dsbd_jax.models.head", "in_host_form"): "dsbd_jax.loading.heads",
}


def _stacklevel() -> int:
    """The ``warnings.warn`` stack level of the first frame outside this module, importlib's
    own frames and an old module's ``__getattr__``: the user's import statement or attribute
    access."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and _skipped(frame.f_code):
        frame = frame.f_back
        # warnings.warn itself passes over importlib's bootstrap frames without counting them
        if frame is not None and not _bootstrap(frame.f_code.co_filename):
            level += 1
    return level


def _bootstrap(filename: str) -> bool:
    return "importlib" in filename and "_bootstrap" in filename


_IMPORTLIB = os.path.dirname(importlib.__file__)
_PACKAGE = os.path.dirname(__file__)


def _skipped(code) -> bool:
    name = code.co_filename
    return (name == __file__ or name.startswith("<frozen importlib")
            or os.path.dirname(name) == _IMPORTLIB
            or (code.co_name == "__getattr__" and name.startswith(_PACKAGE)))


def _warn(old: str, new: str) -> None:
    warnings.warn(f"{old} moved to {new} in 0.3.0; the old path goes in {REMOVED_IN}",
                  DeprecationWarning, stacklevel=_stacklevel())


def moved_name(module: str, name: str):
    """``name`` of the old ``module`` from the module that holds it now, with a
    ``DeprecationWarning``; ``AttributeError`` for any other name (as a module would)."""
    new = NAMES.get((module, name))
    if new is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    _warn(f"{module}.{name}", f"{new}.{name}")
    return getattr(importlib.import_module(new), name)


class _SplitModule(types.ModuleType):
    """The old ``dsbd_jax.models.kernels``: each name read from the first new module that has
    it."""

    def __init__(self, name: str, sources: tuple):
        super().__init__(name, f"Moved: {', '.join(sources)} (see dsbd_jax._moved).")
        self._sources = [importlib.import_module(s) for s in sources]

    def __getattr__(self, name):
        for m in self._sources:
            if hasattr(m, name):
                return getattr(m, name)
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")


class _MovedLoader(importlib.abc.Loader):
    def __init__(self, new):
        self.new = new

    def create_module(self, spec):
        new = self.new
        _warn(spec.name, " and ".join(new) if isinstance(new, tuple) else new)
        if isinstance(new, tuple):
            return _SplitModule(spec.name, new)
        module = importlib.import_module(new)
        self._own_spec = module.__spec__  # importlib sets __spec__ to the old path's: put back
        return module

    def exec_module(self, module):
        if not isinstance(module, _SplitModule):
            module.__spec__ = self._own_spec


class MovedFinder(importlib.abc.MetaPathFinder):
    """Finds the old module paths of :data:`MODULES` and nothing else."""

    def find_spec(self, fullname, path=None, target=None):
        new = MODULES.get(fullname)
        if new is None:
            return None
        return importlib.util.spec_from_loader(fullname, _MovedLoader(new))


def install() -> None:
    """Put one :class:`MovedFinder` at the end of ``sys.meta_path`` (idempotent)."""
    if not any(isinstance(f, MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedFinder())
