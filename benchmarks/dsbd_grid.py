"""DSBD against beam sampling (and speculative sampling) on the offline Qwen pair, one run.

    .venv/bin/python benchmarks/dsbd_grid.py --grid quick --prompts 4 --max-new-tokens 32 \
        --out results/dsbd_grid.json

For each method: tokens/s (wall clock, compile excluded), target calls per generated token,
average accepted width, mean layers accepted per iteration, and the mean target log-likelihood
per token of the returned (best) sequence. Grids:

* ``quick``: a CPU-sized subset of the paper's grid (listed in ``QUICK``);
* ``paper``: gamma in {2, 3} x W_S in {2..6} x t in {0.7, 0.9} x W_min in {1, 2, 3}
  (W_min <= W_S), hours on a CPU.

Beam sampling runs at W in ``--widths`` (default 1 2 3 4). Speeds are compared side by side in
this one run; the summary prints each DSBD setting's speed-up over the beam-sampling width whose
quality (log-likelihood per token) it matches or beats.
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"

# (gamma, W_S, t, W_min)
QUICK = [(2, 3, 0.9, 1), (2, 4, 0.7, 2), (3, 3, 0.9, 1)]


def paper_grid():
    return [(g, ws, t, wm) for g, ws, t, wm in
            itertools.product((2, 3), range(2, 7), (0.7, 0.9), (1, 2, 3)) if wm <= ws]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", choices=("quick", "paper"), default="quick")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--widths", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--top-p", type=float, default=0.8)
    ap.add_argument("--spec-gamma", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/dsbd_grid.json")
    args = ap.parse_args()

    from dsbd_jax import bench, common
    from dsbd_jax.beam import beam_sample
    from dsbd_jax.dsbd import DSBDConfig, dsbd_generate
    from dsbd_jax.loading import load_model
    from dsbd_jax.speculative import speculative_sample
    from dsbd_jax.datasets import benchmark_prompts

    t0 = time.perf_counter()
    target = load_model(TARGET)
    draft = load_model(DRAFT)
    texts, prompts = benchmark_prompts(target.tokenizer, args.prompts)
    P = common.bucket_length(max(len(p) for p in prompts))
    both = {"target": target.params, "draft": draft.params}
    warp = dict(temperature=1.0, top_k=args.top_k, top_p=args.top_p, eos_token_id=(),
                max_new_tokens=args.max_new_tokens)
    runs = []
    for W in args.widths:
        cfg = common.DecodeConfig(target=target.config, num_beams=W, **warp)
        runs.append((f"beam_sample W={W}", beam_sample, target.params, cfg, {"W": W}))
    cfg = common.DecodeConfig(target=target.config, draft=draft.config, gamma=args.spec_gamma, **warp)
    runs.append((f"speculative gamma={args.spec_gamma}", speculative_sample, both, cfg, {}))
    grid = QUICK if args.grid == "quick" else paper_grid()
    for g, ws, t, wm in grid:
        cfg = DSBDConfig(target=target.config, draft=draft.config, gamma=g, draft_width=ws,
                         threshold=t, min_width=wm, **warp)
        runs.append((f"dsbd g={g} WS={ws} t={t} Wmin={wm}", dsbd_generate, both, cfg,
                     {"gamma": g, "W_S": ws, "t": t, "W_min": wm}))
    g, ws, t, wm = grid[0]
    cfg = DSBDConfig(target=target.config, draft=draft.config, gamma=g, draft_width=ws,
                     threshold=t, min_width=wm, single_beam=True, **warp)
    runs.append((f"dsbd single-beam g={g} WS={ws} t={t} Wmin={wm}", dsbd_generate, both, cfg,
                 {"gamma": g, "W_S": ws, "t": t, "W_min": wm, "single_beam": True}))

    rows = []
    for name, fn, params, cfg, setting in runs:
        r = bench.run_over_prompts(fn, params, cfg, prompts, P, seed=args.seed, label=name)
        extra = {}
        for k in ("mean_accepted_width", "mean_layers_per_iteration"):
            vals = [p[k] for p in r["prompts"] if k in p]
            if vals:
                extra[k] = float(np.mean(vals))
        rows.append({"method": name, "setting": setting, **extra, **r})
        print(f"{name}: {r['tokens_per_s']:.2f} tokens/s, loglik/token {r['loglik_per_token']:.3f}",
              flush=True)

    beams = [r for r in rows if r["method"].startswith("beam_sample")]
    comparisons = []
    for r in rows:
        if not r["method"].startswith("dsbd"):
            continue
        matched = [b for b in beams if r["loglik_per_token"] >= b["loglik_per_token"]]
        if matched:
            b = max(matched, key=lambda b: b["loglik_per_token"])
            comparisons.append({"dsbd": r["method"], "beam": b["method"],
                                "speedup": r["tokens_per_s"] / b["tokens_per_s"]})
    print()
    bench.print_table(rows, ["method", "tokens_per_s", "target_calls_per_token",
                             "mean_accepted_width", "mean_layers_per_iteration", "loglik_per_token",
                             "compile_s"])
    print()
    for c in comparisons:
        print(f"{c['dsbd']} vs {c['beam']} (quality matched or beaten): {c['speedup']:.2f}x")
    bench.write_json(args.out, {"machine": bench.machine_info(), "settings": vars(args),
                                "prompt_lengths": [len(p) for p in prompts], "rows": rows,
                                "comparisons": comparisons, "wall_s": time.perf_counter() - t0})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
