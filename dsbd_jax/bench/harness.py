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
    warmup: 1                            # untimed runs per method and bucket (0: compile only)
    batch_size: 4                        # prompts per call (default: 4 on CPU, 16 on GPU/TPU)
    profile: false                       # true: phase profile of each method's first prompt per bucket
    methods:                             # lists expand to their product (min_width > draft_width skipped)
      - {method: beam, num_beams: [1, 2, 3]}
      - {method: spec, gamma: 4}
      - {method: dsbd, gamma: [2, 3], draft_width: 3, threshold: 0.9, min_width: 1}

Prompts run in batches of ``batch_size`` (default :func:`default_batch_size`: 4 on CPU, 16 on
GPU/TPU) prompts of one power-of-two length bucket, with the target's chat template; a short last
batch of a bucket is filled up with copies of its last prompt (no records for those), so each
method compiles once per bucket. The loop is batches outer, methods inner, so slow drifts of the
machine hit every method alike and a run stopped part way has covered every method on the same
problems. Each prompt has its own PRNG key (:func:`prompt_keys`), so its sample does not depend on
its batch mates. Per (method, setting, prompt) one JSON line (``type: "sample"``) holds:
its share of its batch's wall seconds (``seconds`` = ``batch_seconds`` / prompts in the batch;
``block_until_ready``; compile and warm-up runs excluded, compile seconds reported apart on the
line that paid them; with ``warmup: 0`` each method's program is compiled ahead of time for each
bucket (``Decoder.compiled``) and nothing runs untimed, and a timed call that compiled anyway is run
and timed again) and of the prompt passes timed alone (``prefill_s``), new tokens of the
returned best beam, target and draft forward calls of the batch and ``row_target_calls`` (the
target passes this prompt took part in), iterations, DSBD's average accepted width and layers per
iteration, the best beam's unwarped target log-likelihood per token, the task metric
(``score``), the completion text, the KV-cache bytes per prompt (and per batch), the process's
peak device memory where JAX reports it (``memory_stats``; none on CPU, where peak RSS is
recorded) and the joules of the call (:mod:`.energy`; ``null`` with the reason in the header
line where no counter is readable).

**Resuming.** Records are written batch by batch (flushed and synced). Started again with the
same config and output folder, a run keeps what was written, skips the (method, prompt) pairs
done, drops a last line cut off by a kill, and appends a ``type: "resume"`` line; a different
config is refused, naming the keys that differ (:func:`resume_state`; ``warmup`` may change, as it
decides only how compiling is kept out of the timings). A progress bar shows
done/total with an estimate of the time left. ``dsbd summary OUT`` summarises a run at any point.
With ``profile: true``, the first line of each method and bucket also holds ``profile``: one extra
untimed run of that prompt under the XLA:CPU profiler (:mod:`.profile`), with milliseconds per
iteration of each phase and ``overhead_frac`` (the share of the loop's time outside the forward
passes); the summary averages ``overhead_frac`` per method setting.

The first line (``type: "run"``) records the machine, the resolved config, the energy and memory
sources and the prompt buckets; ``summarize`` turns the lines into one row per method and setting
(task metrics with Wilson 95% intervals, log-likelihoods with bootstrap intervals, see
:mod:`.stats`), ``comparisons`` into DSBD's speed-up over beam sampling at matched quality and
single-beam DSBD against speculative sampling, and ``quality_differences`` into paired
differences between DSBD and each baseline on the same problems.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

logger = logging.getLogger("dsbd_jax")

