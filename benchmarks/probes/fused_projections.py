"""Fused projections against separate ones, in the kernel kinds the library runs on this host.

Issue 62 asks whether one product for q, k and v and one for gate and up (the concatenated
kernels) would cut a pass's operations without slowing the CPU. This probe times, per kernel
kind and row count, ``--layers`` chained layers of the target's input-side products:

* ``separate``: ``x @ q``, ``x @ k``, ``x @ v``, ``x @ gate``, ``x @ up`` (five products, as
  ``dsbd_jax.models.llama`` runs them today);
* ``fused``: ``x @ [q | k | v]`` and ``x @ [gate | up]`` (two products), the outputs sliced.

Each layer's next input depends on every output (so the layers chain as a pass's do). The
kinds are the library's own typed kernels (``dsbd_jax.models.weights``): ``float32`` and
``bfloat16`` as transposed row blocks (``RowBlocks``, the form ``load_model`` picks on the
2-core hosts; widths from ``products.transposed_width`` of each product's output width) and
``int8`` (``Int8``: codes ``[out, in]``, one scale per output). Each compiled program's
operations (the instructions of its entry computation: fusions, products, copies; XLA:CPU runs
one thunk for each, as this chain has no loops) are reported with the times.

Both forms compute the same outputs (checked first, to the dtype's rounding). Interleaved round
by round, the median of ``--repeats`` rounds, ms per call (``--layers`` layers). JSON with the
host.

    .venv/bin/python benchmarks/probes/fused_projections.py --out results/fused_projections_<host>.json
    .venv/bin/python benchmarks/probes/fused_projections.py --small --out /tmp/fused.json   # seconds
"""

from __future__ import annotations

import argparse
import os
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from dsbd_jax.models import products, weights  # noqa: E402

QWEN_1_5B = {"d": 1536, "q": 1536, "kv": 256, "ff": 8960}
SMALL = {"d": 64, "q": 64, "kv": 16, "ff": 192}


def make_kernel(w: jax.Array, kind: str):
    """The plain ``[in, out]`` float32 kernel ``w`` as the library's typed kernel of ``kind``."""
    if kind == "int8":
        return weights.Int8.quantize(w)
    dt = jnp.float32 if kind == "float32" else jnp.bfloat16
    width = products.transposed_width(w.shape[1])
    return weights.RowBlocks(products.transpose_block(w.astype(dt), width))


def layer_weights(shape: dict, layers: int, seed: int = 0):
    """``layers`` dicts of plain float32 kernels q, k, v, gate, up."""
    d, kv = shape["d"], shape["kv"]
    outs = {"q": shape["q"], "k": kv, "v": kv, "gate": shape["ff"], "up": shape["ff"]}
    key = jax.random.PRNGKey(seed)
    out = []
    for _ in range(layers):
        ws = {}
        for name, n in outs.items():
            key, sub = jax.random.split(key)
            ws[name] = jax.random.normal(sub, (d, n), jnp.float32) / np.sqrt(d)
        out.append(ws)
    return out


def build(ws, kind: str, fused: bool):
    """The typed kernels of each layer: five, or two concatenated ones."""
    if not fused:
        return [{k: make_kernel(w, kind) for k, w in layer.items()} for layer in ws]
    return [{"qkv": make_kernel(jnp.concatenate([layer["q"], layer["k"], layer["v"]], 1), kind),
             "gu": make_kernel(jnp.concatenate([layer["gate"], layer["up"]], 1), kind)}
            for layer in ws]


def run_layers(x, kernels, shape: dict, fused: bool):
    """The chained layers: each layer's outputs feed the next input."""
    d, nq, kv, ff = shape["d"], shape["q"], shape["kv"], shape["ff"]
    for ks in kernels:
        if fused:
            qkv = weights.product(x, ks["qkv"])
            q, k, v = qkv[:, :nq], qkv[:, nq:nq + kv], qkv[:, nq + kv:]
            gu = weights.product(x, ks["gu"])
            gate, up = gu[:, :ff], gu[:, ff:]
        else:
            q, k, v = (weights.product(x, ks[n]) for n in ("q", "k", "v"))
            gate, up = weights.product(x, ks["gate"]), weights.product(x, ks["up"])
        h = jax.nn.silu(gate) * up
        mix = (q[:, :d] + h[:, :d] + 2.0 * jnp.sum(k, -1, keepdims=True)
               - jnp.sum(v, -1, keepdims=True))
        x = x + 1e-2 * mix.astype(x.dtype)
    return x


# what the entry computation holds but does not run (pass_floor.hlo_ops counts every opcode)
_NOT_RUN = ("parameter", "constant", "get-tuple-element", "tuple", "bitcast")


def entry_ops(fn, *args) -> int:
    """The operations of the compiled program's entry computation
    (:func:`benchmarks.pass_floor.hlo_ops`) other than parameters, constants, tuples and
    bitcasts."""
    from benchmarks.pass_floor import hlo_ops
    ops = hlo_ops(fn.lower(*args).compile().as_text())
    return sum(n for op, n in ops.items() if op.split()[0] not in _NOT_RUN)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 12, 16])
    ap.add_argument("--kinds", nargs="+", default=["float32", "bfloat16", "int8"],
                    choices=["float32", "bfloat16", "int8"])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=11)
    ap.add_argument("--small", action="store_true", help="a tiny shape: a check, seconds")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from dsbd_jax.eval.timing import machine_info, portable_settings, write_json
    shape = SMALL if args.small else QWEN_1_5B
    ws = layer_weights(shape, args.layers)
    t_start = time.perf_counter()
    rows_out = []
    for kind in args.kinds:
        forms = {f: build(ws, kind, f == "fused") for f in ("separate", "fused")}
        fns = {f: jax.jit(lambda x, ks, f=f: run_layers(x, ks, shape, f == "fused"))
               for f in forms}
        for m in args.rows:
            x = jax.random.normal(jax.random.PRNGKey(m), (m, shape["d"]), jnp.float32)
            outs = {f: np.asarray(fns[f](x, forms[f])) for f in forms}
            tol = 1e-4 if kind == "float32" else 2e-2
            np.testing.assert_allclose(outs["fused"], outs["separate"], rtol=tol, atol=tol)
            times = {f: [] for f in forms}
            for _ in range(args.repeats):
                for f in forms:
                    t0 = time.perf_counter()
                    jax.block_until_ready(fns[f](x, forms[f]))
                    times[f].append(time.perf_counter() - t0)
            row = {"kind": kind, "rows": m,
                   **{f"{f}_ms": float(np.median(times[f]) * 1e3) for f in forms},
                   **{f"{f}_ops": entry_ops(fns[f], x, forms[f]) for f in forms}}
            row["fused_over_separate"] = row["fused_ms"] / row["separate_ms"]
            rows_out.append(row)
            print(f"{kind:9s} rows {m:3d}: separate {row['separate_ms']:8.2f} ms "
                  f"({row['separate_ops']} ops), fused {row['fused_ms']:8.2f} ms "
                  f"({row['fused_ops']} ops): {row['fused_over_separate']:.2f}x", flush=True)
    write_json(args.out, {"benchmark": "fused_projections", "machine": machine_info(),
                          "settings": portable_settings(vars(args)), "shape": shape,
                          "rows": rows_out, "wall_s": time.perf_counter() - t_start})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
