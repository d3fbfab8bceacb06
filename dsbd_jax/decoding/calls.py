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
import dataclasses
import logging
from typing import Any, Callable, Dict, NamedTuple, Optional, Tuple

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
        """The compiled program of this call (``lower().compile()``)."""
        return self.lower().compile()

    def prepared(self):
        """The program the call runs, made ready where the call looks for it, nothing run: a
        later call with the same argument shapes and static config compiles nothing. With the
        program store on, the call runs the store's program (:mod:`.programs`): it is compiled,
        or read back, and kept there (a jit's own ``lower().compile()`` would not be what the
        call runs, and the call would compile it a second time). Otherwise :meth:`compile`."""
        folder = programs.store_folder()
        if (folder is not None and hasattr(self.core, "run")
                and not any(isinstance(x, jax.core.Tracer)
                            for x in jax.tree.leaves((self.args, self.kwargs)))):
            jitted, options = self.core.for_call(self.args, self.kwargs,
                                                 named_options(self.kwargs))
            program, _, _ = programs.program_for(self.decoder, jitted, self.core._fun,
                                                 self.core._jit_kwargs, options,
                                                 self.via.programs, self.args, self.kwargs,
                                                 folder)
            if program is not None:
                return program
        return self.compile()


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
        self._chunks: Dict[str, Any] = {}            # chunked runs' programs by phase
        core_name(self.__name__, name)

    def bind(self, *args, **kwargs) -> CoreCall:
        """The call of this core with these arguments, not run."""
        return CoreCall(self, args, kwargs)

    def __call__(self, *args, **kwargs):
        note_core_call(self.decoder, args)
        channel = getattr(kwargs.get("config"), "progress", None)
        if (isinstance(channel, Progress) and channel.every is not None and set(kwargs) == {"config"}
                and hasattr(self._jitted, "run")
                and not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(args))):
            return run_chunks(self, args, kwargs["config"], channel)
        out = self._run(args, kwargs)
        seqs = getattr(out, "sequences", None)
        if isinstance(channel, Progress) and seqs is not None and not isinstance(
                seqs, jax.core.Tracer):
            rows = np.shape(seqs)[0]                # one program: every prompt done at its end
            channel._tell_done(np.ones(rows, bool), np.zeros(rows, bool), lambda: out)
        return out

    def _run(self, args: tuple, kwargs: dict):
        """The core's call as one program, through the program store when it is on."""
        if not hasattr(self._jitted, "run"):
            return self._jitted(*args, **kwargs)
        return _stored_run(self.decoder, self._jitted, self.programs, args, kwargs,
                           named_options(kwargs))

    def chunk_call(self, state, args: tuple, config, phase: Tuple[str, int]):
        """One program of a chunked run (:func:`run_chunks`), compiled under the options the
        core's own call would get, through the program store when it is on. The loop state
        leaves and enters the programs in the layouts XLA picks for the loop
        (``Layout.AUTO``): in the default layout each program would copy the KV caches in and
        out of the loop's own (a transpose of the target's cache, most of a prompt pass)."""
        kind = phase[0]
        if kind not in self._chunks:
            from jax.experimental.layout import Format, Layout
            fun = self._jitted._fun

            def program(state, core_args, config, phase):
                return _chunk_program(fun, state, core_args, config, phase)
            program.__name__ = program.__qualname__ = f"{self.__name__}_chunks"
            core_name(program.__name__, self.decoder)      # its compiles count as the decoder's
            auto = Format(Layout.AUTO)
            out = None if kind == "finish" else (auto, None, None)
            donate = () if kind == "finish" else (0,)     # the outputs: default layouts
            self._chunks[kind] = (type(self._jitted)(
                program, static_argnums=(2, 3), donate_argnums=donate,
                in_shardings=(auto, None), out_shardings=out), programs.LoadedPrograms())
        chunks, loaded = self._chunks[kind]
        return _stored_run(f"{self.decoder}/chunks", chunks, loaded, (state, args, config, phase),
                           {}, getattr(config, "options", None))

    def clear_cache(self):
        """Drop the compiled programs of the jit and those loaded from the program store."""
        self.programs.cache_clear()
        self._jitted.clear_cache()
        for chunks, loaded in self._chunks.values():
            chunks.clear_cache()
            loaded.cache_clear()

    def __getattr__(self, name):
        return getattr(self._jitted, name)


