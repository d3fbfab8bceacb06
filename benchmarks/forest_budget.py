"""DSBD's forest as wide as the pass allows: the target pass's cost curve over forest sizes on
this host, what the node budget's probe decides, and DSBD at node budgets side by side.

1. ``curve``: the whole target's forward pass (loaded weights, the host's kernel form and
   options, 512 cached slots) over one token and over each of ``--nodes`` new tokens, per
   ``--dtypes``, every size interleaved round by round (min of ``--repeats``); each size as a
   multiple of the one-token pass.
2. ``probe``: :func:`dsbd_jax.host.forest_budget.measure` on the same config (the model cut
   to a few blocks, what ``--node-budget auto`` and ``dsbd host`` decide from), with the budget
   :func:`~dsbd_jax.host.forest_budget.pick_budget` takes from it, measured afresh (no cache).
3. ``decoders``: in ``--decode-dtype``, beam sampling W = 4 and DSBD at the beam-W4 point (g2 /
   W_S 4 / t 0.7 / W_min 2 / max_width 4) with each ``--budgets`` (``off``: the 12-node
   forest), drafting with ``--draft`` (a draft head's name or directory, or a draft model;
   default the head registered for the target, else the 0.5B model), batch 1 over the benchmark
   prompts (EOS off, top-k 10 / top-p 0.8; ``--no-replacement``: both without replacement),
   ``--rounds`` passes over the configs in turn: tokens/s, tokens per target pass,
   log-likelihood per token, accepted candidates per verified layer, and each DSBD / beam
   sampling ratio.

    .venv/bin/python benchmarks/forest_budget.py --out results/forest_budget_epyc.json  # ~15 min
    .venv/bin/python benchmarks/forest_budget.py --small --out /tmp/forest_budget.json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
W4 = dict(gamma=2, draft_width=4, threshold=0.7, min_width=2, max_width=4)


def budget_arg(text: str):
    return None if text == "off" else int(text)


def curve(config, params, nodes, repeats: int, slots: int = 512) -> dict:
    """The whole pass over 1 and each of ``nodes`` new tokens: ``{ms, over_one_token}``."""
    from dsbd_jax.host.cpu_options import interleaved_min
    from dsbd_jax.host.pass_probe import pass_call
    calls = {T: pass_call(config, params, T, slots) for T in (1,) + tuple(nodes)}
    best = interleaved_min(calls, repeats)
    return {"ms": {str(T): 1e3 * s for T, s in best.items()},
            "over_one_token": {str(T): best[T] / best[1] for T in nodes}}


def _draft(source, target, small: bool):
    """``(draft config, draft params, name)``: a draft head or a draft model."""
    from dsbd_jax.models.head import is_head
    from dsbd_jax.loading.heads import read_draft_config
    from dsbd_jax.loading.load import load_model
    from dsbd_jax.training import head as th
    if source is None and not small:
        heads = th.trained_heads(TARGET)
        source = str(heads[0]) if heads else DRAFT
    config = read_draft_config(source, target.config, target.config.dtype)
    if is_head(config):
        hc, hp, _ = th.load_head(source, target.config)
        return hc, hp, Path(source).name
    d = load_model(source, target.config.dtype, tokenizer=False, progress=False)
    return d.config, d.params, Path(source).name


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=TARGET)
    ap.add_argument("--draft", default=None, help="a draft head (name or directory) or model")
    ap.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"],
                    help="the curve's and the probe's dtypes (none: decoders only)")
    ap.add_argument("--nodes", type=int, nargs="+", default=[12, 16, 24, 32, 48, 64])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--decode-dtype", default="bfloat16")
    ap.add_argument("--budgets", type=budget_arg, nargs="+", default=[None, 16, 24, 32])
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--no-replacement", action="store_true",
                    help="beam sampling and DSBD without replacement (distinct candidates)")
    ap.add_argument("--small", action="store_true", help="the tiny random pair (seconds)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    from dsbd_jax.decoding.beam import beam_sample
    from dsbd_jax.decoding.common import bucket_length
    from dsbd_jax.decoding.configs import BeamSampleConfig
    from dsbd_jax.decoding.dsbd import DSBDConfig, dsbd_generate
    from dsbd_jax.eval.datasets import benchmark_prompts, encode_chat
    from dsbd_jax.eval.timing import (machine_info, portable_settings, run_over_prompts,
                                      write_json)
    from dsbd_jax.host import forest_budget as fb
    from dsbd_jax.loading.load import load_model

    t_start = time.perf_counter()
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    if args.small:
        from dsbd_jax.testing import make_tiny_pair
        tmp = Path(tempfile.mkdtemp(prefix="forest_budget_"))
        args.target, args.draft = (str(p) for p in make_tiny_pair(tmp / "pair", noise=0.3))
        args.nodes, args.repeats, args.max_new_tokens = [12, 16], 2, 6
    out = {"machine": machine_info(), "settings": portable_settings(vars(args), _ROOT),
           "free": fb.FREE, "curve": {}, "probe": {}, "decoders": {}}
    for dt in args.dtypes:
        target = load_model(args.target, dt, tokenizer=False, progress=False)
        out["curve"][dt] = curve(target.config, target.params, args.nodes, args.repeats)
        times = fb.measure(target.config, nodes=args.nodes, repeats=args.repeats)
        out["probe"][dt] = {"over_one_token": {str(T): times[T] / times[1] for T in args.nodes},
                            "budget": fb.pick_budget(times, nodes=args.nodes),
                            "whole_pass_budget": fb.pick_budget(
                                {int(k): v for k, v in out["curve"][dt]["ms"].items()},
                                nodes=args.nodes)}
        log(f"{dt}: whole pass " + ", ".join(f"{k} {v:.2f}x" for k, v in
                                             out["curve"][dt]["over_one_token"].items())
            + f"; probe budget {out['probe'][dt]['budget']}")
        del target

    target = load_model(args.target, args.decode_dtype, progress=False)
    dc, dp, dname = _draft(args.draft, target, args.small)
    if args.small:
        prompts = encode_chat(target.tokenizer, ["def add(a, b):", "What is 12 times 7?"],
                              raw=True)
    else:
        prompts = benchmark_prompts(target.tokenizer, args.prompts)[1]
    P = bucket_length(max(len(p) for p in prompts))
    warp = dict(top_k=10, top_p=0.8, eos_token_id=(), max_new_tokens=args.max_new_tokens,
                replacement=not args.no_replacement)
    tc = target.config
    configs = {"beam_W4": (beam_sample, target.params, BeamSampleConfig(target=tc, num_beams=4,
                                                                         **warp))}
    both = {"target": target.params, "draft": dp}
    for b in args.budgets:
        cfg = DSBDConfig(target=tc, draft=dc, node_budget=b, **W4, **warp)
        configs[f"dsbd_w4_budget_{b or 'off'}"] = (dsbd_generate, both, cfg)
    from dsbd_jax.models.head import is_head
    out["draft"] = {"name": dname, "kind": "head" if is_head(dc) else "model"}
    runs = {k: [] for k in configs}
    for r in range(args.rounds):
        for name, (fn, params, cfg) in configs.items():
            runs[name].append(run_over_prompts(fn, params, cfg, prompts, P, label=name, log=log))
    beam_tps = sum(x["tokens_per_s"] for x in runs["beam_W4"]) / args.rounds
    for name, rs in runs.items():
        cfg = configs[name][2]
        rec = {"tokens_per_s": sum(x["tokens_per_s"] for x in rs) / len(rs),
               "tokens_per_target_call": sum(x["tokens_per_target_call"] for x in rs) / len(rs),
               "loglik_per_token": sum(x["loglik_per_token"] for x in rs) / len(rs),
               "compile_s": rs[0]["compile_s"], "runs": rs}
        if isinstance(cfg, DSBDConfig):
            acc = [p["mean_accepted_width"] for x in rs for p in x["prompts"]]
            rec.update(node_budget=cfg.node_budget, layer_width=cfg.layer_width,
                       forest_nodes=cfg.forest_nodes, mean_accepted_width=sum(acc) / len(acc),
                       vs_beam_W4=rec["tokens_per_s"] / beam_tps)
        out["decoders"][name] = rec
        log(f"{name}: {rec['tokens_per_s']:.2f} tok/s, "
            f"{rec['tokens_per_target_call']:.2f} tokens per target pass, "
            f"log-lik {rec['loglik_per_token']:.3f}"
            + (f", {rec['vs_beam_W4']:.3f}x beam W4" if "vs_beam_W4" in rec else ""))
    out["wall_s"] = time.perf_counter() - t_start
    write_json(args.out, out)
    return out


if __name__ == "__main__":
    main()
