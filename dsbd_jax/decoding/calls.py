"""How a decoder call runs: every public decoder is a checked call of one jitted core.

``speculative_sample(...)`` is ``speculative_sample.prepare(...)()``: ``prepare`` (named by
``@prepared_by``) checks the inputs on the host and returns a ``CoreCall``, the decoder's jitted
core (``@core``) with the exact arguments it will run on; calling that runs it. So ahead-of-time
compilation (``call.lower()``, ``call.compile()``) and the compiler options a call compiles
under (``call.options``) come from the very call a user makes, with no switch anywhere that
changes what a call does. ``with_progress`` reports each iteration to the host when the
config carries a ``Progress`` channel."""

from __future__ import annotations

import contextlib
import logging
from typing import Any, Callable, Dict, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.decoding import programs
from dsbd_jax.decoding.compiles import core_name, note_core_call

logger = logging.getLogger("dsbd_jax")


# ---------------------------------------------------------------------------------------------
# ahead-of-time compilation: every public decoder is ``@prepared_by(prepare)``: ``prepare``
# validates the inputs on the host and returns the ``CoreCall`` of one jitted core (``@core`` on
# top of ``jax.jit``), which a caller can run, lower or compile: the very program a real call
# runs.
class CoreCall(NamedTuple):
    """A decoder's jitted core with the arguments its public function prepared.

    ``via`` is the decoder's ``@core`` (which counts the call and reads the program store),
    ``core`` its jit object (``tuned_jit``), ``args`` / ``kwargs`` the arguments; calling the
    ``CoreCall`` runs it as the public function would."""

    via: "_Core"
    args: tuple
    kwargs: dict

    def __call__(self):
        return self.via(*self.args, **self.kwargs)

    @property
    def core(self) -> Callable:
        """The jit object the call compiles and runs (``tuned_jit``)."""
        return self.via.__wrapped__

    @property
    def decoder(self) -> str:
        """The public decoder's name (``"dsbd_generate"``, ...)."""
        return self.via.decoder

    @property
    def options(self) -> Dict[str, Any]:
        """The XLA compiler options this call's program compiles under (``{}``: XLA's
        defaults): those the config names (``options``, e.g. a ``HostPlan``'s), else those
        ``tuned_jit`` picks from the arguments' kernels (``models.cpu_options``)."""
        if hasattr(self.core, "for_call"):
            return self.core.for_call(self.args, self.kwargs, named_options(self.kwargs))[1]
        return {}

    def lower(self):
        if hasattr(self.core, "for_call"):
            return self.core.for_call(self.args, self.kwargs, named_options(self.kwargs))[0].lower(
                *self.args, **self.kwargs)
        return self.core.lower(*self.args, **self.kwargs)

    def compile(self):
        """The compiled program. jax keeps it in the core's cache, so the public call with the
        same argument shapes and static config runs it without compiling again."""
        return self.lower().compile()


def named_options(kwargs) -> Any:
    """The compiler options a core's call names itself: its config's ``options`` (a candidate
    of ``models.cpu_options.CANDIDATES``, e.g. ``HostPlan.options``), ``None`` where the
    config has none and the arguments' kernels decide."""
    return getattr(kwargs.get("config"), "options", None)


class _Core:
    """A jitted decoder core: runs as the ``jax.jit`` function it wraps (whose attributes,
    e.g. ``lower`` and ``clear_cache``, it forwards); ``bind`` makes its ``CoreCall``."""

    def __init__(self, jitted, name: str):
        self._jitted = jitted
        self.__wrapped__ = jitted
        self.__name__ = getattr(jitted, "__name__", "core")
        self.__doc__ = getattr(jitted, "__doc__", None)
        self.decoder = name
        self.programs = programs.LoadedPrograms()   # read back from the store (programs.py)
        core_name(self.__name__, name)

    def bind(self, *args, **kwargs) -> CoreCall:
        """The call of this core with these arguments, not run."""
        return CoreCall(self, args, kwargs)

    def __call__(self, *args, **kwargs):
        note_core_call(self.decoder, args)
        if not hasattr(self._jitted, "run"):
            return self._jitted(*args, **kwargs)
        folder, named = programs.store_folder(), named_options(kwargs)
        if folder is None or any(isinstance(x, jax.core.Tracer)
                                 for x in jax.tree.leaves((args, kwargs))):
            return self._jitted.run(args, kwargs, named)
        jitted, options = self._jitted.for_call(args, kwargs, named)
        return programs.call(self.decoder, jitted, self._jitted._fun, self._jitted._jit_kwargs,
                             options, self.programs, args, kwargs, folder)

    def clear_cache(self):
        """Drop the compiled programs of the jit and those loaded from the program store."""
        self.programs.cache_clear()
        self._jitted.clear_cache()

    def __getattr__(self, name):
        return getattr(self._jitted, name)


