"""Decoders with plain and with transposed projection kernels, side by side in one run.

The offline target (Qwen2.5-Coder-1.5B-Instruct) is loaded once; its parameters are used as
loaded (plain ``[in, out]`` kernels) and transposed (``kinds.transpose_params``,
``load_model(..., kernel_blocks="transposed")``). For each decoder (sampling; beam sampling W =
4 by default) and each tree, tok/s over the same prompts, batch 1, EOS off, compile excluded
(each configuration runs once untimed first); the two trees alternate prompt by prompt so that
load from elsewhere hits both. JSON with the CPU model; the second tree's figures are under
``blocked`` (the key of the blocked kernels this script once compared, kept for the committed
results).

``--methods`` may add the drafted decoders on the offline pair (the draft loaded too):
speculative gamma 4 and DSBD at the beam-W4 log-likelihood point (g2 / W_S 4 / t 0.7 / W_min 2);
there both the target and the draft are transposed. Each configuration runs under the compiler
options chosen for its kernels' form (``cpu_options.choice(form)``; ``options`` in the JSON).
The models load in the dtype ``load_model`` picks for this host (``$DSBD_JAX_DTYPE`` forces one).

    .venv/bin/python benchmarks/probes/kernel_blocks.py \
        --methods sample beam_sample_W4 speculative_g4 dsbd_beamW4_point \
        --out results/kernel_transposed.json
    .venv/bin/python benchmarks/probes/kernel_blocks.py --small --out /tmp/kb.json   # tiny model, seconds

Blocked kernels (``[out / n, in, n]``), which ``--blocks 64`` / ``--blocks halves`` compared
before they were removed, made sampling slower in both dtypes and beam sampling slower in
bfloat16 (``results/kernel_blocks_*_epyc.json``, ``docs/results/cpu.md``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)

import jax  # noqa: E402
import numpy as np  # noqa: E402

from dsbd_jax.eval.timing import machine_info, portable_settings, write_json  # noqa: E402
from dsbd_jax.host import cpu_options
from dsbd_jax.models import kinds

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"
PAIR_METHODS = ("speculative_g4", "dsbd_beamW4_point")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=TARGET)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--methods", nargs="+", default=["sample", "beam_sample_W4"],
                    choices=["sample", "beam_sample_W4", *PAIR_METHODS])
    ap.add_argument("--draft", default=DRAFT)
    ap.add_argument("--blocks", default="transposed", choices=["transposed"],
                    help="the second form: transposed kernels (the only one left)")
    ap.add_argument("--small", action="store_true", help="a tiny random model (a check)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    from dsbd_jax.decoding.beam import beam_sample
    from dsbd_jax.decoding.common import pad_prompts, bucket_length
    from dsbd_jax.decoding.configs import BeamSampleConfig, SampleConfig, SpeculativeConfig
    from dsbd_jax.decoding.sampling import sample
    from dsbd_jax.loading.load import load_model
    if args.small:
        from dsbd_jax.testing import make_tiny_pair
        tmp = Path(tempfile.mkdtemp())
        args.target, args.draft = map(str, make_tiny_pair(tmp / "pair")[:2])
        model = load_model(args.target, progress=False, kernel_blocks=None)
        prompts = [[1, 2, 3], [4, 5, 6, 7]][:args.prompts]
    else:
        from dsbd_jax.eval.datasets import benchmark_prompts
        model = load_model(args.target, progress=False, kernel_blocks=None)
        _, prompts = benchmark_prompts(model.tokenizer, args.prompts)
    config = model.config
    blocks = kinds.transposed_widths(config)
    trees = {"plain": model.params, "blocked": kinds.transpose_params(model.params, blocks)}
    base = dict(target=config, max_new_tokens=args.max_new_tokens, eos_token_id=(),
                temperature=1.0, top_k=10, top_p=0.8)
    methods = {"sample": (sample, SampleConfig(**base), trees),
               "beam_sample_W4": (beam_sample, BeamSampleConfig(num_beams=4, **base), trees)}
    if set(args.methods) & set(PAIR_METHODS):
        from dsbd_jax.decoding.dsbd import DSBDConfig, dsbd_generate
        from dsbd_jax.decoding.speculative import speculative_sample
        draft = load_model(args.draft, progress=False, kernel_blocks=None)
        dt = kinds.transpose_params(draft.params, kinds.transposed_widths(draft.config))
        pair = {"plain": {"target": model.params, "draft": draft.params},
                # both models transposed, as load_model stores them where that is faster
                "blocked": {"target": trees["blocked"], "draft": dt}}
        methods["speculative_g4"] = (
            speculative_sample, SpeculativeConfig(draft=draft.config, gamma=4, **base), pair)
        methods["dsbd_beamW4_point"] = (
            dsbd_generate, DSBDConfig(draft=draft.config, gamma=2, draft_width=4, threshold=0.7,
                                      min_width=2, **base), pair)
    P = bucket_length(max(len(p) for p in prompts))
    out = {"machine": machine_info(), "target": args.target, "blocks": blocks,
           "form": "transposed", "dtype": config.jnp_dtype.name,
           "options": {"plain": cpu_options.choice("plain"),
                       "blocked": cpu_options.choice("transposed")},
           "settings": portable_settings(vars(args), _ROOT), "runs": {}}
    for mname in args.methods:
        fn, cfg, variants = methods[mname]
        secs = {k: 0.0 for k in variants}
        toks = {k: 0 for k in variants}
        for i, p in enumerate(prompts):
            ids, lens = pad_prompts([p], length=P)
            key = jax.random.PRNGKey(i)
            for name, params in variants.items():
                if i == 0:  # compile, untimed
                    jax.block_until_ready(fn(params, ids, key, cfg, prompt_lengths=lens))
                t0 = time.perf_counter()
                res = jax.block_until_ready(fn(params, ids, key, cfg, prompt_lengths=lens))
                secs[name] += time.perf_counter() - t0
                toks[name] += int(np.asarray(res.lengths)[0, int(np.asarray(res.best)[0])])
        rec = {name: {"tokens_per_s": toks[name] / secs[name], "seconds": secs[name],
                      "tokens": toks[name]} for name in variants}
        rec["blocked_vs_plain"] = rec["blocked"]["tokens_per_s"] / rec["plain"]["tokens_per_s"]
        out["runs"][mname] = rec
        print(f"{mname}: plain {rec['plain']['tokens_per_s']:.2f} tok/s, blocked "
              f"{rec['blocked']['tokens_per_s']:.2f} tok/s ({rec['blocked_vs_plain']:.2f}x)",
              flush=True)
    write_json(args.out, out)
    print(f"blocks {blocks}; wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
