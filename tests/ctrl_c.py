"""Ctrl-C as a terminal delivers it, to a command started in a subprocess: the long commands'
stop tests (tests/training/test_stop_resume.py, tests/eval/test_bench_resume.py)."""

from __future__ import annotations

import signal
import subprocess
import time


def ctrl_c_after(argv, marker: str, *, env, cwd, timeout: float, settle: float = 0.0,
                 stream: str = "stdout"):
    """Start ``argv``, read its output until ``marker`` appears, wait ``settle`` seconds, send
    SIGINT; returns ``(exit status, the rest of stderr, seconds from the signal to the exit)``.
    ``stream``: where the marker is looked for, ``"stdout"`` (lines) or ``"stderr"`` (any text:
    progress bars rewrite their line with carriage returns). Fails if the marker never comes;
    kills the process if it outlives ``timeout`` seconds after the signal. A test lane runs in
    the background of a script, where the shell starts every command with SIGINT ignored (and
    Python keeps ignoring it), so the child gets the default disposition back first."""
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        if stream == "stdout":
            lines = []
            for line in proc.stdout:
                lines.append(line)
                if marker in line:
                    break
            assert any(marker in x for x in lines), "".join(lines) + proc.stderr.read()[-3000:]
        else:
            seen = ""
            while marker not in seen:
                c = proc.stderr.read(1)
                if not c:
                    break
                seen += c
            assert marker in seen, seen[-3000:]
        time.sleep(settle)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=timeout)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.returncode, err, took
