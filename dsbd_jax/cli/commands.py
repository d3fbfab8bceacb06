"""The ``dsbd`` subcommands (``cmd_*``) and ``main``."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from pathlib import Path
from typing import List, Optional

from dsbd_jax.cli.demo import cmd_demo, demo_draft, demo_verdict  # noqa: F401
from dsbd_jax.cli.options import (DEFAULT_DRAFT, DEFAULT_TARGET, CLIError, _mesh, build_parser,
                                  check_values)
from dsbd_jax.cli.running import (_print_outputs, _status, load_models, prepare, progress_mode,
                                  prompt_block, run_method)

def cmd_generate(args) -> int:
    mesh = _mesh(args.mesh)  # before loading: a bad --mesh fails fast
    configs, decoders, tokenizer, ids, lens = prepare(args, (args.method,), args.prompt, args.raw)
    target, draft = load_models(args, configs)
    # one run: its compile seconds (tracing and lowering, then compiling the program or reading
    # it back from the cache) are reported apart and left out of its tokens/s. With the token
    # bar, each prompt's beams are printed as soon as that prompt is done.
    shown = []

    def done(rows, out):
        from tqdm.auto import tqdm
        for b in rows:
            if b < len(args.prompt):
                tqdm.write(prompt_block(tokenizer, out, b, args.prompt[b], limit=args.beams))
                shown.append(b)
    out, comp, run_s = run_method(decoders[args.method], target, draft, ids, lens, args.seed,
                                  progress=progress_mode(args), warmup=False, mesh=mesh,
                                  on_done=done)
    print(f"[{args.method}] compile {comp:.1f} s")
    _print_outputs(tokenizer, args.method, out, args.prompt, run_s, shown=shown,
                   limit=args.beams)
    return 0


def cmd_bench(args) -> int:
    from dsbd_jax.eval.plan import load_config
    from dsbd_jax.eval.run import run_bench
    from dsbd_jax.eval.summary import format_summary
    mesh = _mesh(args.mesh)
    cfg = load_config(args.config, models=args.models, max_new_tokens=args.max_new_tokens,
                      target=args.target, draft=args.draft, batch_size=args.batch_size)
    if args.limit is not None:
        if args.limit < 1:
            raise CLIError("--limit must be >= 1")
        cfg["datasets"] = [{**d, "limit": min(d.get("limit", args.limit), args.limit)}
                           for d in cfg["datasets"]]
    out = Path(args.out or Path("results") / cfg["name"])
    summary = run_bench(cfg, out, progress=not args.no_progress, mesh=mesh)
    if summary is None:       # not process 0 of many: it writes and prints
        return 0
    print(format_summary(summary))
    print(f"wrote {out / 'records.jsonl'} and {out / 'summary.json'}")
    return 0


def _records_path(arg) -> Path:
    """A run's ``records.jsonl``: the file given, or the one in the run directory given."""
    path = Path(arg)
    return path / "records.jsonl" if path.is_dir() else path


def cmd_plot(args) -> int:
    from dsbd_jax.eval.plot import plot_results
    path = _records_path(args.records)
    for p in plot_results(path, args.out, quality=args.quality, log=print):
        print(f"wrote {p}")
    return 0


def cmd_summary(args) -> int:
    import json
    from dsbd_jax.eval.summary import format_summary, summary_of
    path = _records_path(args.records)
    summary = summary_of(path)
    with open(path.parent / "summary.json", "w") as f:
        json.dump(summary, f, indent=2)
    print(format_summary(summary, markdown=args.markdown))
    print(f"wrote {path.parent / 'summary.json'}")
    return 0


def cmd_make_tiny_pair(args) -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        raise CLIError("make-tiny-pair needs torch (it builds the models with transformers): "
                       "pip install torch, or pip install 'dsbd-jax[test]'") from None
    from dsbd_jax.testing import make_tiny_pair
    target, draft = make_tiny_pair(args.directory)
    print(f"wrote {target} and {draft}")
    print(f"try: dsbd generate --target {target} --draft {draft} --prompt hi --max-new-tokens 8")
    return 0


