"""Compiled decoder programs kept on disk and read back without tracing (the program store).

Beside JAX's persistent compilation cache, in ``<jax_compilation_cache_dir>/programs``, a decoder
core called at the top level keeps its compiled program (``serialize_executable``) under a key
of everything that decides it: the core's name, jit settings and compiler options, the static
config, every argument's shape, dtype and sharding, a digest of the package's source, and the
versions, devices, ``XLA_FLAGS`` and jax's configuration. A later process computes the key and
loads the program: no tracing. A program that calls back to the host is never written. On
exactly when JAX's persistent cache is, unless ``DSBD_JAX_COMPILATION_CACHE=0``.
Long form: docs/results/design_notes.md.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import logging
import os
import pickle
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import jax.monitoring

logger = logging.getLogger("dsbd_jax")

FOLDER = "programs"
FORMAT = 1     # the layout of a stored entry: (format, payload, in_tree, out_tree)
# a jax.monitoring duration event per program read back (seconds), as jax reports its compiles
READ_EVENT = "/dsbd_jax/program_store/read_duration"


def store_folder() -> Optional[Path]:
    """``<jax_compilation_cache_dir>/programs`` while JAX's persistent cache is on and
    ``$DSBD_JAX_COMPILATION_CACHE`` does not turn the library's caches off, else None."""
    from dsbd_jax.host.compilation_cache import compilation_cache_wanted
    folder = jax.config.jax_compilation_cache_dir
    if (not folder or not jax.config.jax_enable_compilation_cache
            or not compilation_cache_wanted()):
        return None
    return Path(folder) / FOLDER


_ONCE: Dict[str, str] = {}   # once per process: the package digest (its code is fixed), the listener


def _package_digest() -> str:
    """A digest of every module of the ``dsbd_jax`` package (their bytes and paths)."""
    if "digest" not in _ONCE:
        root = Path(__file__).resolve().parents[1]
        h = hashlib.sha256()
        for p in sorted(root.rglob("*.py")):
            h.update(str(p.relative_to(root)).encode())
            h.update(p.read_bytes())
        _ONCE["digest"] = h.hexdigest()
    return _ONCE["digest"]


def _environment() -> Tuple:
    import flax
    import jaxlib
    import numpy as np
    devices = tuple((d.platform, d.device_kind, d.id) for d in jax.devices())
    config = tuple(sorted((k, repr(v)) for k, v in jax.config.values.items()
                          if "cache" not in k and "log" not in k))
    return (_package_digest(), sys.version, jax.__version__, jaxlib.__version__,
            flax.__version__, np.__version__, jax.process_index(), jax.process_count(),
            devices, os.environ.get("XLA_FLAGS", ""), config)


