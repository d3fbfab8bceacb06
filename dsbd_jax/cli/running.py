"""Running decoders for the ``dsbd`` command: options and prompts checked before anything heavy,
the models loaded with a status line, a decoder run with progress, its outputs printed."""

from __future__ import annotations

import contextlib
import sys
import time
from typing import Optional

import dsbd_jax
from dsbd_jax.cli.options import NEEDS_DRAFT, CLIError, _settings

def _status(msg: str) -> None:
    """A status line on stderr (stdout carries the results)."""
    print(msg, file=sys.stderr, flush=True)


ACCEPT_LABELS = {"dsbd": "accepted/layer", "spec": "accept rate", "tree": "accept rate"}


# ``--progress tokens``: the host runs the decoder's loop in compiled chunks of this many
# iterations and updates the bar between them (``dsbd_jax.Progress(every=...)``: no callback in
# any program, so the programs are cached like the others)
PROGRESS_EVERY = 1


def progress_mode(args) -> str:
    """``"tokens"`` (a bar over new tokens, updated by the host between compiled chunks of the
    decoder's loop), ``"time"`` (elapsed seconds from a host thread: one program) or
    ``"none"``. ``--no-progress`` wins; a command without
    ``--progress`` shows tokens."""
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
    """A tqdm bar over new tokens, fed by the decoder's ``dsbd_jax.Progress`` channel after each
    chunk of loop trips (``PROGRESS_EVERY``): new tokens, iterations, target calls and the draft
    acceptance figure (no rate: a run has one tokens/s figure, :func:`tokens_per_second`,
    printed when it ends):
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


def build_decoder(name, args, target_config, draft_config, progress: bool, node_budget=None):
    """The method's decoder from the CLI flags: every setting (and the draft's vocabulary) is
    validated here, from the model configs alone, before any weights are loaded.
    ``node_budget``: what ``--node-budget auto`` resolved to (:func:`auto_node_budget`)."""
    from dsbd_jax.decoding._jit.calls import Progress
    from dsbd_jax.decoding.methods import build
    channel = Progress(every=PROGRESS_EVERY) if progress else False
    return build(name, target_config, draft_config, progress=channel,
                 **_settings(name, args, node_budget))


def auto_node_budget(args, methods, target_config):
    """``--node-budget auto`` for DSBD: the target's free forest on this host
    (:func:`dsbd_jax.host.forest_budget.node_budget`: measured once per host, shape and
    weight kind (``--weights``), a few seconds on a cut model, then cached), with a status
    line; ``None`` otherwise."""
    if "dsbd" not in methods or getattr(args, "node_budget", None) != "auto":
        return None
    from dsbd_jax.host.forest_budget import node_budget
    nodes, why = node_budget(target_config, getattr(args, "weights", "float"))
    _status(f"DSBD forest: {why} (--node-budget off or a number overrides it)")
    return nodes


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
        try:
            check_settings(m, settings)
            build_decoder(m, args, stand_in, stand_in if m in NEEDS_DRAFT else None,
                          progress=False)
        except ValueError as e:
            raise CLIError(option_error(str(e))) from None
    check_sources(args, methods)


# the decoders' setting names, as the command line spells them (option_error)
SETTING_OPTIONS = {"num_beams": "--beams", "max_new_tokens": "--max-new-tokens",
                   "draft_width": "--draft-width", "min_width": "--min-width",
                   "max_width": "--beams / --draft-width", "threshold": "--threshold",
                   "gamma": "--gamma", "temperature": "--temperature", "top_k": "--top-k",
                   "top_p": "--top-p", "node_budget": "--node-budget"}


def option_error(message: str) -> str:
    """A decoder's setting error as the command line's: prefixed by the option the user typed
    for the first setting it names (``num_beams`` -> ``--beams``)."""
    import re
    hits = [(m.start(), opt) for name, opt in SETTING_OPTIONS.items()
            for m in [re.search(rf"\b{name}\b", message)] if m]
    return f"{min(hits)[1]}: {message}" if hits else message


def check_sources(args, methods) -> None:
    """``--target`` and, for the drafted methods, ``--draft`` name something loadable (a
    preset, a directory, a GGUF file, a hub id, a saved model, a draft head), checked from
    their names and the disk alone, before any model is read or converted."""
    from dsbd_jax.loading.heads import cache_dir_of_heads, is_head_source
    from dsbd_jax.loading.load import check_source
    try:
        check_source(args.target, "--target")
    except ValueError as e:
        raise CLIError(str(e)) from None
    if not any(m in NEEDS_DRAFT for m in methods) or is_head_source(args.draft):
        return
    try:
        check_source(args.draft, "--draft")
    except ValueError as e:
        raise CLIError(f"{e}; nor a draft head (no trained head of that name under "
                       f"{cache_dir_of_heads()}: `dsbd train-head RECIPE` trains and "
                       f"registers one)") from None


def _with_weights(config, args, option: str):
    """``config`` as an int8 load leaves it when ``args.<option>`` is ``"int8"``
    (:func:`dsbd_jax.models.kinds.int8_config`)."""
    if getattr(args, option, "float") != "int8":
        return config
    from dsbd_jax.models.kinds import int8_config
    return int8_config(config)


@contextlib.contextmanager
def announced(what: str, after_s: float = 2.0):
    """Say on stderr what runs when it has run ``after_s`` seconds (a first run on a host
    measures the host's passes before it loads anything), and how long it took when it ends;
    a quick run (the choices already cached) says nothing."""
    import threading
    t0 = time.perf_counter()
    timer = threading.Timer(after_s, _status, (f"{what} ...",))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        if time.perf_counter() - t0 >= after_s:
            _status(f"{what}: done in {time.perf_counter() - t0:.0f} s (cached for later runs; "
                    f"`dsbd host` prints the figures)")


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
    from dsbd_jax.loading.load import load_tokenizer
    needs_draft = any(m in NEEDS_DRAFT for m in methods)
    with announced("measuring this host's passes to choose each model's dtype and weight "
                   "kind (once per host and model shape)"):
        configs = _role_configs(args, methods, needs_draft)
    target_config, draft_config = configs
    progress = progress_mode(args) == "tokens"
    decoders = {m: build_decoder(m, args, *configs, progress=progress) for m in methods}
    tokenizer = load_tokenizer(args.target)
    if tokenizer is None:
        raise CLIError(f"{args.target} has no tokenizer; cannot encode --prompt text")
    cap = min(max_prompt_length(d.config) for d in decoders.values())
    ids, lens = pad_prompts(encode_chat(tokenizer, prompts, raw), pad_id=0, max_length=cap)
    # everything checked: now the (first run: measured) node budget, for the DSBD decoder
    budget = auto_node_budget(args, methods, target_config)
    if budget is not None:
        decoders["dsbd"] = build_decoder("dsbd", args, *configs, progress=progress,
                                         node_budget=budget)
    return configs, decoders, tokenizer, ids, lens


def _role_configs(args, methods, needs_draft: bool) -> tuple:
    """``(target config, draft config or None)`` in the dtype and weight kind each role runs
    in (:func:`_role_dtype`; ``--draft-weights auto`` decided here, so that the config and the
    load agree), the choices and why recorded on ``args``."""
    from dsbd_jax.loading.heads import read_draft_config
    from dsbd_jax.loading.load import read_config
    args.dtypes, args.dtype_whys = {}, {}
    target_dtype = _role_dtype(args, "target", read_config(args.target), methods)
    target_config = _with_weights(read_config(args.target, target_dtype), args, "weights")
    draft_config = (read_draft_config(args.draft, target_config, "float32") if needs_draft
                    else None)
    if draft_config is not None:
        from dsbd_jax.models.head import is_head
        if is_head(draft_config):   # a head runs in the target's dtype
            args.dtypes["draft"] = target_dtype
            args.dtype_whys["draft"] = "a draft head runs in the target's dtype"
        else:
            draft_config = read_draft_config(
                args.draft, target_config, _role_dtype(args, "draft", draft_config, methods))
        kind = getattr(args, "draft_weights", "float")
        if kind == "int8" and is_head(draft_config):
            raise CLIError(f"--draft-weights int8 quantises a draft model; --draft "
                           f"{args.draft} is a draft head (drop --draft-weights, or give a "
                           f"draft model)")
        if kind == "auto":      # decided here, so that the config and the load agree
            from dsbd_jax.host.forms import weights_choice
            args.draft_weights, args.weights_why = (
                ("float", "int8 draft not used here: a draft head keeps its own weights")
                if is_head(draft_config) else weights_choice(draft_config, draft_config.dtype))
            args.weights_why += ("; --draft-weights float keeps them float"
                                 if args.draft_weights == "int8" else "")
        else:
            args.weights_why = f"--draft-weights {kind}"
        draft_config = _with_weights(draft_config, args, "draft_weights")
    return target_config, draft_config


def _role_dtype(args, role: str, config, methods) -> str:
    """The dtype of the model in ``role`` (``"target"`` or ``"draft"``), recorded with why in
    ``args.dtypes`` / ``args.dtype_whys``: ``--dtype`` when given, else the host plan's for the
    decoders ``methods`` in that role (:func:`dsbd_jax.host.plan.dtype_choice`: a target run
    only by sampling or beam sampling is judged on their one-token passes alone)."""
    from dsbd_jax.host.plan import dtype_choice
    dtype = getattr(args, "dtype", "auto")
    if dtype == "auto":
        dtype, why = dtype_choice(config, methods, role)
        why = f"--dtype auto for {', '.join(methods) if role == 'target' else 'a draft'}: {why}"
    else:
        why = f"--dtype {dtype}"
    args.dtypes[role], args.dtype_whys[role] = dtype, why
    return dtype


def choice_line(role: str, source, info, args) -> str:
    """One line on what a loaded model runs as: its dtype and weight kind, and why each
    (:func:`dsbd_jax.loading.checkpoint.choice_line`, with the options that chose them)."""
    from dsbd_jax.loading.checkpoint import choice_line as line
    kind_why = (getattr(args, "weights_why", None) if role == "draft"
                else f"--weights {getattr(args, 'weights', 'float')}"
                + ("" if getattr(args, "weights", "float") == "float"
                   else ": the target is another model"))
    return line(role, source, info, getattr(args, "dtype_whys", {}).get(role), kind_why)


def weights_label(info) -> str:
    """A loaded model's dtype and weight kind (:func:`dsbd_jax.loading.checkpoint.weights_label`)."""
    from dsbd_jax.loading.checkpoint import weights_label as label
    return label(info)


def load_models(args, configs):
    """Load the target (and the draft when ``configs[1]`` is not None), with a status line and
    timing for each; the loaded configs must be the ones the decoders were checked against."""
    from dsbd_jax.loading.load import load_model
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
        from dsbd_jax.loading.heads import LoadedHead
        if role == "draft" and is_head(config):
            if head:
                raise CLIError("--draft-head-rows truncates a draft model; a draft head keeps "
                               "the vocabulary rows it was trained with")
            m = LoadedHead(source, models[0].config)
        else:
            kind = getattr(args, "weights" if role == "target" else "draft_weights", "float")
            dtype = getattr(args, "dtypes", {}).get(role, getattr(args, "dtype", "auto"))
            m = load_model(source, dtype, tokenizer=False, weights=kind, **head)
        if head:
            _status(f"draft head truncated to {head['head_rows']} rows ({m.info['vocab_table']})"
                    + (" + the prompt's tokens" if head["prompt_rows"] else ""))
        if m.config != config:
            raise CLIError(f"{source}: the loaded model's config differs from the one read "
                           f"before loading (did the files change?)")
        _status(f"loaded {role} {source} ({weights_label(m.info)}) in "
                f"{time.perf_counter() - t0:.1f} s")
        print(choice_line(role, source, m.info, args), flush=True)
        models.append(m)
    return models[0], models[1]


def _run_once(call, total: int, desc: str, method: str, progress,
              rows: Optional[int] = None, channel=None, on_done=None):
    """``timed(call)``, with a token bar when ``progress`` is true or ``"tokens"`` (counting
    the first ``rows`` prompts: a sharded batch may carry padding rows after them; fed by the
    decoder's ``channel``, the ``Progress`` its config carries, which also tells ``on_done``
    the prompts as they finish), elapsed seconds when it is ``"time"``, nothing when false or
    ``"none"``."""
    from dsbd_jax.eval.timing import timed
    if progress == "time":
        ticker = ElapsedTicker(desc)
        try:
            return timed(call)
        finally:
            ticker.close()
    if not progress or progress == "none" or channel is None:
        return timed(call)
    bar = ProgressBar(total, desc, method, rows=rows)
    try:
        with channel.listen(bar), (channel.listen_done(on_done) if on_done
                                   else contextlib.nullcontext()):
            return timed(call)
    finally:
        bar.close()


def run_method(dec, target, draft, prompt_ids, prompt_lengths, seed: int = 0,
               progress: bool = False, warmup: bool = True, mesh=None, on_done=None):
    """Run one decoder (``build_decoder``); returns ``(output, compile_s, run_s)``.
    ``mesh``: decode sharded over it (``parallel.ShardedDecoder``; weights placed once).
    ``warmup=True``: a first, untimed run (compile + run), then the timed run.
    ``warmup=False``: one run; ``run_s`` = wall time minus the compile seconds JAX reports.
    ``progress``: ``True`` / ``"tokens"``, a token bar for each run (the decoder must be built
    with progress: its loop then runs in chunks driven from the host); ``"time"``, elapsed
    seconds (no callback); ``False`` / ``"none"``, nothing. ``on_done(rows, outputs)``: told
    the prompts as they finish, with the token bar (``dsbd_jax.Progress.listen_done``)."""
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
    from dsbd_jax.decoding._jit.calls import Progress
    channel = dec.config.progress if isinstance(dec.config.progress, Progress) else None
    if warmup:
        _status(f"[{name}] compiling, then one warm-up run (not timed) ...")
        _, first = _run_once(call, total, f"{name} warm-up", name, progress, rows, channel)
        out, run_s = _run_once(call, total, f"{name} timed", name, progress, rows, channel,
                               on_done)
        return out, max(first - run_s, 0.0), run_s
    CompileClock.install()
    c0 = CompileClock.total()
    out, wall = _run_once(call, total, name, name, progress, rows, channel, on_done)
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


def _print_outputs(tokenizer, name, out, prompts, run_s, shown=(), limit=None):
    """Every live beam (the ``limit`` most likely, when given) of every prompt with its
    log-likelihood (best first), but the prompts ``shown`` already (:func:`prompt_block`);
    returns the number of new tokens in the best beams."""
    import numpy as np
    gen, rate = tokens_per_second(out, run_s)
    print(f"\n=== {name}: {gen} tokens in {run_s:.2f} s = {rate:.2f} tokens/s "
          f"(best beam of each prompt)")
    stats = {k: np.asarray(v) for k, v in out.stats.items()}
    short = {k: (v.round(3).tolist() if v.size <= 8 else f"[{v.size} values]") for k, v in stats.items()}
    print(f"    stats: {short}")
    for b, text in enumerate(prompts):
        if b not in shown:
            print(prompt_block(tokenizer, out, b, text, limit=limit, method=name))
    return gen


def prompt_block(tokenizer, out, b: int, text: str, limit: Optional[int] = None,
                 method: Optional[str] = None) -> str:
    """Prompt ``b``'s live beams in ``out`` with their log-likelihoods, best first (the
    ``limit`` most likely when given: DSBD's output holds the width of the layer it ended on,
    which can exceed ``--beams``), and a note where beams repeat: which, and how to draw
    distinct ones."""
    import numpy as np
    seqs, lens = np.asarray(out.sequences[b]), np.asarray(out.lengths[b])
    ll, best = np.asarray(out.log_likelihoods[b]), int(np.asarray(out.best[b]))
    lines = [f"--- prompt {b}: {text[:70]!r}"]
    live = [w for w in np.argsort(-ll, kind="stable") if np.isfinite(ll[w])]
    order = live if limit is None else live[:limit]
    for w in order:
        n = lens[w]
        tag = "best " if w == best else ""
        lines.append(f"    {tag}beam {w}: log-lik {ll[w]:.3f} ({ll[w] / max(n, 1):.3f}/token, "
                     f"{n} tokens)")
        lines.append("      " + tokenizer.decode(seqs[w, :n].tolist(), skip_special_tokens=True)
                     .replace("\n", "\n      "))
    if len(order) < len(live):
        lines.append(f"    ({len(live)} beams in the output; the {len(order)} most likely shown, "
                     f"as --beams asks)")
    first = {}
    same = []
    for w in order:
        key = tuple(seqs[w, :lens[w]].tolist())
        if key in first:
            same.append((first[key], w))
        else:
            first[key] = w
    if same:
        pairs = ", ".join(f"{a} and {c}" for a, c in same)
        who = {"beam": "beam sampling draws its beams", "dsbd": "DSBD draws its beams",
               "tree": "tree sampling draws its candidates"}.get(method, "this method draws")
        lines.append(f"    (beams {pairs} are the same text: {who} with replacement, so it can "
                     f"draw the same beam twice; --no-replacement draws distinct beams)")
    return "\n".join(lines)
