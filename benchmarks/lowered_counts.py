"""What each decoder's program holds per iteration when lowered for a GPU (``cuda``) and for the
CPU, at the offline pair's shapes, without weights and without a GPU (``dsbd_jax.eval.lowered``).

Every decoder is lowered for each platform with abstract parameters of the Qwen2.5-Coder
1.5B / 0.5B shapes (``lowered.abstract_params``: nothing is allocated, nothing compiled or run),
batch 1, one prompt bucket, top-k 10 / top-p 0.8, EOS off. Per iteration of the decode loop,
the operations of XLA's input program per phase (before its passes: not the kernels a GPU
launches, which fuse many operations, but what XLA starts from), those over the vocabulary, and
the loops inside the iteration with their trips; and each decoder's figures over beam sampling
W=4's (``beam4``) on the same platform. A ``conditional`` counts all its branches; beside it,
``ops_outside_passes_first_branches`` counts its first only (DSBD's verification on the tops,
the branch that runs unless equal entries reach past them).

    .venv/bin/python benchmarks/lowered_counts.py --out results/lowered_counts.json
        [--methods beam4,dsbd_w4,sample,spec4] [--platforms cuda,cpu] [--dtype bfloat16]

A few seconds per program; the counts depend on the code and the jax version only, not on the
host or its load (the JSON records both).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from dsbd_jax.decoding import methods  # noqa: E402
from dsbd_jax.eval.lowered import abstract_params, lowered_text, static_counts  # noqa: E402
from dsbd_jax.eval.timing import machine_info, write_json  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from phase_profile import SETTINGS  # noqa: E402

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"


def against(run, base):
    """A run's per-iteration figures over the baseline's (``None`` where the baseline's is 0)."""
    ratio = lambda a, b: a / b if b else None  # noqa: E731
    return {"ops_outside_passes": ratio(run["ops_outside_passes"], base["ops_outside_passes"]),
            "ops_outside_passes_first_branches": ratio(
                run["ops_outside_passes_first_branches"],
                base["ops_outside_passes_first_branches"]),
            "vocab_ops_outside_passes": ratio(run["vocab_ops_outside_passes"],
                                              base["vocab_ops_outside_passes"]),
            "loop_trips": run["loop_trips"] - base["loop_trips"]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--methods", default="beam4,dsbd_w4,sample,spec4")
    ap.add_argument("--platforms", default="cuda,cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    ap.add_argument("--new", type=int, default=32, help="new tokens (the loop's bound)")
    ap.add_argument("--bucket", type=int, default=64, help="prompt bucket (tokens)")
    ap.add_argument("--target", default=TARGET)
    ap.add_argument("--draft", default=DRAFT)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from dsbd_jax.loading.load import read_config
    from dsbd_jax.models.llama import forward_scope
    dtype = jnp.dtype(args.dtype)
    target, draft = read_config(args.target, dtype), read_config(args.draft, dtype)
    params = {"target": abstract_params(target, "per_layer"),
              "draft": abstract_params(draft, "per_layer")}
    ids = jnp.zeros((1, args.bucket), jnp.int32)
    lens = jnp.array([args.bucket // 2], jnp.int32)
    warp = dict(top_k=10, top_p=0.8, max_new_tokens=args.new, eos_token_id=())
    runs = []
    for platform in args.platforms.split(","):
        for name in args.methods.split(","):
            method, s = SETTINGS[name]
            dec = methods.build(method, target, draft, **warp, **s)
            p = params if dec.needs_draft else params["target"]
            t0 = time.perf_counter()
            text = lowered_text(dec, p, ids, jax.random.key(0), lens, platform)
            lower_s = time.perf_counter() - t0
            counts = static_counts(text, forward_scope(target),
                                   forward_scope(draft) if dec.needs_draft else None,
                                   target.vocab_size)
            first = static_counts(text, forward_scope(target),
                                  forward_scope(draft) if dec.needs_draft else None,
                                  target.vocab_size, branches="first")
            run = {"platform": platform, "name": name, "method": method, "settings": s,
                   "lower_s": lower_s, **counts,
                   "ops_outside_passes_first_branches": first["ops_outside_passes"]}
            runs.append(run)
            print(f"{platform:5s} {name:8s} ops outside the passes {counts['ops_outside_passes']:6d}"
                  f" (first branches {first['ops_outside_passes']:6d})"
                  f"  vocabulary ops {counts['vocab_ops_outside_passes']:4d}"
                  f"  inner loops {[(lp['phase'], lp['trips']) for lp in counts['loops']]}",
                  flush=True)
    for run in runs:
        base = next((r for r in runs if r["platform"] == run["platform"]
                     and r["name"] == "beam4"), None)
        if base is not None:
            run["against_beam4"] = against(run, base)
    res = {"machine": machine_info(), "jax": jax.__version__, "target": args.target,
           "draft": args.draft, "dtype": args.dtype, "batch": 1, "bucket": args.bucket,
           "new_tokens": args.new, "warping": "top-k 10, top-p 0.8", "eos": "off",
           "weights": "abstract (jax.ShapeDtypeStruct): the programs only, nothing run",
           "counted": "operations of XLA's input program per decode-loop iteration "
                      "(lowered, before XLA's passes)",
           "runs": runs}
    if args.out:
        write_json(args.out, res)
        print(f"wrote {args.out}")
    return res


if __name__ == "__main__":
    main()
