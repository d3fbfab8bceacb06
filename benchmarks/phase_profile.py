"""Phase-by-phase profile of every decoder on the real model pair (``dsbd_jax.eval.profile``).

For each method setting and prompt: one compiled run under the XLA:CPU profiler; thunk time per
phase (prefill, target forward, draft forward, warp, log-softmax, random, verify, width, cache,
other), per iteration, and the overhead share (loop thunk time outside the forward passes). Beside
it, the bare forward passes of the same shapes timed alone (jitted ``model.forward`` with a cache
of the same size), so the in-loop forward time can be checked against them, and the iteration
time against the forward passes it needs.

Each run also counts what it executed (``dsbd_jax.eval.profile.executed_counts``; counts do not
depend on the host's load): per iteration, the thunks per phase and outside the forward passes,
the thunks whose result has a vocabulary-sized axis, the inner loops' trips, and the target's
thunks per pass per layer; ``counts_against`` gives each run's counts over beam sampling W=4's
on the same prompts (``beam4``, when it is among the methods).

Usage: python benchmarks/phase_profile.py [--new 32] [--prompts 2] [--methods NAME,...]
                                    [--batch 1] [--draft-weights float|int8]
                                    [--out results/profile.json]
``--batch B`` profiles batches of B prompts (consecutive prompts of the set, padded to one bucket)
instead of one prompt at a time; the bare forward passes then have B times the rows.
Methods (``--methods``): sample, beam2, beam4, spec4, dsbd_w4 (gamma 2, W_S 4, t 0.7, W_min 2),
dsbd_g3 (gamma 3, W_S 3, t 0.9, W_min 1), dsbd_sb (the same, single-beam), tree.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from dsbd_jax.decoding import methods  # noqa: E402
from dsbd_jax.eval.profile import PHASES, profile_decoder  # noqa: E402
from dsbd_jax.eval.timing import machine_info, write_json  # noqa: E402

SETTINGS = {
    "sample": ("sample", {}),
    "beam2": ("beam", {"num_beams": 2}),
    "beam4": ("beam", {"num_beams": 4}),
    "spec4": ("spec", {"gamma": 4}),
    "tree": ("tree", {"gamma": 3}),
    "dsbd_w4": ("dsbd", {"gamma": 2, "draft_width": 4, "threshold": 0.7, "min_width": 2}),
    "dsbd_g3": ("dsbd", {"gamma": 3, "draft_width": 3, "threshold": 0.9, "min_width": 1}),
    "dsbd_sb": ("dsbd", {"gamma": 3, "draft_width": 3, "threshold": 0.9, "min_width": 1,
                         "single_beam": True}),
}


def forward_shapes(method, s, P, N):
    """The forward passes one iteration runs: ``[(model, rows, new tokens, cache slots)]``."""
    if method in ("sample", "beam"):
        W = s.get("num_beams", 1)
        return [("target", W, 1, P + N)]
    if method == "spec":
        g = s["gamma"]
        S = P + N + g + 1
        return [("draft", 1, 2, S)] + [("draft", 1, 1, S)] * (g - 1) + [("target", 1, g + 1, S)]
    if method == "tree":
        return []
    g, C = s["gamma"], s["draft_width"]
    Wc = 1 if s.get("single_beam") else s.get("max_width", C)
    S = Wc * (P + N + g + 1)
    Td = 2 * Wc + (g - 1) * C
    return ([("draft", 1, 2 * Wc, S + Td)] + [("draft", 1, C, S + Td)] * (g - 1)
            + [("target", 1, Wc + g * C, S)])


_BARE = {}


def bare_forward_ms(name, cfg, params, rows, T, slots, repeats=3):
    key = (name, rows, T, slots)
    if key in _BARE:
        return _BARE[key]
    from dsbd_jax.models.cache import empty_cache
    from dsbd_jax.models.llama import forward
    cache = empty_cache(cfg, rows, slots)
    tokens = jnp.ones((rows, T), jnp.int32)
    positions = jnp.broadcast_to(slots // 2 + jnp.arange(T), (rows, T)).astype(jnp.int32)
    mask = jnp.concatenate([jnp.broadcast_to(jnp.arange(slots) < slots // 2, (rows, T, slots)),
                            jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (rows, T, T))], -1)
    f = jax.jit(lambda p, t, q, m, c: forward(cfg, p, t, q, m, c)).lower(
        params, tokens, positions, mask, cache).compile()
    jax.block_until_ready(f(params, tokens, positions, mask, cache))
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(params, tokens, positions, mask, cache))
        ts.append(time.perf_counter() - t0)
    _BARE[key] = 1e3 * float(np.median(ts))
    return _BARE[key]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new", type=int, default=32, help="new tokens per run")
    ap.add_argument("--prompts", type=int, default=2, help="prompts (HumanEval, GSM8K alternately)")
    ap.add_argument("--methods", default=",".join(SETTINGS))
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    ap.add_argument("--batch", type=int, default=1, help="prompts per profiled call")
    ap.add_argument("--draft-weights", default="float", choices=("float", "int8"),
                    help="the draft's kernels (load_model's weights=): int8 profiles the "
                         "eight-bit draft")
    ap.add_argument("--conditions", default="the machine otherwise quiet",
                    help="what ran beside it (the counts do not depend on it; the times do)")
    ap.add_argument("--out", default="/tmp/dsbd_profile.json")
    args = ap.parse_args(argv)
    if args.batch < 1 or args.prompts % args.batch:
        ap.error("--batch must be >= 1 and divide --prompts")

    from dsbd_jax import load_model
    from dsbd_jax.decoding.common import pad_prompts
    from dsbd_jax.eval.datasets import benchmark_prompts
    target = load_model(args.target, progress=False)
    draft = load_model(args.draft, tokenizer=False, progress=False, weights=args.draft_weights)
    texts, ids_list = benchmark_prompts(target.tokenizer, args.prompts)
    half = (args.prompts + 1) // 2
    prompts = [("humaneval" if i < half else "gsm8k", ids) for i, ids in enumerate(ids_list)]
    warp = dict(top_k=10, top_p=0.8, max_new_tokens=args.new, eos_token_id=())
    res = {"machine": machine_info(), "target": args.target, "draft": args.draft,
           "new_tokens": args.new, "eos": "off", "warping": "top-k 10, top-p 0.8",
           "batch": args.batch, "draft_weights": args.draft_weights,
           "conditions": args.conditions,
           "layout": {k: sorted(m.params)[-1] for k, m in (("target", target), ("draft", draft))},
           "dtypes": {"target": target.config.dtype, "draft": draft.config.dtype},
           "runs": []}
    models = {"target": target, "draft": draft}
    for name in args.methods.split(","):
        method, s = SETTINGS[name]
        dec = methods.build(method, target.config, draft.config, **warp, **s)
        params = methods.model_params(dec, target.params, draft.params)
        for pi in range(0, len(prompts), args.batch):
            group = prompts[pi:pi + args.batch]
            task = "+".join(sorted({t for t, _ in group}))
            pid, plen = pad_prompts([ids for _, ids in group])
            r = profile_decoder(dec, params, pid, jax.random.PRNGKey(pi), plen)
            P = pid.shape[1]
            shapes = forward_shapes(method, s, P, args.new)
            bare = sum(bare_forward_ms(m, models[m].config, models[m].params, args.batch * rows,
                                       T, S) for m, rows, T, S in shapes)
            r.update(name=name, method=method, settings=s, task=task, prompt_len=int(plen.max()),
                     bucket=P, bare_forward_ms_per_iteration=bare,
                     tokens_per_iteration=r["generated_tokens"] / max(r["iterations"], 1))
            r["ms_per_token_decode"] = 1e3 * r["decode_s"] / max(r["generated_tokens"], 1)
            c = r["per_iteration_counts"]
            passes = sum(1 for m, *_ in shapes if m == "target")
            c["target_thunks_per_pass_per_layer"] = (
                c["thunks"]["target forward"] / passes / target.config.num_layers
                if passes else None)
            res["runs"].append(r)
            ph = r["per_iteration_ms"]
            print(f"{name:8s} {task:9s} it={r['iterations']:3d} tok/it={r['tokens_per_iteration']:.2f} "
                  f"decode/it={r['decode_per_iteration_ms']:7.1f}ms bare fwd/it={bare:7.1f}ms "
                  f"overhead={100 * r['overhead_frac']:5.1f}% | "
                  + " ".join(f"{k}={ph[k]:.1f}" for k in PHASES if k != "prefill" and ph[k] >= 0.5),
                  flush=True)
    res["counts_against"] = counts_against(res["runs"])
    for row in res["counts_against"]:
        print(f"{row['name']:8s} {row['task']:9s} against beam4: thunks outside the passes "
              f"{row['thunks_outside_passes']:.2f}x, inner loop trips {row['loop_trips']}, "
              f"vocabulary-axis thunks outside the passes {row['vocab_thunks_outside_passes']:.2f}x")
    write_json(args.out, res)
    print(f"wrote {args.out}")


def counts_against(runs, reference="beam4"):
    """Each run's per-iteration counts over the ``reference`` run's on the same task (module
    doc); the loop trips as they are (beam sampling runs no inner loop)."""
    refs = {r["task"]: r["per_iteration_counts"] for r in runs if r["name"] == reference}
    rows = []
    for r in runs:
        ref, c = refs.get(r["task"]), r["per_iteration_counts"]
        if ref is None or r["name"] == reference:
            continue
        rows.append({"name": r["name"], "task": r["task"],
                     "thunks_outside_passes": c["thunks_outside_passes"]
                     / max(ref["thunks_outside_passes"], 1e-9),
                     "vocab_thunks_outside_passes": c["vocab_thunks_outside_passes"]
                     / max(ref["vocab_thunks_outside_passes"], 1e-9),
                     "loop_trips": c["loop_trips"], "reference_loop_trips": ref["loop_trips"]})
    return rows


if __name__ == "__main__":
    main()
