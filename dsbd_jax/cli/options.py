"""The ``dsbd`` command's options: the parser, its help, and the decoder settings it takes.

Plain Python: nothing here imports JAX or the library's heavy modules, so ``--help``, argument
errors and the settings' refusals (:func:`check_values`) answer before anything is loaded
(``tests/test_cli_light.py`` holds it to that)."""

from __future__ import annotations

import argparse
import math
import re

# the decoding methods (dsbd_jax.decoding.methods.METHODS / NEEDS_DRAFT, spelled here so that
# the parser needs no JAX; tests/test_cli_light.py checks that the two agree)
METHODS = ("dsbd", "beam", "beam_search", "sample", "spec", "tree")
NEEDS_DRAFT = frozenset({"dsbd", "spec", "tree"})
# the methods that draw beams with or without replacement (their configs' ``replacement``)
WITH_REPLACEMENT = frozenset({"dsbd", "beam", "tree"})

DEFAULT_TARGET = "qwen2.5-coder-1.5b-instruct"
DEFAULT_DRAFT = "qwen2.5-coder-0.5b-instruct"

PROGRESS_MODES = ("time", "tokens", "none")

# the top-level help (``dsbd --help``): every subcommand with an example, how ``generate`` runs,
# and how to start many processes
DESCRIPTION = """Command line (the ``dsbd`` console script, or ``python -m dsbd_jax``):

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
default) or a bar per decoder iteration (``--progress tokens``: new tokens, iterations, target
calls and, for DSBD, the accepted draft candidates per verified layer; no rate), then prints
the run's tokens/s and every beam with its target log-likelihood. Neither progress mode puts a
host callback in the compiled programs, so both keep them in the compilation cache
(``$DSBD_JAX_CACHE/xla``; ``DSBD_JAX_COMPILATION_CACHE=0`` turns it off) and a later run
compiles nothing. Each command that loads a model prints one line per model: the dtype and
weight kind it runs in, and why. ``--help``, argument errors and the settings' refusals answer
before JAX is imported; settings and prompts are then checked against the models' configs
before any weights are loaded. Errors for bad input are printed as one line
(``dsbd: error: ...``) with exit status 2.

Many processes (JAX's multi-controller runtime): ``generate`` and ``bench`` run unchanged when
started once per process with ``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES`` and
``JAX_PROCESS_ID`` set (``dsbd_jax.parallel.distributed.initialize``); with ``--mesh`` each
process decodes its share of the prompts, only process 0 prints results and writes files, and
progress bars are off. On one machine, N processes of 4 virtual CPU devices each::

    N=2; for i in $(seq 0 $((N-1))); do JAX_COORDINATOR_ADDRESS=127.0.0.1:12345 JAX_NUM_PROCESSES=$N JAX_PROCESS_ID=$i XLA_FLAGS=--xla_force_host_platform_device_count=4 dsbd generate --mesh data=4,model=2 --no-progress --prompt hi & done; wait
"""

# the demo: DSBD at the beam-W4 point (gamma 2, W_S 4, t 0.7, W_min 2 against beam sampling
# W = 4: DSBD aimed at beam sampling's log-likelihood, the point configs/quality_cpu.yaml and
# the quality pages use), over enough prompts that the log-likelihood difference has an interval
DEMO_DEFAULTS = dict(beams=4, gamma=2, draft_width=4, threshold=0.7, min_width=2)
DEMO_PROMPTS = 6


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


