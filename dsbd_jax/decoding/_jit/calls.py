"""How a decoder call runs: every public decoder is a checked call of one jitted core.

``speculative_sample(...)`` runs ``speculative_sample.prepare(...)``, the ``CoreCall`` that the
decorator ``_jit.decoder`` makes: the decoder's jitted core (:class:`_Core`) with the exact
arguments it will run on. Ahead-of-time compilation (``call.lower()``, ``call.compile()``) and
the compiler options a call compiles under (``call.options``) come from the very call a user
makes. :func:`loop` is every decoder's ``lax.while_loop``, reporting to the config's
``Progress`` channel, or driven from the host in chunks (:func:`run_chunks`)."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Dict, NamedTuple, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.decoding._jit import programs
from dsbd_jax.decoding._jit.compiles import core_name, note_core_call, watch
from dsbd_jax.decoding.progress import _HOOKS, Progress

logger = logging.getLogger("dsbd_jax")


# ---------------------------------------------------------------------------------------------
# ahead-of-time compilation: a public decoder's ``.prepare`` validates the inputs on the host
# and returns the ``CoreCall`` of one jitted core, which a caller can run, lower or compile: the
# very program a real call runs.
class CoreCall(NamedTuple):
    """A decoder's jitted core with the arguments its public function prepared.

    ``via`` is the decoder's :class:`_Core` (which counts the call and reads the program store),
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
        if (isinstance(channel, Progress) and channel._stage_listeners
                and not any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(args))):
            channel._stage("start", 0.0)
            with watch(channel._stage):
                return self._call(channel, args, kwargs)
        return self._call(channel, args, kwargs)

    def _call(self, channel, args: tuple, kwargs: dict):
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
