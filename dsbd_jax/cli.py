"""Command line (the ``dsbd`` console script, or ``python -m dsbd_jax``):

    dsbd demo                                    # DSBD vs beam sampling on the default offline pair
    dsbd generate --prompt "..." [--method dsbd|beam|sample|spec|tree|beam_search] [settings]
    dsbd bench configs/quick_cpu.yaml --out runs/quick_cpu
    dsbd plot runs/quick_cpu/records.jsonl
    dsbd summary runs/quick_cpu               # the summary of a run, finished or not
    dsbd make-tiny-pair /tmp/dsbd_tiny           # tiny random models for configs/tiny.yaml (torch)
    dsbd vocab build --model M --task gsm8k:40:  # token-frequency table for a truncated draft head
    dsbd vocab show TABLE                        # its coverage at N = 16k/32k/64k
    dsbd distill configs/distill_qwen_fkl.yaml   # distil the draft towards the target (resumable)
    dsbd train-head configs/head_qwen.yaml       # train a feature-level draft head (resumable)
    dsbd host [--model M]                        # how this host runs a model: dtype, kernels, options

``generate`` runs its decoder once, showing the elapsed seconds (``--progress time``, the
default: the decoder carries no host callback, so the compilation cache keeps it) or a bar per
decoder iteration (``--progress tokens``: new tokens, iterations, target calls and, for DSBD,
the accepted draft candidates per verified layer; no rate; compiled on every run), then prints
the run's tokens/s and every beam with its target log-likelihood. Settings and prompts are
checked on their own before any model file is read, then against the models' configs before any
weights are loaded. Compiled programs persist in ``$DSBD_JAX_CACHE/xla``
(:mod:`dsbd_jax.models.compilation_cache`; ``DSBD_JAX_COMPILATION_CACHE=0`` turns it off).
Errors for bad input are printed as one line (``dsbd: error: ...``) with exit status 2.

Many processes (JAX's multi-controller runtime): ``generate`` and ``bench`` run unchanged when
started once per process with ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and
``JAX_PROCESS_ID`` set (``dsbd_jax.parallel.distributed.initialize``); with ``--mesh`` each
process decodes its share of the prompts, only process 0 prints results and writes files, and
progress bars are off. On one machine, N processes of 4 virtual CPU devices each::

    N=2; for i in $(seq 0 $((N-1))); do JAX_COORDINATOR_ADDRESS=127.0.0.1:12345 JAX_NUM_PROCESSES=$N JAX_PROCESS_ID=$i XLA_FLAGS=--xla_force_host_platform_device_count=4 dsbd generate --mesh data=4,model=2 --no-progress --prompt hi & done; wait
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
from pathlib import Path
from typing import List, Optional

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"
from dsbd_jax.decoding.methods import METHODS, NEEDS_DRAFT  # noqa: E402
from dsbd_jax.models.presets import PresetError  # noqa: E402


class CLIError(Exception):
    pass


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every option's help ends with its default (``(default: 32)``), unless the default is None,
    False (a flag), an empty list, or the help already names it (``%(default)s``)."""

    def _get_help_string(self, action):
        text = action.help or ""
        d = action.default
        if (d is None or d is False or d is argparse.SUPPRESS or (isinstance(d, list) and not d)
                or "%(default)" in text):
            return text
        if action.option_strings or action.nargs in ("?", "*"):
            text += " (default: %(default)s)"
        return text


def _add_settings(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-new-tokens", type=int, default=32, help="new tokens per prompt")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature (0 = greedy)")
    p.add_argument("--top-k", type=int, default=10,
                   help="keep the k most likely tokens, 0 = off (the paper uses 10)")
    p.add_argument("--top-p", type=float, default=0.8,
                   help="nucleus (top-p) mass, 1 = off (the paper uses 0.8)")
    p.add_argument("--beams", type=int, default=2,
                   help="beam width W: the output beams of beam and beam_search; DSBD: the "
                        "beams its extra layer draws, so its output has W beams when the last "
                        "iteration passed every layer, else the width of the layer it ended on "
                        "(--min-width to max(--beams, --draft-width))")
    p.add_argument("--gamma", type=int, default=2, help="draft look-ahead (layers)")
    p.add_argument("--draft-width", type=int, default=3, help="DSBD draft beam width W_S")
    p.add_argument("--threshold", type=float, default=0.9, help="DSBD width threshold t")
    p.add_argument("--min-width", type=int, default=1, help="DSBD minimum width W_min")
    p.add_argument("--single-beam", action="store_true", help="DSBD memory-saving mode")
    p.add_argument("--no-replacement", action="store_true", help="beams without replacement")
    p.add_argument("--seed", type=int, default=0, help="PRNG seed of the decoders")
    p.add_argument("--no-eos", action="store_true", help="ignore EOS (always generate max tokens)")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                   help="the models' dtype: auto = bfloat16 where this host runs it faster "
                        "than float32 (measured once, cached), else float32")


