"""Progress channels: how a long decoder call reports each loop trip to the caller.

``Progress()`` reports from inside the compiled program (a host callback); ``Progress(every=k)``
from the host, which then drives the loop in chunks of ``k`` trips (``_jit.calls.run_chunks``),
so the programs stay cacheable. The channel is the caller's object: no listener lives in the
library, and a listener added or removed between runs recompiles nothing.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Optional

import numpy as np


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
        self._stage_listeners: list = []

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

    @contextlib.contextmanager
    def listen_stages(self, fn: Callable[[str, float], None]):
        """Call ``fn(stage, seconds)`` as a call on this channel goes: ``("start", 0.0)`` before
        its first program runs, then, when it compiles, ``"traced"``, ``"lowered"`` (XLA
        compiles next: minutes for a real model on a CPU) and ``"compiled"`` with each stage's
        seconds, so a first call is not minutes of silence. Outside the user's own ``jax.jit``
        only (there the user's program compiles, not the decoder's)."""
        self._stage_listeners.append(fn)
        try:
            yield fn
        finally:
            self._stage_listeners.remove(fn)

    def _stage(self, stage: str, seconds: float) -> None:
        for fn in list(self._stage_listeners):
            fn(stage, seconds)

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
                      "progress=dsbd_jax.Progress() in the config and listen on "
                      "it (channel.listen(fn)); they will be removed in the next release",
                      DeprecationWarning, stacklevel=3)
    with _HOOKS.listen(fn):
        yield fn
