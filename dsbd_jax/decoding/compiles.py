"""Compile counting: how many real XLA compilations each decoder caused, whoever triggered them.

jax reports every backend compilation through ``jax.monitoring`` (the duration event
``/jax/core/compile/backend_compile_duration`` with the compiled function's name as
``fun_name``, e.g. ``jit(_dsbd_core)``). A compilation is attributed to a decoder when

* ``fun_name`` is the name of a decoder's jitted core (``@common.core("dsbd_generate")`` on
  ``_dsbd_core``): the decoder was called directly and jax compiled its core; or
* the core was called with traced arguments inside someone else's ``jax.jit`` (the user's
  ``jax.jit(functools.partial(dsbd_generate, config=cfg))``, ``ShardedDecoder``'s): when that
  outermost trace ends (jax's ``/jax/core/compile/jaxpr_trace_duration`` event, which fires for
  top-level traces only, names the function), the decoders traced in it wait for that
  function's compilation, which then counts as theirs.

A user's jit and a plain call on the same shapes are two programs and count twice. A hit of
jax's persistent compilation cache still passes through the backend-compile event and counts.
Each counted compilation logs one INFO line on the ``dsbd_jax`` logger: method, shapes, time.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Dict, Optional, Union

import jax
from jax import monitoring

logger = logging.getLogger("dsbd_jax")

BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
TRACE_EVENT = "/jax/core/compile/jaxpr_trace_duration"

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


def _on_duration(event: str, duration: float, **kwargs) -> None:
    if event not in (BACKEND_COMPILE_EVENT, TRACE_EVENT):
        return
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