def static_split(fun: Callable, jit_kwargs: Dict[str, Any], args: tuple, kwargs: dict):
    """``(static, dynamic_args, dynamic_kwargs)`` of a call of ``jax.jit(fun, **jit_kwargs)``:
    the static arguments (by position and name) and what a compiled program is called with."""
    nums = jit_kwargs.get("static_argnums", ()) or ()
    names = jit_kwargs.get("static_argnames", ()) or ()
    nums = {nums} if isinstance(nums, int) else set(nums)
    names = {names} if isinstance(names, str) else set(names)
    params = [p.name for p in inspect.signature(fun).parameters.values()
              if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    nums |= {i for i, n in enumerate(params) if n in names}
    names |= {params[i] for i in nums if i < len(params)}
    static = ([(i, a) for i, a in enumerate(args) if i in nums],
              sorted((k, v) for k, v in kwargs.items() if k in names))
    dyn_args = tuple(a for i, a in enumerate(args) if i not in nums)
    dyn_kwargs = {k: v for k, v in kwargs.items() if k not in names}
    return static, dyn_args, dyn_kwargs


def program_key(name: str, jit_kwargs: Dict[str, Any], options: Dict[str, Any], static,
                dyn_args: tuple, dyn_kwargs: dict) -> Optional[str]:
    """The store's key of a program (module doc), or ``None`` when an argument has no stable
    description (an object whose ``repr`` names its address): such a call is not stored."""
    leaves, tree = jax.tree.flatten((dyn_args, dyn_kwargs))
    avals = []
    for x in leaves:
        if not hasattr(x, "shape") or not hasattr(x, "dtype"):
            avals.append(("value", type(x).__name__, repr(x)))
            continue
        weak = bool(getattr(getattr(x, "aval", None), "weak_type", False))
        avals.append((tuple(x.shape), str(x.dtype), weak, repr(getattr(x, "sharding", None))))
    text = repr((FORMAT, name, sorted((k, repr(v)) for k, v in jit_kwargs.items()),
                 sorted(options.items()), repr(static), str(tree), avals, _environment()))
    if " at 0x" in text:
        return None
    return hashlib.sha256(text.encode()).hexdigest()


def _has_host_callbacks(lowered) -> Optional[bool]:
    """Whether a lowered program calls back to the host (``None``: cannot tell)."""
    args = getattr(getattr(lowered, "_lowering", None), "compile_args", None)
    if not isinstance(args, dict) or "host_callbacks" not in args:
        return None
    return bool(args["host_callbacks"])


# XLA:CPU cannot serialise again a program it read back from JAX's persistent cache (the copy
# lacks some of its functions), so a stored program is always one compiled here: its jit carries
# an option that changes nothing but JAX's cache key (a dump setting; nothing is dumped unless
# the user dumps), and JAX does not write it to its own cache. A compilation that still reads
# JAX's cache (a hit event) is run, never stored.
MARKER_OPTION = ("xla_dump_large_constants", True)
HIT_EVENT = "/jax/compilation_cache/cache_hits"
_HITS = threading.local()


def _on_event(event: str, **_) -> None:
    if event == HIT_EVENT and getattr(_HITS, "count", None) is not None:
        _HITS.count += 1


@contextlib.contextmanager
def _fresh_compilation():
    """Yields a list that holds ``True`` after the block when the compilation inside read JAX's
    persistent cache, or when this jax cannot keep the compilation out of that cache (then the
    program is not stored); JAX writes nothing to its cache inside."""
    try:
        from jax._src import config as jax_config
        no_write = jax_config.persistent_cache_min_compile_time_secs(float("inf"))
    except Exception:   # another jax: compile as usual, store nothing
        no_write = None
    if "listener" not in _ONCE:
        jax.monitoring.register_event_listener(_on_event)
        _ONCE["listener"] = "registered"
    read = []
    _HITS.count = 0
    try:
        with (no_write if no_write is not None else contextlib.nullcontext()):
            yield read
    finally:
        read.append(no_write is None or _HITS.count > 0)
        _HITS.count = None


def store_jit(fun: Callable, jit_kwargs: Dict[str, Any], options: Dict[str, Any]):
    """The ``jax.jit`` that compiles a program for the store (``MARKER_OPTION`` added)."""
    return jax.jit(fun, compiler_options={**options, MARKER_OPTION[0]: MARKER_OPTION[1]},
                   **jit_kwargs)


def load(folder: Path, key: str):
    """The compiled program stored under ``key``, or ``None`` (absent or unreadable)."""
    path = folder / f"{key}.pkl"
    if not path.is_file():
        return None
    from jax.experimental.serialize_executable import deserialize_and_load
    try:
        with open(path, "rb") as f:
            fmt, payload, in_tree, out_tree = pickle.load(f)
        if fmt != FORMAT:
            return None
        return deserialize_and_load(payload, in_tree, out_tree)
    except Exception as e:   # a truncated or foreign file: compile instead, and say so
        logger.warning("could not read the stored program %s (%s: %s); compiling it again",
                       path, type(e).__name__, e)
        return None


def save(folder: Path, key: str, lowered, compiled) -> bool:
    """Write ``compiled`` under ``key`` (atomically) unless it calls back to the host; returns
    whether it was written."""
    if _has_host_callbacks(lowered) is not False:
        return False
    from jax.experimental.serialize_executable import serialize
    try:
        payload, in_tree, out_tree = serialize(compiled)
        data = pickle.dumps((FORMAT, payload, in_tree, out_tree))
    except Exception as e:
        logger.info("a compiled program could not be serialised (%s: %s); not stored",
                    type(e).__name__, e)
        return False
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{key}.{os.getpid()}.{threading.get_ident()}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, folder / f"{key}.pkl")
    return True


