"""Command line (the ``dsbd`` console script, or ``python -m dsbd_jax``):

    dsbd demo                                    # DSBD vs beam sampling on the default offline pair
    dsbd generate --prompt "..." [--method dsbd|beam|sample|spec|tree|beam_search] [settings]
    dsbd bench configs/quick_cpu.yaml --out results/quick_cpu
    dsbd plot results/quick_cpu/records.jsonl

``generate`` shows a progress bar per decoder iteration (tokens, tokens/s, accepted width) and
prints every beam with its target log-likelihood. Errors for bad input are printed as one line
(``dsbd: error: ...``) with exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path
from typing import List, Optional

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
from .methods import METHODS, NEEDS_DRAFT  # noqa: E402


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


MESH_HELP = ("decode sharded over a device mesh, e.g. data=2,model=4 (prompts over 'data', "
             "tensor parallel over 'model'; data defaults to the remaining devices); "
             "see dsbd_jax.sharding")


def _mesh(text):
    """The mesh of ``--mesh`` (None when not given); bad values end as a CLI error."""
    if not text:
        return None
    from .sharding import make_mesh, parse_mesh
    try:
        sizes = parse_mesh(text)
        return make_mesh(sizes["data"], sizes["model"])
    except ValueError as e:
        raise CLIError(f"--mesh: {e}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsbd", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
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
    gen.add_argument("--no-progress", action="store_true", help="no progress bar")
    gen.add_argument("--mesh", default=None, help=MESH_HELP)
    _add_settings(gen)
    bench = sub.add_parser("bench", help="run a benchmark config (configs/*.yaml): JSON lines + summary")
    bench.add_argument("config", help="a bench config, e.g. configs/quick_cpu.yaml")
    bench.add_argument("--out", default=None, help="output folder (default results/<config name>)")
    bench.add_argument("--models", default=None, help="a model-pair file (configs/models/*.yaml)")
    bench.add_argument("--target", default=None, help="override the config's target")
    bench.add_argument("--draft", default=None, help="override the config's draft")
    bench.add_argument("--limit", type=int, default=None, help="at most N prompts per dataset")
    bench.add_argument("--max-new-tokens", type=int, default=None)
    bench.add_argument("--no-progress", action="store_true")
    bench.add_argument("--mesh", default=None, help=MESH_HELP)
    plot = sub.add_parser("plot", help="Pareto plots (PNG + SVG) from a bench records.jsonl")
    plot.add_argument("records", help="records.jsonl written by dsbd bench (or its folder)")
    plot.add_argument("--out", default=None, help="output folder (default: next to the records)")
    plot.add_argument("--quality", default="loglik_per_token",
                      help="y axis: loglik_per_token, perplexity or a task metric such as "
                           "humaneval/pass@1")
    return parser


def _settings(name: str, args) -> dict:
    """The method's settings (``dsbd_jax.methods``) from the CLI flags."""
    s = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
             top_k=args.top_k or None, top_p=args.top_p, replacement=not args.no_replacement,
             eos_token_id=() if args.no_eos else None)
    if name == "dsbd":
        s.update(gamma=args.gamma, draft_width=args.draft_width, threshold=args.threshold,
                 min_width=args.min_width, num_beams=args.beams,
                 max_width=max(args.beams, args.draft_width), single_beam=args.single_beam)
    elif name in ("beam", "beam_search"):
        s.update(num_beams=args.beams)
    elif name in ("spec", "tree"):
        s.update(gamma=args.gamma)
    return s


class ProgressBar:
    """A tqdm bar over new tokens, fed by ``common.progress_hook`` once per decoder loop trip:
    iterations, tokens/s since the first trip, target calls and (DSBD / speculative) the average
    accepted width = accepted candidates per verified layer."""

    def __init__(self, total: int, desc: str, rows: Optional[int] = None):
        from tqdm.auto import tqdm
        self.bar = tqdm(total=total, desc=desc, unit="tok", leave=True)
        self.t0 = None
        self.n0 = 0
        self.rows = rows  # prompts to count (a sharded batch may carry padding rows after them)

    def __call__(self, v) -> None:
        n = int(v["generated"][:self.rows].sum())
        now = time.perf_counter()
        if self.t0 is None:
            self.t0, self.n0 = now, n
        post = {"iter": int(v["iterations"]), "target calls": int(v["target_calls"])}
        if "accepted" in v:
            post["acc. width"] = f"{int(v['accepted']) / max(int(v['verified']), 1):.2f}"
        if now > self.t0:
            post["tok/s"] = f"{(n - self.n0) / (now - self.t0):.2f}"
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(n - self.bar.n)

    def close(self) -> None:
        self.bar.close()