_TOP_KEYS = {"name", "models", "models_file", "target", "draft", "dtype", "datasets", "max_new_tokens", "warping",
             "eos", "seed", "warmup", "methods", "description", "profile", "batch_size"}
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
    if cfg.get("batch_size") is None:
        cfg["batch_size"] = default_batch_size()
    if isinstance(cfg["batch_size"], bool) or not isinstance(cfg["batch_size"], int) \
            or cfg["batch_size"] < 1:
        raise ValueError(f"{where}: batch_size must be an int >= 1, got {cfg['batch_size']!r}")
    if not isinstance(cfg["profile"], bool):
        raise ValueError(f"{where}: profile must be true or false, got {cfg['profile']!r}")
    bad = sorted(set(cfg["warping"]) - _WARP_KEYS)
    if bad:
        raise ValueError(f"{where}: unknown warping key(s) {bad}; allowed: {sorted(_WARP_KEYS)}")
    if not isinstance(cfg["max_new_tokens"], int) or cfg["max_new_tokens"] < 1:
        raise ValueError(f"{where}: max_new_tokens must be an int >= 1, got {cfg['max_new_tokens']!r}")
    if isinstance(cfg["warmup"], bool) or not isinstance(cfg["warmup"], int) \
            or cfg["warmup"] < 0:
        raise ValueError(f"{where}: warmup must be an int >= 0 (untimed runs per method and "
                         f"bucket; 0: compile ahead of time only), got {cfg['warmup']!r}")
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
def default_batch_size() -> int:
    """The harness's batch size when a config gives none: 4 on CPU (decoding is bandwidth-bound
    there, so 4 prompts per forward pass cost little more than one; measured in
    ``docs/results.md``), 16 on GPU/TPU."""
    import jax
    return 4 if jax.default_backend() == "cpu" else 16


def _prompts(cfg, tokenizer) -> List[Tuple[Any, List[int], int]]:
    """``(example, token ids, datasets entry index)`` of every prompt, in config order."""
    from ..datasets import encode_chat
    from ..tasks import load_examples
    out = []
    for n, d in enumerate(cfg["datasets"]):
        kw = {k: d[k] for k in ("limit", "path", "split", "db_dir") if k in d}
        extra = sorted(set(d) - {"task", "limit", "path", "split", "db_dir"})
        if extra:
            raise ValueError(f"datasets entry {d!r}: unknown key(s) {extra}")
        examples = load_examples(d["task"], **kw)
        ids = encode_chat(tokenizer, [e.prompt for e in examples])
        out.extend((e, i, n) for e, i in zip(examples, ids))
    return out


@dataclasses.dataclass(frozen=True)
class Batch:
    """Prompts that run as one call: ``prompts`` are indices into the run's prompt list, all of
    length bucket ``bucket``; ``index`` is the batch's place in the run."""

    index: int
    bucket: int
    prompts: Tuple[int, ...]


def plan_batches(buckets: Sequence[int], sources: Sequence[int], batch_size: int) -> List[Batch]:
    """Group prompts into batches of at most ``batch_size`` of one length bucket.

    ``buckets[i]`` / ``sources[i]``: prompt ``i``'s padded length and datasets entry. Within a
    bucket the datasets take turns (first of each, then second of each, ...), and the batches of
    different buckets take turns too, so that a run stopped part way has covered every dataset
    and bucket alike. The plan depends only on its arguments, so a resumed run makes the same
    batches."""
    if len(buckets) != len(sources):
        raise ValueError("plan_batches: one bucket and one source per prompt")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    by_bucket: Dict[int, List[int]] = {}
    for i, P in enumerate(buckets):
        by_bucket.setdefault(P, []).append(i)
    chunks = []  # (turn within bucket, bucket, prompts)
    for P, idx in sorted(by_bucket.items()):
        seen: Dict[int, int] = {}
        rank = []
        for i in idx:
            rank.append((seen.get(sources[i], 0), sources[i], i))
            seen[sources[i]] = seen.get(sources[i], 0) + 1
        order = [i for *_, i in sorted(rank)]
        for t, s in enumerate(range(0, len(order), batch_size)):
            chunks.append((t, P, tuple(order[s:s + batch_size])))
    chunks.sort(key=lambda c: (c[0], c[1]))
    return [Batch(n, P, idx) for n, (_, P, idx) in enumerate(chunks)]


