"""Compile counting: how many real XLA compilations each decoder caused, whoever triggered them.

jax reports every backend compilation through ``jax.monitoring`` with the compiled function's
name; a compilation counts for a decoder when it compiles the decoder's core (``_dsbd_core``), or
the user's or ``ShardedDecoder``'s jit that traced the core. Each counted compilation logs one
INFO line (method, shapes, time). After a compilation this module also compares the process's
memory maps with ``vm.max_map_count`` (:func:`map_usage`) and warns past
``MAP_WARN_FRACTION``: a process that compiles thousands of programs otherwise dies in a
compilation. It only logs; nothing is freed behind the caller's back.
Long form: docs/results/design_notes.md.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import threading
import time
from typing import Dict, Optional, Tuple, Union

import jax
from jax import monitoring

logger = logging.getLogger("dsbd_jax")

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"
LOWER_EVENT = "/jax/core/compile/jaxpr_to_mlir_module_duration"
# what a watcher (``watch``) hears: a compilation's stages as they end
STAGES = {TRACE_EVENT: "traced", LOWER_EVENT: "lowered", BACKEND_COMPILE_EVENT: "compiled"}

_COUNTS: Dict[str, int] = collections.Counter()
_CORES: Dict[str, str] = {}          # jitted core's function name -> decoder name
# per thread: .pending {decoder: shapes} traced in the current outer trace, .awaiting
# {outer function name: pending} until it compiles, .last {decoder: shapes} of direct calls
_THREAD = threading.local()


def compile_count(name: Optional[str] = None) -> Union[int, Dict[str, int]]:
    """Real XLA compilations in this process: ``compile_count("dsbd_generate") -> int`` for one
    decoder (0 if never compiled), ``compile_count() -> {decoder name: int}`` (a copy) for all."""
    return dict(_COUNTS) if name is None else _COUNTS.get(name, 0)


def core_name(fun_name: str, decoder: str) -> None:
    """Register a jitted core's function name as decoder ``decoder``'s (at import time)."""
    _CORES[fun_name] = decoder


def _shapes(args) -> str:
    ids = args[1] if len(args) > 1 else None
    shape = getattr(ids, "shape", None)
    return f"batch {shape[0]}, prompt {shape[1]}" if shape is not None and len(shape) == 2 else "?"


def note_core_call(decoder: str, args) -> None:
    """Called by every core call: remembers the shapes for the INFO line and, when the
    arguments are traced (inside another jit), that the next compilation here is ``decoder``'s."""
    shapes = _shapes(args)
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(args)):
        if not hasattr(_THREAD, "pending"):
            _THREAD.pending = {}
        _THREAD.pending[decoder] = shapes
    else:
        if not hasattr(_THREAD, "last"):
            _THREAD.last = {}
        _THREAD.last[decoder] = shapes


# ---------------------------------------------------------------------------------------------
# the kernel's memory-map limit (module doc)
MAP_WARN_FRACTION = 0.75
MAP_CHECK_INTERVAL_S = 1.0
_MAPS = {"checked": float("-inf"), "warned": False}  # throttle and warn-once state (logging only)


def map_usage() -> Optional[Tuple[int, int]]:
    """``(memory maps this process holds, the kernel's vm.max_map_count)``, or ``None`` where
    ``/proc`` does not tell (not Linux)."""
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            limit = int(f.read().strip())
        with open("/proc/self/maps", "rb") as f:
            used = f.read().count(b"\n")
    except (OSError, ValueError):
        return None
    return used, limit


def check_map_usage(force: bool = False) -> Optional[Tuple[int, int]]:
    """Compare the process's memory maps with the kernel's limit (at most once every
    ``MAP_CHECK_INTERVAL_S`` unless ``force``); log one WARNING when they pass
    ``MAP_WARN_FRACTION`` of it (again only after they fell back below). Returns
    :func:`map_usage`'s answer, or ``None`` when skipped or unknown."""
    now = time.monotonic()
    if not force and now - _MAPS["checked"] < MAP_CHECK_INTERVAL_S:
        return None
    _MAPS["checked"] = now
    usage = map_usage()
    if usage is None:
        return None
    used, limit = usage
    high = limit > 0 and used >= MAP_WARN_FRACTION * limit
    if high and not _MAPS["warned"]:
        logger.warning(
            "this process holds %d memory maps of the kernel's limit of %d (vm.max_map_count). "
            "Every compiled XLA program keeps some until it is freed, and at the limit the next "
            "compilation kills the process with a segmentation fault. Free the cached programs "
            "with jax.clear_caches() (they compile again on their next call), run separate "
            "settings in separate processes, or raise the limit (sysctl -w "
            "vm.max_map_count=262144).", used, limit)
    _MAPS["warned"] = high
    return usage


@contextlib.contextmanager
def watch(fn):
    """Call ``fn(stage, seconds)`` as each stage of a compilation in this thread ends
    (``"traced"``, ``"lowered"``: XLA compiles next, ``"compiled"``) while the block runs."""
    if not hasattr(_THREAD, "watchers"):
        _THREAD.watchers = []
    _THREAD.watchers.append(fn)
    try:
        yield fn
    finally:
        _THREAD.watchers.remove(fn)


def _on_duration(event: str, duration: float, **kwargs) -> None:
    for fn in list(getattr(_THREAD, "watchers", ())):
        if event in STAGES:
            fn(STAGES[event], duration)
    if event not in (BACKEND_COMPILE_EVENT, TRACE_EVENT):
        return
    if event == BACKEND_COMPILE_EVENT:
        check_map_usage()
    fun = str(kwargs.get("fun_name", ""))   # "jit(_dsbd_core)" when compiling, in jax 0.10
    if fun.startswith("jit(") and fun.endswith(")"):
        fun = fun[4:-1]
    if not hasattr(_THREAD, "awaiting"):
        _THREAD.awaiting = {}
    if event == TRACE_EVENT:              # an outermost trace ended
        if fun not in _CORES and getattr(_THREAD, "pending", None):
            _THREAD.awaiting.setdefault(fun, {}).update(_THREAD.pending)
        _THREAD.pending = {}
        return
    if fun in _CORES:
        name = _CORES[fun]
        found = {name: getattr(_THREAD, "last", {}).get(name, "?")}
        where = ""
    else:
        found = _THREAD.awaiting.pop(fun, {})
        where = f", inside {fun}"
    for name, shapes in found.items():
        _COUNTS[name] += 1
        logger.info("compiled %s #%d (%s%s) in %.1f s", name, _COUNTS[name], shapes, where,
                    duration)


monitoring.register_event_duration_secs_listener(_on_duration)
