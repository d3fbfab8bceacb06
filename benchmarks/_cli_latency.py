"""How soon the command line answers: help, option refusals, and a warm run's first token.

Whole commands, timed from outside (wall seconds, the median of ``--repeats`` runs), each a new
``python -m dsbd_jax`` process as a user's ``dsbd`` is:

* ``python_startup``: ``python -c pass``, the interpreter alone (the floor of every command);
* ``help``: ``dsbd --help``; ``help_demo``: ``dsbd demo --help`` (answered before JAX is
  imported: ``tests/test_cli_light.py``);
* ``refusal_generate``: ``dsbd generate --prompt hi --threshold 1.5`` (refused: a bad setting,
  before JAX is imported);
* ``refusal_bench``: ``dsbd bench configs/quick_cpu.yaml --max-new-tokens 0`` (refused);
* ``first_token_warm``: the README's example, ``dsbd generate --prompt "Write quicksort in
  Python." --method dsbd --beams 2 --max-new-tokens 1``, after one untimed run that fills the
  caches (converted weights, compiled programs): the imports, loading, tracing the decoder and
  reading its compiled program back (the default progress, elapsed seconds, keeps the decoder
  free of host callbacks, so JAX's compilation cache holds it), the prompt passes and the first
  iteration; ``generate`` runs its decoder once. Skipped with ``--no-model``.

The JSON's ``machine`` block names the host (CPU model, its deciding flags such as ``avx2`` or
``avx512_bf16``, cores, jax); ``load_per_core`` is the load average per core before the first
command (a figure taken beside other work is no figure). The goal is ``help`` and the refusals
at or under 1 s on a 2-core AVX2 host.

    .venv/bin/python -m benchmarks.speed --cli --no-model --out results/cli_latency_<host>.json
    .venv/bin/python -m benchmarks.speed --cli --repeats 5 --out results/cli_latency_<host>.json  # warm
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

COMMANDS = {
    "python_startup": (None, 0),
    "help": (["--help"], 0),
    "help_demo": (["demo", "--help"], 0),
    "refusal_generate": (["generate", "--prompt", "hi", "--threshold", "1.5"], 2),
    "refusal_bench": (["bench", "configs/quick_cpu.yaml", "--max-new-tokens", "0"], 2),
    "first_token_warm": (["generate", "--prompt", "Write quicksort in Python.", "--method",
                          "dsbd", "--beams", "2", "--max-new-tokens", "1"], 0),
}


def run(args, expect_rc):
    """Wall seconds of ``python -m dsbd_jax ARGS`` (``RuntimeError`` on another exit status)."""
    argv = [sys.executable, "-c", "pass"] if args is None else [sys.executable, "-m",
                                                                 "dsbd_jax", *args]
    t0 = time.perf_counter()
    r = subprocess.run(argv, cwd=_ROOT, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != expect_rc:
        raise RuntimeError(f"{' '.join(argv[1:])}: exit {r.returncode}, expected {expect_rc}:\n"
                           f"{r.stderr[-1500:]}")
    return dt


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-model", action="store_true", help="only the refusals")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from dsbd_jax.eval.timing import machine_info, portable_settings, write_json
    load = os.getloadavg()[0] / max(os.cpu_count() or 1, 1) if hasattr(os, "getloadavg") else None
    out = {"machine": machine_info(), "settings": portable_settings(vars(args), _ROOT),
           "load_per_core": None if load is None else round(load, 2),
           "seconds": {}, "commands": {}}
    for name, (cmd, rc) in COMMANDS.items():
        if args.no_model and name == "first_token_warm":
            continue
        if name == "first_token_warm":
            run(cmd, rc)  # fills the caches; not timed
        times = [run(cmd, rc) for _ in range(args.repeats)]
        out["seconds"][name] = statistics.median(times)
        out["commands"][name] = "python -c pass" if cmd is None else "dsbd " + " ".join(cmd)
        print(f"{name}: {out['seconds'][name]:.2f} s (runs: "
              f"{', '.join(f'{t:.2f}' for t in times)})", flush=True)
    write_json(args.out, out)
    print(f"wrote {args.out}")
    return out
