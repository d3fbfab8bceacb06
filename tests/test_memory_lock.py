"""The suite's memory lock (``tests/memory_lock.py``) keeps a heavy (real-model) test
apart from every other test, across processes (threads here: ``flock`` locks belong to each open
file, so two opens in one process exclude each other like two processes do)."""

from __future__ import annotations

import threading
import time

from memory_lock import lock_paths, memory_slot


def hold(root, heavy, seconds, events, name, started=None):
    with memory_slot(root, heavy):
        events.append((time.monotonic(), name, "in"))
        if started is not None:
            started.set()
        time.sleep(seconds)
        events.append((time.monotonic(), name, "out"))


def spans(events):
    got = {}
    for t, name, what in events:
        got.setdefault(name, {})[what] = t
    return {n: (d["in"], d["out"]) for n, d in got.items()}


def test_heavy_waits_for_running_tests_and_later_tests_wait_for_it(tmp_path):
    events = []
    first = threading.Event()
    light = threading.Thread(target=hold, args=(tmp_path, False, 0.6, events, "light", first))
    light.start()
    first.wait(5)
    heavy = threading.Thread(target=hold, args=(tmp_path, True, 0.6, events, "heavy"))
    heavy.start()
    time.sleep(0.2)  # the heavy test now waits at the lock, holding the gate
    later = threading.Thread(target=hold, args=(tmp_path, False, 0.1, events, "later"))
    later.start()
    for t in (light, heavy, later):
        t.join(10)
    s = spans(events)
    assert s["heavy"][0] >= s["light"][1]     # waited for the running light test
    assert s["later"][0] >= s["heavy"][1]     # the later light test waited for the heavy one


def test_light_tests_run_together_and_heavy_ones_one_at_a_time(tmp_path):
    events = []
    ts = [threading.Thread(target=hold, args=(tmp_path, False, 0.5, events, f"l{i}"))
          for i in range(2)]
    ts += [threading.Thread(target=hold, args=(tmp_path, True, 0.3, events, f"h{i}"))
           for i in range(2)]
    for t in ts[:2]:
        t.start()
    time.sleep(0.1)
    for t in ts[2:]:
        t.start()
    for t in ts:
        t.join(10)
    s = spans(events)
    assert s["l1"][0] < s["l0"][1] and s["l0"][0] < s["l1"][1]  # overlapped
    (a0, a1), (b0, b1) = sorted([s["h0"], s["h1"]])
    assert b0 >= a1                                            # never together
    assert min(a0, b0) >= max(s["l0"][1], s["l1"][1])          # nor beside a light test


def test_lock_files_are_per_checkout(tmp_path):
    assert lock_paths(tmp_path / "a") != lock_paths(tmp_path / "b")
    assert lock_paths(tmp_path / "a") == lock_paths(tmp_path / "a" / ".." / "a")
