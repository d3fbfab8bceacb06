"""Eight-bit products against the float kinds, at few rows, on this host.

One call chains ``--layers`` MLP pairs ``[M, in] x [in, out] x [out, in]`` (default: the 1.5B
target's ``1536 x 8960``, or ``--shape 896 4864`` for the 0.5B draft), each product waiting for
the previous one as in a forward pass, with separate weights per layer, through the library's
own product rule for each kernel kind (:func:`dsbd_jax.models.weights.product`), compiled under
the compiler options the library gives a program over that kind
(:func:`dsbd_jax.host.cpu_options.options_of`):

* ``float32 plain``: ``[in, out]`` float32 kernels;
* ``float32 transposed``: float32 row blocks (:class:`~dsbd_jax.models.weights.RowBlocks`);
* ``bfloat16 rows``: bfloat16 ``[out, in]`` rows, float32 accumulation, one row padded to two
  (what a bfloat16 load runs on the CPU);
* ``int8``: :class:`~dsbd_jax.models.weights.Int8` (codes ``[out, in]``, a scale per output;
  activations quantised per row; XLA's ``s8 x s8 -> s32`` dot; one row padded to two);
* ``int8 one-row``: the same product without the padding of one row (what the padding saves);
* ``int8 <options>``: the int8 product under each other candidate of
  ``cpu_options.CANDIDATES`` this XLA accepts (why int8 programs run under ``default``);
* with ``--qwix``, the same products through qwix (:func:`qwix_variants`).

Each figure is the minimum over ``--repeats`` interleaved rounds (``interleaved_min``). The JSON
also gives, per ``M``, each kind's time over float32 plain's and over bfloat16's, and the int8
chain's error: the relative RMS distance of its output from float32's on the same weights and
input (the quantisation's cost, separate from its speed). The host (CPU model, flags) is in
``machine``. Timings need a quiet machine.

Usage: python benchmarks/int8_products.py [--rows 1 2 4 12 16 64] [--layers 4] [--repeats 9]
       [--shape 1536 8960] [--qwix] [--out results/int8_products_HOST.json]
       python benchmarks/int8_products.py --small   (a check: seconds)
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from dsbd_jax.eval.timing import machine_info, portable_settings, write_json  # noqa: E402
from dsbd_jax.models import products, weights
from dsbd_jax.host import cpu_options


def kernels_of(kind: str, w: np.ndarray):
    """The float32 ``[in, out]`` array ``w`` as a kernel of ``kind``."""
    if kind == "float32 plain":
        return jnp.asarray(w)
    if kind == "float32 transposed":
        return weights.RowBlocks(products.transpose_block(jnp.asarray(w),
                                                          products.transposed_width(w.shape[1])))
    if kind == "bfloat16 rows":
        return weights.Rows(jnp.asarray(w.T, jnp.bfloat16))
    return weights.Int8.quantize(jnp.asarray(w))


def _one_row_int8(x, kernel):
    """The int8 product without the one-row padding (``int8 one-row``)."""
    xq, xs = products.quantize_rows(x)
    y = jax.lax.dot_general(xq, kernel.codes, (((1,), (1,)), ((), ())),
                            preferred_element_type=jnp.int32)
    return y.astype(jnp.float32) * xs[:, None] * kernel.scales


def chain_fn(product):
    def chain(x, ups, downs):
        for u, d in zip(ups, downs):
            x = product(product(x, u), d)
        return x
    return chain


def build(din: int, dout: int, layers: int, qwix: bool = False):
    """``{variant: (compiled chain, ups, downs)}`` over the same random weights."""
    rng = np.random.default_rng(0)
    ups = [rng.standard_normal((din, dout), np.float32) / np.float32(np.sqrt(din))
           for _ in range(layers)]
    downs = [rng.standard_normal((dout, din), np.float32) / np.float32(np.sqrt(dout))
             for _ in range(layers)]
    out = {}
    for kind in ("float32 plain", "float32 transposed", "bfloat16 rows", "int8"):
        us = [kernels_of(kind, w) for w in ups]
        ds = [kernels_of(kind, w) for w in downs]
        opts = cpu_options.compiler_options(*weights.program_kind({"a": {"kernel": us[0]}}))
        out[kind] = (jax.jit(chain_fn(weights.product), compiler_options=opts), us, ds, opts)
    _, us, ds, opts = out["int8"]
    out["int8 one-row"] = (jax.jit(chain_fn(lambda x, k: _one_row_int8(x, k)
                                            if x.shape[0] == 1 else k.product(x)),
                                   compiler_options=opts), us, ds, opts)
    for name, cand in cpu_options.candidates().items():
        if dict(cand) != opts:
            out[f"int8 {name}"] = (jax.jit(chain_fn(weights.product),
                                           compiler_options=dict(cand)), us, ds, dict(cand))
    if qwix:
        out.update(qwix_variants(ups, downs, opts))
    return out


def qwix_variants(ups, downs, opts):
    """The same chain through qwix (``--qwix``; Google's JAX quantisation library, not a
    dependency: ``pip install --no-deps qwix``), each weight quantised once by
    ``qwix.quantize`` (int8, a scale per output channel), under the int8 kind's options:

    * ``qwix int8 [out, in]``: activations quantised per row in the graph
      (``qwix.quantize``), ``qwix.dot_general`` of the two ``QArray`` s (its fast path: the
      integer dot, then the scales), weights stored ``[out, in]`` as the int8 kind stores them;
    * ``qwix int8 [in, out]``: the same with the weights ``[in, out]``, as a Flax kernel is;
    * ``qwix weight-only``: float activations times the ``QArray`` weight (qwix's path for it
      dequantises the weight, then runs a float product)."""
    import qwix
    dims_rows, dims_plain = (((1,), (1,)), ((), ())), (((1,), (0,)), ((), ()))

    def dynamic(dims):
        def product(x, wq):
            xq = qwix.quantize(x, jnp.int8, channelwise_axes=[0])
            return qwix.dot_general(xq, wq, dims, preferred_element_type=jnp.float32)
        return product

    def weight_only(x, wq):
        return qwix.dot_general(x, wq, dims_plain, preferred_element_type=jnp.float32)

    q = lambda w, axis: qwix.quantize(jnp.asarray(w), jnp.int8, channelwise_axes=[axis])  # noqa
    rows_u, rows_d = [q(w.T, 0) for w in ups], [q(w.T, 0) for w in downs]
    plain_u, plain_d = [q(w, 1) for w in ups], [q(w, 1) for w in downs]
    jit = lambda f: jax.jit(chain_fn(f), compiler_options=opts)  # noqa: E731
    return {"qwix int8 [out, in]": (jit(dynamic(dims_rows)), rows_u, rows_d, opts),
            "qwix int8 [in, out]": (jit(dynamic(dims_plain)), plain_u, plain_d, opts),
            "qwix weight-only": (jit(weight_only), plain_u, plain_d, opts)}


def rel_rms(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.sqrt(np.mean((a - b) ** 2) / np.mean(b ** 2)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 12, 16, 64])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--shape", type=int, nargs=2, default=[1536, 8960], metavar=("IN", "OUT"))
    ap.add_argument("--small", action="store_true", help="a 128 x 256 shape, 2 layers: a check")
    ap.add_argument("--qwix", action="store_true",
                    help="also the same products through qwix (qwix_variants; qwix installed)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.qwix:
        try:
            import qwix  # noqa: F401
        except ImportError:
            ap.error("--qwix needs qwix, which dsbd-jax does not install: "
                     ".venv/bin/pip install --no-deps qwix (its other needs are installed)")
    if args.small:
        args.shape, args.layers, args.repeats, args.rows = [128, 256], 2, 2, [1, 2, 4]
    din, dout = args.shape
    variants = build(din, dout, args.layers, args.qwix)
    rng = np.random.default_rng(1)
    results = []
    for m in args.rows:
        x = jnp.asarray(rng.standard_normal((m, din), np.float32))
        calls = {k: functools.partial(f, x, us, ds) for k, (f, us, ds, _) in variants.items()}
        t = cpu_options.interleaved_min(calls, args.repeats)
        ref = calls["float32 plain"]()
        row = {"rows": m, "ms": {k: 1e3 * v for k, v in t.items()},
               "over_float32": {k: v / t["float32 plain"] for k, v in t.items()},
               "over_bfloat16": {k: v / t["bfloat16 rows"] for k, v in t.items()},
               "rel_rms_vs_float32": {k: rel_rms(calls[k](), ref) for k in calls
                                      if k in ("bfloat16 rows", "int8") or "qwix" in k}}
        results.append(row)
        print(f"M={m:3d}  " + "  ".join(f"{k} {1e3 * v:.2f} ms" for k, v in t.items())
              + f"  | int8/f32 {row['over_float32']['int8']:.2f}x"
              f"  int8/bf16 {row['over_bfloat16']['int8']:.2f}x"
              f"  int8 rel err {row['rel_rms_vs_float32']['int8']:.4f}", flush=True)
    payload = {"benchmark": "int8_products", "settings": portable_settings(vars(args)),
               "machine": machine_info(),
               "options": {k: v[3] for k, v in variants.items()}, "results": results}
    if args.out:
        write_json(args.out, payload)
        print(f"wrote {args.out}")
    return payload


if __name__ == "__main__":
    main()