def _stored_run(name: str, tuned, loaded, args: tuple, kwargs: dict, named):
    """``tuned`` (a ``tuned_jit``) called with ``args`` / ``kwargs`` under the compiler options
    ``named`` (``None``: the arguments' kernels pick them), through the program store under
    ``name`` when it is on and no argument is traced (``loaded``: the programs read back)."""
    folder = programs.store_folder()
    if folder is None or any(isinstance(x, jax.core.Tracer)
                             for x in jax.tree.leaves((args, kwargs))):
        return tuned.run(args, kwargs, named)
    jitted, options = tuned.for_call(args, kwargs, named)
    return programs.call(name, jitted, tuned._fun, tuned._jit_kwargs, options, loaded, args,
                         kwargs, folder)


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
# ``generated`` ([B] new tokens per prompt), ``done`` ([B] bool: the prompt's result is final),
# ``target_calls`` and, for DSBD and speculative sampling, ``accepted`` / ``verified`` (accepted
# candidates / verified layers or tokens so far, summed over prompts). The channel is the
# caller's object, so no listener lives in the library.
class Progress:
    """A progress channel for decoders: ``DSBDConfig(..., progress=channel)`` (any decoder's
    config) reports to each function listening on ``channel`` (:meth:`listen`) a dict of numpy
    values (module comment above), in one of two ways:

    * ``Progress()``: after every loop trip, from inside the compiled program (a host
      callback). Such a program is never cached on disk (neither JAX's persistent cache nor the
      program store keeps a program that calls back), so a new process compiles it again. The
      program holds the channel itself (hashed by identity, a static part of the config): keep
      one channel per decoder and change its listeners freely between runs, with no
      recompilation; a new channel is a new program.
    * ``Progress(every=k)``: after every ``k`` loop trips, from the host, which drives the loop
      in chunks (:func:`run_chunks`): three programs (the prompts' passes and the first ``k``
      trips; ``k`` more trips; the outputs), none with a callback, so they are cached and
      stored like any other and shared by every channel with the same ``every``. The outputs
      are those of the one-program call, bit for bit. Under the caller's own ``jax.jit`` the
      host cannot drive the loop: the call runs as one program without progress.
    """

    def __init__(self, every: Optional[int] = None):
        if every is not None and (not isinstance(every, (int, np.integer))
                                  or isinstance(every, bool) or every < 1):
            raise ValueError(f"Progress(every=...) must be None (a report per loop trip, from "
                             f"inside the program) or an int >= 1, got {every!r}")
        self.every = None if every is None else int(every)
        self._listeners: list = []
        self._done_listeners: list = []

    @contextlib.contextmanager
    def listen(self, fn: Callable[[Dict[str, np.ndarray]], None]):
        """Call ``fn(values)`` after every loop trip (every ``every`` trips) while the ``with``
        block runs."""
        self._listeners.append(fn)
        try:
            yield fn
        finally:
            self._listeners.remove(fn)

    @contextlib.contextmanager
    def listen_done(self, fn: Callable[[list, Any], None]):
        """Call ``fn(rows, outputs)`` as prompts finish while the ``with`` block runs: ``rows``
        the indices of the prompts just done, ``outputs`` the decoder's outputs for the whole
        batch at that point, final for those rows (the same arrays, row for row, as the call
        returns). Only a chunked run (``every`` set) can tell a prompt early: it runs the
        outputs' program on the loop state after the chunk in which prompts finished (an extra
        run of the decoder's last, small program per such chunk). Otherwise, and for prompts
        that finish in the last chunk, ``fn`` gets them with the call's outputs; a call under
        the caller's own ``jax.jit`` tells nothing."""
        self._done_listeners.append(fn)
        try:
            yield fn
        finally:
            self._done_listeners.remove(fn)

    def __call__(self, values) -> None:
        values = {k: np.asarray(v) for k, v in values.items()}
        for fn in list(self._listeners):
            fn(values)

    def _tell_done(self, done, told, outputs: Callable[[], Any]):
        """Report the prompts ``done`` (``[B]`` bool) and not yet ``told`` to the done listeners
        with ``outputs()`` (computed only if a prompt is new); returns the prompts told."""
        done = np.asarray(done, bool)
        new = done & ~told
        if self._done_listeners and new.any():
            out, rows = outputs(), np.flatnonzero(new).tolist()
            for fn in list(self._done_listeners):
                fn(rows, out)
        return told | done


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