class LoadedPrograms:
    """The programs a core loaded or compiled through the store in this process, by key;
    ``jax.clear_caches()`` empties it (registered with jax's own caches)."""

    def __init__(self):
        self._programs: Dict[str, Any] = {}
        self._jits: Dict[str, Any] = {}
        self._lock = threading.Lock()
        try:
            from jax._src import util
            util._caches[self] = "dsbd_jax stored programs"
        except (ImportError, AttributeError, TypeError):   # another jax: clear_cache() only
            pass

    def cache_clear(self) -> None:
        with self._lock:
            self._programs.clear()
            for j in self._jits.values():
                j.clear_cache()

    def __len__(self) -> int:
        return len(self._programs)

    def get(self, key):
        return self._programs.get(key)

    def store_jit(self, fun: Callable, jit_kwargs: Dict[str, Any], options: Dict[str, Any]):
        """:func:`store_jit`, one per set of compiler options."""
        k = repr(sorted(options.items()))
        with self._lock:
            if k not in self._jits:
                self._jits[k] = store_jit(fun, jit_kwargs, options)
            return self._jits[k]

    def put(self, key, program) -> None:
        with self._lock:
            self._programs[key] = program


def call(name: str, jitted, fun: Callable, jit_kwargs: Dict[str, Any], options: Dict[str, Any],
         programs: LoadedPrograms, args: tuple, kwargs: dict, folder: Path):
    """Run ``jitted(*args, **kwargs)`` through the store in ``folder``: the program loaded in
    this process, else the stored one, else compiled (and stored). ``fun`` and ``jit_kwargs``
    are what ``jitted`` was made from; ``options`` its compiler options."""
    program, dyn_args, dyn_kwargs = program_for(name, jitted, fun, jit_kwargs, options, programs,
                                                args, kwargs, folder)
    if program is None:
        return jitted(*args, **kwargs)
    return program(*dyn_args, **dyn_kwargs)


def program_for(name: str, jitted, fun: Callable, jit_kwargs: Dict[str, Any],
                options: Dict[str, Any], programs: LoadedPrograms, args: tuple, kwargs: dict,
                folder: Path):
    """The program :func:`call` would run, made ready and kept in ``programs`` (loaded, read
    from the store, or compiled and stored), nothing run: ``(program, dynamic args, dynamic
    kwargs)``; ``(None, ...)`` when the call has no key (then ``jitted`` compiles it). A later
    :func:`call` with the same arguments runs this program without compiling."""
    static, dyn_args, dyn_kwargs = static_split(fun, jit_kwargs, args, kwargs)
    key = program_key(name, jit_kwargs, options, static, dyn_args, dyn_kwargs)
    if key is None:
        return None, dyn_args, dyn_kwargs
    program = programs.get(key)
    if program is None:
        t0 = time.perf_counter()
        program = load(folder, key)
        if program is not None:
            dt = time.perf_counter() - t0
            jax.monitoring.record_event_duration_secs(READ_EVENT, dt)
            logger.info("%s: read its compiled program from %s in %.2f s", name, folder, dt)
        else:
            lowered = programs.store_jit(fun, jit_kwargs, options).lower(*args, **kwargs)
            with _fresh_compilation() as read:
                program = lowered.compile()
            if read[0]:
                logger.info("%s: its program came from JAX's compilation cache; not stored", name)
            elif save(folder, key, lowered, program):
                logger.info("%s: stored its compiled program in %s", name, folder)
        programs.put(key, program)
    return program, dyn_args, dyn_kwargs

