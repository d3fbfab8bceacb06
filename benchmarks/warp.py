"""Cost of warping a beam joint: the sort-free ``warp_logits`` against the full-sort rule it
replaced, side by side in one process.

The joint of ``--beams`` beams of a 151,936-token vocabulary (Qwen2.5's), top-k 10 + top-p 0.8,
top-k alone and top-p alone, each jitted as part of a program that also normalises the logits
(as the decoders do: a ``lax.top_k`` inside a larger fusion is where XLA:CPU falls back to a full
sort). The reference is the previous implementation: ``lax.top_k`` fused into the program, then
an ascending argsort for top-p (``warping._top_p_keep_sorted``). Median of ``--repeats`` calls.

Usage: python benchmarks/warp.py [--beams 4] [--repeats 20] [--out results/warp.json]
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
import numpy as np  # noqa: E402

from dsbd_jax.eval.timing import machine_info, write_json  # noqa: E402
from dsbd_jax.decoding.warping import _top_p_keep_sorted, warp_logits  # noqa: E402

V = 151936


def full_sort_warp(x, top_k, top_p):
    """The previous rule: fused top-k (a full sort on XLA:CPU), then a full argsort for top-p."""
    if top_k:
        x = jnp.where(x < jax.lax.top_k(x, top_k)[0][..., -1:], -jnp.inf, x)
    if top_p < 1.0:
        x = jnp.where(_top_p_keep_sorted(x, top_p), x, -jnp.inf)
    return jax.nn.log_softmax(x, axis=-1)


def median_ms(f, x, repeats):
    jax.block_until_ready(f(x))
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(x))
        ts.append(time.perf_counter() - t0)
    return 1e3 * float(np.median(ts))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--beams", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", default=os.path.join(_ROOT, "results", "warp.json"))
    args = ap.parse_args(argv)
    # a realistic joint: beam scores plus peaked next-token log-probabilities
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((args.beams, V)).astype(np.float32) * 4.0
    x = jnp.asarray(logits)
    rows = []
    for top_k, top_p in ((10, 0.8), (10, 1.0), (None, 0.8)):
        new = jax.jit(lambda l: warp_logits(jax.nn.log_softmax(l, -1).reshape(-1), 1.0, top_k,
                                            top_p))
        old = jax.jit(lambda l: full_sort_warp(jax.nn.log_softmax(l, -1).reshape(-1), top_k,
                                               top_p))
        same = bool(np.array_equal(np.isfinite(np.asarray(new(x))),
                                   np.isfinite(np.asarray(old(x)))))
        r = {"top_k": top_k, "top_p": top_p, "entries": args.beams * V,
             "sort_free_ms": median_ms(new, x, args.repeats),
             "full_sort_ms": median_ms(old, x, args.repeats), "same_support": same}
        r["speedup"] = r["full_sort_ms"] / r["sort_free_ms"]
        rows.append(r)
        print(f"top-k {top_k}, top-p {top_p}: sort-free {r['sort_free_ms']:.2f} ms, full sort "
              f"{r['full_sort_ms']:.2f} ms ({r['speedup']:.0f}x), same support: {same}",
              flush=True)
    write_json(args.out, {"machine": machine_info(), "beams": args.beams, "vocab": V,
                          "repeats": args.repeats, "rows": rows})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
