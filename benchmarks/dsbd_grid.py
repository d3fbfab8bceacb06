"""DSBD against beam sampling (and speculative sampling) on the offline Qwen pair, one run.

    .venv/bin/python benchmarks/dsbd_grid.py --grid configs/quick_cpu.yaml --prompts 2 \
        --max-new-tokens 32 --out results/dsbd_grid.json

For each method: tokens/s (wall clock, compile excluded), target calls per generated token,
average accepted width, mean layers accepted per iteration, and the mean target log-likelihood
per token of the returned (best) sequence. The grid file (``configs/``) names the model pair,
the warping, the beam-sampling widths, the speculative gamma and the DSBD settings:
``configs/quick_cpu.yaml`` is a CPU-sized subset of ``configs/paper_grid.yaml`` (the paper's
gamma in {2, 3} x W_S in {2..6} x t in {0.7, 0.9} x W_min in {1, 2, 3}; hours on a CPU).

Speeds are compared side by side in this one run; the summary prints each DSBD setting's
speed-up over the widest beam-sampling run whose quality (log-likelihood per token) it matches
or beats.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def load_grid(path):
    """Read a grid file from configs/ (see configs/quick_cpu.yaml for the keys)."""
    import yaml
    with open(path) as f:
        cfg = yaml.safe_load(f)
    required = ("target", "draft", "beam_widths", "dsbd")
    missing = [k for k in required if k not in cfg]
    if missing:
        raise SystemExit(f"{path}: missing keys {missing}")
    for i, e in enumerate(cfg["dsbd"]):
        if set(e) != {"gamma", "draft_width", "threshold", "min_width"}:
            raise SystemExit(f"{path}: dsbd entry {i} needs gamma, draft_width, threshold, min_width")
    return cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", default="configs/quick_cpu.yaml", help="a grid file in configs/")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/dsbd_grid.json")
    args = ap.parse_args()

    from dsbd_jax import bench, common
    from dsbd_jax.beam import beam_sample
    from dsbd_jax.dsbd import DSBDConfig, dsbd_generate
    from dsbd_jax.loading import load_model
    from dsbd_jax.speculative import speculative_sample
    from dsbd_jax.datasets import benchmark_prompts

    grid = load_grid(args.grid)
    t0 = time.perf_counter()
    target = load_model(grid["target"])
    draft = load_model(grid["draft"])
    texts, prompts = benchmark_prompts(target.tokenizer, args.prompts)
    P = common.bucket_length(max(len(p) for p in prompts))
    both = {"target": target.params, "draft": draft.params}
    warp = dict(temperature=grid.get("temperature", 1.0), top_k=grid.get("top_k"),
                top_p=grid.get("top_p", 1.0), eos_token_id=(),
                max_new_tokens=args.max_new_tokens)
    runs = []
    for W in grid["beam_widths"]:
        cfg = common.DecodeConfig(target=target.config, num_beams=W, **warp)
        runs.append((f"beam_sample W={W}", beam_sample, target.params, cfg, {"W": W}))
    sg = grid.get("speculative_gamma")
    if sg:
        cfg = common.DecodeConfig(target=target.config, draft=draft.config, gamma=sg, **warp)
        runs.append((f"speculative gamma={sg}", speculative_sample, both, cfg, {}))
    entries = [(e["gamma"], e["draft_width"], e["threshold"], e["min_width"]) for e in grid["dsbd"]]
    for g, ws, t, wm in entries:
        cfg = DSBDConfig(target=target.config, draft=draft.config, gamma=g, draft_width=ws,
                         threshold=t, min_width=wm, **warp)
        runs.append((f"dsbd g={g} WS={ws} t={t} Wmin={wm}", dsbd_generate, both, cfg,
                     {"gamma": g, "W_S": ws, "t": t, "W_min": wm}))
    g, ws, t, wm = entries[0]
    cfg = None if not grid.get("single_beam") else DSBDConfig(target=target.config, draft=draft.config, gamma=g, draft_width=ws,
                     threshold=t, min_width=wm, single_beam=True, **warp)
    if cfg is not None:
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
    bench.write_json(args.out, {"machine": bench.machine_info(), "settings": vars(args), "grid": grid,
                                "prompt_lengths": [len(p) for p in prompts], "rows": rows,
                                "comparisons": comparisons, "wall_s": time.perf_counter() - t0})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
