"""What a head recipe's data phase costs, both ways, side by side in one run: the target's
rollouts of the same prompts with their features and warped distributions

* ``rescore``: sampled by the sampling decoder (``rollout_batch`` prompts at a time, padded to
  the longest prompt's power-of-two bucket), then one target pass over each finished text;
* ``own_passes``: taken from the passes that sample them (``training.head_data.rollout_data``:
  prompts sorted by length, each batch padded to a multiple of 64).

Each way runs twice (the first run compiles; its time is reported apart) on the first
``--prompts`` training prompts of the recipe; the JSON holds both wall times and their ratio,
and the host.

    .venv/bin/python benchmarks/head_data_speed.py configs/head_qwen.yaml --prompts 16 \\
        --rollout-batch 8 --out results/head_data_speed.json   # ~20 min on a 2-core CPU
"""

from __future__ import annotations

import argparse
import os
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--rollout-batch", type=int, default=None,
                    help="prompts at a time (default: the recipe's rollout_batch)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import jax
    import jax.numpy as jnp
    import numpy as np

    from dsbd_jax.eval.timing import machine_info, portable_settings, write_json
    from dsbd_jax.models import head as mhead
    from dsbd_jax.loading.load import load_model
    from dsbd_jax.training import head as th
    from dsbd_jax.training import head_data as hd
    r = th.load_recipe(args.recipe)
    cfg = r["train"]
    target = load_model(r["target"], jnp.dtype(r["dtype"]), progress=False)
    hc = mhead.HeadConfig(target.config,
                          feature_layers=tuple(r["head"].get("feature_layers") or ()))
    prompts = hd.rollout_prompts(target.tokenizer, r["train_rollouts"],
                                 r["max_prompt_tokens"])[:args.prompts]
    if args.rollout_batch:
        r["rollout_batch"] = args.rollout_batch
    N, batch, T = r["rollout_tokens"], r["rollout_batch"], r["max_tokens"]

    def rescore(key):
        texts, lf = hd.target_rollouts(target.config, target.params, prompts, cfg, N, batch,
                                       key, progress=False)
        return hd.prepare_data(target.config, target.params, texts, hc.feature_layers, cfg, T,
                               False, lf)

    def own_passes(key):
        return hd.rollout_data(target.config, target.params, prompts, hc.feature_layers, cfg, N,
                               batch, T, key, progress=False)

    seconds, counted = {}, {}
    for name, fn in (("rescore", rescore), ("own_passes", own_passes)):
        runs = []
        for rep in range(2):
            t0 = time.perf_counter()
            data = fn(jax.random.PRNGKey(rep))
            runs.append(time.perf_counter() - t0)
        seconds[name] = {"first_run_s": runs[0], "second_run_s": runs[1]}
        counted[name] = int(np.sum(data["mask"]))
        print(f"{name}: {runs[1]:.1f} s ({runs[0]:.1f} s with compiling), "
              f"{counted[name]} counted positions", flush=True)
    ratio = seconds["own_passes"]["second_run_s"] / seconds["rescore"]["second_run_s"]
    print(f"own_passes / rescore: {ratio:.2f}x the time")
    out = {"machine": machine_info(), "settings": portable_settings(vars(args), _ROOT),
           "recipe": {k: r[k] for k in ("target", "dtype", "rollout_tokens", "rollout_batch",
                                        "max_prompt_tokens", "max_tokens")},
           "prompts": len(prompts), "prompt_tokens": [len(p) for p in prompts],
           "seconds": seconds, "counted_positions": counted,
           "own_passes_over_rescore": ratio}
    write_json(args.out, out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