def prompt_keys(seed: int, indices: Sequence[int]):
    """Typed PRNG keys ``[len(indices)]``, one per prompt: prompt ``i`` always gets the key a
    batch-1 call with ``fold_in(key(seed), i)`` gives its only row, whatever batch it runs in."""
    import jax
    import jax.numpy as jnp
    base = jax.random.key(seed)
    return jax.vmap(lambda i: jax.random.fold_in(jax.random.fold_in(base, i), 0))(
        jnp.asarray(list(indices), jnp.int32))


# may differ between machines or edits; ``warmup`` only decides how compilation is kept out of
# the timings (untimed runs or ahead-of-time compiles), not what a record holds
_RESUME_IGNORED = ("description", "models_file", "warmup")


def _comparable(config: Dict[str, Any]) -> Dict[str, Any]:
    return json.loads(json.dumps({k: v for k, v in config.items()
                                  if k not in _RESUME_IGNORED and k != "runs"}))


def resume_state(records_path, config: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """What an earlier run of ``config`` left in ``records_path``, or ``None`` if there is none.

    Returns ``{"done": {(label, prompt_index), ...}, "records": n}``. A last line cut off by a
    kill (no newline, or not JSON) is removed from the file; every earlier line must be JSON.
    ``ValueError`` if the file was written by a different config (naming the keys that differ)
    or has no ``type: "run"`` header first."""
    path = Path(records_path)
    if not path.is_file() or path.stat().st_size == 0:
        return None
    with open(path, "rb") as f:
        data = f.read()
    keep = data.rfind(b"\n") + 1  # bytes up to the last complete line
    tail = data[keep:]
    if tail.strip():
        try:
            json.loads(tail)  # a whole record whose newline was never written: keep it
            with open(path, "ab") as f:
                f.write(b"\n")
            keep = len(data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            logger.warning("%s: dropping a cut-off last line (%d bytes)", path, len(tail))
            with open(path, "r+b") as f:
                f.truncate(keep)
    lines = data[:keep].decode().splitlines()
    records = []
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not a JSON line ({e.msg}); the records file is "
                                 "damaged before its last line, so the run cannot resume") from None
    if not records:
        return None
    head = records[0]
    if head.get("type") != "run":
        raise ValueError(f"{path}: the first line is not a run header; not a dsbd bench records file")
    old, new = _comparable(head.get("config", {})), _comparable(config)
    if old != new:
        keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        raise ValueError(
            f"{path} holds a run of a different config (differs in: {', '.join(keys)}); resuming "
            "would mix two configs. Use another output folder (--out), or delete the file to "
            "start over")
    done = {(r["label"], r["prompt_index"]) for r in records
            if r.get("type") == "sample" and "prompt_index" in r}
    return {"done": done, "records": len(done)}


def prefill_seconds(model, P: int, ids, lens, repeats: int = 2) -> float:
    """Median wall seconds of ``model``'s prompt pass over the padded batch ``ids`` (compiled
    first, untimed): what a decoder's end-to-end time holds besides decoding."""
    import jax
    from .. import common
    f = jax.jit(lambda p, i, n: common.prefill(model.config, p, i, n, P + 1)[1])
    jax.block_until_ready(f(model.params, ids, lens))
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(model.params, ids, lens))
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def run_bench(cfg: Dict[str, Any], out_dir, *, progress: bool = True,
              log: Callable[[str], None] = print, models: Optional[Tuple[Any, Any]] = None,
              mesh=None) -> Dict[str, Any]:
    """Run a loaded config (:func:`load_config`); write ``out_dir/records.jsonl`` and
    ``out_dir/summary.json``; return the summary.

    Prompts run in batches of ``cfg["batch_size"]`` prompts of one length bucket
    (:func:`plan_batches`; a short last batch is filled up with copies of its last prompt, whose
    results are dropped, so each bucket compiles once). The loop is batches outer, methods
    inner. If ``out_dir/records.jsonl`` already holds part of a run of the same config, the run
    resumes: records written are kept, (method, prompt) pairs already done are skipped, and a
    ``type: "resume"`` line notes the restart (:func:`resume_state`; ``ValueError`` if the config
    differs). ``models``: already loaded ``(target, draft)`` (otherwise loaded from the config).
    ``mesh``: a ``jax.sharding.Mesh`` from ``dsbd_jax.sharding.make_mesh``: every method runs
    sharded over it (:class:`dsbd_jax.sharding.ShardedDecoder`). ``kv_cache_bytes`` stays the
    total."""
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
    records_path = out_dir / "records.jsonl"
    resumed = resume_state(records_path, cfg)  # a changed config fails here, before the load
    done = resumed["done"] if resumed else set()
    t_start = time.perf_counter()
    eos = None if cfg["eos"] else ()
    base = dict(max_new_tokens=cfg["max_new_tokens"], eos_token_id=eos, **cfg["warping"])
    if mesh is not None and cfg.get("profile"):
        raise ValueError("profile: true profiles the single-device program; run it without a mesh")
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
    B = cfg["batch_size"]
    prompt_buckets = [common.bucket_length(len(ids), maximum=cap) for _, ids, _ in prompts]
    batches = plan_batches(prompt_buckets, [src for *_, src in prompts], B)
    buckets = sorted(set(prompt_buckets))
    total = len(decoders) * len(prompts)
    if resumed is None:
        header = {"type": "run", "name": cfg["name"], "started": datetime.datetime.now().isoformat(),
                  "machine": machine_info(), "energy": meter.describe(),
                  "memory": {"device": mem0["reason"] or "memory_stats peak_bytes_in_use"},
                  "config": {k: v for k, v in cfg.items() if k != "runs"},
                  "runs": [lab for lab, *_ in decoders],
                  "buckets": buckets, "num_prompts": len(prompts), "batch_size": B,
                  "num_batches": len(batches), "load_s": load_s,
                  "mesh": None if mesh is None else dict(mesh.shape)}
        with open(records_path, "w") as f:
            f.write(json.dumps(header) + "\n")
    else:
        with open(records_path, "a") as f:
            f.write(json.dumps({"type": "resume", "started": datetime.datetime.now().isoformat(),
                                "machine": machine_info(), "done": len(done), "total": total,
                                "load_s": load_s}) + "\n")
    log(f"bench {cfg['name']}: {len(decoders)} method settings x {len(prompts)} prompts in "
        f"{len(batches)} batches of <= {B} (buckets {buckets})"
        + (f", resuming: {len(done)}/{total} done" if resumed else "")
        + f", energy: {meter.source or 'unavailable: ' + meter.reason}")
    bar = None
    if progress:
        from tqdm.auto import tqdm
        # smoothing 0: the ETA uses this session's average rate over all methods and batches
        bar = tqdm(total=total, initial=len(done), desc="bench", unit="run", smoothing=0)
    warmed = set()
    kv_bytes: Dict[Tuple[str, int], int] = {}
    prefill_s: Dict[Tuple[str, int], float] = {}
    with open(records_path, "a") as f:
        for batch in batches:
            P, idx = batch.bucket, list(batch.prompts)
            rows = idx + [idx[-1]] * (B - len(idx))  # fillers: copies of the last prompt
            pid, plen = common.pad_prompts([prompts[i][1] for i in rows], pad_id=0, length=P)
            keys = prompt_keys(cfg["seed"], rows)
            for lab, method, setting, dec, params, run in decoders:
                todo = [r for r, i in enumerate(idx) if (lab, i) not in done]
                if not todo:
                    continue
                compile_s = 0.0
                prof = None
                if (lab, P) not in warmed:
                    c0 = CompileClock.total()
                    if cfg["warmup"] == 0:  # compile ahead of time, run nothing
                        run.compiled(params, pid, keys, prompt_lengths=plen)
                    for _ in range(cfg["warmup"]):
                        jax.block_until_ready(run(params, pid, keys, prompt_lengths=plen))
                    compile_s = CompileClock.total() - c0
                    kv_bytes[(lab, P)] = kv_cache_bytes(dec, P, B)
                    warmed.add((lab, P))
                    if cfg.get("profile"):
                        from .profile import profile_decoder
                        p = profile_decoder(dec, params, pid, keys, plen)
                        prof = {"phase_ms_per_iteration": p["per_iteration_ms"],
                                "decode_ms_per_iteration": p["decode_per_iteration_ms"],
                                "overhead_frac": p["overhead_frac"]}
                for _ in range(2):  # a call that compiled is not timed: it runs again
                    c0 = CompileClock.total()
                    e0 = meter.read()
                    t0 = time.perf_counter()
                    out = jax.block_until_ready(run(params, pid, keys, prompt_lengths=plen))
                    seconds = time.perf_counter() - t0
                    joules = meter.joules_since(e0)
                    compile_s += CompileClock.total() - c0  # non-zero only on a recompile
                    if CompileClock.total() == c0:
                        break
                    logger.warning("%s compiled during a timed batch of bucket %d; timing it "
                                   "again", lab, P)
                pre = 0.0
                for name, m in (("target", target), ("draft", draft)):
                    if name == "draft" and not dec.needs_draft:
                        continue
                    if mesh is None and (name, P) not in prefill_s:
                        prefill_s[(name, P)] = prefill_seconds(m, P, pid, plen)
                    pre += prefill_s.get((name, P), float("nan"))
                n = len(idx)
                lines = []
                for r in todo:
                    ex, ids, _ = prompts[idx[r]]
                    rec = _record(out, target.tokenizer, r)
                    rec.update(type="sample", label=lab, method=method, setting=setting,
                               task=ex.task, example_id=ex.id, prompt_index=idx[r],
                               prompt_tokens=len(ids), bucket=P, batch=batch.index,
                               batch_size=B, batch_prompts=n, batch_seconds=seconds,
                               seconds=seconds / n, prefill_s=pre / n if mesh is None else None,
                               tokens_per_s=rec["new_tokens"] / (seconds / n),
                               compile_s=compile_s if r == todo[0] else 0.0,
                               metric=metric_name(ex.task),
                               kv_cache_bytes=kv_bytes[(lab, P)] // B,
                               kv_cache_bytes_batch=kv_bytes[(lab, P)],
                               energy_j=None if joules is None else joules / n,
                               peak_device_bytes=device_memory()["peak_device_bytes"],
                               peak_rss_gb=peak_rss_gb())
                    rec["score"] = score(ex, rec["completion"])
                    if prof is not None and r == todo[0]:
                        rec["profile"] = prof
                    lines.append(json.dumps(rec) + "\n")
                    done.add((lab, idx[r]))
                f.write("".join(lines))  # one batch's records at once: a kill loses whole batches
                f.flush()
                os.fsync(f.fileno())
                if bar is not None:
                    new = sum(int(out.lengths[r, int(out.best[r])]) for r in todo)
                    bar.set_postfix_str(f"{lab}: {new / seconds:.2f} tok/s, bucket {P}")
                    bar.update(len(todo))
    if bar is not None:
        bar.close()
    summary = summary_of(records_path)
    summary.update(compiles={k: v for k, v in common.compile_count().items()},
                   wall_s=time.perf_counter() - t_start)
    with open(out_dir / "summary.json", "w") as f:
        json.dump(summary, f, indent=2)
    return summary


