"""Several trained draft heads on the same held-out data: a recipe's ``RUN/data.npz`` (the
target's continuations of its held-out prompts, with the target's features and warped
distributions), each head counted as head training counts it (``training.head.head_losses``,
the unrolled steps attending as draft tokens do): the acceptance ``sum min(p, q)`` of a first
and of a second draft token, and the token KL. Heads trained on other data are compared on the
same positions.

    .venv/bin/python benchmarks/head_heldout.py configs/head_qwen.yaml \\
        --heads head_qwen runs/old/head --out results/head_heldout.json     # ~3 min
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe")
    ap.add_argument("--heads", nargs="+", required=True, help="names or directories")
    ap.add_argument("--data", default=None, help="default: the recipe's RUN/data.npz")
    ap.add_argument("--unroll", type=int, default=2)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    import jax.numpy as jnp
    import numpy as np

    from dsbd_jax.eval.timing import machine_info, portable_settings, write_json
    from dsbd_jax.loading.heads import load_head
    from dsbd_jax.loading.load import load_model
    from dsbd_jax.training import head as th
    r = th.load_recipe(args.recipe)
    data_path = Path(args.data or Path(r["run_dir"]) / "data.npz")
    if not data_path.is_file():
        raise SystemExit(f"no data at {data_path}: run `dsbd train-head {args.recipe}` first")
    z = np.load(data_path)
    held = {k[5:]: z[k] for k in z.files if k.startswith("held_")}
    target = load_model(r["target"], jnp.dtype(r["dtype"]), progress=False)
    shared = {k: v for k, v in target.params.items() if k in ("embed", "lm_head")}
    cfg = th.HeadTrainConfig(**{**r["train"].__dict__, "unroll": args.unroll})
    n = held["tokens"].shape[0]
    out = {"machine": machine_info(), "settings": portable_settings(vars(args), _ROOT),
           "data": {"path": os.path.relpath(data_path, _ROOT), "texts": int(n),
                    "counted_positions": int(held["mask"].sum())}, "heads": {}}
    for name in args.heads:
        hc, hp, meta = load_head(name, target.config)
        res = th.heldout_metrics(hc, hp, shared, held, cfg)
        res["trained"] = {k: meta.get(k) for k in ("recipe", "steps", "data")}
        out["heads"][name] = res
        print(f"{name}: acceptance {res['acceptance_1']:.3f} / "
              f"{res.get('acceptance_2', float('nan')):.3f}, kl {res['kl_1']:.3f}", flush=True)
    write_json(args.out, out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