def core(name: str) -> Callable[[Callable], _Core]:
    """Decorator: mark a ``jax.jit`` function as the core of the public decoder ``name`` (its
    compilations count as ``compile_count(name)``; ``core.bind(...)`` makes a ``CoreCall``)."""
    return lambda jitted: _Core(jitted, name)


def prepared_by(prepare: Callable[..., CoreCall]) -> Callable[[Callable], Callable]:
    """Decorator of a public decoder whose body is ``return prepare(...)()``: records
    ``prepare`` (same arguments; checks them and returns the ``CoreCall``) as the decoder's
    ``.prepare`` attribute, which ``methods.Decoder.core_call`` uses, and gives the decoder a
    ``jax.jit``-like ``.lower(...)`` (same arguments: the lowered program of that call, whose
    ``.compile()`` a public call of the same shapes then runs without compiling)."""
    def mark(public: Callable) -> Callable:
        public.prepare = prepare
        public.lower = lambda *args, **kwargs: prepare(*args, **kwargs).lower()
        return public
    return mark


# ---------------------------------------------------------------------------------------------
# progress: a decoder whose config has ``progress=Progress()`` calls that channel once per loop
# trip (``jax.debug.callback``) with numpy values: ``iterations`` (loop trips so far),
# ``generated`` ([B] new tokens per prompt), ``target_calls`` and, for DSBD, ``accepted`` /
# ``verified`` (accepted candidates / verified layers so far, summed over prompts). The channel
# is the caller's object, so no listener lives in the library.
class Progress:
    """A progress channel for decoders: ``DSBDConfig(..., progress=channel)`` (any decoder's
    config) compiles a program that, after every loop trip, calls each function listening on
    ``channel`` (:meth:`listen`) with a dict of numpy values (module comment above). The
    program holds the channel itself (hashed by identity, a static part of the config): keep
    one channel per decoder and change its listeners freely between runs, with no
    recompilation; a new channel is a new program (and a program with progress is a separate
    one from the program without)."""

    def __init__(self):
        self._listeners: list = []

    @contextlib.contextmanager
    def listen(self, fn: Callable[[Dict[str, np.ndarray]], None]):
        """Call ``fn(values)`` after every loop trip while the ``with`` block runs."""
        self._listeners.append(fn)
        try:
            yield fn
        finally:
            self._listeners.remove(fn)

    def __call__(self, values) -> None:
        values = {k: np.asarray(v) for k, v in values.items()}
        for fn in list(self._listeners):
            fn(values)


# ``progress=True`` (before channels): report to the functions of ``progress_hook``, listening
# on a channel this module holds. Kept for one release; a ``Progress`` channel replaces both.
_HOOKS = Progress()
_WARNED: list = []


@contextlib.contextmanager
def progress_hook(fn: Callable[[Dict[str, np.ndarray]], None]):
    """Call ``fn(values)`` after every loop trip of decoders configured with ``progress=True``
    while the ``with`` block runs. Deprecated: give the config ``progress=Progress()`` and
    listen on that channel (:meth:`Progress.listen`)."""
    if not _WARNED:
        _WARNED.append(True)
        import warnings
        warnings.warn("progress_hook and progress=True are deprecated: pass "
                      "progress=dsbd_jax.decoding.calls.Progress() in the config and listen on "
                      "it (channel.listen(fn)); they will be removed in the next release",
                      DeprecationWarning, stacklevel=3)
    with _HOOKS.listen(fn):
        yield fn


def step_progress(batch: int) -> Callable:
    """Progress values of the one-token-per-step decoders (sampling, beam sampling/search): one
    loop trip = one token for every prompt."""
    return lambda s: dict(iterations=s.step, generated=jnp.full((batch,), s.step),
                          target_calls=s.target_calls)


def with_progress(config, body: Callable, values: Callable) -> Callable:
    """``body`` of a ``lax.while_loop``, reporting ``values(new_state)`` after each trip to
    ``config.progress`` (a :class:`Progress` channel; ``True``: the deprecated
    ``progress_hook`` functions). No callback is traced otherwise, so the program is
    unchanged."""
    channel = getattr(config, "progress", False)
    if channel is False or channel is None:
        return body
    report = channel if isinstance(channel, Progress) else _HOOKS

    def reporting(state):
        state = body(state)
        jax.debug.callback(report, values(state))
        return state
    return reporting