def run_method(name, args, target, draft, prompt_ids, prompt_lengths, progress: bool = False):
    """Run one method. ``progress=False``: compile + run once untimed, then one timed run
    (returns ``(output, compile_s, run_s)``). ``progress=True``: one run with a progress bar;
    ``run_s`` = wall time minus the compile seconds JAX reports."""
    import jax
    from .bench.harness import CompileClock
    from .bench.timing import timed
    from .methods import build, model_params
    dec = build(name, target.config, draft.config if draft else None, progress=progress,
                **_settings(name, args))
    params = model_params(dec, target.params, draft.params if draft else None)
    mesh = getattr(args, "mesh_obj", None) or _mesh(getattr(args, "mesh", None))
    if mesh is not None:
        from .sharding import ShardedDecoder, mesh_label
        dec = ShardedDecoder.of(dec, mesh)
        params = dec.place(params)
        print(f"[{name}] mesh {mesh_label(mesh)} over {mesh.devices.size} "
              f"{mesh.devices.flat[0].platform} devices"
              + "".join(f"\n  note: {n}" for n in dec.rules.notes))
    key = jax.random.key(args.seed)
    call = lambda: dec(params, prompt_ids, key, prompt_lengths=prompt_lengths)  # noqa: E731
    if not progress:
        _, first = timed(call)
        out, run_s = timed(call)
        return out, max(first - run_s, 0.0), run_s
    from .common import progress_hook
    CompileClock.install()
    c0 = CompileClock.total()
    bar = ProgressBar(args.max_new_tokens * prompt_ids.shape[0], name, rows=prompt_ids.shape[0])
    try:
        with progress_hook(bar):
            out, wall = timed(call)
    finally:
        bar.close()
    comp = CompileClock.total() - c0
    return out, comp, max(wall - comp, 1e-9)


def _print_outputs(tokenizer, name, out, prompts, run_s):
    """Every live beam of every prompt with its log-likelihood (best first); returns the number
    of new tokens in the best beams."""
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
        print(f"--- prompt {b}: {text[:70]!r}")
        order = [w for w in np.argsort(-ll[b], kind="stable") if np.isfinite(ll[b, w])]
        for w in order:
            n = lens[b, w]
            tag = "best " if w == best[b] else ""
            print(f"    {tag}beam {w}: log-lik {ll[b, w]:.3f} ({ll[b, w] / max(n, 1):.3f}/token, "
                  f"{n} tokens)")
            print("      " + tokenizer.decode(seqs[b, w, :n].tolist(), skip_special_tokens=True)
                  .replace("\n", "\n      "))
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
    from .common import pad_prompts
    from .datasets import encode_chat
    from .loading import load_model
    args.mesh_obj = _mesh(args.mesh)  # before loading: a bad --mesh fails fast
    target = load_model(args.target)
    if target.tokenizer is None:
        raise CLIError(f"{args.target} has no tokenizer; cannot encode --prompt text")
    draft = load_model(args.draft, tokenizer=False) if args.method in NEEDS_DRAFT else None
    ids, lens = pad_prompts(encode_chat(target.tokenizer, args.prompt, args.raw), pad_id=0)
    out, comp, run_s = run_method(args.method, args, target, draft, ids, lens,
                                  progress=not args.no_progress)
    print(f"[{args.method}] compile {comp:.1f} s")
    _print_outputs(target.tokenizer, args.method, out, args.prompt, run_s)
    return 0


def cmd_bench(args) -> int:
    from .bench.harness import format_summary, load_config, run_bench
    mesh = _mesh(args.mesh)
    cfg = load_config(args.config, models=args.models, max_new_tokens=args.max_new_tokens,
                      target=args.target, draft=args.draft)
    if args.limit is not None:
        if args.limit < 1:
            raise CLIError("--limit must be >= 1")
        cfg["datasets"] = [{**d, "limit": min(d.get("limit", args.limit), args.limit)}
                           for d in cfg["datasets"]]
    out = Path(args.out or Path("results") / cfg["name"])
    summary = run_bench(cfg, out, progress=not args.no_progress, mesh=mesh)
    print(format_summary(summary))
    print(f"wrote {out / 'records.jsonl'} and {out / 'summary.json'}")
    return 0


def cmd_plot(args) -> int:
    from .bench.plot import plot_results
    path = Path(args.records)
    if path.is_dir():
        path = path / "records.jsonl"
    for p in plot_results(path, args.out, quality=args.quality):
        print(f"wrote {p}")
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
        if args.command == "bench":
            return cmd_bench(args)
        if args.command == "plot":
            return cmd_plot(args)
    except (CLIError, ValueError, FileNotFoundError, OSError) as e:
        print(f"dsbd: error: {e}", file=sys.stderr)
        return 2
    return 1


if __name__ == "__main__":
    sys.exit(main())