def summary_of(records_path) -> Dict[str, Any]:
    """The summary of a records file, finished or not (``dsbd summary``): the rows of
    :func:`summarize`, :func:`comparisons`, :func:`quality_differences`, and how much of the
    run is done (``done`` / ``total`` (method, prompt) pairs, ``complete``)."""
    records = read_records(records_path)
    head = records[0] if records and records[0].get("type") == "run" else {}
    rows = summarize(records)
    done = sum(1 for r in records if r.get("type") == "sample")
    total = len(head.get("runs", [])) * head.get("num_prompts", 0) or done
    return {"name": head.get("name"), "machine": head.get("machine"), "energy": head.get("energy"),
            "batch_size": head.get("batch_size"), "complete": done >= total, "done": done,
            "total": total, "sessions": 1 + sum(r.get("type") == "resume" for r in records),
            "rows": rows, "comparisons": comparisons(rows),
            "quality_differences": quality_differences(records)}


def _record(out, tokenizer, row: int = 0) -> Dict[str, Any]:
    """Per-prompt figures of row ``row`` of a ``GenerateOutput`` (its best beam).
    ``target_calls`` / ``draft_calls`` / ``iterations`` are the whole batch's;
    ``row_target_calls`` counts the target passes in which this prompt was still decoding
    (prefill included)."""
    from .timing import best_beam
    bb = best_beam(out, row)
    stats, n, ll = bb["stats"], bb["new_tokens"], bb["loglik"]
    rec = {"new_tokens": n, "loglik": ll, "loglik_per_token": ll / n if n else None,
           **{k: bb[k] for k in ("target_calls", "draft_calls", "iterations")},
           "completion": tokenizer.decode(bb["token_ids"], skip_special_tokens=True)}
    if "row_iterations" in stats:  # speculative, tree, DSBD: one target pass per iteration
        rec["row_target_calls"] = int(np.asarray(stats["row_iterations"]).reshape(-1)[row]) + 1
    else:  # sample / beam: the prefill, then one step per token after the first
        rec["row_target_calls"] = max(n, 1)
    for k in ("mean_accepted_width", "mean_layers_per_iteration", "acceptance_rate"):
        if k in stats:
            v = np.asarray(stats[k]).reshape(-1)
            rec[k] = float(v[row] if v.size > 1 else v[0])
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
    """One row per method setting (in first-seen order) from ``type: "sample"`` lines.

    Speeds: tokens/s = all new tokens / all timed seconds (each prompt holds its share of its
    batch's wall time, so this is the throughput at the batch size used, ``batch_size``);
    ``decode_tokens_per_s`` leaves out the prompt passes (``prefill_s``, timed alone).
    ``target_calls_per_token``: target passes each prompt took part in / its tokens, summed
    (comparable across batch sizes); ``batch_target_calls_per_token``: the batch's passes.
    Quality: mean over prompts of log-likelihood per token with a bootstrap 95% interval
    (``loglik_interval``; per task in ``loglik_by_task``), and each task's metric
    (``task_metrics``: the mean; ``task_intervals``: Wilson 95% intervals, see :mod:`.stats`).
    Energy = joules / token where every line has a reading (else ``None``)."""
    from .stats import bootstrap_interval, wilson_interval
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
        pre = [r.get("prefill_s") for r in rs]
        decode_s = sec - sum(pre) if all(p is not None for p in pre) else None
        batches = {}  # one record per batch: its target_calls / draft_calls are the batch's
        for n, r in enumerate(rs):  # records without a batch (older files) are batches of one
            batches.setdefault(r.get("batch", f"line{n}"), r)
        row = {"label": lab, "method": rs[0]["method"], "setting": rs[0]["setting"],
               "prompts": len(rs), "new_tokens": tok, "seconds": sec,
               "batch_size": max(r.get("batch_size", 1) for r in rs),
               "tokens_per_s": tok / sec if sec > 0 else None,
               "decode_tokens_per_s": tok / decode_s if decode_s and decode_s > 0 else None,
               "mean_new_tokens": tok / len(rs),
               "target_calls_per_token": sum(r.get("row_target_calls", r["target_calls"])
                                             for r in rs) / max(tok, 1),
               "batch_target_calls_per_token": sum(b["target_calls"] for b in batches.values())
               / max(tok, 1),
               "draft_calls_per_token": sum(b["draft_calls"] for b in batches.values())
               / max(tok, 1),
               "loglik_per_token": ll,
               "loglik_interval": bootstrap_interval(lls),
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
        tasks, by_task = {}, {}
        for r in rs:
            if r.get("score") is not None:
                tasks.setdefault(f"{r['task']}/{r['metric']}", []).append(r["score"])
            if r["loglik_per_token"] is not None:
                by_task.setdefault(r["task"], []).append(r["loglik_per_token"])
        row["task_metrics"] = {k: float(np.mean(v)) for k, v in tasks.items()}
        row["task_intervals"] = {k: wilson_interval(sum(v), len(v)) for k, v in tasks.items()}
        row["loglik_by_task"] = {k: bootstrap_interval(v) for k, v in by_task.items()}
        rows.append(row)
    return rows


def quality_differences(records: Iterable[Dict[str, Any]],
                        pairs: Optional[Sequence[Tuple[str, str]]] = None) -> List[Dict[str, Any]]:
    """Paired differences on the prompts both settings ran: by default each DSBD setting against
    each other (non-DSBD) method setting; ``pairs`` names other ``(a, b)`` label pairs (``a``
    minus ``b``; both keys of the result keep the names ``dsbd`` and ``baseline``). For every
    task metric and the log-likelihood per token per task: the mean difference with a bootstrap
    95% interval over prompts (:func:`.stats.paired_difference`). Where the records hold two or
    more task metrics, ``pooled/task_metric`` pairs them over all their prompts together (each
    score is 0 or 1 for pass@1 and exact match), which narrows the interval. An interval above 0
    says ``a`` is better on these problems; one containing 0 says the run cannot tell them
    apart."""
    from .stats import paired_difference
    per: Dict[str, Dict[str, Dict[Any, float]]] = {}
    method_of = {}
    metrics = set()
    for r in records:
        if r.get("type") != "sample":
            continue
        key = r.get("prompt_index", (r["task"], r["example_id"]))
        figs = per.setdefault(r["label"], {})
        method_of[r["label"]] = r["method"]
        if r.get("score") is not None:
            metrics.add(f"{r['task']}/{r['metric']}")
            figs.setdefault(f"{r['task']}/{r['metric']}", {})[key] = r["score"]
        if r["loglik_per_token"] is not None:
            figs.setdefault(f"{r['task']}/loglik_per_token", {})[key] = r["loglik_per_token"]
    if len(metrics) >= 2:  # one metric alone: the pooled row would repeat that task's row
        for figs in per.values():
            figs["pooled/task_metric"] = {(m, k): v for m in sorted(metrics) if m in figs
                                          for k, v in figs[m].items()}
    if pairs is None:
        pairs = [(a, b) for a in per if method_of[a] == "dsbd"
                 for b in per if b != a and method_of[b] != "dsbd"]
    out = []
    for a, b in pairs:
        if a not in per or b not in per:
            raise ValueError(f"quality_differences: no records for {a if a not in per else b!r} "
                             f"(labels: {sorted(per)})")
        fa, fb = per[a], per[b]
        for fig in sorted(set(fa) & set(fb)):
            d = paired_difference(fa[fig], fb[fig])
            if d["n"]:
                out.append({"dsbd": a, "baseline": b, "figure": fig, **d})
    return out


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
    cols = [("label", "method"), ("tokens_per_s", "tok/s"), ("decode_tokens_per_s", "decode tok/s"),
            ("target_calls_per_token", "tgt calls/tok"),
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
        for k in metric_keys:
            iv = r.get("task_intervals", {}).get(k)
            cells.append(fmt(r["task_metrics"].get(k)) if not iv else
                         f"{iv['mean']:.3f} [{iv['lo']:.2f}, {iv['hi']:.2f}] n={iv['n']}")
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
    if summary.get("batch_size"):
        text.append(f"{bullet}batch size {summary['batch_size']}; task metrics with Wilson 95% "
                    "intervals" + ("" if summary.get("complete", True) else
                                   f"; PARTIAL run: {summary['done']}/{summary['total']} done"))
    for c in summary.get("comparisons", []):
        note = "" if c.get("quality_matched", True) else " (quality NOT matched)"
        text.append(f"{bullet}{c['dsbd']} vs {c['baseline']}: {c['speedup']:.2f}x{note} "
                    f"(loglik/tok {c['dsbd_loglik_per_token']:.4f} vs "
                    f"{c['baseline_loglik_per_token']:.4f})")
    return "\n".join(text)