MODEL_HELP = "target model: preset name, HF directory, .gguf or hub id org/name[@revision]"
DRAFT_HELP = ("draft (the speculative methods): a draft model, in the same forms as --target, "
              "or a draft head: its directory or the name `dsbd train-head` registered")
MESH_HELP = ("decode sharded over a device mesh, e.g. data=2,model=4 (prompts over 'data', "
             "tensor parallel over 'model'; data defaults to the remaining devices); "
             "see dsbd_jax.parallel")


def _mesh(text):
    """The mesh of ``--mesh`` (None when not given); bad values end as a CLI error."""
    if not text:
        return None
    from dsbd_jax.parallel import make_mesh, parse_mesh
    try:
        sizes = parse_mesh(text)
        return make_mesh(sizes["data"], sizes["model"])
    except ValueError as e:
        raise CLIError(f"--mesh: {e}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsbd", description=__doc__,
                                     formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    # every subcommand's --help shows each option's default (HelpFormatter)
    add = lambda name, **kw: sub.add_parser(name, formatter_class=HelpFormatter, **kw)  # noqa: E731
    demo = add("demo", help="DSBD vs beam sampling on the default offline model pair")
    demo.add_argument("--target", default=DEFAULT_TARGET, help=MODEL_HELP)
    demo.add_argument("--draft", default=None,
                      help=DRAFT_HELP + f"; default: a draft head trained for the target when one "
                      f"is registered (dsbd train-head), else {DEFAULT_DRAFT}")
    demo.add_argument("--prompt", action="append", default=None,
                      help="a user message (repeatable); default: one HumanEval and one GSM8K problem")
    _add_settings(demo)
    gen = add("generate", help="generate with one method and print the beams")
    gen.add_argument("--target", default=DEFAULT_TARGET, help=MODEL_HELP)
    gen.add_argument("--draft", default=DEFAULT_DRAFT, help=DRAFT_HELP)
    gen.add_argument("--prompt", action="append", required=True,
                     help="a user message (repeatable: one batch of prompts)")
    gen.add_argument("--method", choices=METHODS, default="dsbd", help="the decoding method")
    gen.add_argument("--raw", action="store_true", help="do not apply the chat template")
    gen.add_argument("--progress", choices=PROGRESS_MODES, default="time",
                     help="time (default): elapsed seconds while the decoder runs; its compiled "
                          "program is kept in the compilation cache, so a later run reads it "
                          "back. tokens: a bar over new tokens fed from inside the loop; a "
                          "program with that host callback is never cached, so every run "
                          "compiles it again. none: nothing")
    gen.add_argument("--no-progress", action="store_true", help="the same as --progress none")
    gen.add_argument("--mesh", default=None, help=MESH_HELP)
    gen.add_argument("--draft-head-rows", type=int, default=None,
                     help="truncate the draft's vocabulary head to the N most frequent tokens "
                          "(its frequency table: --draft-vocab-table, else the one beside it)")
    gen.add_argument("--draft-vocab-table", default=None, help="a table from `dsbd vocab build`")
    gen.add_argument("--draft-prompt-rows", action="store_true",
                     help="with --draft-head-rows: also propose the prompt's own tokens (keeps "
                          "the full head in memory)")
    _add_settings(gen)
    bench = add("bench", help="run a benchmark config (configs/*.yaml): JSON lines + summary")
    bench.add_argument("config", help="a bench config, e.g. configs/quick_cpu.yaml")
    bench.add_argument("--out", default=None, help="output folder (default results/<config name>)")
    bench.add_argument("--models", default=None, help="a model-pair file (configs/models/*.yaml)")
    bench.add_argument("--target", default=None, help="override the config's target")
    bench.add_argument("--draft", default=None, help="override the config's draft")
    bench.add_argument("--limit", type=int, default=None, help="at most N prompts per dataset")
    bench.add_argument("--max-new-tokens", type=int, default=None,
                       help="override the config's new tokens per prompt")
    bench.add_argument("--batch-size", type=int, default=None,
                       help="prompts per call (default: the config's batch_size, else 4 on CPU, "
                            "16 on GPU/TPU)")
    bench.add_argument("--no-progress", action="store_true", help="no progress bar")
    bench.add_argument("--mesh", default=None, help=MESH_HELP)
    plot = add("plot", help="Pareto plots (PNG + SVG) from a bench records.jsonl")
    plot.add_argument("records", help="records.jsonl written by dsbd bench (or its folder)")
    plot.add_argument("--out", default=None, help="output folder (default: next to the records)")
    plot.add_argument("--quality", default="loglik_per_token",
                      help="y axis: loglik_per_token, perplexity or a task metric such as "
                           "humaneval/pass@1")
    summ = add("summary", help="the summary of a bench run, finished or not "
                                          "(rewrites its summary.json)")
    summ.add_argument("records", help="records.jsonl written by dsbd bench (or its folder)")
    summ.add_argument("--markdown", action="store_true", help="a Markdown table")
    voc = add("vocab", help="token-frequency tables for truncated draft heads")
    vsub = voc.add_subparsers(dest="vocab_command", required=True)
    vb = vsub.add_parser("build", help="count tokens of a corpus or of a model's generations",
                         formatter_class=HelpFormatter)
    vb.add_argument("--model", default=DEFAULT_DRAFT,
                    help="the model the table is for: its tokenizer and vocabulary, and the "
                         "default place of the table (beside it)")
    vb.add_argument("--text", action="append", default=[],
                    help="a corpus file: .jsonl (every string) or plain text (repeatable)")
    vb.add_argument("--task", action="append", default=[],
                    help="training-side text of a task slice NAME:START:STOP, e.g. gsm8k:40: "
                         "(repeatable)")
    vb.add_argument("--rollouts", action="append", default=[],
                    help="a dsbd distill run's stored target distributions (RUN_DIR/"
                         "data_train.npz): every position adds the target's top-k "
                         "probabilities, expected counts (repeatable)")
    vb.add_argument("--generate-with", default=None,
                    help="also count the tokens this model (the draft or the target) samples "
                         "after the prompts of --prompts / --prompt-task")
    vb.add_argument("--prompts", default=None, help="prompts file, one prompt per line")
    vb.add_argument("--prompt-task", action="append", default=[],
                    help="chat prompts of a task slice NAME:START:STOP (repeatable)")
    vb.add_argument("--max-new-tokens", type=int, default=128,
                    help="new tokens per prompt with --generate-with")
    vb.add_argument("--seed", type=int, default=0, help="PRNG seed of --generate-with")
    vb.add_argument("--out", default=None, help="table path (default: beside the model, see "
                    "dsbd_jax.models.vocab.table_path)")
    vs = vsub.add_parser("show", help="a table's size and its coverage at several N",
                         formatter_class=HelpFormatter)
    vs.add_argument("table", help="a table from `dsbd vocab build` (.npz)")
    vs.add_argument("--n", type=int, action="append", default=None,
                    help="head sizes to report (default 16384, 32768, 65536)")
    dis = add("distill", help="distil the draft towards the target (resumable)")
    dis.add_argument("config", help="a distillation recipe, e.g. configs/distill_qwen_fkl.yaml "
                                    "(the README's recipe)")
    dis.add_argument("--no-progress", action="store_true", help="no progress bar")
    dis.add_argument("--stop-after", type=int, default=None,
                     help="stop after N steps of this call (checkpointed; run again to go on)")
    th = add("train-head", help="train a feature-level draft head for the target (optax; "
                                "resumable)")
    th.add_argument("config", help="a head-training recipe, e.g. configs/head_qwen.yaml")
    th.add_argument("--no-progress", action="store_true", help="no progress lines")
    th.add_argument("--stop-after", type=int, default=None,
                    help="stop after N steps of this call (checkpointed; run again to go on)")
    hst = add("host", help="how this host runs a model: its dtype (float32 or bfloat16), kernel "
                           "form and compiler options, measured once and cached")
    hst.add_argument("--model", action="append", default=None,
                     help="a preset, HF directory, .gguf or hub id (repeatable; default: the "
                          "default target and draft); only its config is read")
    hst.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                     help="auto: measured on this host; or the plan for a forced dtype")
    tiny = add("make-tiny-pair",
                          help="write a tiny random target/draft pair (Hugging Face format) to try "
                               "the CLI and configs/tiny.yaml without the offline weights; "
                               "needs torch")
    tiny.add_argument("directory", nargs="?", default="/tmp/dsbd_tiny",
                      help="output folder (configs/tiny.yaml reads /tmp/dsbd_tiny)")
    return parser