def _add_settings(p: argparse.ArgumentParser, groups) -> None:
    """The decoders' settings, in ``groups`` (``{"decoder", "dsbd", "loading"}``: argument
    groups of ``p``)."""
    dec, dsbd, load = groups["decoder"], groups["dsbd"], groups["loading"]
    dec.add_argument("--max-new-tokens", type=int, default=32, help="new tokens per prompt")
    dec.add_argument("--temperature", type=float, default=1.0,
                     help="sampling temperature (0 = greedy)")
    dec.add_argument("--top-k", type=int, default=10,
                     help="keep the k most likely tokens, 0 = off (the paper uses 10)")
    dec.add_argument("--top-p", type=float, default=0.8,
                     help="nucleus (top-p) mass, 1 = off (the paper uses 0.8)")
    dec.add_argument("--beams", type=int, default=2,
                     help="beam width W: the output beams of beam and beam_search; DSBD: the "
                          "beams its extra layer draws, so its output has W beams when the last "
                          "iteration passed every layer, else the width of the layer it ended on "
                          "(--min-width to max(--beams, --draft-width))")
    dec.add_argument("--no-replacement", action="store_true",
                     help="draw without replacement (beam sampling, DSBD, tree sampling): "
                          "distinct beams, where with replacement the same beam can be drawn twice")
    dec.add_argument("--seed", type=int, default=0, help="PRNG seed of the decoders")
    dec.add_argument("--no-eos", action="store_true",
                     help="ignore EOS (always generate max tokens)")
    dsbd.add_argument("--gamma", type=int, default=3,
                      help="draft look-ahead (layers; also speculative and tree sampling's). 3 "
                           "by default: with the int8 draft (what --draft-weights auto picks "
                           "where integer products are faster) DSBD W_S 3 ran faster at gamma 3 "
                           "than at 2 or 4 (docs/results/speed.md)")
    dsbd.add_argument("--draft-width", type=int, default=3, help="DSBD draft beam width W_S")
    dsbd.add_argument("--threshold", type=float, default=0.9,
                      help="DSBD width threshold t, in [0, 1]")
    dsbd.add_argument("--min-width", type=int, default=1, help="DSBD minimum width W_min")
    dsbd.add_argument("--single-beam", action="store_true", help="DSBD memory-saving mode")
    dsbd.add_argument("--node-budget", type=node_budget_arg, default="off",
                      help="DSBD forest nodes (input beams + gamma layers) to fill by widening "
                           "each draft layer past --draft-width with leaf candidates: off = the "
                           "--draft-width x --gamma forest; auto = the largest forest the target "
                           "verifies for free on this host (measured once per host and model, "
                           "cached; dsbd host prints it; none where no forest is free); or a "
                           "number. Off by default: wider forests verified no more tokens per "
                           "target pass at the beam-W4 point (docs/results/speed.md)")
    load.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                      help="the models' dtype: auto = the CPU flags' choice (bfloat16 with "
                           "AMX-BF16 or AVX512-BF16, else float32) unless the other dtype runs "
                           "the passes of the methods at hand clearly and repeatably faster here "
                           "(measured once, cached; each model's line says which and why)")
    load.add_argument("--draft-weights", default="auto", choices=("auto", "float", "int8"),
                      help="the draft model's projection and head kernels: int8 = eight-bit "
                           "codes run by XLA's integer product (a quarter of float32's bytes); "
                           "auto = int8 where this host runs the draft's products (1 to 4 rows) "
                           "clearly faster so (measured once, cached), else float. The outputs "
                           "keep the target's exact distributions whatever the draft")
    load.add_argument("--weights", default="float", choices=("float", "int8"),
                      help="the target's kernels: int8 makes the target ANOTHER MODEL (eight-bit "
                           "weights and activations in its products): every method then samples "
                           "that model's distributions, not the float model's (docs/loading.md)")


def _groups(p: argparse.ArgumentParser) -> dict:
    """The argument groups of ``demo`` and ``generate``'s help, in the order shown."""
    return {"loading": p.add_argument_group("models and loading"),
            "decoder": p.add_argument_group("the decoder's settings"),
            "dsbd": p.add_argument_group("DSBD's settings (and the drafted methods')"),
            "output": p.add_argument_group("output")}


# one story of what --progress costs, shared by demo and generate
PROGRESS_HELP = ("time: elapsed seconds while each run goes. tokens: a bar over new tokens, "
                 "updated after every loop iteration (the host runs the loop in compiled "
                 "chunks). Both keep their compiled programs in the compilation cache "
                 "($DSBD_JAX_CACHE/xla), so a later run compiles nothing. none: nothing")


MODEL_HELP = "target model: preset name, HF directory, .gguf or hub id org/name[@revision]"
DRAFT_HELP = ("draft (the speculative methods): a draft model, in the same forms as --target, "
              "or a draft head: its directory or the name dsbd train-head registered")
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


