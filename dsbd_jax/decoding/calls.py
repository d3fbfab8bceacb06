"""How a decoder call runs: every public decoder checks its inputs on the host, then calls one
jitted core (``@core``); ``capture_core_calls`` hands back that core and its exact arguments
instead of running it (ahead-of-time compilation), and ``with_progress`` / ``progress_hook``
report each iteration to the host when a progress callback is installed."""

from __future__ import annotations

import contextlib
import logging
from typing import Callable, Dict, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.decoding import programs
from dsbd_jax.decoding.compiles import core_name, note_core_call

logger = logging.getLogger("dsbd_jax")


# ---------------------------------------------------------------------------------------------
# ahead-of-time compilation: every public decoder validates its inputs on the host, then calls
# one jitted core (``@core`` on top of ``jax.jit``). Inside ``capture_core_calls()`` that call
# returns a ``CoreCall`` (the core and the exact arguments) instead of running, so a caller can
# lower or compile the very program a real call would run, without running it.
_CAPTURING: list = []


class CoreCall(NamedTuple):
    """A decoder's jitted core with the arguments its public function prepared."""

    core: Callable
    args: tuple
    kwargs: dict

    def lower(self):
        return self.core.lower(*self.args, **self.kwargs)

    def compile(self):
        """The compiled program. jax keeps it in the core's cache, so the public call with the
        same argument shapes and static config runs it without compiling again."""
        return self.lower().compile()


class _Core:
    """A jitted decoder core: runs as the ``jax.jit`` function it wraps (whose attributes,
    e.g. ``lower`` and ``clear_cache``, it forwards), or is captured as a ``CoreCall``."""

    def __init__(self, jitted, name: str):
        self._jitted = jitted
        self.__wrapped__ = jitted
        self.__name__ = getattr(jitted, "__name__", "core")
        self.__doc__ = getattr(jitted, "__doc__", None)
        self.decoder = name
        self.programs = programs.LoadedPrograms()   # read back from the store (programs.py)
        core_name(self.__name__, name)

    def __call__(self, *args, **kwargs):
        if _CAPTURING:
            return CoreCall(self._jitted, args, kwargs)
        note_core_call(self.decoder, args)
        folder = programs.store_folder()
        if folder is None or not hasattr(self._jitted, "for_call") or any(
                isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((args, kwargs))):
            return self._jitted(*args, **kwargs)
        jitted, options = self._jitted.for_call(args, kwargs)
        return programs.call(self.decoder, jitted, self._jitted._fun, self._jitted._jit_kwargs,
                             options, self.programs, args, kwargs, folder)

    def clear_cache(self):
        """Drop the compiled programs of the jit and those loaded from the program store."""
        self.programs.cache_clear()
        self._jitted.clear_cache()

    def __getattr__(self, name):
        return getattr(self._jitted, name)


def core(name: str) -> Callable[[Callable], _Core]:
    """Decorator: mark a ``jax.jit`` function as the core of the public decoder ``name`` (see
    ``capture_core_calls``; its compilations count as ``compile_count(name)``)."""
    return lambda jitted: _Core(jitted, name)


@contextlib.contextmanager
def capture_core_calls():
    """While active, calls of ``@core`` functions return a ``CoreCall`` instead of running."""
    _CAPTURING.append(True)
    try:
        yield
    finally:
        _CAPTURING.pop()


# ---------------------------------------------------------------------------------------------
# progress: decoders built with ``config.progress=True`` call the registered host functions once
# per loop trip (``jax.debug.callback``) with numpy values: ``iterations`` (loop trips so far),
# ``generated`` ([B] new tokens per prompt), ``target_calls`` and, for DSBD, ``accepted`` /
# ``verified`` (accepted candidates / verified layers so far, summed over prompts).
_PROGRESS_HOOKS: list = []


@contextlib.contextmanager
def progress_hook(fn: Callable[[Dict[str, np.ndarray]], None]):
    """Call ``fn(values)`` after every loop trip of decoders configured with ``progress=True``
    while the ``with`` block runs (e.g. to update a progress bar)."""
    _PROGRESS_HOOKS.append(fn)
    try:
        yield fn
    finally:
        _PROGRESS_HOOKS.remove(fn)


def _dispatch_progress(values) -> None:
    values = {k: np.asarray(v) for k, v in values.items()}
    for fn in list(_PROGRESS_HOOKS):
        fn(values)


def step_progress(batch: int) -> Callable:
    """Progress values of the one-token-per-step decoders (sampling, beam sampling/search): one
    loop trip = one token for every prompt."""
    return lambda s: dict(iterations=s.step, generated=jnp.full((batch,), s.step),
                          target_calls=s.target_calls)


def with_progress(config, body: Callable, values: Callable) -> Callable:
    """``body`` of a ``lax.while_loop``, reporting ``values(new_state)`` after each trip when
    ``config.progress`` (no callback is traced otherwise, so the program is unchanged)."""
    if not getattr(config, "progress", False):
        return body

    def reporting(state):
        state = body(state)
        jax.debug.callback(_dispatch_progress, values(state))
        return state
    return reporting
