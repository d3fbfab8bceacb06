"""``dsbd demo``: DSBD against beam sampling on the same prompts, like with like.

DSBD runs at the beam-W4 point (``options.DEMO_DEFAULTS``: its settings aimed at beam sampling
W=4's log-likelihood), both methods take turns twice, and the verdict weighs the speed ratio
round by round and the log-likelihood difference with its interval over the prompts."""

from __future__ import annotations

from typing import Optional

from dsbd_jax.cli.options import DEFAULT_DRAFT, DEMO_PROMPTS
from dsbd_jax.cli.running import (_print_outputs, _status, check_options, load_models, prepare,
                                  progress_mode, run_method, tokens_per_second, weights_label)


def demo_draft(target: str, draft: Optional[str]):
    """The demo's draft and what to say about it: ``(draft, note, hint)``. ``--draft`` when
    given; else the newest draft head registered for ``target`` (``note`` names it), else
    :data:`DEFAULT_DRAFT` with a ``hint``: the command that trains a head for the target and its
    recorded time (``results/<recipe>_training.json``), or None without a recipe."""
    if draft is not None:
        return draft, None, None
    from dsbd_jax.training import head as th
    heads = th.trained_heads(target)
    if heads:
        return str(heads[0]), (f"draft: the trained draft head {heads[0].name} "
                               f"({heads[0]}); --draft {DEFAULT_DRAFT} drafts with the full "
                               f"model"), None
    recipes = th.recipes_for(target)
    if not recipes:
        return DEFAULT_DRAFT, None, None
    recipe = recipes[0]
    took = ""
    record = recipe.parents[1] / "results" / f"{recipe.stem}_training.json"
    if record.is_file():
        import json
        r = json.loads(record.read_text())
        took = (f" (about {r['wall_s'] / 60:.0f} minutes and {r['peak_rss_kb'] / 1e6:.1f} GB "
                f"on a {r['machine'].get('cpu_count', '?')}-core CPU, "
                f"{record.relative_to(recipe.parents[1]).as_posix()})")
    rel = recipe.relative_to(recipe.parents[1]).as_posix()
    return DEFAULT_DRAFT, None, (f"a draft head reads the target's own features and costs a "
                                 f"fraction of the draft model's pass: `dsbd train-head {rel}` "
                                 f"trains one{took}; the demo then drafts with it")


def cmd_demo(args) -> int:
    from dsbd_jax.eval import datasets
    half = DEMO_PROMPTS // 2
    prompts = args.prompt or (datasets.chat_prompts("humaneval", half)
                              + datasets.chat_prompts("gsm8k", DEMO_PROMPTS - half))
    # the demo's draft (a head registered for the target, else the default draft) is chosen
    # first, so that the checks below see the draft that will run
    args.draft, note, hint = demo_draft(args.target, args.draft)
    check_options(args, ("beam", "dsbd"), prompts)  # before anything is read (prepare: again)
    if note:
        print(note, flush=True)
    configs, decoders, tokenizer, ids, lens = prepare(args, ("beam", "dsbd"), prompts)
    target, draft = load_models(args, configs)
    print(f"target {args.target} ({weights_label(target.info)}), "
          f"draft {args.draft} ({weights_label(draft.info)}); {len(prompts)} prompt(s), "
          f"{args.max_new_tokens} new tokens; each method runs twice, the methods taking turns "
          f"(a first round that also compiles, then a second; both timed, compilation left "
          f"out)", flush=True)
    print(f"DSBD: {args.beams} beams in the extra layer (the output: {args.min_width} to "
          f"{max(args.beams, args.draft_width)}, the width of the layer a run ends on), draft look-ahead gamma={args.gamma}, draft beam "
          f"width W_S={args.draft_width}, width threshold t={args.threshold}, widths "
          f"{args.min_width}..{max(args.beams, args.draft_width)}"
          f"{', single-beam' if args.single_beam else ''}; {forest_line(decoders['dsbd'].config)}"
          f"; beam sampling: W={args.beams} "
          f"; both with temperature {args.temperature}, "
          f"top-k {args.top_k}, top-p {args.top_p}", flush=True)
    rounds = {name: [] for name in decoders}
    for r in range(2):     # the methods take turns, so that a load beside them touches both
        for name, dec in decoders.items():
            _status(f"[{name}] round {r + 1} of 2" + (" (compiles first)" if r == 0 else ""))
            out, comp, run_s = run_method(dec, target, draft, ids, lens, args.seed,
                                          progress=progress_mode(args), warmup=False)
            if r == 0:
                print(f"[{name}] compile {comp:.1f} s")
            rounds[name].append((out, run_s))
    results = {}
    for name in decoders:
        out, run_s = min(rounds[name], key=lambda x: x[1])    # the faster round's outputs
        results[name] = (_print_outputs(tokenizer, name, out, prompts, run_s, limit=args.beams),
                         run_s, out)
    (_, tb, ob), (_, td, od) = results["beam"], results["dsbd"]
    rate = lambda o, t: tokens_per_second(o, t)[1]  # noqa: E731
    ratios = [rate(*d) / rate(*b) for b, d in zip(rounds["beam"], rounds["dsbd"])]
    rd, rb = rate(od, td), rate(ob, tb)
    diff = loglik_difference(od, ob)
    print(f"\nspeed: DSBD {rd:.2f} tokens/s vs beam sampling (W={args.beams}) {rb:.2f} tokens/s"
          f" -> {rd / rb:.2f}x (round by round: "
          f"{', '.join(f'{x:.2f}x' for x in ratios)})")
    print(f"log-likelihood per token of the best beam, DSBD minus beam sampling: "
          f"{interval_text(diff)}")
    print(demo_verdict(rd / rb, diff["mean"], od.stats, target.info["dtype"],
                       rounds=ratios, ll_interval=(diff["lo"], diff["hi"])))
    if hint:
        print(hint)
    return 0