def cmd_vocab(args) -> int:
    import numpy as np

    from dsbd_jax.models import vocab as mv
    if args.vocab_command == "show":
        counts, meta = mv.load_table(args.table)
        total = int(counts.sum())
        print(f"{args.table}: V = {counts.shape[0]}, {total} tokens counted, "
              f"{int((counts > 0).sum())} distinct; sources: {meta.get('sources', '?')}")
        ordered = np.sort(counts)[::-1]
        for n in args.n or (16384, 32768, 65536):
            n = min(n, counts.shape[0])
            share = ordered[:n].sum() / max(total, 1)
            print(f"  N = {n:6d}: {100 * share:.2f}% of the counted tokens")
        return 0
    from dsbd_jax.eval import vocab as ev
    from dsbd_jax.eval.datasets import chat_prompts, encode_chat
    from dsbd_jax.loading.load import load_tokenizer, read_config
    if not (args.text or args.task or args.rollouts or args.generate_with):
        raise CLIError("vocab build needs a source: --text, --task, --rollouts or "
                       "--generate-with")
    if args.generate_with and not (args.prompts or args.prompt_task):
        raise CLIError("--generate-with needs prompts: --prompts FILE or --prompt-task SLICE")
    for spec in args.task + args.prompt_task:
        ev.parse_slice(spec)
    for option, paths in (("--text", args.text), ("--rollouts", args.rollouts),
                          ("--prompts", [args.prompts] if args.prompts else [])):
        for path in paths:
            if not Path(path).exists():
                raise CLIError(f"{option} {path}: no such file")
    from dsbd_jax.loading.load import check_source
    for option, source in (("--model", args.model), ("--generate-with", args.generate_with)):
        if source:
            try:
                check_source(source, option)
            except ValueError as e:
                raise CLIError(str(e)) from None
    config = read_config(args.model)
    V = config.vocab_size
    tokenizer = load_tokenizer(args.model)
    if tokenizer is None:
        raise CLIError(f"{args.model} has no tokenizer")
    counts = np.zeros(V, np.float64)
    sources = []
    for path in args.text:
        counts += ev.text_counts(tokenizer, ev.file_texts(path), V)
        sources.append(f"text:{path}")
    for spec in args.task:
        counts += ev.text_counts(tokenizer, ev.task_texts(spec), V)
        sources.append(f"task:{spec}")
    for path in args.rollouts:
        counts += mv.rollout_counts(path, V)
        sources.append(f"rollouts:{path}")
    if args.generate_with:
        gen_config = read_config(args.generate_with)
        if gen_config.vocab_size != V:
            raise CLIError(f"{args.generate_with} has {gen_config.vocab_size} tokens, "
                           f"{args.model} has {V}")
        texts = []
        if args.prompts:
            texts += [t for t in Path(args.prompts).read_text(encoding="utf-8").splitlines()
                      if t.strip()]
        for spec in args.prompt_task:
            name, start, stop = ev.parse_slice(spec)
            texts += chat_prompts(name, None if stop == -1 else stop)[start:]
        from dsbd_jax.loading.load import load_model
        _status(f"loading {args.generate_with} ...")
        from dsbd_jax.host.plan import dtype_choice
        from dsbd_jax.loading.checkpoint import choice_line
        dtype, why = dtype_choice(gen_config, "sample")   # it samples: one-token passes
        model = load_model(args.generate_with, dtype, tokenizer=False)
        _status(choice_line("generator", args.generate_with, model.info,
                            f"auto for sampling: {why}", "float: given"))
        counts += ev.generation_counts(model.config, model.params, encode_chat(tokenizer, texts),
                                       V, max_new_tokens=args.max_new_tokens, seed=args.seed,
                                       eos_token_id=model.config.eos_token_id)
        sources.append(f"generations:{args.generate_with}:{len(texts)} prompts")
    out = Path(args.out) if args.out else mv.table_path(args.model)
    mv.save_table(out, counts, {"model": str(args.model), "sources": sources})
    print(f"wrote {out} ({counts.sum():.0f} tokens, {int((counts > 0).sum())} distinct)")
    return 0


def cmd_distill(args) -> int:
    from dsbd_jax.training.recipe import load_recipe, run_recipe
    recipe = load_recipe(args.config)  # checked before any weights are loaded
    res = run_recipe(args.config, progress=not args.no_progress, stop_after=args.stop_after)
    acc = res["heldout_acceptance"]
    print(f"step {res['step']} of {recipe['distill'].steps}; held-out acceptance "
          f"{acc[0][1]:.4f} (step {acc[0][0]}) -> {acc[-1][1]:.4f} (step {acc[-1][0]})")
    if res["step"] == recipe["distill"].steps:
        print(f"wrote {Path(recipe['run_dir']) / 'model'}; load_model({res['name']!r}) and "
              f"--draft {res['name']} read it")
    return 0


