"""jaxlib 0.10.2 against 0.11.x on the CPU, side by side.

The same measurement, ``benchmarks/accelerator.py`` on the CPU (random weights at the shapes of
the default Qwen 1.5B / 0.5B pair: forward passes at every shape and every decoder's cost per
iteration inside its compiled loop), runs alternately in two Python environments of this
machine: this project's (jax/jaxlib pinned at 0.10.2, Python 3.11) and a Debian trixie root with
Python 3.13 and jax/jaxlib 0.11.x (``scripts/jax011_check.sh`` builds it; jax 0.11 needs Python
>= 3.12). Rounds alternate the order (A B, B A, ...); each figure is the minimum over the rounds
of the per-process minimum, and the JSON gives the ratio 0.11.x / 0.10.2 for every item, with
both environments' ``machine_info`` (CPU model, versions, compiler options).

Needs root (chroot and bind mounts). Nothing else may run beside it: both cores are timed.

Usage: sudo python benchmarks/jax_versions.py --root $TMPDIR/dsbd-trixie [--rounds 2]
       [--out results/jax_versions_cpu.json] [-- ACCELERATOR_ARGS...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)

# forward passes and decoders of the default pair in float32 (bfloat16 is emulated on the CPU),
# batch 1, 512 cache slots: about 6 minutes per run on a 2-core host
DEFAULT_ARGS = ["--pairs", "qwen", "--dtypes", "float32", "--layouts", "per_layer",
                "--slots", "512", "--batches", "1", "--max-new-tokens", "16", "--repeats", "3",
                "--budget-s", "1800"]


def _ensure_mounts(root):
    for sub, src in (("proc", "/proc"), ("repo", _ROOT)):
        path = os.path.join(root, sub)
        os.makedirs(path, exist_ok=True)
        if subprocess.run(["mountpoint", "-q", path]).returncode != 0:
            subprocess.run(["mount", "--bind", src, path], check=True)


def _run(env, root, accel_args, out):
    """One accelerator.py process; returns its JSON."""
    script = "benchmarks/accelerator.py"
    if env == "host":
        python = os.path.join(_ROOT, ".venv", "bin", "python")
        cmd = [python if os.path.exists(python) else sys.executable, os.path.join(_ROOT, script)]
        cmd += accel_args + ["--out", out]
        environ = dict(os.environ, PYTHONPATH=_ROOT)
    else:  # the trixie root: the checkout is bind-mounted at /repo, `out` written under it
        rel = os.path.relpath(out, _ROOT)
        cmd = ["chroot", root, "/opt/v/bin/python", f"/repo/{script}"] + accel_args + [
            "--out", f"/repo/{rel}"]
        environ = dict(os.environ, PYTHONPATH="/repo", HOME="/root")
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, env=environ, cwd=_ROOT)
    print(f"  {env}: {time.perf_counter() - t0:.0f} s", flush=True)
    with open(out) as f:
        return json.load(f)


def _items(result):
    """``{item: ms}``: every forward pass and every decoder's cost per iteration."""
    items = {}
    for run in result["runs"]:
        for name, v in run["forward"].items():
            items[f"forward {name}"] = v["ms"]
        for batch, costs in run.get("decoders", {}).items():
            for method, c in costs.items():
                items[f"{method} batch {batch} ms/iteration"] = c["ms_per_iteration"]
    return items


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    accel_args = DEFAULT_ARGS
    if "--" in argv:
        i = argv.index("--")
        argv, accel_args = argv[:i], argv[i + 1:]
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                   "dsbd-trixie"))
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="/tmp/dsbd_jax_versions_cpu.json")
    args = ap.parse_args(argv)
    if not os.path.exists(os.path.join(args.root, "opt", "v", "bin", "python")):
        raise SystemExit(f"no venv at {args.root}/opt/v: build it with "
                         f"`sudo bash scripts/jax011_check.sh {args.root} --co -q`")
    _ensure_mounts(args.root)
    per_env = {"host": [], "trixie": []}
    machines = {}
    with tempfile.TemporaryDirectory(dir=_ROOT, prefix=".jax_versions_") as tmp:
        for r in range(args.rounds):
            order = ("host", "trixie") if r % 2 == 0 else ("trixie", "host")
            print(f"round {r + 1}/{args.rounds}: {' then '.join(order)}", flush=True)
            for env in order:
                res = _run(env, args.root, accel_args, os.path.join(tmp, f"{env}{r}.json"))
                per_env[env].append(_items(res))
                machines[env] = res["machine"]
    best = {env: {k: min(run[k] for run in runs if k in run) for k in runs[0]}
            for env, runs in per_env.items()}
    a, b = machines["host"], machines["trixie"]
    label_a, label_b = f"jax {a['jax']}", f"jax {b['jax']}"
    rows = [{"item": k, label_a: best["host"][k], label_b: best["trixie"].get(k),
             "ratio": (best["trixie"][k] / best["host"][k]) if k in best["trixie"] else None}
            for k in best["host"]]
    out = {"what": f"{label_b} / {label_a} on the CPU, ms (minimum over rounds of each "
                   "process's minimum); accelerator.py " + " ".join(accel_args),
           # the host (its CPU fields hold for both environments), then each environment's block
           "rounds": args.rounds, "machine": a, "environments": {"host": a, "trixie": b},
           "per_round": per_env, "rows": rows}
    from dsbd_jax.eval.timing import write_json
    write_json(args.out, out)
    width = max(len(r["item"]) for r in rows)
    print(f"{'item':{width}s}  {label_a:>11s}  {label_b:>11s}  ratio")
    for r in rows:
        print(f"{r['item']:{width}s}  {r[label_a]:11.2f}  "
              f"{(r[label_b] or float('nan')):11.2f}  {(r['ratio'] or float('nan')):.3f}")
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
