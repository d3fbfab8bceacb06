"""How long a long command takes to stop after Ctrl-C, phase by phase.

Runs ``COMMAND`` once per marker: reads its output (stdout and stderr together, progress bars
included) until the marker appears, sends SIGINT as a terminal would, and reports the seconds
from the signal to the exit, the exit status and the last line. On the tiny pair
(``dsbd make-tiny-pair /tmp/dsbd_tiny``; recipes as in ``tests/training/test_stop_resume.py``):

    .venv/bin/python benchmarks/probes/ctrl_c_phases.py --run-dir RUN \\
        --markers "loaded checkpoint|target rollouts|target passes 8/|step 0 held-out|step 10/" \\
        -- .venv/bin/dsbd train-head RECIPE

``--run-dir`` is removed before each run, so every run starts from nothing. The tests check the
bound (5 s) for the rollouts and training phases; this probe covers every phase by hand.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import time


def stop_after(argv, marker: str, env=None):
    """``(seconds from the signal to the exit, exit status, last line of output)``."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    seen = b""
    while marker.encode() not in seen:
        chunk = os.read(proc.stdout.fileno(), 4096)
        if not chunk:
            raise RuntimeError(f"{marker!r} never appeared; output ends "
                               f"{seen[-500:].decode(errors='replace')!r}")
        seen += chunk
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    rest = proc.stdout.read()
    proc.wait()
    took = time.monotonic() - t0
    lines = rest.decode(errors="replace").replace("\r", "\n").split("\n")
    last = [x for x in lines if x.strip()][-1:] or [""]
    return took, proc.returncode, last[0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--markers", required=True, help="'|'-separated output markers")
    ap.add_argument("--run-dir", required=True, help="removed before each run")
    ap.add_argument("command", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    env = dict(os.environ)
    env.setdefault("DSBD_JAX_CPU_OPTIONS", "default")
    for m in a.markers.split("|"):
        shutil.rmtree(a.run_dir, ignore_errors=True)
        took, code, last = stop_after(cmd, m, env)
        print(f"{m!r}: exit status {code} {took:.2f} s after SIGINT; last line: {last[:160]}",
              flush=True)


if __name__ == "__main__":
    main()
