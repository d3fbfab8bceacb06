"""The demo as a user runs it: each run's wall seconds and peak resident memory, and the cache
it leaves on disk.

``--runs`` runs of ``dsbd demo`` one after the other, each in a fresh process, sharing one cache
folder (``--cache``; default a new, empty folder, so the first run converts and caches the
models and compiles, and the later runs read both back). Arguments after ``--`` go to the demo
(e.g. ``-- --weights int8 --draft-weights int8``). Each run reports its exit status, wall
seconds and peak RSS (``VmHWM``, the process's own high-water mark), and after each run the
cache's entries with their bytes, as ``dsbd cache`` lists them (``cli.commands.cache_entries``),
and before each run the bytes of the cache held in the OS page cache (:func:`page_cache_bytes`).
JSON to ``--out`` with the host.

    .venv/bin/python benchmarks/demo_memory.py --out results/demo_memory_int8_<host>.json \\
        -- --weights int8 --draft-weights int8
    .venv/bin/python benchmarks/demo_memory.py --small --out /tmp/demo_memory.json   # tiny pair
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)

# the demo in this process, then its peak RSS (VmHWM: this process's own, reset by exec)
CHILD = r"""
import json, sys
from dsbd_jax.cli import main
rc = main(sys.argv[1:])
hwm = [int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:")]
print("DEMO_MEMORY " + json.dumps({"rc": rc, "peak_rss_bytes": hwm[0] if hwm else None}))
"""


def page_cache_bytes(folder: Path):
    """Bytes of ``folder``'s files held in the OS page cache (util-linux ``fincore``), or
    ``None`` where it cannot tell (no ``fincore``, no files). A second demo whose cached
    models are not resident reads them back from disk during its first round."""
    import shutil
    files = [str(p) for p in Path(folder).rglob("*") if p.is_file() and p.stat().st_size]
    if not files or shutil.which("fincore") is None:
        return None
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--raw", "--output", "RES",
                          *files], capture_output=True, text=True)
    if out.returncode != 0:
        return None
    return sum(int(x) for x in out.stdout.split())


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    demo_args = argv[argv.index("--") + 1:] if "--" in argv else []
    own = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--cache", default=None, help="the cache folder (default: a new, empty one)")
    ap.add_argument("--small", action="store_true",
                    help="the tiny random pair (dsbd make-tiny-pair), 4 new tokens: a check")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(own)
    if args.runs < 1:
        raise SystemExit("--runs must be >= 1")
    from dsbd_jax.cli.commands import cache_entries
    from dsbd_jax.eval.timing import machine_info, portable_settings, write_json
    cache = Path(args.cache or tempfile.mkdtemp(prefix="dsbd_demo_cache_"))
    if args.small:
        from dsbd_jax.testing import make_tiny_pair
        t, d = make_tiny_pair(Path(tempfile.mkdtemp(prefix="demo_memory_")) / "pair")
        demo_args = ["--target", str(t), "--draft", str(d), "--prompt", "hi",
                     "--max-new-tokens", "4", *demo_args]
    env = dict(os.environ, DSBD_JAX_CACHE=str(cache))
    runs = []
    for i in range(args.runs):
        resident = page_cache_bytes(cache)
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-c", CHILD, "demo", *demo_args], env=env,
                              cwd=_ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        lines = [l for l in proc.stdout.splitlines() if l.startswith("DEMO_MEMORY ")]
        if proc.returncode != 0 or not lines:
            raise SystemExit(f"run {i + 1}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
        rec = json.loads(lines[-1][len("DEMO_MEMORY "):])
        verdict = [l for l in proc.stdout.splitlines() if l.startswith("DSBD ")]
        runs.append({"run": i + 1, "rc": rec["rc"], "wall_s": wall,
                     "peak_rss_bytes": rec["peak_rss_bytes"], "verdict": verdict[-1:],
                     "cache_bytes": dict(cache_entries(cache)),
                     "cache_resident_before_bytes": resident})
        print(f"run {i + 1}: {wall:.1f} s, peak RSS {rec['peak_rss_bytes'] / 1e9:.2f} GB, "
              f"cache {sum(runs[-1]['cache_bytes'].values()) / 1e9:.2f} GB", flush=True)
    settings = portable_settings({**vars(args), "demo_args": demo_args}, _ROOT)
    settings["cache"] = "given" if args.cache else "a new, empty folder"
    res = {"benchmark": "demo_memory", "machine": machine_info(), "settings": settings,
           "runs": runs}
    write_json(args.out, res)
    print(f"wrote {args.out}")
    return res


if __name__ == "__main__":
    main()