def cmd_train_head(args) -> int:
    from dsbd_jax.training.head import load_recipe, run_recipe
    recipe = load_recipe(args.config)  # checked before any weights are loaded
    res = run_recipe(args.config, progress=not args.no_progress, stop_after=args.stop_after)
    log = [r for r in res["log"] if "heldout_acceptance_1" in r]
    if log:
        print(f"step {res['step']} of {recipe['train'].steps}; held-out acceptance "
              f"{log[0]['heldout_acceptance_1']:.4f} (step {log[0]['step']}) -> "
              f"{log[-1]['heldout_acceptance_1']:.4f} (step {log[-1]['step']})")
    if "head_dir" in res:
        print(f"wrote {res['head_dir']} ({res['num_params']:,} parameters of its own) and "
              f"{res['plot']}; --draft {recipe['save_as']} reads it")
    return 0


def weights_line(config, dtype) -> str:
    """What ``--draft-weights auto`` gives a draft of ``config``'s shape here, with the figures
    it was measured from (:func:`dsbd_jax.host.forms.choose_weights`)."""
    from dsbd_jax.host import forms
    kind, why = forms.weights_choice(config, dtype)
    return f"{kind} weights (--draft-weights auto: {why})"


def cmd_host(args) -> int:
    """Print :func:`dsbd_jax.host.plan.plan` for each model (its config only), the DSBD
    node budget of a forest it verifies as a target
    (:func:`dsbd_jax.host.forest_budget.node_budget`), and every choice cached for this host
    (:func:`dsbd_jax.host.cpu_options.host_entries`)."""
    import jax
    from dsbd_jax.host import plan as host
    from dsbd_jax.host.forest_budget import node_budget
    from dsbd_jax.host.cpu_options import cache_file, host_entries, host_key
    from dsbd_jax.loading.load import read_config
    from dsbd_jax.loading.load_args import fuses_by_default
    from dsbd_jax.host.cpu_options import forget_host
    if args.remeasure:
        print(f"--remeasure: dropped {forget_host()} choices cached for this host")
    print(f"host: {host_key()}, backend {jax.default_backend()}")
    for source in args.model or [DEFAULT_TARGET, DEFAULT_DRAFT]:
        config = read_config(source)
        plan = host.plan(config, args.dtype)
        print(f"{source} ({config.hidden_size}x{config.intermediate_size}): dtype {plan.dtype} "
              f"for any decoder ({plan.why}); kernels {plan.form}"
              f"{', head as [V, d] rows' if plan.head_transposed else ''}; "
              f"compiler options {plan.options}; projections "
              f"{'fused' if fuses_by_default(plan.form == 'transposed') else 'separate'}")
        if args.dtype == "auto":
            for label, methods, role in (("sampling and beam sampling", ("sample", "beam"),
                                          "target"), ("DSBD's target", ("dsbd",), "target"),
                                         ("a draft", None, "draft")):
                dt, why = host.dtype_choice(config, methods, role)
                print(f"  dtype for {label}: {dt} ({why})")
        nodes, why = node_budget(config.replace(dtype=plan.dtype))
        print(f"  as a DSBD target: {why}")
        nodes, why = node_budget(config.replace(dtype=plan.dtype), "int8")
        print(f"  as a DSBD target in int8 (--weights int8): {why}")
        print(f"  as a draft: {weights_line(config, plan.dtype)}")
    entries = host_entries()
    print(f"this host's plan: {len(entries)} choices in {cache_file()}" + (":" if entries else ""))
    for entry, got in sorted(entries.items()):
        print(f"  {entry}: {got.get('choice')}")
    return 0


