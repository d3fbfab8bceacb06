"""Load time (cold / cached), peak memory and decode speed of the preset models.

For each model, in separate processes (peak RSS is per process and monotonic):
  1. cold load: an empty cache dir (``$DSBD_JAX_CACHE`` = a fresh temp folder): join the
     parts, verify sha256, dequantise, write the float32 cache, build the tokenizer;
  2. cached load from that folder (OS page cache warm: it was just written), then a jitted
     prefill of ``--prefill`` tokens and ``--steps`` greedy decode steps with the KV cache
     (batch 1; compile and one warm-up step excluded; ``block_until_ready`` per step).
Prints a table and writes JSON (default ``/tmp/dsbd_load_and_forward.json``).

Usage: python benchmarks/load_and_forward.py [--models a,b] [--out PATH] [--dtype float32]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)

DEFAULT_MODELS = ["smollm2-135m-instruct", "qwen2.5-coder-0.5b-instruct",
                  "qwen2.5-coder-1.5b-instruct"]


def _maxrss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def child_cold(name, dtype):
    import jax.numpy as jnp

    from dsbd_jax.loading.load import load_model

    t0 = time.perf_counter()
    m = load_model(name, jnp.dtype(dtype), progress=False)
    t1 = time.perf_counter()
    assert m.info.get("built_cache"), "the cold run found a cache"
    return {"cold_load_s": t1 - t0, "peak_rss_cold_mb": _maxrss_mb(),
            "cold_steps_s": {k: v for k, v in m.info.items() if k.endswith("_s")},
            "tokenizer": type(m.tokenizer).__name__}


def child_cached(name, dtype, prefill, steps):
    import jax
    import jax.numpy as jnp
    import numpy as np

    from dsbd_jax.decoding import common
    from dsbd_jax.loading.load import load_model

    t0 = time.perf_counter()
    m = load_model(name, jnp.dtype(dtype), progress=False)
    jax.block_until_ready(m.params)
    load_s = time.perf_counter() - t0
    rss_load = _maxrss_mb()
    cfg, params = m.config, m.params
    n_params = sum(int(x.size) for x in jax.tree.leaves(params))
    n_bytes = sum(int(x.nbytes) for x in jax.tree.leaves(params))

    slots = prefill + steps + 8
    prompt = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(1, prefill)).astype(np.int32)
    lengths = jnp.asarray([prefill], jnp.int32)
    prefill_fn = jax.jit(common.prefill, static_argnums=(0, 4))
    step_fn = jax.jit(common.decode_step, static_argnums=0, donate_argnums=2)

    t = time.perf_counter()
    cache, last = prefill_fn(cfg, params, jnp.asarray(prompt), lengths, slots)
    jax.block_until_ready(last)
    prefill_compile_s = time.perf_counter() - t
    t = time.perf_counter()
    cache, last = prefill_fn(cfg, params, jnp.asarray(prompt), lengths, slots)
    jax.block_until_ready(last)
    prefill_s = time.perf_counter() - t

    tok = jnp.argmax(last, -1).astype(jnp.int32)
    t = time.perf_counter()
    out, cache = step_fn(cfg, params, cache, tok, lengths)  # compile + warm-up step
    jax.block_until_ready(out)
    decode_compile_s = time.perf_counter() - t
    pos = lengths + 1
    tok = jnp.argmax(out, -1).astype(jnp.int32)
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        out, cache = step_fn(cfg, params, cache, tok, pos)
        tok = jnp.argmax(out, -1).astype(jnp.int32)
        jax.block_until_ready(tok)
        times.append(time.perf_counter() - t)
        pos = pos + 1
    return {
        "cached_load_s": load_s, "peak_rss_cached_load_mb": rss_load,
        "peak_rss_after_decode_mb": _maxrss_mb(),
        "num_params": n_params, "param_bytes": n_bytes,
        "prefill_tokens": prefill, "prefill_compile_s": prefill_compile_s,
        "prefill_ms": prefill_s * 1e3, "decode_compile_s": decode_compile_s,
        "decode_steps": steps, "decode_ms_per_token": 1e3 * float(np.mean(times)),
        "decode_ms_per_token_median": 1e3 * float(np.median(times)),
        "jax_backend": jax.default_backend(), "jax_version": jax.__version__,
    }


def _child(args, phase, name, cache_dir):
    env = dict(os.environ, DSBD_JAX_CACHE=cache_dir, TOKENIZERS_PARALLELISM="false")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", phase, "--models", name,
           "--dtype", args.dtype, "--prefill", str(args.prefill), "--steps", str(args.steps)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{phase} {name} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", nargs="?", default="/tmp/dsbd_load_and_forward.json")
    p.add_argument("--models", default=",".join(DEFAULT_MODELS))
    p.add_argument("--dtype", default="float32")
    p.add_argument("--prefill", type=int, default=32)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--child", choices=["cold", "cached"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    models = [m for m in args.models.split(",") if m]

    if args.child:
        if args.child == "cold":
            res = child_cold(models[0], args.dtype)
        else:
            res = child_cached(models[0], args.dtype, args.prefill, args.steps)
        print(json.dumps(res))
        return

    from dsbd_jax.eval.timing import machine_info
    # the measuring processes' host: this one (they inherit its environment, XLA_FLAGS included)
    results = {"machine": {**machine_info(), "os": platform.platform(),
                           "loadavg_start": os.getloadavg()},
               "dtype": args.dtype, "models": {}}
    for name in models:
        cache_dir = tempfile.mkdtemp(prefix="dsbd_bench_cache_")
        try:
            print(f"[{name}] cold load ...", file=sys.stderr, flush=True)
            row = _child(args, "cold", name, cache_dir)
            print(f"[{name}] cached load + decode ...", file=sys.stderr, flush=True)
            row.update(_child(args, "cached", name, cache_dir))
        finally:
            shutil.rmtree(cache_dir, ignore_errors=True)
        results["models"][name] = row
        print(f"[{name}] {json.dumps(row)}", file=sys.stderr, flush=True)

    hdr = (f"{'model':30s} {'params':>8s} {'cold s':>7s} {'cached s':>8s} {'RSS cold':>9s} "
           f"{'RSS cached':>10s} {'prefill ms':>10s} {'ms/token':>8s}")
    print(hdr)
    print("-" * len(hdr))
    for name, r in results["models"].items():
        print(f"{name:30s} {r['num_params'] / 1e6:7.0f}M {r['cold_load_s']:7.1f} "
              f"{r['cached_load_s']:8.1f} {r['peak_rss_cold_mb'] / 1024:8.2f}G "
              f"{r['peak_rss_after_decode_mb'] / 1024:9.2f}G {r['prefill_ms']:10.1f} "
              f"{r['decode_ms_per_token']:8.1f}")
    results["machine"]["loadavg_end"] = os.getloadavg()  # other work on the machine skews times
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