def _settings(name: str, args) -> dict:
    """The method's settings (``dsbd_jax.decoding.methods``) from the CLI flags."""
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


def _status(msg: str) -> None:
    """A status line on stderr (stdout carries the results)."""
    print(msg, file=sys.stderr, flush=True)


ACCEPT_LABELS = {"dsbd": "accepted/layer", "spec": "accept rate", "tree": "accept rate"}
PROGRESS_MODES = ("time", "tokens", "none")


def progress_mode(args) -> str:
    """``"tokens"`` (a bar fed from inside the decoder's loop: the decoder is built with a host
    callback), ``"time"`` (elapsed seconds from the host: the decoder has no callback, so its
    compiled program can be cached) or ``"none"``. ``--no-progress`` wins; a command without
    ``--progress`` (``demo``) shows tokens."""
    if getattr(args, "no_progress", False):
        return "none"
    return getattr(args, "progress", "tokens")


class ElapsedTicker:
    """Elapsed seconds on stderr while a call runs, from a host thread: progress that needs
    nothing from inside the compiled program (so the program stays cacheable)."""

    def __init__(self, desc: str, every_s: float = 0.5):
        import threading
        from tqdm.auto import tqdm
        self.bar = tqdm(total=None, desc=desc, leave=True, bar_format="{desc}: {elapsed}")
        self._stop = threading.Event()
        self._every = every_s
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            self.bar.refresh()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.bar.refresh()
        self.bar.close()


