"""The benchmark harness: methods x settings x prompts from one config file -> JSON lines + summary.

    dsbd bench configs/quick_cpu.yaml --out results/quick_cpu      # or python -m dsbd_jax bench
    dsbd plot results/quick_cpu/records.jsonl

Config file (YAML; see ``configs/quick_cpu.yaml``)::

    name: quick_cpu
    models: models/qwen_offline.yaml     # or target: / draft: (preset, HF directory or .gguf)
    dtype: float32
    datasets:                            # tasks of dsbd_jax.tasks, each with limit / path / ...
      - {task: humaneval, limit: 20}
      - {task: gsm8k, limit: 20}
    max_new_tokens: 64
    warping: {temperature: 1.0, top_k: 10, top_p: 0.8}
    eos: true                            # stop at the target's EOS (false: always max_new_tokens)
    seed: 0
    warmup: 1                            # untimed runs (>= 1: the first compiles) per method and bucket
    profile: false                       # true: phase profile of each method's first prompt per bucket
    methods:                             # lists expand to their product (min_width > draft_width skipped)
      - {method: beam, num_beams: [1, 2, 3]}
      - {method: spec, gamma: 4}
      - {method: dsbd, gamma: [2, 3], draft_width: 3, threshold: 0.9, min_width: 1}

Prompts run one at a time (batch 1) with the target's chat template, padded to power-of-two
length buckets; the loop is prompts outer, methods inner, so slow drifts of the machine hit every
method alike. Per (method, setting, prompt) one JSON line (``type: "sample"``) holds:
wall seconds of the timed call (``block_until_ready``; compile and warm-up runs excluded, compile
seconds reported apart on the line that paid them), new tokens of the returned best beam, target
and draft forward calls, iterations, DSBD's average accepted width and layers per iteration, the
best beam's unwarped target log-likelihood per token, the task metric (``score``), the completion
text, the KV-cache bytes the method holds, the process's peak device memory where JAX reports it
(``memory_stats``; none on CPU, where peak RSS is recorded) and the joules of the call
(:mod:`.energy`; ``null`` with the reason in the header line where no counter is readable).
With ``profile: true``, the first line of each method and bucket also holds ``profile``: one extra
untimed run of that prompt under the XLA:CPU profiler (:mod:`.profile`), with milliseconds per
iteration of each phase and ``overhead_frac`` (the share of the loop's time outside the forward
passes); the summary averages ``overhead_frac`` per method setting.

The first line (``type: "run"``) records the machine, the resolved config, the energy and memory
sources and the prompt buckets; ``summarize`` turns the lines into one row per method and setting,
and ``comparisons`` into DSBD's speed-up over beam sampling at matched quality and single-beam DSBD
against speculative sampling.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import logging
import math
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

logger = logging.getLogger("dsbd_jax")

_TOP_KEYS = {"name", "models", "models_file", "target", "draft", "dtype", "datasets", "max_new_tokens", "warping",
             "eos", "seed", "warmup", "methods", "description", "profile"}
_WARP_KEYS = {"temperature", "top_k", "top_p"}


# ---------------------------------------------------------------------------------------------
# config
def load_config(path, **overrides) -> Dict[str, Any]:
    """Read and validate a bench config file (module doc); ``overrides`` replace top-level keys
    (``None`` values are ignored). ``models:`` is resolved relative to the config's folder."""
    import yaml
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"bench config {path} does not exist")
    try:
        with open(path) as f:
            cfg = yaml.safe_load(f) or {}
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML ({getattr(e, 'problem', e)})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: a bench config is a mapping of keys, got {type(cfg).__name__}")
    cfg.setdefault("name", path.stem)
    return make_config(cfg, base_dir=path.parent, where=str(path), **overrides)