def step_progress(batch: int, steps: int, stopped: Callable) -> Callable:
    """Progress values of the one-token-per-step decoders (sampling, beam sampling/search): one
    loop trip = one token for every prompt; a prompt is ``done`` after the last step or once
    ``stopped(state)`` (``[B]`` bool: its result can no longer change)."""
    return lambda s: dict(iterations=s.step, generated=jnp.full((batch,), s.step),
                          target_calls=s.target_calls, done=(s.step >= steps) | stopped(s))


def with_progress(config, body: Callable, values: Callable) -> Callable:
    """``body`` of a ``lax.while_loop``, reporting ``values(new_state)`` after each trip to
    ``config.progress`` (a :class:`Progress` channel without ``every``; ``True``: the
    deprecated ``progress_hook`` functions). No callback is traced otherwise (no progress, or
    a channel the host reports to between chunks), so the program is unchanged."""
    channel = getattr(config, "progress", False)
    if channel is False or channel is None or getattr(channel, "every", None) is not None:
        return body
    report = channel if isinstance(channel, Progress) else _HOOKS

    def reporting(state):
        state = body(state)
        jax.debug.callback(report, values(state))
        return state
    return reporting


def loop(config, cond: Callable, body: Callable, state, values: Callable):
    """Every decoder's ``lax.while_loop(cond, body, state)``, with ``values(state)`` the
    progress it reports (:func:`with_progress`). In a program of a chunked run
    (:func:`run_chunks`) it runs that program's part of the loop instead."""
    phase = getattr(config, "progress", False)
    if isinstance(phase, _Phase):
        return phase.run(cond, body, state, values)
    return jax.lax.while_loop(cond, with_progress(config, body, values), state)


# ---------------------------------------------------------------------------------------------
# chunked runs: ``Progress(every=k)``. The core's own function is traced three times, each time
# with a ``_Phase`` in place of its config's progress, which ``loop`` asks what to do:
# ``start`` runs the prologue (the prompts' passes) and at most k trips from the state the core
# built; ``step`` ignores that state (XLA drops the prologue that built it: nothing else reads
# it) and runs at most k trips from the state passed in; ``finish`` returns the state passed in,
# so the core's epilogue makes the outputs. The loop state leaves and re-enters the programs as
# arrays in the loop's own layouts, donated (``_Core.chunk_call``), so the caches are not copied.
class _Phase(Progress):
    """What ``loop`` does inside one program of a chunked run (comment above); lives only while
    that program is traced."""

    def __init__(self, kind: str, every: int, state_in=None):
        super().__init__()
        self.kind, self.chunk, self.state_in, self.out = kind, every, state_in, None

    def run(self, cond, body, state, values):
        if self.kind == "finish":
            return self.state_in
        start = state if self.kind == "start" else self.state_in

        def more(carry):
            s, trips = carry
            return (trips < self.chunk) & cond(s)

        def trip(carry):
            s, trips = carry
            return body(s), trips + 1
        s, _ = jax.lax.while_loop(more, trip, (start, jnp.zeros((), jnp.int32)))
        self.out = (s, values(s), cond(s))
        return s


def _chunk_program(fun: Callable, state, core_args: tuple, config, phase: Tuple[str, int]):
    """One program of a chunked run of the core ``fun`` (its own function, not jitted):
    ``(state, progress values, more)`` after ``start`` / ``step``, the outputs after
    ``finish``."""
    kind, every = phase
    holder = _Phase(kind, every, state)
    out = fun(*core_args, config=dataclasses.replace(config, progress=holder))
    return out if kind == "finish" else holder.out


def run_chunks(core: "_Core", args: tuple, config, channel: Progress):
    """The core's call with ``config`` (its ``progress`` the channel ``channel``, ``every``
    set) run as a host loop over compiled chunks of ``channel.every`` loop trips, reporting
    the progress values to ``channel`` after each chunk (:class:`Progress`)."""
    plain = dataclasses.replace(config, progress=False)

    def finish(state):
        return core.chunk_call(state, args, plain, ("finish", channel.every))
    state, values, more = core.chunk_call(None, args, plain, ("start", channel.every))
    told = np.zeros(np.shape(values["generated"]), bool)
    while True:
        channel(values)
        if not bool(more):
            break
        # prompts done now are told before the next chunk, which takes (donates) the state
        told = channel._tell_done(values["done"], told, lambda: finish(state))
        state, values, more = core.chunk_call(state, args, plain, ("step", channel.every))
    out = finish(state)
    channel._tell_done(np.ones_like(told), told, lambda: out)
    return out