class ProgressBar:
    """A tqdm bar over new tokens, fed by ``common.progress_hook`` once per decoder loop trip:
    iterations, target calls and the draft acceptance figure (no rate: a run has one tokens/s
    figure, :func:`tokens_per_second`, printed when it ends):
    for DSBD ``accepted/layer`` = accepted draft candidates per verified layer (below 1 when
    layers end with a correction draw, at most the width), for speculative and tree sampling
    ``accept rate`` = accepted draft tokens per verified draft token."""

    def __init__(self, total: int, desc: str, method: str = "", rows: Optional[int] = None):
        from tqdm.auto import tqdm
        self.bar = tqdm(total=total, desc=desc, unit="tok", leave=True,
                        bar_format="{l_bar}{bar}| {n_fmt}/{total_fmt} tok [{elapsed}{postfix}]")
        self.accept_label = ACCEPT_LABELS.get(method, "accepted")
        self.rows = rows  # prompts to count (a sharded batch may carry padding rows after them)

    def __call__(self, v) -> None:
        n = int(v["generated"][:self.rows].sum())
        post = {"iter": int(v["iterations"]), "target calls": int(v["target_calls"])}
        if "accepted" in v:
            post[self.accept_label] = f"{int(v['accepted']) / max(int(v['verified']), 1):.2f}"
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(n - self.bar.n)

    def close(self) -> None:
        self.bar.close()


def build_decoder(name, args, target_config, draft_config, progress: bool):
    """The method's decoder from the CLI flags: every setting (and the draft's vocabulary) is
    validated here, from the model configs alone, before any weights are loaded."""
    from dsbd_jax.decoding.methods import build
    return build(name, target_config, draft_config, progress=progress, **_settings(name, args))


# A stand-in model for checking the settings alone (``check_options``): a vocabulary and
# context no setting can exceed and no EOS / pad id, so only model-independent rules can fail.
_STAND_IN = dict(vocab_size=2**31 - 1, hidden_size=8, intermediate_size=8, num_layers=1,
                 num_heads=1, num_kv_heads=1, head_dim=8, max_position_embeddings=2**31 - 1)