def make_config(cfg: Dict[str, Any], base_dir=".", where: str = "config", **overrides
                ) -> Dict[str, Any]:
    """Validate a bench config given as a dict (the keys of a config file), fill in defaults
    and expand ``methods`` into ``runs``; ``models:`` files resolve relative to ``base_dir``."""
    import yaml
    cfg = dict(cfg)
    cfg.update({k: v for k, v in overrides.items() if v is not None})
    unknown = sorted(set(cfg) - _TOP_KEYS)
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(_TOP_KEYS)}")
    if "models" in cfg:
        mpath = Path(cfg.pop("models")).expanduser()
        mpath = mpath if mpath.is_absolute() or mpath.is_file() else Path(base_dir) / mpath
        if not mpath.is_file():
            raise FileNotFoundError(f"{where}: models file {mpath} does not exist")
        with open(mpath) as f:
            pair = yaml.safe_load(f) or {}
        for k in ("target", "draft"):
            cfg.setdefault(k, pair.get(k))
        cfg["models_file"] = str(mpath)
    if not cfg.get("target"):
        raise ValueError(f"{where}: no target model (give target: or models:)")
    cfg.setdefault("name", "bench")
    cfg.setdefault("dtype", "float32")
    cfg.setdefault("max_new_tokens", 64)
    cfg.setdefault("eos", True)
    cfg.setdefault("seed", 0)
    cfg.setdefault("warmup", 1)
    cfg.setdefault("warping", {})
    cfg.setdefault("profile", False)
    if not isinstance(cfg["profile"], bool):
        raise ValueError(f"{where}: profile must be true or false, got {cfg['profile']!r}")
    bad = sorted(set(cfg["warping"]) - _WARP_KEYS)
    if bad:
        raise ValueError(f"{where}: unknown warping key(s) {bad}; allowed: {sorted(_WARP_KEYS)}")
    if not isinstance(cfg["max_new_tokens"], int) or cfg["max_new_tokens"] < 1:
        raise ValueError(f"{where}: max_new_tokens must be an int >= 1, got {cfg['max_new_tokens']!r}")
    if not isinstance(cfg["warmup"], int) or cfg["warmup"] < 1:
        raise ValueError(f"{where}: warmup must be an int >= 1 (the first run compiles and is "
                         f"never timed), got {cfg['warmup']!r}")
    if not cfg.get("datasets"):
        raise ValueError(f"{where}: datasets: needs at least one {{task: ...}} entry")
    from ..tasks import TASKS
    for d in cfg["datasets"]:
        if not isinstance(d, dict) or d.get("task") not in TASKS:
            raise ValueError(f"{where}: each datasets entry needs task: one of {TASKS}, got {d!r}")
    cfg["runs"] = expand_methods(cfg.get("methods") or [], where=where)
    if not cfg["runs"]:
        raise ValueError(f"{where}: methods: needs at least one entry")
    needs_draft = any(m in ("dsbd", "spec", "tree") for m, _ in cfg["runs"])
    if needs_draft and not cfg.get("draft"):
        raise ValueError(f"{where}: dsbd/spec/tree need a draft model (draft: or models:)")
    return cfg


def expand_methods(entries: Sequence[Dict[str, Any]], where: str = "config"
                   ) -> List[Tuple[str, Dict[str, Any]]]:
    """``[{method: dsbd, gamma: [2, 3], ...}, ...]`` -> ``[(method, setting), ...]``: list values
    expand to their product (``tree_widths`` stays a list); DSBD settings with
    ``min_width > draft_width`` are skipped. Unknown methods/settings raise ``ValueError``."""
    from ..methods import check_settings
    runs = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or "method" not in e:
            raise ValueError(f"{where}: methods entry {i} needs method:, got {e!r}")
        e = dict(e)
        method = e.pop("method")
        try:
            check_settings(method, e)
        except ValueError as err:
            raise ValueError(f"{where}: methods entry {i}: {err}") from None
        if method == "dsbd":
            from ..dsbd import DSBDConfig
            defaults = {f.name: f.default for f in dataclasses.fields(DSBDConfig)}
        keys = list(e)
        axes = [v if isinstance(v, list) and k != "tree_widths" else [v] for k, v in e.items()]
        for combo in itertools.product(*axes):
            s = dict(zip(keys, combo))
            if method == "dsbd" and (s.get("min_width", defaults["min_width"])
                                     > s.get("draft_width", defaults["draft_width"])):
                continue
            if (method, s) not in runs:
                runs.append((method, s))
    return runs


# ---------------------------------------------------------------------------------------------
# measurement pieces
class CompileClock:
    """Seconds JAX spends tracing, lowering and compiling (``jax.monitoring`` events)."""

    EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
              "/jax/core/compile/jaxpr_to_mlir_module_duration",
              "/jax/core/compile/backend_compile_duration")
    _total = 0.0
    _registered = False

    @classmethod
    def install(cls) -> None:
        if not cls._registered:
            import jax.monitoring

            def listener(event, duration, **_):
                if event in cls.EVENTS:
                    cls._total += duration
            jax.monitoring.register_event_duration_secs_listener(listener)
            cls._registered = True

    @classmethod
    def total(cls) -> float:
        return cls._total


