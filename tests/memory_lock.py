"""The suite's memory lock: ``scripts/test.sh`` runs its folders in two lanes side by
side, and a real-model test (tests marked ``slow``: a 1.5B model is ~11.5 GB) must not run while
the other lane's tests push the machine's memory up. Every test holds a slot of the lock while it
runs (``tests/conftest.py``): a heavy test exclusively (no other test of any lane runs beside it),
the others shared (any number together). Two files under the temp dir, keyed by the repository
path (so other checkouts are not affected), locked with ``fcntl.flock``:

* ``.gate``: a heavy test takes it exclusively first, so the tests that start after it wait at
  the gate (a light test holds it shared only while taking its slot): a heavy test is never
  starved by a lane whose tests follow each other without a gap;
* ``.lock``: the slot itself: shared by light tests while they run, exclusive for a heavy one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import tempfile
from pathlib import Path
from typing import Iterator, Tuple


def lock_paths(root) -> Tuple[Path, Path]:
    """``(gate, lock)`` files for the repository at ``root``."""
    key = hashlib.sha1(str(Path(root).resolve()).encode()).hexdigest()[:12]
    base = Path(tempfile.gettempdir()) / f"dsbd-tests-{key}"
    return base.with_suffix(".gate"), base.with_suffix(".lock")


@contextlib.contextmanager
def memory_slot(root, heavy: bool) -> Iterator[None]:
    """Hold a slot of ``root``'s memory lock for the ``with`` block: exclusive if ``heavy``
    (waits until the tests running now end; later ones wait for this one), else shared."""
    gate_path, lock_path = lock_paths(root)
    with open(gate_path, "a") as gate, open(lock_path, "a") as lock:
        try:
            fcntl.flock(gate, fcntl.LOCK_EX if heavy else fcntl.LOCK_SH)
            fcntl.flock(lock, fcntl.LOCK_EX if heavy else fcntl.LOCK_SH)
            if not heavy:
                fcntl.flock(gate, fcntl.LOCK_UN)
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)
