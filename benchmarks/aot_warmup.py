"""Is the first call after an ahead-of-time compile as fast as later calls? (the harness's
``warmup: 0``)

With ``warmup: 0`` the benchmark harness compiles each method's program per bucket without
running it (``Decoder.compiled``) and times the very first call. This script checks that such a
first call is not slower than the calls after it (buffer allocation, first-touch page faults):
on the offline model pair it compiles, then times ``--calls`` calls in a row, for sampling and
for DSBD (gamma 2, W_S 4, t 0.7, W_min 2), at batch ``--batch`` of a synthetic 40-token prompt
(bucket 64), ``--new`` new tokens with EOS off. It writes the call times, the first call's ratio
to the median of the later ones, and the later calls' spread, as JSON.

Usage: python benchmarks/aot_warmup.py [--new 32] [--batch 4] [--calls 4]
                                      [--out results/aot_warmup.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from dsbd_jax import load_model  # noqa: E402
from dsbd_jax.decoding import common
from dsbd_jax.eval.plan import load_config, prompt_keys  # noqa: E402
from dsbd_jax.eval.timing import machine_info  # noqa: E402
from dsbd_jax.decoding.methods import build, label, model_params  # noqa: E402

METHODS = [("sample", {}),
           ("dsbd", dict(gamma=2, draft_width=4, threshold=0.7, min_width=2))]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--new", type=int, default=32)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--calls", type=int, default=4)
    ap.add_argument("--models", default="configs/quality_cpu.yaml",
                    help="a bench config whose target/draft to load")
    ap.add_argument("--out", default="results/aot_warmup.json")
    a = ap.parse_args(argv)
    if a.calls < 2:
        ap.error("--calls must be >= 2 (the first call and at least one after it)")
    cfg = load_config(a.models)
    t = load_model(cfg["target"], jnp.float32, tokenizer=False, progress=False)
    d = load_model(cfg["draft"], jnp.float32, tokenizer=False, progress=False)
    ids, lens = common.pad_prompts([[1000 + i for i in range(40)]] * a.batch, pad_id=0, length=64)
    keys = prompt_keys(0, list(range(a.batch)))
    res = {"machine": machine_info(), "new_tokens": a.new, "batch": a.batch, "bucket": 64,
           "methods": {}}
    for method, setting in METHODS:
        dec = build(method, t.config, d.config, max_new_tokens=a.new, eos_token_id=(), top_k=10,
                    top_p=0.8, **setting)
        p = model_params(dec, t.params, d.params)
        t0 = time.perf_counter()
        dec.compiled(p, ids, keys, prompt_lengths=lens)
        compile_s = time.perf_counter() - t0
        calls = []
        for _ in range(a.calls):
            t0 = time.perf_counter()
            jax.block_until_ready(dec(p, ids, keys, prompt_lengths=lens))
            calls.append(time.perf_counter() - t0)
        later = calls[1:]
        row = {"compile_s": compile_s, "calls_s": calls,
               "first_over_median_later": calls[0] / statistics.median(later),
               "later_min_over_max": min(later) / max(later)}
        res["methods"][label(method, setting)] = row
        print(label(method, setting), json.dumps(row), flush=True)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(res, f, indent=2)
    return res


if __name__ == "__main__":
    main()
