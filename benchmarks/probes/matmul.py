"""Few-row matrix products on the CPU: kernel layout x per-executable XLA options vs torch.

For each product shape of one Qwen2.5-1.5B layer (``up``: ``[M, 1536] x [1536, 8960]``, and
``q``, ``kv``, ``o``, ``down``) and each row count ``M`` (default 1, 4, 12, 16), one call runs
``--layers`` (default 28) products with ``--layers`` different weights, as a forward pass does.
Variants:

* ``jax in_out``: kernel ``[in, out]``, ``x @ w`` (Flax ``Dense``, today's layout);
* ``jax out_in``: kernel ``[out, in]``, contracting the last axes of both (torch's layout);
* each of those compiled with every candidate of ``dsbd_jax.host.cpu_options.CANDIDATES``
  this XLA accepts (per-executable ``compiler_options`` of ``jax.jit``; ``{}`` is today's default);
* ``jax blocked<n>``: kernel ``[out / n, in, n]`` (the output split into blocks of ``n``
  columns, each block a contiguous ``[in, n]`` matrix; ``--blocks``, default 32 64 128), one
  batched product over the blocks (``cmk,ckn->cmn``) with ``x`` broadcast to every block, then
  the blocks put back side by side; ``M = 1`` is padded to 2 rows (XLA:CPU takes a slower
  batched matrix-vector path for one row). XLA's default options only;
* ``torch``: ``torch.nn.functional.linear`` (weight ``[out, in]``), ``--threads`` threads.

``--dtypes float32 bfloat16`` adds bfloat16 kernels: ``jax out_in bf16 mixed`` and ``jax in_out
bf16 mixed`` (``dsbd_jax.models.products.mixed_rows`` / ``mixed_cols``: the input cast to
bfloat16, float32 accumulation and result, one row padded to two: what a bfloat16 model runs),
``jax out_in bf16 one-row`` (the same without the padding), ``jax in_out bf16 bf16-out`` (a
bfloat16 result, Flax ``Dense``'s product) and ``torch bf16`` (weights and input in bfloat16).

**Caveat:** the ``--layers`` products of one call are independent, and XLA:CPU runs
independent products side by side. That flatters variants whose products are single-threaded
(the blocked ones: a gain here need not survive a whole forward pass with the same blocks). ``benchmarks/forward.py`` is the arbiter;
``dsbd_jax.host.forms.measure_forms`` chains its products for that reason (blocked
kernels, once a load option, were removed: ``docs/results/cpu.md``).

Variants are interleaved (one call of each per round, in a shuffled order) and each figure is the
MINIMUM over ``--repeats`` rounds, so that load from other processes hurts every variant alike
and the figure is the least disturbed call. Under contention treat the figures as provisional.
The JSON records the CPU model, core count, ``XLA_FLAGS`` and each variant's compiler options.

Usage: python benchmarks/probes/matmul.py [--repeats 15] [--rows 1 4 12 16] [--shapes up q kv o down]
       [--blocks 32 64 128] [--threads N] [--out results/matmul.json]
       python benchmarks/probes/matmul.py --small   (2 layers, a 256-wide shape: a check, seconds)
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from dsbd_jax.eval.timing import machine_info, write_json  # noqa: E402
from dsbd_jax.host.cpu_options import candidates  # noqa: E402
from dsbd_jax.models.products import mixed_cols, mixed_rows  # noqa: E402

# (in, out) of the products of one Qwen2.5-1.5B layer
SHAPES = {"up": (1536, 8960), "down": (8960, 1536), "q": (1536, 1536), "kv": (1536, 256),
          "o": (1536, 1536)}
SMALL_SHAPES = {"up": (256, 512)}


def jax_variants(weights_in_out, layout: str):
    """``{options name: compiled fn(x)}`` for one kernel layout."""
    if layout == "in_out":
        ws = [jnp.asarray(w) for w in weights_in_out]
        body = lambda x, ws: [x @ w for w in ws]  # noqa: E731
    else:
        ws = [jnp.asarray(np.ascontiguousarray(w.T)) for w in weights_in_out]
        body = lambda x, ws: [jax.lax.dot_general(x, w, (((1,), (1,)), ((), ())))  # noqa: E731
                              for w in ws]
    fns = {}
    for name, opts in candidates().items():
        f = jax.jit(body, compiler_options=dict(opts))
        fns[name] = (f, ws)
    return fns


def blocked_product(x, w):
    """``x [M, in]`` times a blocked kernel ``w [out / n, in, n]``: ``[M, out]``."""
    m = x.shape[0]
    if m == 1:
        x = jnp.pad(x, ((0, 1), (0, 0)))
    y = jnp.einsum("cmk,ckn->cmn", jnp.broadcast_to(x, (w.shape[0],) + x.shape), w)
    return y.transpose(1, 0, 2).reshape(x.shape[0], -1)[:m]


def width_fits(n: int, dout: int) -> bool:
    """Whether blocks of ``n`` columns split ``dout`` output columns into two or more."""
    return n > 0 and dout % n == 0 and n < dout


def blocked_variant(weights_in_out, n: int):
    """``(compiled fn(x), blocked weights)`` for blocks of ``n`` output columns."""
    ws = [jnp.asarray(np.ascontiguousarray(w.reshape(w.shape[0], -1, n).transpose(1, 0, 2)))
          for w in weights_in_out]
    return jax.jit(lambda x, ws: [blocked_product(x, w) for w in ws]), ws


def bf16_variants(weights_in_out):
    """``{label: (compiled fn(x), weights)}`` of the bfloat16 products (module docstring)."""
    cols = [jnp.asarray(w, jnp.bfloat16) for w in weights_in_out]
    rows = [jnp.asarray(np.ascontiguousarray(w.T), jnp.bfloat16) for w in weights_in_out]
    one_row = lambda x, w: jax.lax.dot_general(  # noqa: E731
        x.astype(w.dtype), w, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
    bf16_out = lambda x, w: x.astype(w.dtype) @ w  # noqa: E731
    return {"jax out_in bf16 mixed": (jax.jit(lambda x, ws: [mixed_rows(x, w) for w in ws]), rows),
            "jax in_out bf16 mixed": (jax.jit(lambda x, ws: [mixed_cols(x, w) for w in ws]), cols),
            "jax out_in bf16 one-row": (jax.jit(lambda x, ws: [one_row(x, w) for w in ws]), rows),
            "jax in_out bf16 bf16-out": (jax.jit(lambda x, ws: [bf16_out(x, w) for w in ws]),
                                         cols)}


def run_shape(name, din, dout, rows, layers, repeats, threads, rng, blocks=(32, 64, 128),
              dtypes=("float32",)):
    weights = [rng.standard_normal((din, dout), np.float32) * 0.02 for _ in range(layers)]
    variants = {}
    if "bfloat16" in dtypes:
        variants.update(bf16_variants(weights))
    for layout in ("in_out", "out_in"):
        for opt, (f, ws) in jax_variants(weights, layout).items():
            variants[f"jax {layout} {opt}"] = (f, ws)
    for n in blocks:
        if width_fits(n, dout):
            variants[f"jax blocked{n} default"] = blocked_variant(weights, n)
    import torch
    torch.set_num_threads(threads)
    tw = [torch.from_numpy(np.ascontiguousarray(w.T)) for w in weights]
    tw16 = [w.to(torch.bfloat16) for w in tw] if "bfloat16" in dtypes else None
    results = {}
    for M in rows:
        x_np = rng.standard_normal((M, din), np.float32)
        x = jnp.asarray(x_np)
        xt = torch.from_numpy(x_np)
        calls = {}
        for label, (f, ws) in variants.items():
            t0 = time.perf_counter()
            ref = jax.block_until_ready(f(x, ws))  # compile + first run, not timed below
            calls[label] = (lambda f=f, ws=ws: jax.block_until_ready(f(x, ws)))
            results.setdefault(label, {})[M] = {"compile_and_first_s": time.perf_counter() - t0}
        with torch.inference_mode():
            def torch_call():
                return [torch.nn.functional.linear(xt, w) for w in tw]
            torch_call()
            calls["torch"] = torch_call
            results.setdefault("torch", {})[M] = {}
            if tw16 is not None:
                xt16 = xt.to(torch.bfloat16)
                calls["torch bf16"] = lambda: [torch.nn.functional.linear(xt16, w) for w in tw16]
                results.setdefault("torch bf16", {})[M] = {}
            # same products, same results up to float rounding (a sanity check of the set-up;
            # bfloat16 inputs are rounded to 8 bits of mantissa: a looser tolerance)
            for label in variants:  # every variant: the same products up to rounding
                tol = 3e-2 if "bf16" in label else 1e-3
                np.testing.assert_allclose(np.asarray(calls[label]()[0], np.float32),
                                           torch_call()[0].numpy(), rtol=tol, atol=tol)
            times = {label: [] for label in calls}
            order = list(calls)
            for _ in range(repeats):
                random.shuffle(order)
                for label in order:
                    t0 = time.perf_counter()
                    calls[label]()
                    times[label].append(time.perf_counter() - t0)
        for label, ts in times.items():
            results[label][M].update(min_ms=1e3 * min(ts), median_ms=1e3 * float(np.median(ts)))
        line = "  ".join(f"{lab}: {results[lab][M]['min_ms']:.1f}" for lab in calls)
        print(f"{name} [{M}, {din}] x [{din}, {dout}] x{layers} (min ms)  {line}", flush=True)
    return {"in": din, "out": dout, "layers": layers, "variants": results}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 12, 16])
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--blocks", type=int, nargs="*", default=[32, 64, 128],
                    help="output block widths of the blocked kernel variants (none: skip them)")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--small", action="store_true", help="2 layers of a 256x512 product")
    ap.add_argument("--dtypes", nargs="+", default=["float32"], choices=["float32", "bfloat16"],
                    help="bfloat16: also the bfloat16 variants (module docstring)")
    ap.add_argument("--out", default="/tmp/dsbd_matmul.json")
    args = ap.parse_args(argv)
    shapes = SMALL_SHAPES if args.small else {k: SHAPES[k] for k in args.shapes}
    layers = 2 if args.small else args.layers
    repeats = 3 if args.small else args.repeats
    rng = np.random.default_rng(0)
    random.seed(0)
    out = {"machine": machine_info(), "rows": args.rows, "repeats": repeats,
           "blocks": args.blocks,
           "torch_threads": args.threads, "figure": "minimum over interleaved rounds, ms",
           "candidates": {k: dict(v) for k, v in candidates().items()}, "shapes": {}}
    for name, (din, dout) in shapes.items():
        out["shapes"][name] = run_shape(name, din, dout, args.rows, layers, repeats,
                                        args.threads, rng, blocks=args.blocks,
                                        dtypes=tuple(args.dtypes))
    write_json(args.out, out)
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
