"""Every decoder under each XLA:CPU compiler-options candidate, side by side in one process.

``dsbd_jax.host.cpu_options`` picks one ``compiler_options`` dict per host for every jit of
the library. This script times what the pick is worth end to end: the offline pair, the same
prompts, batch 1, EOS off (every call makes ``--max-new-tokens`` tokens), top-k 10, top-p 0.8,
and for each decoder its jitted core compiled once per candidate (``--options``, default every
candidate this XLA accepts). Compile is excluded (each program runs once untimed first) and the
candidates alternate prompt by prompt, so load from elsewhere hits them alike. It also records
whether the candidates produced the same integer outputs (tokens, lengths) as ``default``: they
should (``eigen_dot`` changes float rounding only), and the JSON says so per decoder.

Decoders (``--methods``): ``sample``; ``beam_sample_W4``; ``speculative_g4``;
``dsbd_single_beam`` (gamma 3, W_S 3, t 0.9, W_min 1, single beam); ``dsbd_beamW4_point``
(gamma 2, W_S 4, t 0.7, W_min 2: the setting at beam-W4 log-likelihood in ``docs/results/speed.md``).

    .venv/bin/python benchmarks/cpu_options.py --out results/cpu_options.json        # ~20 min
    .venv/bin/python benchmarks/cpu_options.py --small --out /tmp/co.json            # seconds
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)

import jax  # noqa: E402
import numpy as np  # noqa: E402

from dsbd_jax.host import cpu_options

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"
METHODS = {
    "sample": ("sample", {}),
    "beam_sample_W4": ("beam", dict(num_beams=4)),
    "speculative_g4": ("spec", dict(gamma=4)),
    "dsbd_single_beam": ("dsbd", dict(gamma=3, draft_width=3, threshold=0.9, min_width=1,
                                      single_beam=True)),
    "dsbd_beamW4_point": ("dsbd", dict(gamma=2, draft_width=4, threshold=0.7, min_width=2)),
}


def with_options(core, options):
    """The decoder core ``core`` (a ``cpu_options.tuned_jit``) jitted with ``options``."""
    return jax.jit(core._fun, compiler_options=dict(options), **core._jit_kwargs)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=TARGET)
    ap.add_argument("--draft", default=DRAFT)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--options", nargs="+", default=None,
                    help="candidates of cpu_options.CANDIDATES (default: all this XLA accepts)")
    ap.add_argument("--small", action="store_true", help="a tiny random pair (a check)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    from dsbd_jax.decoding import methods as dm
    from dsbd_jax.decoding.common import bucket_length, pad_prompts
    from dsbd_jax.eval.timing import machine_info, portable_settings, write_json
    from dsbd_jax.loading.load import load_model

    supported = cpu_options.candidates()
    names = list(supported) if args.options is None else args.options
    bad = [n for n in names if n not in supported]
    if bad:
        ap.error(f"this XLA rejects the options of {bad}; supported: {sorted(supported)}")
    if "default" not in names:
        names = ["default"] + names
    if args.small:
        from dsbd_jax.testing import make_tiny_pair
        args.target, args.draft = (str(p) for p in
                                   make_tiny_pair(Path(tempfile.mkdtemp()) / "pair"))
    target = load_model(args.target, progress=not args.small)
    draft = load_model(args.draft, progress=not args.small)
    if args.small:
        prompts = [[1, 2, 3], [4, 5, 6, 7]][:args.prompts]
    else:
        from dsbd_jax.eval.datasets import benchmark_prompts
        _, prompts = benchmark_prompts(target.tokenizer, args.prompts)
    P = bucket_length(max(len(p) for p in prompts))
    N = args.max_new_tokens
    warp = dict(temperature=1.0, top_k=10, top_p=0.8, eos_token_id=(), max_new_tokens=N)
    out = {"machine": machine_info(), "target": args.target, "draft": args.draft,
           "settings": portable_settings(vars(args), _ROOT), "host_choice": cpu_options.choice(),
           "options": {n: dict(supported[n]) for n in names}, "runs": {}}
    for mname in args.methods:
        method, settings = METHODS[mname]
        dec = dm.build(method, target.config, draft.config, **warp, **settings)
        params = dm.model_params(dec, target.params, draft.params)
        fns, secs, first = {}, {n: 0.0 for n in names}, {}
        same = {n: True for n in names}
        for i, p in enumerate(prompts):
            ids, lens = pad_prompts([p], length=P)
            call = dec.core_call(params, ids, jax.random.PRNGKey(i), lens)
            for n in names:
                if n not in fns:  # compile, and run once untimed
                    fns[n] = with_options(call.core, supported[n])
                    jax.block_until_ready(fns[n](*call.args, **call.kwargs))
                t0 = time.perf_counter()
                res = jax.block_until_ready(fns[n](*call.args, **call.kwargs))
                secs[n] += time.perf_counter() - t0
                ints = [np.asarray(x) for x in jax.tree.leaves(res)
                        if np.issubdtype(np.asarray(x).dtype, np.integer)]
                if n == "default":
                    first = ints
                else:
                    same[n] &= all(np.array_equal(a, b) for a, b in zip(first, ints))
        toks = N * len(prompts)
        rec = {n: {"tokens_per_s": toks / secs[n], "seconds": secs[n], "tokens": toks}
               for n in names}
        for n in names:
            if n != "default":
                rec[f"{n}_vs_default"] = rec[n]["tokens_per_s"] / rec["default"]["tokens_per_s"]
                rec[f"{n}_same_integer_outputs"] = bool(same[n])
        out["runs"][mname] = rec
        print(f"{mname}: " + ", ".join(f"{n} {rec[n]['tokens_per_s']:.2f} tok/s" for n in names)
              + "".join(f" ({n} {rec[f'{n}_vs_default']:.2f}x, same ints "
                        f"{rec[f'{n}_same_integer_outputs']})" for n in names if n != "default"),
              flush=True)
        write_json(args.out, out)  # after every decoder: a killed run keeps what it measured
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