def kv_cache_bytes(decoder, prompt_len: int, batch: int = 1) -> int:
    """Bytes of the KV caches (target + draft) ``decoder`` allocates for ``batch`` prompts padded
    to ``prompt_len``: shapes from ``jax.eval_shape`` of the method's own state initialisation."""
    import jax
    import jax.numpy as jnp
    from .. import common
    cfg = decoder.config
    ids = jax.ShapeDtypeStruct((batch, prompt_len), jnp.int32)
    lens = jax.ShapeDtypeStruct((batch,), jnp.int32)
    keys = jax.eval_shape(lambda: common.row_keys(jax.random.key(0), batch))

    def nbytes(tree):
        return int(sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize
                       for x in jax.tree.leaves(tree)))

    def params_of(mc):
        from ..model import init_params
        return jax.eval_shape(lambda: init_params(mc, jax.random.key(0)))

    if decoder.method == "dsbd":
        from ..dsbd import init_state
        p = {"target": params_of(cfg.target), "draft": params_of(cfg.draft)}
        st = jax.eval_shape(lambda p, i, l, k: init_state(cfg, p, i, l, k), p, ids, lens, keys)
        return nbytes((st.target_cache, st.draft_cache))
    if decoder.method in ("spec", "tree"):
        from .. import speculative
        extra = 0
        if decoder.method == "tree":
            from ..tree import draft_extra_slots
            extra = draft_extra_slots(cfg)
        p = {"target": params_of(cfg.target), "draft": params_of(cfg.draft)}
        st = jax.eval_shape(lambda p, i, l, k: speculative.init_state(cfg, p, i, l, k, extra),
                            p, ids, lens, keys)
        return nbytes((st.target_cache, st.draft_cache))
    # sample / beam / beam_search: one target cache of prompt + max_new_tokens slots per beam
    rows = batch * cfg.num_beams
    shape = jax.eval_shape(lambda: common.kvc.empty_cache(cfg.target, rows,
                                                          prompt_len + cfg.max_new_tokens))
    return nbytes(shape)


def device_memory() -> Dict[str, Any]:
    """Peak device bytes in use so far (``memory_stats``), or the reason there is none."""
    import jax
    stats = jax.devices()[0].memory_stats()
    if not stats or "peak_bytes_in_use" not in stats:
        return {"peak_device_bytes": None,
                "reason": f"{jax.devices()[0].platform} device does not report memory_stats"}
    return {"peak_device_bytes": int(stats["peak_bytes_in_use"]), "reason": None}


# ---------------------------------------------------------------------------------------------
def _prompts(cfg, tokenizer) -> List[Tuple[Any, List[int]]]:
    from ..datasets import encode_chat
    from ..tasks import load_examples
    out = []
    for d in cfg["datasets"]:
        kw = {k: d[k] for k in ("limit", "path", "split", "db_dir") if k in d}
        extra = sorted(set(d) - {"task", "limit", "path", "split", "db_dir"})
        if extra:
            raise ValueError(f"datasets entry {d!r}: unknown key(s) {extra}")
        examples = load_examples(d["task"], **kw)
        ids = encode_chat(tokenizer, [e.prompt for e in examples])
        out.extend(zip(examples, ids))
    return out