def plain(text: str) -> str:
    """``text`` without its reStructuredText markup (````x````, ``:mod:`x```, a closing ``::``)
    for the command line's help."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", text)
    return text.replace("``", "").replace("::\n", ":\n")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dsbd", description=plain(DESCRIPTION),
                                     formatter_class=HelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    # every subcommand's --help shows each option's default (HelpFormatter)
    add = lambda name, **kw: sub.add_parser(name, formatter_class=HelpFormatter, **kw)  # noqa: E731
    demo = add("demo", help="DSBD vs beam sampling on the default offline model pair",
               description="DSBD against beam sampling W = 4 on the same prompts, DSBD at "
                           "the beam-W4 point (gamma 2, W_S 4, t 0.7, W_min 2: aimed at beam "
                           "sampling's log-likelihood, as the quality pages measure it): each "
                           "method's tokens/s, and DSBD minus beam sampling's log-likelihood "
                           "per token with a 95% interval over the prompts")
    g = _groups(demo)
    g["loading"].add_argument("--target", default=DEFAULT_TARGET, help=MODEL_HELP)
    g["loading"].add_argument(
        "--draft", default=None,
        help=DRAFT_HELP + f"; default: a draft head trained for the target when one is "
        f"registered (dsbd train-head), else {DEFAULT_DRAFT}")
    g["decoder"].add_argument("--prompt", action="append", default=None,
                              help="a user message (repeatable); default: "
                                   f"{DEMO_PROMPTS // 2} HumanEval and {DEMO_PROMPTS // 2} "
                                   "GSM8K problems")
    g["output"].add_argument("--progress", choices=PROGRESS_MODES, default="time",
                             help=PROGRESS_HELP)
    _add_settings(demo, g)
    demo.set_defaults(**DEMO_DEFAULTS)
    gen = add("generate", help="generate with one method and print the beams")
    g = _groups(gen)
    g["loading"].add_argument("--target", default=DEFAULT_TARGET, help=MODEL_HELP)
    g["loading"].add_argument("--draft", default=DEFAULT_DRAFT, help=DRAFT_HELP)
    g["decoder"].add_argument("--prompt", action="append", required=True,
                              help="a user message (repeatable: one batch of prompts)")
    g["decoder"].add_argument("--method", choices=METHODS, default="dsbd",
                              help="the decoding method")
    g["decoder"].add_argument("--raw", action="store_true",
                              help="do not apply the chat template")
    g["output"].add_argument("--progress", choices=PROGRESS_MODES, default="time",
                             help=PROGRESS_HELP)
    g["output"].add_argument("--no-progress", action="store_true",
                             help="the same as --progress none")
    g["loading"].add_argument("--mesh", default=None, help=MESH_HELP)
    g["loading"].add_argument(
        "--draft-head-rows", type=int, default=None,
        help="truncate the draft's vocabulary head to the N most frequent tokens (its frequency "
             "table: --draft-vocab-table, else the one beside it)")
    g["loading"].add_argument("--draft-vocab-table", default=None,
                              help="a table from dsbd vocab build")
    g["loading"].add_argument("--draft-prompt-rows", action="store_true",
                              help="with --draft-head-rows: also propose the prompt's own tokens "
                                   "(keeps the full head in memory)")
    _add_settings(gen, g)
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
    vs.add_argument("table", help="a table from dsbd vocab build (.npz)")
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
                           "form and compiler options, and the DSBD forest it verifies for free "
                           "as a target (--node-budget auto), measured once and cached")
    hst.add_argument("--model", action="append", default=None,
                     help="a preset, HF directory, .gguf or hub id (repeatable; default: the "
                          "default target and draft); only its config is read")
    hst.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                     help="auto: measured on this host; or the plan for a forced dtype")
    hst.add_argument("--remeasure", action="store_true",
                     help="drop every choice cached for this host first, so each is measured "
                          "again (e.g. after one was made on a busy machine)")
    cch = add("cache", help="list what $DSBD_JAX_CACHE stores (each model's forms, draft heads, "
                            "saved models, compiled programs) with sizes, or remove entries")
    cch.add_argument("--remove", action="append", default=[], metavar="ENTRY",
                     help="remove an entry as the list names it (e.g. "
                          "qwen2.5-coder-1.5b-instruct/params-v1, or a whole model: "
                          "qwen2.5-coder-1.5b-instruct; repeatable); later loads rebuild what "
                          "they need")
    tiny = add("make-tiny-pair",
                          help="write a tiny random target/draft pair (Hugging Face format) to try "
                               "the CLI and configs/tiny.yaml without the offline weights; "
                               "needs torch")
    tiny.add_argument("directory", nargs="?", default="/tmp/dsbd_tiny",
                      help="output folder (configs/tiny.yaml reads /tmp/dsbd_tiny)")
    return parser


def node_budget_arg(text: str):
    """``--node-budget``: ``"auto"``, ``None`` (``off``) or an int >= 1."""
    if text in ("auto", "off"):
        return None if text == "off" else text
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected auto, off or a number of nodes >= 1, got "
                                         f"{text!r}")
    return n


def _settings(name: str, args, node_budget=None) -> dict:
    """The method's settings (``dsbd_jax.decoding.methods``) from the CLI flags;
    ``node_budget``: the DSBD budget ``--node-budget auto`` resolved to (``None`` until the
    target's config is read)."""
    s = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
             top_k=args.top_k or None, top_p=args.top_p,
             eos_token_id=() if args.no_eos else None)
    if name in WITH_REPLACEMENT:      # the methods that draw with or without it
        s.update(replacement=not args.no_replacement)
    if name == "dsbd":
        s.update(gamma=args.gamma, draft_width=args.draft_width, threshold=args.threshold,
                 min_width=args.min_width, num_beams=args.beams,
                 max_width=max(args.beams, args.draft_width), single_beam=args.single_beam,
                 node_budget=(node_budget if args.node_budget == "auto" else args.node_budget))
    elif name in ("beam", "beam_search"):
        s.update(num_beams=args.beams)
    elif name in ("spec", "tree"):
        s.update(gamma=args.gamma)
    return s


