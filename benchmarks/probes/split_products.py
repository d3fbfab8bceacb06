"""Chained MLP product pairs with the weights split in two halves, against plain kernels and torch.

The open gap is the 16-row product (the 16-token forward of the 1.5B target is 1.14x
transformers' on the 2-core host). A forward pass chains its products (each waits for the last),
so this probe times ``--layers`` chained up/down pairs ``[M, din] x [din, dout] x [dout, din]``
(as ``dsbd_jax.host.cpu_options.measure`` does) in these forms, each under every candidate of
``cpu_options.CANDIDATES`` this XLA accepts:

* ``plain``: kernels ``[in, out]`` (the library today);
* ``split2``: each kernel stored as two ``[in, out / 2]`` halves by output columns, two products
  side by side and their outputs concatenated (XLA:CPU may run the two on the two cores);
* ``split_in``: ``up`` split by output columns, ``down`` by input rows (two partial products
  summed);
* ``blocks2``: each kernel as a blocked kernel of two blocks (``[2, in, out / 2]``: one
  batched product; the library's blocked kernels, since removed);
* ``transposed``: each kernel as its ``[out, in]`` rows in blocks (``kinds.transpose_block``
  with ``kinds.transposed_width``, run by ``kinds.project_t``: the library's transposed
  form, which ``load_model`` picks on the 2-core host);
* ``torch``: ``F.linear`` with ``[out, in]`` weights, ``--threads`` threads (when installed).

``--forms`` restricts the forms (``torch`` always runs when installed).

Every form computes the same products (checked against ``plain`` first). Interleaved round by
round, the minimum of ``--repeats`` rounds, in ms per pair. JSON with the CPU model.

Usage: python benchmarks/probes/split_products.py [--din 1536 --dout 8960] [--rows 1 4 8 12 16]
       [--layers 8] [--repeats 9] [--forms plain transposed] [--out results/split_products.json]
       python benchmarks/probes/split_products.py --small   (a 64 x 256 shape: a check, seconds)
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from dsbd_jax.eval.timing import machine_info, write_json  # noqa: E402
from dsbd_jax.models import kinds
from dsbd_jax.host.cpu_options import CANDIDATES, candidates, interleaved_min  # noqa: E402


def plain(x, ups, downs):
    for u, d in zip(ups, downs):
        x = (x @ u) @ d
    return x


def split2(x, ups, downs):  # every weight as (left half, right half) of its output columns
    for (u0, u1), (d0, d1) in zip(ups, downs):
        h = jnp.concatenate([x @ u0, x @ u1], -1)
        x = jnp.concatenate([h @ d0, h @ d1], -1)
    return x


def split_in(x, ups, downs):  # up by output columns, down by input rows
    for (u0, u1), (d0, d1) in zip(ups, downs):
        x = (x @ u0) @ d0 + (x @ u1) @ d1
    return x


def _block(w, n):
    """``[in, out]`` -> ``[out / n, in, n]``: the output columns in blocks of ``n``."""
    din, dout = w.shape
    return jnp.transpose(jnp.reshape(w, (din, dout // n, n)), (1, 0, 2))


def _blocked(x, w):
    """``x [M, in]`` times a blocked kernel: one batched product over the blocks (the blocked
    kernels the library once stored, since removed: ``docs/results/cpu.md``)."""
    c, din, n = w.shape
    m = x.shape[0]
    xm = jnp.pad(x, ((0, 1), (0, 0))) if m == 1 else x
    y = jnp.einsum("cmk,ckn->cmn", jnp.broadcast_to(xm, (c,) + xm.shape), w)
    return y.transpose(1, 0, 2).reshape(xm.shape[0], c * n)[:m]


def blocks2(x, ups, downs):  # blocked kernels [2, in, out / 2]
    for u, d in zip(ups, downs):
        x = _blocked(_blocked(x, u), d)
    return x


def transposed(x, ups, downs):  # transposed kernels [out / n, n, in]
    for u, d in zip(ups, downs):
        x = kinds.project_t(kinds.project_t(x, u), d)
    return x


FORMS = ("plain", "split2", "split_in", "blocks2", "transposed")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--din", type=int, default=1536)
    ap.add_argument("--dout", type=int, default=8960)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 8, 12, 16])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--forms", nargs="+", default=list(FORMS), choices=FORMS)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--out", default="/tmp/dsbd_split_products.json")
    args = ap.parse_args(argv)
    din, dout, L = (64, 256, 2) if args.small else (args.din, args.dout, args.layers)
    rng = np.random.default_rng(0)
    ups = [(rng.standard_normal((din, dout)) / np.sqrt(din)).astype(np.float32) for _ in range(L)]
    downs = [(rng.standard_normal((dout, din)) / np.sqrt(dout)).astype(np.float32)
             for _ in range(L)]
    J = jnp.asarray
    U, D = [J(w) for w in ups], [J(w) for w in downs]
    trees = {
        "plain": (plain, U, D),
        "split2": (split2, [(J(w[:, :dout // 2]), J(w[:, dout // 2:])) for w in ups],
                   [(J(w[:, :din // 2]), J(w[:, din // 2:])) for w in downs]),
        "split_in": (split_in, [(J(w[:, :dout // 2]), J(w[:, dout // 2:])) for w in ups],
                     [(J(w[:dout // 2]), J(w[dout // 2:])) for w in downs]),
        "blocks2": (blocks2, [_block(u, dout // 2) for u in U],
                    [_block(d, din // 2) for d in D]),
        "transposed": (transposed,
                       [kinds.transpose_block(u, kinds.transposed_width(dout)) for u in U],
                       [kinds.transpose_block(d, kinds.transposed_width(din)) for d in D]),
    }
    trees = {k: v for k, v in trees.items() if k in set(args.forms) | {"plain"}}
    fns = {f"{form} | {opt}": (jax.jit(f, compiler_options=dict(CANDIDATES[opt])), a, b)
           for opt in candidates() for form, (f, a, b) in trees.items()}
    torch_chain = None
    try:
        import torch
        torch.set_num_threads(args.threads)
        tu = [torch.from_numpy(np.ascontiguousarray(w.T)) for w in ups]
        td = [torch.from_numpy(np.ascontiguousarray(w.T)) for w in downs]

        def torch_chain(x):
            with torch.no_grad():
                for u, d in zip(tu, td):
                    x = torch.nn.functional.linear(torch.nn.functional.linear(x, u), d)
            return x
    except ImportError:
        torch = None
    table = {}
    for M in args.rows:
        x = rng.standard_normal((M, din)).astype(np.float32)
        ref = np.asarray(fns["plain | default"][0](J(x), U, D))
        calls = {}
        for name, (f, a, b) in fns.items():
            np.testing.assert_allclose(np.asarray(f(J(x), a, b)), ref, rtol=2e-3, atol=2e-3)
            calls[name] = functools.partial(f, J(x), a, b)
        if torch_chain is not None:
            xt = torch.from_numpy(x)
            np.testing.assert_allclose(torch_chain(xt).numpy(), ref, rtol=2e-3, atol=2e-3)
            calls["torch"] = lambda xt=xt: (torch_chain(xt), jnp.zeros(()))[1]
        t = interleaved_min(calls, args.repeats)
        table[str(M)] = {k: 1e3 * v / L for k, v in t.items()}
        print(f"M={M:2d}  " + "  ".join(f"{k}={v:.2f}" for k, v in table[str(M)].items()),
              flush=True)
    out = {"machine": machine_info(), "din": din, "dout": dout, "layers": L,
           "torch_threads": args.threads if torch_chain is not None else None,
           "figure": "ms per chained up/down pair, minimum over rounds", "ms": table}
    write_json(args.out, out)
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
