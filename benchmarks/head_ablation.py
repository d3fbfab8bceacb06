"""Head-training choices side by side: the recipe and variants of it (another initialisation,
another loss) trained from the same data (the recipe's ``RUN/data.npz``, written by
``dsbd train-head``), the same seed, data order and learning-rate schedule, for the first
``--steps`` steps of the recipe's run, then counted on the same held-out positions the way
``benchmarks/head_heldout.py`` counts (every counted position weighs the same; the second draft
token read through the first's chain, whatever the variant trained).

    .venv/bin/python -m benchmarks.head_ablation configs/head_qwen.yaml --steps 40 \\
        --out results/head_ablation.json          # ~8 min per variant on a 2-core CPU

Variants (``--variants``; default: the first four): ``recipe`` (as written), ``random_init``
(the block initialised at random instead of from the target's last layer), ``no_feature_loss``
(token KL only: ``feature_weight: 0``), ``one_step`` (no unrolled second step: ``unroll: 1``),
``half_data`` / ``quarter_data`` (every second / fourth training text only: both tasks stay in,
the same steps and schedule; how acceptance grows with the data), ``fused_layers`` (the block
reads a fusion of a low, a middle and the last target layer, EAGLE-3's choice, instead of the
final hidden state: layers ``L // 10``, ``L // 2``, ``L - 1`` of ``L``; their features come from
one more target pass over each stored text, cached in ``--run-dir/fused_layers/features.npz``,
the continuations and the target's distributions unchanged), ``longer`` (the recipe's data and
settings on a schedule of 600 steps, five times the recipe's: what more training alone gives),
``more_text`` (``longer`` with 400 more training texts: GSM8K problems 160-559, none of them a
benchmark, rollout or held-out prompt, each its prompt and the dataset's worked answer, scored
by one target pass each, the loss counting the answer's positions as a rollout counts its
continuation (``text_loss: answer``); cached in ``--run-dir/more_text/texts.npz``). A variant
with its own schedule trains for ``--steps`` of that schedule. Each trains in
``--run-dir/VARIANT`` (resumable: a killed run picks up at its last checkpoint) and leaves its
head in ``--run-dir/VARIANT/head``, a draft by path (``benchmarks/draft_terms.py --head PATH``,
``dsbd generate --draft PATH``).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

VARIANTS = {
    "recipe": {},
    "random_init": {"head": {"init": "random"}},
    "no_feature_loss": {"train": {"feature_weight": 0.0}},
    "one_step": {"train": {"unroll": 1}},
    "half_data": {"data_stride": 2},
    "quarter_data": {"data_stride": 4},
    "fused_layers": {"head": {"feature_layers": "low_mid_high"}},
    "longer": {"train": {"steps": 600}},
    "more_text": {"train": {"steps": 600},
                  "texts": [{"task": "gsm8k", "start": 160, "stop": 560}]},
}
CHOICES = ("recipe", "random_init", "no_feature_loss", "one_step")   # the default set


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe")
    ap.add_argument("--steps", type=int, required=True,
                    help="train each variant for the first STEPS steps of the recipe's schedule")
    ap.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(CHOICES),
                    help="default: the training choices (%(default)s); the others on request")
    ap.add_argument("--run-dir", default=None, help="default: RUN_ablation beside the recipe's")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import jax.numpy as jnp
    import numpy as np

    from dsbd_jax.eval.timing import machine_info, portable_settings, write_json
    from dsbd_jax.loading import heads
    from dsbd_jax.loading.load import load_model
    from dsbd_jax.training import head as th
    from dsbd_jax.training.head_data import concat_data
    r = th.load_recipe(args.recipe)
    for name in args.variants:
        n = VARIANTS[name].get("train", {}).get("steps", r["train"].steps)
        if not 0 < args.steps <= n:
            raise SystemExit(f"--steps must be within 1..{n}, the schedule of {name}")
    data_path = Path(r["run_dir"]) / "data.npz"
    if not data_path.is_file():
        raise SystemExit(f"no data at {data_path}: run `dsbd train-head {args.recipe}` first "
                         f"(its data are written before its first step)")
    z = np.load(data_path)
    train_data = {k[6:]: z[k] for k in z.files if k.startswith("train_")}
    held = {k[5:]: z[k] for k in z.files if k.startswith("held_")}
    run_root = Path(args.run_dir or f"{r['run_dir']}_ablation")
    target = load_model(r["target"], jnp.dtype(r["dtype"]), progress=False)
    shared = {k: v for k, v in target.params.items() if k in ("embed", "lm_head")}
    count_cfg = dataclasses.replace(r["train"], unroll=2)
    out = {"machine": machine_info(), "settings": portable_settings(vars(args), _ROOT),
           "recipe": {"head": r["head"], "train": dataclasses.asdict(r["train"])},
           "data": {"path": os.path.relpath(data_path, _ROOT),
                    "train_texts": int(train_data["tokens"].shape[0]),
                    "heldout_texts": int(held["tokens"].shape[0]),
                    "counted_positions": int(held["mask"].sum())},
           "variants": {}}
    for name in args.variants:
        over = VARIANTS[name]
        h = {**r["head"], **over.get("head", {})}
        data, held_v = train_data, held
        if h.get("feature_layers") == "low_mid_high":
            L = target.config.num_layers
            h["feature_layers"] = sorted({L // 10, L // 2, L - 1})
            data, held_v = _with_layer_features(target, train_data, held, h["feature_layers"],
                                                run_root / name)
        cfg = dataclasses.replace(r["train"], **over.get("train", {}))
        hc = th.head_config(target.config, h)
        params = th.initial_params(hc, h, target, cfg.seed, r["target"])
        stride = over.get("data_stride", 1)
        data = {k: v[::stride] for k, v in data.items()}
        if over.get("texts"):
            data = concat_data(data, _answer_text_data(target, over["texts"], cfg,
                                                       r["max_tokens"], run_root / name))
        t0 = time.perf_counter()
        res = th.train(hc, params, shared, data, held_v, cfg, run_root / name,
                       progress=True, stop_at=args.steps)
        if res["step"] != args.steps:
            raise SystemExit(f"{run_root / name} holds a checkpoint at step {res['step']}, not "
                             f"{args.steps}: delete it to train this variant again")
        metrics = th.heldout_metrics(hc, res["params"], shared, held_v, count_cfg)
        head_dir = heads.save(run_root / name / "head", hc, res["params"],
                              {"recipe": r["name"], "variant": name, "steps": args.steps,
                               "overrides": over})
        out["variants"][name] = {"overrides": over,
                                 "feature_layers": h.get("feature_layers", []),
                                 "steps": args.steps,
                                 "train_texts": int(data["tokens"].shape[0]),
                                 "train_positions": int(data["mask"].sum()), **metrics,
                                 "seconds_this_run": time.perf_counter() - t0,
                                 "head": os.path.relpath(head_dir, _ROOT),
                                 "log": res["log"]}
        print(f"{name}: acceptance {metrics['acceptance_1']:.3f} / "
              f"{metrics['acceptance_2']:.3f}, kl {metrics['kl_1']:.3f}", flush=True)
        write_json(args.out, out)   # after each variant: a partial file is a valid one
    print(f"wrote {args.out}")


def _answer_text_data(target, specs, cfg, max_tokens: int, run_dir: Path):
    """:func:`~dsbd_jax.training.head_data.prepare_data`'s arrays for the texts of ``specs``, the
    loss on each answer alone (one target pass per text, cached in ``run_dir/texts.npz``)."""
    import json

    import numpy as np

    from dsbd_jax.training.head_data import answer_texts, prepare_data
    path = run_dir / "texts.npz"
    key = json.dumps({"texts": specs, "store_k": cfg.store_k, "max_tokens": max_tokens,
                      "warping": [cfg.temperature, cfg.top_k, cfg.top_p]}, sort_keys=True)
    if path.is_file():
        z = np.load(path)
        if str(z["key"]) == key:
            return {k: z[k] for k in z.files if k != "key"}
    texts, answer_from = answer_texts(target.tokenizer, specs)
    d = prepare_data(target.config, target.params, texts, (), cfg, max_tokens, True, answer_from)
    run_dir.mkdir(parents=True, exist_ok=True)
    np.savez(path, key=np.asarray(key), **d)
    return d


def _with_layer_features(target, train_data, held, layers, run_dir: Path):
    """The recipe's data with the features of ``layers`` in place of the stored ones (one target
    pass per text, cached in ``run_dir/features.npz``)."""
    import numpy as np

    from dsbd_jax.training.head_data import layer_features
    path = run_dir / "features.npz"
    if path.is_file():
        z = np.load(path)
        if list(z["layers"]) == list(layers):
            return ({**train_data, "feats": z["train"]}, {**held, "feats": z["held"]})
    run_dir.mkdir(parents=True, exist_ok=True)
    f = {part: layer_features(target.config, target.params, d["tokens"], d["lengths"], layers)
         for part, d in (("train", train_data), ("held", held))}
    np.savez(path, layers=np.asarray(layers), **f)
    return {**train_data, "feats": f["train"]}, {**held, "feats": f["held"]}


if __name__ == "__main__":
    main()
