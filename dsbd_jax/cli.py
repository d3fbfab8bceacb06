"""Command line: ``python -m dsbd_jax demo`` and ``python -m dsbd_jax generate ...``
(also installed as the ``dsbd`` console script).

Errors for bad input are printed as one line (``dsbd: error: ...``) with exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from typing import List, Optional

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
METHODS = ("dsbd", "beam", "sample", "spec", "tree", "beam_search")


class CLIError(Exception):
    pass


def _add_settings(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=10, help="0 = off (the paper uses 10)")
    p.add_argument("--top-p", type=float, default=0.8, help="1 = off (the paper uses 0.8)")
    p.add_argument("--beams", type=int, default=2, help="beam width W (beam/dsbd output width)")
    p.add_argument("--gamma", type=int, default=2, help="draft look-ahead (layers)")
    p.add_argument("--draft-width", type=int, default=3, help="DSBD draft beam width W_S")
    p.add_argument("--threshold", type=float, default=0.9, help="DSBD width threshold t")
    p.add_argument("--min-width", type=int, default=1, help="DSBD minimum width W_min")
    p.add_argument("--single-beam", action="store_true", help="DSBD memory-saving mode")
    p.add_argument("--no-replacement", action="store_true", help="beams without replacement")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-eos", action="store_true", help="ignore EOS (always generate max tokens)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsbd", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="DSBD vs beam sampling on the default offline model pair")
    demo.add_argument("--target", default=DEFAULT_TARGET)
    demo.add_argument("--draft", default=DEFAULT_DRAFT)
    demo.add_argument("--prompt", action="append", default=None,
                      help="a user message (repeatable); default: one HumanEval and one GSM8K problem")
    _add_settings(demo)
    gen = sub.add_parser("generate", help="generate with one method and print the beams")
    gen.add_argument("--target", default=DEFAULT_TARGET, help="preset name, HF directory or .gguf")
    gen.add_argument("--draft", default=DEFAULT_DRAFT)
    gen.add_argument("--prompt", action="append", required=True)
    gen.add_argument("--method", choices=METHODS, default="dsbd")
    gen.add_argument("--raw", action="store_true", help="do not apply the chat template")
    _add_settings(gen)
    return parser


def _method(name: str, args, target_cfg, draft_cfg):
    """(function, config, takes_key) for a method name and the CLI settings."""
    from . import common
    eos = () if args.no_eos else None
    base = dict(target=target_cfg, max_new_tokens=args.max_new_tokens,
                temperature=args.temperature, top_k=args.top_k or None, top_p=args.top_p,
                replacement=not args.no_replacement, eos_token_id=eos)
    if name == "dsbd":
        from .dsbd import DSBDConfig, dsbd_generate
        cfg = DSBDConfig(**base, draft=draft_cfg, gamma=args.gamma, draft_width=args.draft_width,
                         threshold=args.threshold, min_width=args.min_width,
                         num_beams=args.beams, max_width=max(args.beams, args.draft_width),
                         single_beam=args.single_beam)
        return dsbd_generate, cfg, True
    if name == "beam":
        from .beam import beam_sample
        return beam_sample, common.DecodeConfig(**base, num_beams=args.beams), True
    if name == "beam_search":
        from .beam import beam_search
        return beam_search, common.DecodeConfig(**base, num_beams=args.beams), False
    if name == "sample":
        from .sampling import sample
        return sample, common.DecodeConfig(**base), True
    if name == "spec":
        from .speculative import speculative_sample
        return speculative_sample, common.DecodeConfig(**base, draft=draft_cfg, gamma=args.gamma), True
    if name == "tree":
        from .tree import tree_speculative_sample
        return tree_speculative_sample, common.DecodeConfig(**base, draft=draft_cfg, gamma=args.gamma), True
    raise CLIError(f"unknown method {name!r}; choose from {METHODS}")


def run_method(name, args, target, draft, prompt_ids, prompt_lengths):
    """Compile (timed apart), run once timed; returns (output, compile_s, run_s)."""
    import jax
    from .bench import timed
    fn, cfg, takes_key = _method(name, args, target.config, draft.config if draft else None)
    needs_draft = name in ("dsbd", "spec", "tree")
    params = {"target": target.params, "draft": draft.params} if needs_draft else target.params
    key = jax.random.PRNGKey(args.seed)
    call = (lambda: fn(params, prompt_ids, key, cfg, prompt_lengths=prompt_lengths)) if takes_key \
        else (lambda: fn(params, prompt_ids, cfg, prompt_lengths=prompt_lengths))
    _, first = timed(call)
    out, run_s = timed(call)
    return out, max(first - run_s, 0.0), run_s


def _print_outputs(tokenizer, name, out, prompts, run_s):
    import numpy as np
    seqs = np.asarray(out.sequences)
    lens = np.asarray(out.lengths)
    ll = np.asarray(out.log_likelihoods)
    best = np.asarray(out.best)
    gen = int(lens[np.arange(len(best)), best].sum())
    print(f"\n=== {name}: {gen} tokens in {run_s:.2f} s = {gen / run_s:.2f} tokens/s "
          f"(best beam of each prompt)")
    stats = {k: np.asarray(v) for k, v in out.stats.items()}
    short = {k: (v.round(3).tolist() if v.size <= 8 else f"[{v.size} values]") for k, v in stats.items()}
    print(f"    stats: {short}")
    for b, text in enumerate(prompts):
        w = best[b]
        n = lens[b, w]
        print(f"--- prompt {b}: {text[:70]!r}")
        print(f"    best beam {w}: log-lik/token {ll[b, w] / max(n, 1):.3f}")
        print("    " + tokenizer.decode(seqs[b, w, :n].tolist()).replace("\n", "\n    "))
    return gen


def cmd_demo(args) -> int:
    from .loading import load_model
    from .common import pad_prompts
    from . import datasets
    from .datasets import encode_chat
    prompts = args.prompt or [datasets.chat_prompts("humaneval", 1)[0],
                              datasets.chat_prompts("gsm8k", 1)[0]]
    t0 = time.perf_counter()
    draft = load_model(args.draft)
    target = load_model(args.target)
    print(f"loaded {args.target} (target) and {args.draft} (draft) in {time.perf_counter() - t0:.1f} s")
    ids, lens = pad_prompts(encode_chat(target.tokenizer, prompts), pad_id=0)
    results = {}
    for name in ("beam", "dsbd"):
        out, comp, run_s = run_method(name, args, target, draft, ids, lens)
        print(f"[{name}] compile {comp:.1f} s")
        results[name] = (_print_outputs(target.tokenizer, name, out, prompts, run_s), run_s, out)
    import numpy as np
    (gb, tb, ob), (gd, td, od) = results["beam"], results["dsbd"]
    def ll_per_tok(o):
        b = np.asarray(o.best)
        i = np.arange(len(b))
        return float(np.mean(np.asarray(o.log_likelihoods)[i, b] / np.maximum(np.asarray(o.lengths)[i, b], 1)))
    print(f"\nspeed: DSBD {gd / td:.2f} tokens/s vs beam sampling (W={args.beams}) {gb / tb:.2f} tokens/s"
          f" -> {(gd / td) / (gb / tb):.2f}x; mean log-lik/token: DSBD {ll_per_tok(od):.3f}, "
          f"beam {ll_per_tok(ob):.3f}")
    return 0


def cmd_generate(args) -> int:
    from .loading import load_model
    from .common import pad_prompts
    from .datasets import encode_chat
    if args.method not in METHODS:
        raise CLIError(f"unknown method {args.method!r}")
    target = load_model(args.target)
    if target.tokenizer is None:
        raise CLIError(f"{args.target} has no tokenizer; cannot encode --prompt text")
    draft = load_model(args.draft) if args.method in ("dsbd", "spec", "tree") else None
    ids, lens = pad_prompts(encode_chat(target.tokenizer, args.prompt, args.raw), pad_id=0)
    out, comp, run_s = run_method(args.method, args, target, draft, ids, lens)
    print(f"[{args.method}] compile {comp:.1f} s")
    _print_outputs(target.tokenizer, args.method, out, args.prompt, run_s)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "demo":
            return cmd_demo(args)
        if args.command == "generate":
            return cmd_generate(args)
    except (CLIError, ValueError, FileNotFoundError) as e:
        print(f"dsbd: error: {e}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
