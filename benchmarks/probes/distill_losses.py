"""Which distillation loss moves the draft, measured on one recipe's own data.

For a recipe (``configs/distill_qwen.yaml``): its rollouts are made (or read) once in its run
directory; then, for each ``--losses`` entry, the same LoRA run of ``--steps`` steps (same
initial adapters, same batches, same schedule over ``--steps``) starts from the base draft in
``RUN_race/<loss>``. For the base draft and each trained one, on the recipe's held-out rollouts:

* ``acceptance``: mean ``sum_x min(p(x), q(x))`` on the warped distributions (1 - the TV loss);
* ``unreachable``: mean ``sum_x p(x) [q(x) = 0]``, the target's warped mass on tokens that the
  **warped** draft gives zero. The ``tv`` loss on warped distributions has no gradient towards
  those tokens (top-k / top-p zero them: ``q`` is constant there), so this part of ``1 -
  acceptance`` is out of its reach from where the draft starts;
* ``single_token``: the fraction of positions where the warped draft keeps one token (``q`` is
  then 1 on it whatever the logits: every warped loss's gradient is zero there).

Acceptance is not a timing: the host does not change these figures beyond float rounding.

    .venv/bin/python benchmarks/probes/distill_losses.py configs/distill_qwen.yaml --losses tv fkl \
        --steps 20 --out results/distill_losses.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from pathlib import Path


def warped_stats(dc, config, params, data, batch_size):
    """``{acceptance, unreachable, single_token, positions}`` over ``data``'s stored positions."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from dsbd_jax.decoding.warping import warp_logits
    from dsbd_jax.training.distill import _logits_at

    @jax.jit
    def f(params, b):
        logits = _logits_at(config, params, b["tokens"], b["total"], b["pos"])
        q = jnp.exp(warp_logits(logits, dc.temperature, dc.top_k, dc.top_p))
        q_at = jnp.take_along_axis(q, b["idx"], axis=-1)
        acc = jnp.sum(jnp.minimum(b["p"], q_at), -1)
        unreach = jnp.sum(jnp.where(q_at > 0, 0.0, b["p"]), -1)
        single = (jnp.sum(q > 0, -1) == 1).astype(jnp.float32)
        m = b["mask"].astype(jnp.float32)
        return jnp.stack([jnp.sum(acc * m), jnp.sum(unreach * m), jnp.sum(single * m), jnp.sum(m)])

    n = data["tokens"].shape[0]
    tot = np.zeros(4)
    for i in range(0, n, batch_size):
        idx = np.arange(i, i + batch_size) % n
        b = {k: jnp.asarray(v[idx]) for k, v in data.items()}
        b["mask"] = jnp.asarray(data["mask"][idx] & (np.arange(i, i + batch_size) < n)[:, None])
        tot += np.asarray(f(params, b))
    return {"acceptance": round(tot[0] / tot[3], 5), "unreachable": round(tot[1] / tot[3], 5),
            "single_token": round(tot[2] / tot[3], 5), "positions": int(tot[3])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", help="a distillation recipe, e.g. configs/distill_qwen.yaml")
    ap.add_argument("--losses", nargs="+", default=["tv", "fkl"])
    ap.add_argument("--steps", type=int, default=20, help="LoRA steps per loss (default 20)")
    ap.add_argument("--out", default="/tmp/dsbd_distill_losses.json")
    args = ap.parse_args(argv)

    import jax.numpy as jnp
    from dsbd_jax.eval.datasets import encode_chat
    from dsbd_jax.eval.timing import machine_info
    from dsbd_jax.models.kinds import unblock_params
    from dsbd_jax.loading.load import load_model
    from dsbd_jax.training import recipe as rc
    from dsbd_jax.training.distill import _load_data, distill, prepare_data

    r = rc.load_recipe(args.config)
    dc = r["distill"]
    dtype = jnp.dtype(r["dtype"])
    target = load_model(r["target"], dtype)
    draft = load_model(r["draft"], dtype)
    tok = draft.tokenizer or target.tokenizer
    train = rc.cap_prompts(encode_chat(tok, rc.prompt_texts(r["train_prompts"])),
                           r.get("max_prompt_tokens"))
    held = rc.cap_prompts(encode_chat(tok, rc.prompt_texts(r["heldout_prompts"])),
                          r.get("max_prompt_tokens"))
    run = Path(r["run_dir"])
    eos = target.config.eos_token_id
    t0 = time.perf_counter()
    prepare_data((target.config, target.params), (draft.config, draft.params), train, held, dc,
                 run, eos)  # the rollouts, once (kept in the recipe's run dir)
    rollout_s = time.perf_counter() - t0
    del target  # 7 GB for the offline pair; training does not need it (it OOM-ed 24 GB with it)
    pair = (None, (draft.config, draft.params))
    held_data = _load_data(run / "data_heldout.npz")
    dp = unblock_params(draft.params)
    out = {"config": args.config, "steps": args.steps, "machine": machine_info(),
           "rollouts_s": round(rollout_s, 1),
           "train_rollouts": int(_load_data(run / "data_train.npz")["tokens"].shape[0]),
           "heldout_rollouts": int(held_data["tokens"].shape[0]),
           "base": warped_stats(dc, draft.config, dp, held_data, dc.batch_size), "losses": {}}
    print("base", out["base"], flush=True)
    for loss in args.losses:
        d = run.parent / f"{run.name}_race" / loss
        d.mkdir(parents=True, exist_ok=True)
        for name in ("data_train.npz", "data_heldout.npz"):
            if not (d / name).exists():
                os.symlink((run / name).resolve(), d / name)
        ldc = dataclasses.replace(dc, loss=loss, steps=args.steps,
                                  warmup_steps=max(args.steps // 4, 1),
                                  eval_every=args.steps, checkpoint_every=args.steps)
        t0 = time.perf_counter()
        res = distill(*pair, train, held, ldc, d, eos_token_id=eos, progress=True)
        stats = warped_stats(dc, draft.config, res["params"], held_data, dc.batch_size)
        stats["seconds"] = round(time.perf_counter() - t0, 1)
        stats["heldout_acceptance_history"] = res["heldout_acceptance"]
        out["losses"][loss] = stats
        del res  # the merged draft (2 GB): one at a time
        print(loss, stats, flush=True)
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