def check_values(args) -> None:
    """The settings' ranges, checked on the parsed flags alone (plain Python, before JAX or any
    model is imported): :class:`CLIError` naming the option as typed. The decoders' configs
    check the same rules again (``running.check_options``), with the model configs."""
    def need(ok: bool, option: str, rule: str, value) -> None:
        if not ok:
            raise CLIError(f"{option}: must be {rule}, got {value!r}")
    cmd = getattr(args, "command", None)
    if cmd == "bench":
        for option, name in (("--max-new-tokens", "max_new_tokens"), ("--limit", "limit"),
                             ("--batch-size", "batch_size")):
            v = getattr(args, name, None)
            need(v is None or v >= 1, option, "an int >= 1", v)
        return
    if cmd not in ("demo", "generate"):
        return
    need(args.max_new_tokens >= 1, "--max-new-tokens", "an int >= 1", args.max_new_tokens)
    t = args.temperature
    need(math.isfinite(t) and t >= 0, "--temperature", "a finite number >= 0", t)
    need(args.top_k >= 0, "--top-k", "an int >= 0 (0 = off)", args.top_k)
    need(0 < args.top_p <= 1, "--top-p", "in (0, 1]", args.top_p)
    need(args.beams >= 1, "--beams", "an int >= 1", args.beams)
    need(args.gamma >= 1, "--gamma", "an int >= 1", args.gamma)
    need(args.draft_width >= 1, "--draft-width", "an int >= 1", args.draft_width)
    need(args.min_width >= 1, "--min-width", "an int >= 1", args.min_width)
    need(0 <= args.threshold <= 1, "--threshold", "a number in [0, 1]", args.threshold)
    methods = ("beam", "dsbd") if cmd == "demo" else (args.method,)
    if "dsbd" in methods:
        need(args.draft_width >= args.min_width, "--draft-width",
             f"at least --min-width ({args.min_width})", args.draft_width)
        need(max(args.beams, args.draft_width) >= args.min_width, "--beams / --draft-width",
             f"at least --min-width ({args.min_width})", max(args.beams, args.draft_width))
