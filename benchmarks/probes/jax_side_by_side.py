"""Forward-pass speed under two Python environments (two jax releases), side by side in one run.

Runs ``benchmarks/forward.py`` (the 1.5B target's shape, ours only, transposed kernels) under
each interpreter in turn, ``--rounds`` times alternately (A, B, A, B, ...), so that drift of the
host hits both alike, and writes one JSON with every run's figures, each environment's best
(minimum over rounds of each pass's median) and the ratio B / A per pass shape.

    python benchmarks/probes/jax_side_by_side.py --a .venv/bin/python \\
        --b .venv-jax-newest/bin/python --small --out results/jax_side_by_side.json

``--small``: 4 layers of the same width (a minute or two per run); without it, 28 layers.
The environment ``.venv-jax-newest`` is the one ``scripts/newest_jax.sh`` builds (Python 3.12,
the newest jax the install accepts).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def run_once(python: str, small: bool, repeats: int) -> dict:
    """One ``forward.py`` run under ``python``; its JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "forward.json")
        cmd = [python, os.path.join(_ROOT, "benchmarks", "forward.py"), "--no-transformers",
               "--layouts", "per_layer_transposed", "--repeats", str(repeats), "--out", out]
        if small:
            cmd.append("--small")
        env = dict(os.environ, PYTHONPATH=_ROOT)
        subprocess.run(cmd, check=True, env=env, cwd=_ROOT, stdout=subprocess.DEVNULL)
        with open(out) as f:
            return json.load(f)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", required=True, help="the first interpreter (e.g. .venv/bin/python)")
    ap.add_argument("--b", required=True, help="the second interpreter")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--out", default="/tmp/dsbd_jax_side_by_side.json")
    args = ap.parse_args(argv)
    runs = {"a": [], "b": []}
    for r in range(args.rounds):
        for side in ("a", "b"):
            res = run_once(getattr(args, side), args.small, args.repeats)
            runs[side].append(res)
            ms = {k: round(v["ms"], 1) for k, v in res["per_layer_transposed"].items()}
            print(f"round {r} {side} (jax {res['machine']['jax']}): {ms}", flush=True)
    best = {side: {shape: min(run["per_layer_transposed"][shape]["ms"] for run in rs)
                   for shape in rs[0]["per_layer_transposed"]} for side, rs in runs.items()}
    # interpreters as paths from the checkout (no absolute path of the measuring machine)
    rel = {side: os.path.relpath(os.path.abspath(getattr(args, side)), _ROOT) for side in "ab"}
    # the host's block: side a's (both sides run on this host; each side's block is kept too)
    result = {"machine": runs["a"][0]["machine"],
              "a": {"python": rel["a"], "machine": runs["a"][0]["machine"]},
              "b": {"python": rel["b"], "machine": runs["b"][0]["machine"]},
              "layers": runs["a"][0]["layers"], "rounds": args.rounds, "repeats": args.repeats,
              "best_ms": best, "ratio_b_over_a": {s: best["b"][s] / best["a"][s] for s in best["a"]},
              "runs": runs}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    for s, r in result["ratio_b_over_a"].items():
        print(f"{s}: jax {result['b']['machine']['jax']} / jax {result['a']['machine']['jax']}"
              f" = {r:.2f}x ({best['b'][s]:.1f} vs {best['a'][s]:.1f} ms)")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