def check_options(args, methods, prompts, raw: bool = False) -> None:
    """The checks that need no model, before any model file is read: each method's settings
    (the decoders' own rules, built on a stand-in model whose vocabulary and context no
    setting can exceed) and the prompts (an empty ``--raw`` prompt has no token to start
    from)."""
    from dsbd_jax.decoding.methods import check_settings
    from dsbd_jax.models.config import ModelConfig
    if raw:
        for i, text in enumerate(prompts):
            if not text:
                raise CLIError(f"--prompt {i + 1} is empty: with --raw it has no token to start "
                               f"from (without --raw the chat template gives it some)")
    stand_in = ModelConfig(**_STAND_IN)
    for m in methods:
        settings = _settings(m, args)
        check_settings(m, settings)
        build_decoder(m, args, stand_in, stand_in if m in NEEDS_DRAFT else None, progress=False)


def prepare(args, methods, prompts, raw: bool = False):
    """Everything that can fail without weights, checked before the slow load and cheapest
    first: the settings and prompts alone (:func:`check_options`), then against the model
    configs (the converted cache's ``config.json`` / a GGUF's header), the tokenizer and the
    prompts' length. Returns ``(configs, decoders, tokenizer, prompt_ids, prompt_lengths)``
    with ``configs = (target, draft or None)``; the decoders carry the progress callback only
    when :func:`progress_mode` is ``"tokens"``."""
    check_options(args, methods, prompts, raw)
    from dsbd_jax.decoding.common import max_prompt_length, pad_prompts
    from dsbd_jax.eval.datasets import encode_chat
    from dsbd_jax.models.head_registry import read_draft_config
    from dsbd_jax.models.loading import load_tokenizer, read_config
    needs_draft = any(m in NEEDS_DRAFT for m in methods)
    dtype = getattr(args, "dtype", "auto")
    target_config = read_config(args.target, dtype)
    configs = (target_config, read_draft_config(args.draft, target_config, dtype)
               if needs_draft else None)
    progress = progress_mode(args) == "tokens"
    decoders = {m: build_decoder(m, args, *configs, progress=progress) for m in methods}
    tokenizer = load_tokenizer(args.target)
    if tokenizer is None:
        raise CLIError(f"{args.target} has no tokenizer; cannot encode --prompt text")
    cap = min(max_prompt_length(d.config) for d in decoders.values())
    ids, lens = pad_prompts(encode_chat(tokenizer, prompts, raw), pad_id=0, max_length=cap)
    return configs, decoders, tokenizer, ids, lens


def load_models(args, configs):
    """Load the target (and the draft when ``configs[1]`` is not None), with a status line and
    timing for each; the loaded configs must be the ones the decoders were checked against."""
    from dsbd_jax.models.loading import load_model
    models = []
    for role, source, config in (("target", args.target, configs[0]),
                                 ("draft", args.draft, configs[1])):
        if config is None:
            models.append(None)
            continue
        _status(f"loading {role} {source} ...")
        t0 = time.perf_counter()
        head = {}
        if role == "draft" and getattr(args, "draft_head_rows", None) is not None:
            head = dict(head_rows=args.draft_head_rows, vocab_table=args.draft_vocab_table,
                        prompt_rows=bool(getattr(args, "draft_prompt_rows", False)))
        elif role == "draft" and (getattr(args, "draft_vocab_table", None) is not None
                                  or getattr(args, "draft_prompt_rows", False)):
            raise CLIError("--draft-vocab-table and --draft-prompt-rows need --draft-head-rows N")
        from dsbd_jax.models.head import is_head
        from dsbd_jax.models.head_registry import LoadedHead
        if role == "draft" and is_head(config):
            if head:
                raise CLIError("--draft-head-rows truncates a draft model; a draft head keeps "
                               "the vocabulary rows it was trained with")
            m = LoadedHead(source, models[0].config)
        else:
            m = load_model(source, getattr(args, "dtype", "auto"), tokenizer=False, **head)
        if head:
            _status(f"draft head truncated to {head['head_rows']} rows ({m.info['vocab_table']})"
                    + (" + the prompt's tokens" if head["prompt_rows"] else ""))
        if m.config != config:
            raise CLIError(f"{source}: the loaded model's config differs from the one read "
                           f"before loading (did the files change?)")
        _status(f"loaded {role} {source} ({m.info['dtype']}) in "
                f"{time.perf_counter() - t0:.1f} s")
        models.append(m)
    return models[0], models[1]


