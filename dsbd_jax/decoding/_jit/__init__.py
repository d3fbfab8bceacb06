"""How a decoder becomes a checked, stored program: ``@decoder(core)``, in one private place.

A decoder module holds its algorithm, a core ``core(params, prompt_ids, prompt_lengths, *arrays,
config)``, and a public function that checks its arguments on the host and returns the core's
``(arrays, config)``; ``@decoder(core)`` on that function does the rest: the core runs under
``inputs.guard_inputs`` / ``inputs.mark_invalid`` (bad prompts blank their rows, also under the
user's ``jit``), as one ``tuned_jit`` program (``calls``), counted (``compiles``) and kept in the
program store (``programs``); ``public.prepare(...)`` is the ``calls.CoreCall`` a call runs.

Invariant: this package is the only part of ``dsbd_jax.decoding`` that imports ``dsbd_jax.host``.
"""

from __future__ import annotations

import functools
from typing import Callable

from dsbd_jax.decoding._jit import inputs
from dsbd_jax.decoding._jit.calls import CoreCall, Progress, _Core, loop, step_progress
from dsbd_jax.decoding._jit.compiles import compile_count
from dsbd_jax.host.cpu_options import CANDIDATES, tuned_jit

__all__ = ["CANDIDATES", "CoreCall", "Progress", "compile_count", "decoder", "inputs", "jit",
           "loop", "step_progress"]


def jit(fun: Callable) -> Callable:
    """``jax.jit(fun, static_argnames=("config",))`` under the host's compiler options
    (``tuned_jit``): for a decoder's helper programs that are not public decoders."""
    return tuned_jit(fun, static_argnames=("config",))


def _guarded_core(body: Callable, name: str) -> _Core:
    """``body`` as decoder ``name``'s jitted core, its prompts guarded and its bad rows blanked."""
    @functools.wraps(body)
    def core(params, prompt_ids, prompt_lengths, *arrays, config):
        invalid, prompt_ids, prompt_lengths = inputs.guard_inputs(
            name, config, params, prompt_ids, prompt_lengths)
        out = body(params, prompt_ids, prompt_lengths, *arrays, config=config)
        return inputs.mark_invalid(out, invalid, config.pad_id)
    return _Core(jit(core), name)


def decoder(body: Callable) -> Callable[[Callable], Callable]:
    """Decorator of a public decoder whose body checks its arguments and returns
    ``(arrays, config)``, the arguments of ``body`` after ``params``, ``prompt_ids`` and
    ``prompt_lengths`` are the first three arrays (module doc). The decorated function runs
    that call; ``.prepare(...)`` (same arguments) returns its ``CoreCall`` unrun, ``.lower(...)``
    its lowered program, ``.core`` the jitted core (``.core.clear_cache()``)."""
    def make(prepare: Callable) -> Callable:
        core = _guarded_core(body, prepare.__name__)

        def call(*args, **kwargs) -> CoreCall:
            arrays, config = prepare(*args, **kwargs)
            return core.bind(*arrays, config=config)

        @functools.wraps(prepare)
        def public(*args, **kwargs):
            return call(*args, **kwargs)()
        public.prepare = call
        public.lower = lambda *args, **kwargs: call(*args, **kwargs).lower()
        public.core = core
        return public
    return make