def per_prompt_loglik(out):
    """``[prompts]``: the best beam's log-likelihood per new token, prompt by prompt."""
    import numpy as np
    b = np.asarray(out.best)
    i = np.arange(len(b))
    return (np.asarray(out.log_likelihoods)[i, b]
            / np.maximum(np.asarray(out.lengths)[i, b], 1)).astype(np.float64)


def loglik_difference(a, b) -> dict:
    """DSBD's (``a``) minus beam sampling's (``b``) best-beam log-likelihood per token over the
    same prompts: the mean of the per-prompt differences with its 95% percentile-bootstrap
    interval over prompts (:func:`dsbd_jax.eval.stats.paired_difference`; the spread between
    prompts, which both methods share, cancels). ``{"n", "mean", "lo", "hi", ...}``."""
    from dsbd_jax.eval.stats import paired_difference
    la, lb = per_prompt_loglik(a), per_prompt_loglik(b)
    return paired_difference(dict(enumerate(la.tolist())), dict(enumerate(lb.tolist())))


def interval_text(diff) -> str:
    """``-0.012 (95% interval -0.061 to 0.040 over 6 prompts)``; one prompt has no interval."""
    if diff["n"] < 2:
        return (f"{diff['mean']:+.3f} (one prompt: no interval; one draw per prompt varies by "
                f"about 0.05 per token, so give several --prompt)")
    return (f"{diff['mean']:+.3f} (95% interval {diff['lo']:+.3f} to {diff['hi']:+.3f} over "
            f"{diff['n']} prompts, bootstrap)")


def forest_line(config) -> str:
    """What DSBD's target pass verifies per prompt: its nodes and layers, and the node budget
    that widened them."""
    grown = config.layer_width > config.draft_width
    return (f"a forest of {config.forest_nodes} nodes ({config.gamma} layers of "
            f"{config.layer_width}" + (f", widened from W_S by the node budget "
                                        f"{config.node_budget}" if grown else "") + ")")


def demo_verdict(speedup: float, ll_gain: float, stats, dtype: str,
                 backend: Optional[str] = None, rounds=(), ll_interval=None) -> str:
    """One line on what the demo showed: DSBD faster at equal or better log-likelihood, or what
    held it back (tokens per target pass; on a CPU backend, the forest pass's cost). The two
    prompts' log-likelihoods vary by about 0.05 per token from seed to seed, so a gap under 0.05
    counts as equal. ``rounds``: the speed ratio of each round; when they fall on both sides of
    1, the line says the run cannot tell the two apart. ``backend``: jax's default backend when
    left out. ``ll_interval``: ``(lo, hi)``, the difference's 95% interval over the prompts
    (:func:`loglik_difference`): then the quality words follow it (no difference shown where it
    holds 0) instead of the 0.05 rule."""
    if backend is None:
        import jax
        backend = jax.default_backend()
    import numpy as np
    per_call = float(np.sum(np.asarray(stats["generated_tokens"]))) / max(
        float(np.sum(np.asarray(stats["target_calls"]))), 1.0)
    quality = "equal or better" if ll_gain > -0.05 else "lower"
    if ll_interval is not None and None not in ll_interval and ll_interval[0] < ll_interval[1]:
        lo, hi = ll_interval
        quality = ("a log-likelihood this run cannot tell from beam sampling's" if lo <= 0 <= hi
                   else "higher" if lo > 0 else "lower")
    quality = quality if quality.startswith("a log") else f"{quality} log-likelihood"
    if rounds and min(rounds) < 1.0 <= max(rounds):
        return (f"DSBD and beam sampling were within this run's noise ({min(rounds):.2f}x to "
                f"{max(rounds):.2f}x round by round, {quality}; "
                f"{per_call:.2f} new tokens per target pass): `dsbd bench` with more prompts "
                f"says which is faster")
    if speedup >= 1.0:
        return (f"DSBD was {speedup:.2f}x as fast as beam sampling at {quality} "
                f"({per_call:.2f} new tokens per target pass, all prompts together)")
    why = ""
    if backend == "cpu":
        why = (f"; on this CPU the target's pass over a forest costs more than a one-token pass "
               f"({dtype}; what it costs per host and dtype: docs/results/precision.md), "
               f"so verifying a forest in one pass does not pay for itself")
    return (f"DSBD was slower than beam sampling here ({speedup:.2f}x, {quality}): "
            f"{per_call:.2f} new tokens per target pass (all prompts together){why}")