def _run_once(call, total: int, desc: str, method: str, progress,
              rows: Optional[int] = None):
    """``timed(call)``, with a token bar when ``progress`` is true or ``"tokens"`` (counting
    the first ``rows`` prompts: a sharded batch may carry padding rows after them), elapsed
    seconds when it is ``"time"``, nothing when false or ``"none"``."""
    from dsbd_jax.eval.timing import timed
    if progress == "time":
        ticker = ElapsedTicker(desc)
        try:
            return timed(call)
        finally:
            ticker.close()
    if not progress or progress == "none":
        return timed(call)
    from dsbd_jax.decoding.common import progress_hook
    bar = ProgressBar(total, desc, method, rows=rows)
    try:
        with progress_hook(bar):
            return timed(call)
    finally:
        bar.close()


def run_method(dec, target, draft, prompt_ids, prompt_lengths, seed: int = 0,
               progress: bool = False, warmup: bool = True, mesh=None):
    """Run one decoder (``build_decoder``); returns ``(output, compile_s, run_s)``.
    ``mesh``: decode sharded over it (``parallel.ShardedDecoder``; weights placed once).
    ``warmup=True``: a first, untimed run (compile + run), then the timed run.
    ``warmup=False``: one run; ``run_s`` = wall time minus the compile seconds JAX reports.
    ``progress``: ``True`` / ``"tokens"``, a token bar for each run (the decoder must be built
    with progress; its host callback costs about 0.15 ms per loop trip, measured with tiny
    models); ``"time"``, elapsed seconds (no callback); ``False`` / ``"none"``, nothing."""
    import jax
    from dsbd_jax.eval.run import CompileClock
    from dsbd_jax.decoding.methods import model_params
    params = model_params(dec, target.params, draft.params if draft else None)
    name = dec.method
    if mesh is not None:
        from dsbd_jax.parallel import ShardedDecoder, mesh_label
        dec = ShardedDecoder.of(dec, mesh)
        params = dec.place(params)
        print(f"[{name}] mesh {mesh_label(mesh)} over {mesh.devices.size} "
              f"{mesh.devices.flat[0].platform} devices"
              + "".join(f"\n  note: {n}" for n in dec.rules.notes))
    key = jax.random.key(seed)
    whole = {} if mesh is None else {"whole_batch": True}   # many processes: each its share
    def call():
        return dec(params, prompt_ids, key, prompt_lengths=prompt_lengths, **whole)
    rows = prompt_ids.shape[0]
    total = dec.config.max_new_tokens * rows
    if warmup:
        _status(f"[{name}] compiling, then one warm-up run (not timed) ...")
        _, first = _run_once(call, total, f"{name} warm-up", name, progress, rows)
        out, run_s = _run_once(call, total, f"{name} timed", name, progress, rows)
        return out, max(first - run_s, 0.0), run_s
    CompileClock.install()
    c0 = CompileClock.total()
    out, wall = _run_once(call, total, name, name, progress, rows)
    comp = CompileClock.total() - c0
    return out, comp, max(wall - comp, 1e-9)


def tokens_per_second(out, seconds: float):
    """The one tokens/s figure of a run (README, "tokens/s"): new tokens of the best beam of
    each prompt (up to and including EOS), summed over the prompts, over the seconds of the
    timed decode (compilation excluded). Returns ``(tokens, tokens / seconds)``."""
    import numpy as np
    lens, best = np.asarray(out.lengths), np.asarray(out.best)
    tokens = int(lens[np.arange(len(best)), best].sum())
    return tokens, tokens / max(seconds, 1e-9)