def run_bench(cfg: Dict[str, Any], out_dir, *, progress: bool = True,
              log: Callable[[str], None] = print, models: Optional[Tuple[Any, Any]] = None,
              mesh=None) -> Dict[str, Any]:
    """Run a loaded config (:func:`load_config`); write ``out_dir/records.jsonl`` and
    ``out_dir/summary.json``; return the summary. ``models``: already loaded ``(target, draft)``
    (otherwise loaded from the config). ``mesh``: a ``jax.sharding.Mesh`` from
    ``dsbd_jax.sharding.make_mesh``: every method runs sharded over it
    (:class:`dsbd_jax.sharding.ShardedDecoder`; prompts run one at a time, so a data axis > 1
    only repeats the prompt on its other shards). ``kv_cache_bytes`` stays the total."""
    import jax
    import jax.numpy as jnp
    from .. import common
    from ..loading import load_model, read_config
    from ..methods import build, label, model_params
    from ..tasks import metric_name, score
    from .energy import energy_meter
    from .timing import machine_info, peak_rss_gb

    CompileClock.install()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    eos = None if cfg["eos"] else ()
    base = dict(max_new_tokens=cfg["max_new_tokens"], eos_token_id=eos, **cfg["warping"])
    if models is None:
        dtype = jnp.dtype(cfg["dtype"])
        # every method setting is checked against the model configs before the slow load
        configs = (read_config(cfg["target"], dtype),
                   read_config(cfg["draft"], dtype) if cfg.get("draft") else None)
        for method, setting in cfg["runs"]:
            build(method, *configs, **base, **setting)
        target = load_model(cfg["target"], dtype, tokenizer=True, progress=progress)
        draft = load_model(cfg["draft"], dtype, tokenizer=False, progress=progress) \
            if cfg.get("draft") else None
    else:
        target, draft = models
    if target.tokenizer is None:
        raise ValueError(f"{cfg['target']} has no tokenizer: the harness needs one for the chat "
                         "template and the task metrics")
    load_s = time.perf_counter() - t_start
    if mesh is not None and cfg.get("profile"):
        raise ValueError("profile: true profiles the single-device program; run it without a mesh")
    prompts = _prompts(cfg, target.tokenizer)
    decoders = []
    for method, setting in cfg["runs"]:
        dec = build(method, target.config, draft.config if draft else None, **base, **setting)
        params = model_params(dec, target.params, draft.params if draft else None)
        run = dec
        if mesh is not None:
            from ..sharding import ShardedDecoder
            run = ShardedDecoder.of(dec, mesh)
            params = run.place(params)
        decoders.append((label(method, setting), method, setting, dec, params, run))
    meter = energy_meter()
    mem0 = device_memory()
    # prompts that fit are never padded past what every method's models allow
    cap = min(common.max_prompt_length(dec.config) for _, _, _, dec, _, _ in decoders)
    buckets = sorted({common.bucket_length(len(ids), maximum=cap) for _, ids in prompts})
    header = {"type": "run", "name": cfg["name"], "started": datetime.datetime.now().isoformat(),
              "machine": machine_info(), "energy": meter.describe(),
              "memory": {"device": mem0["reason"] or "memory_stats peak_bytes_in_use"},
              "config": {k: v for k, v in cfg.items() if k != "runs"},
              "runs": [lab for lab, *_ in decoders], "buckets": buckets,
              "num_prompts": len(prompts), "load_s": load_s,
              "mesh": None if mesh is None else dict(mesh.shape)}
    records_path = out_dir / "records.jsonl"
    log(f"bench {cfg['name']}: {len(decoders)} method settings x {len(prompts)} prompts "
        f"(buckets {buckets}), energy: {meter.source or 'unavailable: ' + meter.reason}")
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(decoders) * len(prompts), desc="bench", unit="run")
    warmed = set()
    kv_bytes = {}
    with open(records_path, "w") as f:
        f.write(json.dumps(header) + "\n")
        for i, (ex, ids) in enumerate(prompts):
            P = common.bucket_length(len(ids), maximum=cap)
            pid, plen = common.pad_prompts([ids], pad_id=0, length=P)
            key = jax.random.fold_in(jax.random.key(cfg["seed"]), i)
            for lab, method, setting, dec, params, run in decoders:
                compile_s = 0.0
                prof = None
                if (lab, P) not in warmed:
                    c0 = CompileClock.total()
                    for _ in range(cfg["warmup"]):
                        jax.block_until_ready(run(params, pid, key, prompt_lengths=plen))
                    compile_s = CompileClock.total() - c0
                    kv_bytes[(lab, P)] = kv_cache_bytes(dec, P)
                    warmed.add((lab, P))
                    if cfg.get("profile"):
                        from .profile import profile_decoder
                        p = profile_decoder(dec, params, pid, key, plen)
                        prof = {"phase_ms_per_iteration": p["per_iteration_ms"],
                                "decode_ms_per_iteration": p["decode_per_iteration_ms"],
                                "overhead_frac": p["overhead_frac"]}
                c0 = CompileClock.total()
                e0 = meter.read()
                t0 = time.perf_counter()
                out = jax.block_until_ready(run(params, pid, key, prompt_lengths=plen))
                seconds = time.perf_counter() - t0
                joules = meter.joules_since(e0)
                compile_s += CompileClock.total() - c0  # non-zero only on a recompile (logged)
                if CompileClock.total() > c0:
                    logger.warning("%s recompiled for a prompt of bucket %d", lab, P)
                rec = _record(out, target.tokenizer)
                rec.update(type="sample", label=lab, method=method, setting=setting,
                           task=ex.task, example_id=ex.id, prompt_tokens=len(ids), bucket=P,
                           seconds=seconds, tokens_per_s=rec["new_tokens"] / seconds,
                           compile_s=compile_s, metric=metric_name(ex.task),
                           kv_cache_bytes=kv_bytes[(lab, P)], energy_j=joules,
                           peak_device_bytes=device_memory()["peak_device_bytes"],
                           peak_rss_gb=peak_rss_gb())
                rec["score"] = score(ex, rec["completion"])
                if prof is not None:
                    rec["profile"] = prof
                f.write(json.dumps(rec) + "\n")
                f.flush()
                if bar is not None:
                    bar.set_postfix_str(f"{lab}: {rec['tokens_per_s']:.2f} tok/s")
                    bar.update(1)
    if bar is not None:
        bar.close()
    rows = summarize(read_records(records_path))
    summary = {"name": cfg["name"], "machine": header["machine"], "energy": header["energy"],
               "rows": rows, "comparisons": comparisons(rows),
               "compiles": {k: v for k, v in common.compile_count().items()},
               "wall_s": time.perf_counter() - t_start}
    with open(out_dir / "summary.json", "w") as f:
        json.dump(summary, f, indent=2)
    return summary


