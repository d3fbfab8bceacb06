"""A tied vocabulary head on XLA:CPU: operand orders and forms, at M = 1..16 rows.

A tied head multiplies the hidden states ``h [M, d]`` by the embedding ``E [V, d]``
transposed (``nn.Embed.attend``: ``h E^T``). The 0.5B Qwen draft from the Hugging Face hub and
Llama-3.2-1B, the usual drafts, have tied heads. Variants, each compiled under every candidate
of ``dsbd_jax.host.cpu_options`` this XLA accepts, interleaved round by round, minimum of
``--repeats``:

* ``h E^T``: ``jnp.dot(h, E.T)`` (``attend``; the library before the one-row fix, and for M >= 2 now);
* ``E h^T``: ``dot_general(E, h)`` then transposed (the library for M = 1 now);
* ``library``: ``dsbd_jax.models.vocab.tied_logits`` as it is now;
* ``rows one by one``: M products of one row, each as ``E h_i^T``;
* ``kernel [d, V]``: an untied copy of the head (``V * d`` more memory), for reference.

With ``--forward``, also whole decode-step forward passes of the draft of
``benchmarks/accelerator.py``'s Qwen pair (the 0.5B shapes; random weights, float32, per-layer,
512 cache slots) at 1 token, 4 rows and 16 rows, tied against untied
(``dsbd_jax.models.vocab.untie_head``), interleaved, under the host's options
(``benchmarks/draft_levers.py``'s ``pass_call``, compiled as the decoders are).

Usage: python benchmarks/probes/tied_head.py [--vocab 151936 --dim 896] [--rows 1 2 4 8 16]
       [--repeats 7] [--forward] [--out results/tied_head.json]
       python benchmarks/probes/tied_head.py --small   (a 4096 x 64 head: a check, seconds)
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
from dsbd_jax.host.cpu_options import CANDIDATES, candidates, interleaved_min  # noqa: E402
from dsbd_jax.models.vocab import tied_logits, untie_head  # noqa: E402


def _e_ht(h, E):
    return jax.lax.dot_general(E, h, (((1,), (1,)), ((), ()))).T


def _by_row(h, E):
    return jnp.concatenate([_e_ht(h[i:i + 1], E) for i in range(h.shape[0])], axis=0)


VARIANTS = {
    "h E^T": lambda h, E: jnp.dot(h, E.T),
    "E h^T": _e_ht,
    "library": tied_logits,
    "rows one by one": _by_row,
    "kernel [d, V]": lambda h, W: h @ W,
}


def forward_passes(small, repeats):
    """``{shape: {"tied": ms, "untied": ms}}``: decode-step forward passes of the draft of
    ``accelerator.py``'s Qwen pair (``draft_levers.pass_call``: the host's options), tied and
    untied, interleaved, minimum."""
    from benchmarks.accelerator import PAIRS, SMALL_PAIRS
    from benchmarks.draft_levers import pass_call
    from dsbd_jax.models import llama
    from dsbd_jax.models.config import ModelConfig
    shape = (SMALL_PAIRS["tiny"] if small else PAIRS["qwen"])[1]
    cfg = ModelConfig(**dict(shape, tie_word_embeddings=True), dtype="float32")
    params = llama.init_params(cfg, jax.random.PRNGKey(0), "per_layer")
    up, ucfg = untie_head(params, cfg)
    models = {"tied": (cfg, params), "untied": (ucfg, up)}
    slots = 64 if small else 512
    res = {}
    for name, B in {"1 token": 1, "4 rows": 4, "16 rows": 16}.items():
        t = interleaved_min({kind: pass_call(c, p, B, slots, 1)
                             for kind, (c, p) in models.items()}, repeats)
        res[name] = {k: 1e3 * v for k, v in t.items()}
        print(f"draft forward {name}: " + "  ".join(f"{k}={v:.1f} ms"
                                                    for k, v in res[name].items()), flush=True)
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--dim", type=int, default=896)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--forward", action="store_true",
                    help="also whole draft forward passes, tied against untied")
    ap.add_argument("--out", default="/tmp/dsbd_tied_head.json")
    args = ap.parse_args(argv)
    V, d = (4096, 64) if args.small else (args.vocab, args.dim)
    rng = np.random.default_rng(0)
    E = jnp.asarray(rng.standard_normal((V, d), np.float32) * 0.02)
    W = jnp.asarray(np.asarray(E).T.copy())
    fns = {(name, opt): (jax.jit(f, compiler_options=dict(CANDIDATES[opt])),
                         W if name == "kernel [d, V]" else E)
           for opt in candidates() for name, f in VARIANTS.items()}
    table = {}
    for M in args.rows:
        h = jnp.asarray(rng.standard_normal((M, d), np.float32))
        ref = np.asarray(jnp.dot(h, E.T))
        for (name, opt), (f, w) in fns.items():  # every variant computes the same product
            np.testing.assert_allclose(np.asarray(f(h, w)), ref, rtol=1e-4, atol=1e-5)
        t = interleaved_min({k: functools.partial(f, h, w) for k, (f, w) in fns.items()},
                            args.repeats)
        table[str(M)] = {f"{name} | {opt}": 1e3 * s for (name, opt), s in t.items()}
        print(f"M={M:2d}  " + "  ".join(f"{k}={v:.1f}" for k, v in table[str(M)].items()),
              flush=True)
    out = {"machine": machine_info(), "vocab": V, "dim": d, "dtype": "float32",
           "figure": "ms per product, minimum over rounds", "ms": table}
    if args.forward:
        out["forward"] = forward_passes(args.small, args.repeats)
    write_json(args.out, out)
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