def _print_outputs(tokenizer, name, out, prompts, run_s):
    """Every live beam of every prompt with its log-likelihood (best first); returns the number
    of new tokens in the best beams."""
    import numpy as np
    seqs = np.asarray(out.sequences)
    lens = np.asarray(out.lengths)
    ll = np.asarray(out.log_likelihoods)
    best = np.asarray(out.best)
    gen, rate = tokens_per_second(out, run_s)
    print(f"\n=== {name}: {gen} tokens in {run_s:.2f} s = {rate:.2f} tokens/s "
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
        texts = [tuple(seqs[b, w, :lens[b, w]].tolist()) for w in order]
        if len(set(texts)) < len(texts):
            print("    (some beams are identical: beam sampling draws its beams independently, "
                  "with replacement, so it can draw the same beam twice; --no-replacement draws "
                  "distinct beams)")
    return gen


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
        took = (f" (about {r['wall_s'] / 60:.0f} minutes and {r['peak_rss_kb'] / 2 ** 20:.1f} GB "
                f"on a {r['machine'].get('cpu_count', '?')}-core CPU, "
                f"{record.relative_to(recipe.parents[1]).as_posix()})")
    rel = recipe.relative_to(recipe.parents[1]).as_posix()
    return DEFAULT_DRAFT, None, (f"a draft head reads the target's own features and costs a "
                                 f"fraction of the draft model's pass: `dsbd train-head {rel}` "
                                 f"trains one{took}; the demo then drafts with it")


def cmd_demo(args) -> int:
    from dsbd_jax.eval import datasets
    prompts = args.prompt or [datasets.chat_prompts("humaneval", 1)[0],
                              datasets.chat_prompts("gsm8k", 1)[0]]
    check_options(args, ("beam", "dsbd"), prompts)  # before anything is read (prepare: again)
    args.draft, note, hint = demo_draft(args.target, args.draft)
    if note:
        print(note, flush=True)
    configs, decoders, tokenizer, ids, lens = prepare(args, ("beam", "dsbd"), prompts)
    target, draft = load_models(args, configs)
    print(f"target {args.target} ({target.info['dtype']}: {target.info['dtype_why']}), "
          f"draft {args.draft} ({draft.info['dtype']}); {len(prompts)} prompt(s), "
          f"{args.max_new_tokens} new tokens; each method runs twice (compile + warm-up, then "
          f"timed)", flush=True)
    print(f"DSBD: {args.beams} beams in the extra layer (the output: {args.min_width} to "
          f"{max(args.beams, args.draft_width)}, the width of the layer a run ends on), draft look-ahead gamma={args.gamma}, draft beam "
          f"width W_S={args.draft_width}, width threshold t={args.threshold}, widths "
          f"{args.min_width}..{max(args.beams, args.draft_width)}"
          f"{', single-beam' if args.single_beam else ''}; beam sampling: W={args.beams} "
          f"; both with temperature {args.temperature}, "
          f"top-k {args.top_k}, top-p {args.top_p}", flush=True)
    results = {}
    for name, dec in decoders.items():
        out, comp, run_s = run_method(dec, target, draft, ids, lens, args.seed, progress=True)
        print(f"[{name}] compile {comp:.1f} s")
        results[name] = (_print_outputs(tokenizer, name, out, prompts, run_s), run_s, out)
    import numpy as np
    (_, tb, ob), (_, td, od) = results["beam"], results["dsbd"]
    def ll_per_tok(o):
        b = np.asarray(o.best)
        i = np.arange(len(b))
        return float(np.mean(np.asarray(o.log_likelihoods)[i, b] / np.maximum(np.asarray(o.lengths)[i, b], 1)))
    rd, rb = tokens_per_second(od, td)[1], tokens_per_second(ob, tb)[1]
    lld, llb = ll_per_tok(od), ll_per_tok(ob)
    print(f"\nspeed: DSBD {rd:.2f} tokens/s vs beam sampling (W={args.beams}) {rb:.2f} tokens/s"
          f" -> {rd / rb:.2f}x; mean log-lik/token of the best beams: DSBD {lld:.3f}, "
          f"beam sampling {llb:.3f}")
    print(demo_verdict(rd / rb, lld - llb, od.stats, target.info["dtype"]))
    if hint:
        print(hint)
    return 0


def demo_verdict(speedup: float, ll_gain: float, stats, dtype: str,
                 backend: Optional[str] = None) -> str:
    """One line on what the demo showed: DSBD faster at equal or better log-likelihood, or what
    held it back (tokens per target pass; on a CPU backend, the forest pass's cost). The two
    prompts' log-likelihoods vary by about 0.05 per token from seed to seed, so a gap under 0.05
    counts as equal. ``backend``: jax's default backend when left out."""
    if backend is None:
        import jax
        backend = jax.default_backend()
    import numpy as np
    per_call = float(np.sum(np.asarray(stats["generated_tokens"]))) / max(
        float(np.sum(np.asarray(stats["target_calls"]))), 1.0)
    quality = "equal or better" if ll_gain > -0.05 else "lower"
    if speedup >= 1.0:
        return (f"DSBD was {speedup:.2f}x as fast as beam sampling at {quality} log-likelihood "
                f"({per_call:.2f} new tokens per target pass, all prompts together)")
    why = ""
    if backend == "cpu":
        why = (f"; on this CPU the target's pass over a forest costs more than a one-token pass "
               f"({dtype}: about twice on the 2-core hosts measured, docs/results/precision.md), "
               f"so verifying a forest in one pass does not pay for itself")
    return (f"DSBD was slower than beam sampling here ({speedup:.2f}x, {quality} log-likelihood): "
            f"{per_call:.2f} new tokens per target pass (all prompts together){why}")


def cmd_generate(args) -> int:
    mesh = _mesh(args.mesh)  # before loading: a bad --mesh fails fast
    configs, decoders, tokenizer, ids, lens = prepare(args, (args.method,), args.prompt, args.raw)
    target, draft = load_models(args, configs)
    # one run: its compile seconds (tracing and lowering, then compiling the program or reading
    # it back from the cache) are reported apart and left out of its tokens/s
    out, comp, run_s = run_method(decoders[args.method], target, draft, ids, lens, args.seed,
                                  progress=progress_mode(args), warmup=False, mesh=mesh)
    print(f"[{args.method}] compile {comp:.1f} s")
    _print_outputs(tokenizer, args.method, out, args.prompt, run_s)
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


def cmd_plot(args) -> int:
    from dsbd_jax.eval.plot import plot_results
    path = Path(args.records)
    if path.is_dir():
        path = path / "records.jsonl"
    for p in plot_results(path, args.out, quality=args.quality, log=print):
        print(f"wrote {p}")
    return 0


def cmd_summary(args) -> int:
    import json
    from dsbd_jax.eval.summary import format_summary, summary_of
    path = Path(args.records)
    if path.is_dir():
        path = path / "records.jsonl"
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
    from dsbd_jax.models.loading import load_tokenizer, read_config
    if not (args.text or args.task or args.rollouts or args.generate_with):
        raise CLIError("vocab build needs a source: --text, --task, --rollouts or "
                       "--generate-with")
    if args.generate_with and not (args.prompts or args.prompt_task):
        raise CLIError("--generate-with needs prompts: --prompts FILE or --prompt-task SLICE")
    for spec in args.task + args.prompt_task:
        ev.parse_slice(spec)
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
        from dsbd_jax.models.loading import load_model
        _status(f"loading {args.generate_with} ...")
        model = load_model(args.generate_with, tokenizer=False)
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


def cmd_host(args) -> int:
    """Print :func:`dsbd_jax.models.host.plan` for each model (its config only)."""
    import jax
    from dsbd_jax.models import host
    from dsbd_jax.models.cpu_options import host_key
    from dsbd_jax.models.loading import read_config
    print(f"host: {host_key()}, backend {jax.default_backend()}")
    for source in args.model or [DEFAULT_TARGET, DEFAULT_DRAFT]:
        config = read_config(source)
        plan = host.plan(config, args.dtype)
        print(f"{source} ({config.hidden_size}x{config.intermediate_size}): dtype {plan.dtype} "
              f"({plan.why}); kernels {plan.form}"
              f"{', head as [V, d] rows' if plan.head_transposed else ''}; "
              f"compiler options {plan.options}")
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    # transformers only tokenizes here; its advice (e.g. "PyTorch was not found") is noise
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command in ("demo", "generate", "bench", "vocab", "distill", "host"):
            from dsbd_jax.models.compilation_cache import enable_compilation_cache
            enable_compilation_cache()      # compiled programs persist across runs
        if args.command in ("generate", "bench") and _join_processes():
            args.no_progress = True      # the progress callback is one process's
            if not _is_first_process():
                with open(os.devnull, "w") as null, contextlib.redirect_stdout(null):
                    return _dispatch(args)
        return _dispatch(args)
    except (CLIError, ValueError, FileNotFoundError, OSError, ImportError, PresetError) as e:
        print("dsbd: error: " + " ".join(str(e).split()), file=sys.stderr)
        return 2


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
                "distill": cmd_distill, "train-head": cmd_train_head, "host": cmd_host}
    return commands[args.command](args) if args.command in commands else 1


if __name__ == "__main__":
    sys.exit(main())