def _record(out, tokenizer) -> Dict[str, Any]:
    """Per-prompt figures of a batch-1 ``GenerateOutput`` (best beam)."""
    from .timing import best_beam
    bb = best_beam(out)
    stats, n, ll = bb["stats"], bb["new_tokens"], bb["loglik"]
    rec = {"new_tokens": n, "loglik": ll, "loglik_per_token": ll / n if n else None,
           **{k: bb[k] for k in ("target_calls", "draft_calls", "iterations")},
           "completion": tokenizer.decode(bb["token_ids"], skip_special_tokens=True)}
    for k in ("mean_accepted_width", "mean_layers_per_iteration", "acceptance_rate"):
        if k in stats:
            rec[k] = float(np.asarray(stats[k]).reshape(-1)[0])
    return rec


# ---------------------------------------------------------------------------------------------
# reading and summarising
def read_records(path) -> List[Dict[str, Any]]:
    """All JSON lines of a results file (``ValueError`` naming the line if one is broken)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"results file {path} does not exist")
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: not a JSON line ({e.msg})") from None
    return out


def summarize(records: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per method setting (in first-seen order) from ``type: "sample"`` lines:
    tokens/s = all new tokens / all timed seconds; calls per token likewise; quality = mean over
    prompts of log-likelihood per token (and its perplexity) and of each task's metric;
    energy = joules / token where every line has a reading (else ``None``)."""
    groups: Dict[str, List[Dict[str, Any]]] = {}
    for r in records:
        if r.get("type") == "sample":
            groups.setdefault(r["label"], []).append(r)
    rows = []
    for lab, rs in groups.items():
        tok = sum(r["new_tokens"] for r in rs)
        sec = sum(r["seconds"] for r in rs)
        lls = [r["loglik_per_token"] for r in rs if r["loglik_per_token"] is not None]
        ll = float(np.mean(lls)) if lls else None
        row = {"label": lab, "method": rs[0]["method"], "setting": rs[0]["setting"],
               "prompts": len(rs), "new_tokens": tok, "seconds": sec,
               "tokens_per_s": tok / sec if sec > 0 else None,
               "target_calls_per_token": sum(r["target_calls"] for r in rs) / max(tok, 1),
               "draft_calls_per_token": sum(r["draft_calls"] for r in rs) / max(tok, 1),
               "loglik_per_token": ll,
               "perplexity": None if ll is None else math.exp(min(-ll, 700.0)),
               "compile_s": sum(r.get("compile_s", 0.0) for r in rs),
               "kv_cache_bytes": max(r["kv_cache_bytes"] for r in rs)}
        for k in ("mean_accepted_width", "mean_layers_per_iteration"):
            vals = [r[k] for r in rs if r.get(k) is not None]
            row[k] = float(np.mean(vals)) if vals else None
        profs = [r["profile"]["overhead_frac"] for r in rs if r.get("profile")]
        row["overhead_frac"] = float(np.mean(profs)) if profs else None
        peaks = [r["peak_device_bytes"] for r in rs if r.get("peak_device_bytes") is not None]
        row["peak_device_bytes"] = max(peaks) if peaks else None
        joules = [r.get("energy_j") for r in rs]
        row["joules_per_token"] = (sum(joules) / max(tok, 1)
                                   if all(j is not None for j in joules) else None)
        tasks = {}
        for r in rs:
            if r.get("score") is not None:
                tasks.setdefault(f"{r['task']}/{r['metric']}", []).append(r["score"])
        row["task_metrics"] = {k: float(np.mean(v)) for k, v in tasks.items()}
        rows.append(row)
    return rows


