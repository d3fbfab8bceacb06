"""The prompt pass at its length: the whole bucket against chunks up to the longest prompt.

For the speed benchmark's prompts (the first ``--prompts`` of ``benchmark_prompts``: HumanEval,
then GSM8K), one at a time and all of them as one batch, each in the bucket the decoders pad it
to: ``common.prefill`` of the target and of the draft with ``chunk=0`` (one pass over the whole
bucket, as before chunking) and with each of ``--chunks``, timed alone and interleaved round by
round (min of ``--repeats``), all in this one process. ``ratio`` is a chunked pass's time over
the whole bucket's, per model and prompt.

    .venv/bin/python -m benchmarks.speed --prefill --dtypes float32 bfloat16 \
        --out results/prefill_<host>.json
"""

from __future__ import annotations

import argparse
import os

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64, help="the cache's new slots")
    ap.add_argument("--chunks", type=int, nargs="+", default=[32, 64])
    ap.add_argument("--dtypes", nargs="+", default=["float32"], choices=["float32", "bfloat16"])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import jax
    import numpy as np
    from dsbd_jax.decoding import common
    from dsbd_jax.eval.datasets import benchmark_prompts
    from dsbd_jax.eval.timing import machine_info, portable_settings, write_json
    from dsbd_jax.host.cpu_options import interleaved_min
    from dsbd_jax.loading.load import load_model
    load = os.getloadavg()[0] / max(os.cpu_count() or 1, 1)
    out = {"machine": machine_info(), "settings": portable_settings(vars(args), _ROOT),
           "load_per_core": round(load, 2), "rows": []}
    for dtype in args.dtypes:
        for role, name in (("target", TARGET), ("draft", DRAFT)):
            model = load_model(name, dtype, progress=False)
            _, prompts = benchmark_prompts(model.tokenizer, args.prompts)
            batches = [[p] for p in prompts] + [list(prompts)]
            for batch in batches:
                lens = [len(p) for p in batch]
                P = common.bucket_length(max(lens))
                ids, n = common.pad_prompts(batch, pad_id=0, max_length=P)
                S = P + args.max_new_tokens
                calls = {}
                for chunk in [0] + list(args.chunks):
                    f = jax.jit(lambda p, i, l, c=chunk: common.prefill(model.config, p, i, l, S,
                                                                        chunk=c)[1])
                    calls[chunk] = (lambda f=f: f(model.params, ids, n))
                logits = {c: np.asarray(f()) for c, f in calls.items()}
                gap = max(float(np.max(np.abs(logits[c] - logits[0]))) for c in logits)
                best = interleaved_min(calls, args.repeats)
                row = {"dtype": dtype, "model": role, "prompt_tokens": lens, "bucket": P,
                       "ms": {str(c): round(1e3 * s, 2) for c, s in best.items()},
                       "ratio": {str(c): round(best[c] / best[0], 3) for c in args.chunks},
                       "max_abs_logit_gap": gap}
                out["rows"].append(row)
                print(f"{dtype} {role} prompts {lens} in {P}: whole {row['ms']['0']:.0f} ms; "
                      + ", ".join(f"chunks of {c}: {row['ms'][str(c)]:.0f} ms "
                                  f"({row['ratio'][str(c)]:.2f}x)" for c in args.chunks)
                      + f"; logits differ by at most {gap:.1e}", flush=True)
            del model
    write_json(args.out, out)
    print(f"wrote {args.out}")
    return out
