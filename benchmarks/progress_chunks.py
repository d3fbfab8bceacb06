"""What a progress bar costs: a decoder run as one program against the same run driven by the
host in chunks (``Progress(every=k)``, what ``--progress tokens`` runs) and with the in-loop
callback (``Progress()``), side by side on the same prompts.

For each decoder (``--methods``: DSBD at the beam-W4 point, g2 / W_S 4 / t 0.7 / W_min 2, and
beam sampling W = 4), each form is compiled first (untimed), then the forms run interleaved,
``--repeats`` rounds (the median of each, seconds per call). The JSON gives per method and form
the seconds, the loop trips, the ratio to the one-program run, and the cost per chunk
(``(chunked - one program) / chunks``); the host in ``machine``. Timings need a quiet machine.

    .venv/bin/python benchmarks/progress_chunks.py --out results/progress_chunks_HOST.json
    .venv/bin/python benchmarks/progress_chunks.py --small --out /tmp/progress_chunks.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)

FORMS = ("one_program", "every_1", "every_4", "callback")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--methods", nargs="+", default=["dsbd", "beam_sample"],
                    choices=("dsbd", "beam_sample"))
    ap.add_argument("--prompts", type=int, default=1)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--small", action="store_true", help="a tiny random pair: seconds")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import jax
    from dsbd_jax.decoding.beam import beam_sample
    from dsbd_jax.decoding._jit.calls import Progress
    from dsbd_jax.decoding.common import max_prompt_length, pad_prompts
    from dsbd_jax.decoding.configs import BeamSampleConfig
    from dsbd_jax.decoding.dsbd import DSBDConfig, dsbd_generate
    from dsbd_jax.eval.datasets import benchmark_prompts, encode_chat
    from dsbd_jax.eval.timing import machine_info, portable_settings, write_json
    from dsbd_jax.loading.load import load_model

    if args.small:
        from dsbd_jax.testing import make_tiny_pair
        tmp = Path(tempfile.mkdtemp(prefix="progress_chunks_"))
        args.target, args.draft = (str(p) for p in make_tiny_pair(tmp / "pair", noise=0.3))
        args.max_new_tokens, args.repeats = 8, 2
    target = load_model(args.target, progress=not args.small)
    draft = load_model(args.draft, progress=not args.small)
    if args.small:
        prompts = encode_chat(target.tokenizer, ["def add(a, b):"] * args.prompts, raw=True)
    else:
        prompts = benchmark_prompts(target.tokenizer, args.prompts)[1]
    warp = dict(max_new_tokens=args.max_new_tokens, top_k=10, top_p=0.8, eos_token_id=())
    configs = {
        "dsbd": (dsbd_generate, {"target": target.params, "draft": draft.params},
                 DSBDConfig(target=target.config, draft=draft.config, gamma=2, draft_width=4,
                            threshold=0.7, min_width=2, **warp)),
        "beam_sample": (beam_sample, target.params,
                        BeamSampleConfig(target.config, num_beams=4, **warp)),
    }
    key = jax.random.key(0)
    out = {"benchmark": "progress_chunks", "machine": machine_info(),
           "settings": portable_settings(vars(args)), "methods": {}}
    for name in args.methods:
        fn, params, cfg = configs[name]
        ids, lengths = pad_prompts(prompts, max_length=max_prompt_length(cfg))
        forms = {"one_program": cfg, "every_1": cfg.replace(progress=Progress(every=1)),
                 "every_4": cfg.replace(progress=Progress(every=4)),
                 "callback": cfg.replace(progress=Progress())}
        calls = {f: (lambda c=c: jax.block_until_ready(fn(params, ids, key, c,
                                                              prompt_lengths=lengths)))
                 for f, c in forms.items()}
        trips = None
        for f, call in calls.items():      # compile and warm each form, untimed
            res = call()
            trips = int(res.stats["iterations"])
            print(f"{name} {f}: compiled", flush=True)
        times = {f: [] for f in calls}
        for _ in range(args.repeats):
            for f, call in calls.items():
                t0 = time.perf_counter()
                call()
                times[f].append(time.perf_counter() - t0)
        med = {f: statistics.median(t) for f, t in times.items()}
        rows = {}
        for f in FORMS:
            every = {"every_1": 1, "every_4": 4}.get(f)
            chunks = -(-trips // every) if every else None
            rows[f] = {"seconds": med[f], "all_seconds": times[f],
                       "over_one_program": med[f] / med["one_program"],
                       "chunks": chunks,
                       "ms_per_chunk": (1e3 * (med[f] - med["one_program"]) / chunks
                                        if chunks else None)}
            print(f"{name} {f}: {med[f]:.3f} s, {rows[f]['over_one_program']:.3f}x"
                  + (f", {rows[f]['ms_per_chunk']:.1f} ms per chunk" if chunks else ""),
                  flush=True)
        out["methods"][name] = {"loop_trips": trips, "batch": len(prompts), "forms": rows}
        write_json(args.out, out)
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