def cache_entries(root: Path):
    """``[(entry, bytes)]`` of the cache at ``root``: each folder of a model (its source file,
    converted parameters, host forms, tokenizer) as ``MODEL/FOLDER``, each registered head and
    saved model, the compiled programs (``xla``) and loose files."""
    def size(p: Path) -> int:
        if p.is_symlink() or p.is_file():
            return p.lstat().st_size
        return sum(f.lstat().st_size for f in p.rglob("*") if f.is_file() and not f.is_symlink())
    out = []
    if not root.is_dir():
        return out
    for top in sorted(root.iterdir()):
        if top.is_dir() and not top.is_symlink() and top.name not in ("xla",):
            for sub in sorted(top.iterdir()):
                out.append((f"{top.name}/{sub.name}", size(sub)))
        else:
            out.append((top.name, size(top)))
    return out


def cmd_cache(args) -> int:
    """``dsbd cache``: the cache's entries with sizes (:func:`cache_entries`), or ``--remove``."""
    import shutil
    from dsbd_jax.loading.presets import cache_root
    root = cache_root()
    for entry in args.remove:
        target = (root / entry).resolve()
        if (entry in ("", ".") or not target.exists() or root.resolve() not in target.parents):
            raise CLIError(f"--remove {entry}: no such entry under {root} (`dsbd cache` lists "
                           f"them)")
        shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
        print(f"removed {entry}")
    entries = cache_entries(root)
    total = sum(b for _, b in entries)
    print(f"{root}: {total / 1e9:.2f} GB in {len(entries)} entries")
    for entry, b in entries:
        print(f"  {b / 1e9:8.3f} GB  {entry}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    # transformers only tokenizes here; its advice (e.g. "PyTorch was not found") is noise
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        check_values(args)       # plain Python: a refusal imports nothing heavy
        if args.command in ("demo", "generate", "bench", "vocab", "distill", "host"):
            from dsbd_jax.host.compilation_cache import enable_compilation_cache
            enable_compilation_cache()      # compiled programs persist across runs
        if args.command in ("generate", "bench") and _join_processes():
            args.no_progress = True      # the progress callback is one process's
            if not _is_first_process():
                with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
                    return _dispatch(args)
        return _dispatch(args)
    except Exception as e:  # noqa: BLE001 - the user's errors end as one line, others raise
        if not isinstance(e, _user_errors()):
            raise
        print("dsbd: error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        # Ctrl-C: say what is kept and how to go on, then leave at once (a batch interrupted
        # in its worker thread may still be running in XLA: nothing waits for it)
        hint = RESUME_HINTS.get(args.command)
        print(f"\ndsbd {args.command}: stopped (Ctrl-C)" + (f"; {hint}" if hint else ""),
              file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(130)


def _user_errors() -> tuple:
    """The exceptions that mean bad input (printed as one line, exit status 2): the presets'
    own error only when its module was imported (the parser imports no heavy module)."""
    errors = (CLIError, ValueError, FileNotFoundError, OSError, ImportError)
    presets = sys.modules.get("dsbd_jax.loading.presets")
    return errors + ((presets.PresetError,) if presets is not None else ())


# what a stopped long command keeps, and how it goes on (main's Ctrl-C message)
RESUME_HINTS = {
    "train-head": "the finished batches of the data phases (RUN/data-parts/) and the last "
                  "finished step (RUN/checkpoint.msgpack) are kept: the same command resumes "
                  "from there",
    "distill": "the finished rollout batches (RUN/rollouts-*/) and the last finished step "
               "(RUN/state.npz) are kept: the same command resumes from there",
    "bench": "the finished records are kept: the same command resumes after them",
}


def _join_processes() -> bool:
    """Join the other processes when JAX's environment names them (``JAX_COORDINATOR_ADDRESS``,
    ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``): ``parallel.distributed.initialize``. Returns
    whether this is one of many processes."""
    from dsbd_jax.parallel import distributed
    if distributed.env_settings() is None:
        return False
    distributed.initialize()
    import jax
    return jax.process_count() > 1


def _is_first_process() -> bool:
    import jax
    return jax.process_index() == 0


def _dispatch(args) -> int:
    commands = {"demo": cmd_demo, "generate": cmd_generate, "bench": cmd_bench, "plot": cmd_plot,
                "summary": cmd_summary, "make-tiny-pair": cmd_make_tiny_pair, "vocab": cmd_vocab,
                "distill": cmd_distill, "train-head": cmd_train_head, "host": cmd_host,
                "cache": cmd_cache}
    return commands[args.command](args) if args.command in commands else 1
