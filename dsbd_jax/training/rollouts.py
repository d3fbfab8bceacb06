"""Continuations sampled from a model, a fixed number of prompts at a time: what distillation
(:func:`dsbd_jax.training.distill.make_rollouts`) and head training
(:func:`dsbd_jax.training.head_data.target_rollouts`) both train on; and what lets those long
phases stop and resume: :func:`ready` (a batch that Ctrl-C can interrupt) and
:class:`BatchStore` (finished batches on disk)."""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import threading
import time
from pathlib import Path
from typing import (Any, Callable, Container, Dict, Iterator, List, Optional, Sequence,
                    Tuple)

import jax
import numpy as np

from dsbd_jax.decoding.common import pad_prompts
from dsbd_jax.decoding.configs import SampleConfig
from dsbd_jax.decoding.sampling import sample

logger = logging.getLogger("dsbd_jax")


def sampled_batches(params, prompts: Sequence[Sequence[int]], dc: SampleConfig, key,
                    batch: int, length: int, skip: Container[int] = (),
                    heartbeat: Optional[Callable[[int, float], None]] = None
                    ) -> Iterator[Tuple[int, int, List[List[int]], np.ndarray, np.ndarray,
                                        np.ndarray]]:
    """Sample one continuation of each prompt, ``batch`` prompts per call (the last batch
    filled up with copies of its last prompt, so every call runs one compiled program), the
    prompts padded to ``length``; batch ``b`` starting at prompt ``i`` uses
    ``fold_in(key, i)``. Yields ``(i, n, chunk, lens, seqs, clen)``: the first ``n`` rows of
    ``chunk`` are real; ``lens [batch]`` prompt lengths, ``seqs [batch, T]`` the continuations,
    ``clen [batch]`` their lengths. Batches starting at an index in ``skip`` (a stopped run's,
    read back by the caller) are not sampled; each other one runs under :func:`ready` (Ctrl-C
    stops it at once; ``heartbeat(i, seconds)`` is called while batch ``i`` runs, every
    :data:`HEARTBEAT_S` seconds)."""
    def one(ids, key, lens):
        res = sample(params, ids, key, dc, prompt_lengths=lens)
        return res.sequences[:, 0], res.lengths[:, 0]

    for i in range(0, len(prompts), batch):
        if i in skip:
            continue
        chunk = [list(p) for p in prompts[i:i + batch]]
        n = len(chunk)
        chunk += [chunk[-1]] * (batch - n)
        ids, lens = pad_prompts(chunk, pad_id=0, length=length)
        beat = None if heartbeat is None else functools.partial(heartbeat, i)
        seqs, clen = ready(one, ids, jax.random.fold_in(key, i), lens, heartbeat=beat,
                           every_s=HEARTBEAT_S)
        yield i, n, chunk, lens, np.asarray(seqs), np.asarray(clen)


# ---------------------------------------------------------------------------------------------
# long phases that can be stopped and resumed

# a running batch says so this often (a batch can take minutes on a CPU); $DSBD_JAX_HEARTBEAT_S
HEARTBEAT_S = float(os.environ.get("DSBD_JAX_HEARTBEAT_S", "15"))


def batch_line(what: str, start: int, batch: int, total: int, rows: int, tokens: int):
    """``heartbeat(seconds)`` printing one progress line for a running batch: which prompts,
    how long it has run, that the first one compiles."""
    def beat(seconds: float) -> None:
        print(f"train-head: {what}: prompts {start + 1}-{min(start + rows, total)} of {total} "
              f"({rows} x {tokens} new tokens) running for {seconds:.0f} s"
              + (" (the first batch compiles first)" if start == 0 else ""), flush=True)
    return beat

def ready(fun: Callable, *args, poll_s: float = 0.2, fetch: bool = True,
          heartbeat: Optional[Callable[[float], None]] = None, every_s: float = 15.0,
          **kwargs):
    """``jax.device_get(fun(*args, **kwargs))`` (``fetch=False``: the arrays, computed), run in
    a worker thread while this thread waits in short sleeps: Ctrl-C (``KeyboardInterrupt``)
    reaches the caller within ``poll_s`` seconds even while XLA compiles or runs the call (a
    blocking call would hold it for the whole batch, minutes on a CPU). An interrupted call
    keeps running in its thread; the caller stops the process (the command line does, saying
    how to resume). ``heartbeat(seconds)``: called every ``every_s`` seconds while the call
    runs (a progress line for a batch that takes minutes)."""
    box: Dict[str, Any] = {}

    def work():
        try:
            out = fun(*args, **kwargs)
            box["out"] = jax.device_get(out) if fetch else jax.block_until_ready(out)
        except BaseException as e:   # re-raised in the caller
            box["error"] = e

    t = threading.Thread(target=work, name="dsbd-jax-batch", daemon=True)
    t.start()
    t0 = last = time.monotonic()
    while t.is_alive():
        t.join(poll_s)
        if heartbeat is not None and t.is_alive() and time.monotonic() - last >= every_s:
            last = time.monotonic()
            heartbeat(last - t0)
    if "error" in box:
        raise box["error"]
    return box["out"]


def fingerprint(*parts) -> str:
    """A digest of ``parts`` (token lists, settings; anything ``repr`` spells fully): what a
    :class:`BatchStore`'s batches were computed from."""
    h = hashlib.sha256()
    for p in parts:
        h.update(repr(p).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


class BatchStore:
    """A phase's finished batches on disk, one ``.npz`` file each, in ``folder``, so that a
    stopped phase resumes from its last finished batch. ``what`` (:func:`fingerprint`) names
    what the batches are computed from; the batches of a folder that holds another ``what``
    (other data or settings) are removed, with a warning, and computed again. ``folder=None``:
    a store that keeps nothing (every batch is computed)."""

    def __init__(self, folder, what: str, label: str):
        self.folder = None if folder is None else Path(folder)
        self.label, self.read, self.computed = label, 0, 0
        if self.folder is None:
            return
        tag = self.folder / "what.txt"
        if tag.is_file() and tag.read_text().strip() != what:
            stale = list(self.folder.glob("*.npz"))
            logger.warning("%s: %d batch(es) of %s from other data or settings (%s, now %s) "
                           "removed; computing them again", self.folder, len(stale), label,
                           tag.read_text().strip(), what)
            for f in stale:
                f.unlink()
        self.folder.mkdir(parents=True, exist_ok=True)
        tag.write_text(what + "\n")

    def _path(self, name: str) -> Path:
        return self.folder / f"{name}.npz"

    def get(self, name: str) -> Optional[Dict[str, np.ndarray]]:
        """The arrays stored for batch ``name``, or None."""
        if self.folder is None or not self._path(name).is_file():
            return None
        with np.load(self._path(name)) as z:
            out = {k: z[k] for k in z.files}
        self.read += 1
        return out

    def put(self, name: str, arrays: Dict[str, np.ndarray]) -> None:
        """Store batch ``name`` (written whole, then renamed: a stop never leaves half a
        batch)."""
        self.computed += 1
        if self.folder is None:
            return
        tmp = self.folder / f".{name}.tmp.npz"
        np.savez(tmp, **arrays)
        os.replace(tmp, self._path(name))

    def summary(self) -> str:
        """``"3 batches read from FOLDER, 2 computed"``, or ``"5 batches computed"``."""
        if self.read:
            return (f"{self.read} batch(es) read from {self.folder} (a stopped run's), "
                    f"{self.computed} computed")
        return f"{self.computed} batch(es) computed"