def comparisons(rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """DSBD against the baselines, from ``summarize`` rows:

    * each multi-beam DSBD setting vs the beam-sampling setting of the highest quality it matches
      or beats (log-likelihood per token): ``speedup`` = DSBD tokens/s / beam tokens/s; if it
      beats none, vs the lowest-quality beam setting, flagged ``quality_matched: False``;
    * each single-beam DSBD setting vs every speculative-sampling setting.
    """
    rows = [r for r in rows if r["tokens_per_s"] and r["loglik_per_token"] is not None]
    beams = [r for r in rows if r["method"] == "beam"]
    specs = [r for r in rows if r["method"] == "spec"]
    out = []
    for r in rows:
        if r["method"] != "dsbd":
            continue
        if r["setting"].get("single_beam"):
            for s in specs:
                out.append({"dsbd": r["label"], "baseline": s["label"], "kind": "single-beam vs spec",
                            "speedup": r["tokens_per_s"] / s["tokens_per_s"],
                            "dsbd_loglik_per_token": r["loglik_per_token"],
                            "baseline_loglik_per_token": s["loglik_per_token"]})
            continue
        if not beams:
            continue
        matched = [b for b in beams if r["loglik_per_token"] >= b["loglik_per_token"]]
        b = max(matched, key=lambda b: b["loglik_per_token"]) if matched else \
            min(beams, key=lambda b: b["loglik_per_token"])
        out.append({"dsbd": r["label"], "baseline": b["label"], "kind": "vs beam sampling",
                    "quality_matched": bool(matched),
                    "speedup": r["tokens_per_s"] / b["tokens_per_s"],
                    "dsbd_loglik_per_token": r["loglik_per_token"],
                    "baseline_loglik_per_token": b["loglik_per_token"]})
    return out


def format_summary(summary: Dict[str, Any], markdown: bool = False) -> str:
    """The summary table and the comparisons as plain text (``markdown=True``: a Markdown table
    and a bullet list, as pasted into docs/results.md)."""
    def fmt(v, nd=3):
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.{nd}f}" if abs(v) < 1e4 else f"{v:.3g}"
        return str(v)
    cols = [("label", "method"), ("tokens_per_s", "tok/s"), ("target_calls_per_token", "tgt calls/tok"),
            ("mean_accepted_width", "acc. width"), ("mean_layers_per_iteration", "layers/iter"),
            ("loglik_per_token", "loglik/tok"), ("joules_per_token", "J/tok"),
            ("kv_cache_bytes", "KV MB"), ("compile_s", "compile s")]
    if not summary["rows"]:
        return "no results"
    metric_keys = sorted({k for r in summary["rows"] for k in r["task_metrics"]})
    header = [c[1] for c in cols] + metric_keys
    lines = []
    for r in summary["rows"]:
        cells = []
        for k, _ in cols:
            v = r.get(k)
            cells.append(fmt(v / 1e6, 1) if k == "kv_cache_bytes" and v is not None
                         else fmt(v, 4 if k == "loglik_per_token" else 3))
        cells += [fmt(r["task_metrics"].get(k)) for k in metric_keys]
        lines.append(cells)
    if markdown:
        text = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        text += ["| " + " | ".join(cells) + " |" for cells in lines]
        bullet = "- "
    else:
        widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(header)]
        text = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
        text += ["  ".join(c.ljust(w) for c, w in zip(cells, widths)) for cells in lines]
        bullet = ""
    if summary.get("energy", {}).get("source") is None:
        text.append(f"{bullet}energy: unavailable ({summary.get('energy', {}).get('reason')})")
    for c in summary.get("comparisons", []):
        note = "" if c.get("quality_matched", True) else " (quality NOT matched)"
        text.append(f"{bullet}{c['dsbd']} vs {c['baseline']}: {c['speedup']:.2f}x{note} "
                    f"(loglik/tok {c['dsbd_loglik_per_token']:.4f} vs "
                    f"{c['baseline_loglik_per_token']:.4f})")
    return "\n".join(text)
