"""Running the benchmark: :func:`run_bench` times every method setting of a config over its
prompts, batch by batch, and writes the records (:mod:`.records`) and the summary
(:mod:`.summary`); the measurement pieces it uses: :class:`CompileClock`, :func:`kv_cache_bytes`,
:func:`device_memory`, :func:`prefill_seconds`. The config and the plan are :mod:`.plan`'s.
"""

from __future__ import annotations

import datetime
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

import dsbd_jax
from dsbd_jax.eval.plan import plan_prompts, plan_batches, prompt_keys
from dsbd_jax.eval.records import record_of, resume_state
from dsbd_jax.eval.summary import summary_of

logger = logging.getLogger("dsbd_jax")


# ---------------------------------------------------------------------------------------------
# measurement pieces
class CompileClock:
    """Seconds JAX spends tracing, lowering and compiling, and reading decoder programs back
    from the program store (``jax.monitoring`` events; :mod:`dsbd_jax.decoding._jit.programs`)."""

    EVENTS = ("/jax/core/compile/jaxpr_trace_duration",
              "/jax/core/compile/jaxpr_to_mlir_module_duration",
              "/jax/core/compile/backend_compile_duration",
              "/dsbd_jax/program_store/read_duration")
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
    from dsbd_jax.decoding import common
    from dsbd_jax.decoding._jit import inputs
    cfg = decoder.config
    ids = jax.ShapeDtypeStruct((batch, prompt_len), jnp.int32)
    lens = jax.ShapeDtypeStruct((batch,), jnp.int32)
    keys = jax.eval_shape(lambda: inputs.row_keys(jax.random.key(0), batch))

    def nbytes(tree):
        return int(sum(math.prod(x.shape) * np.dtype(x.dtype).itemsize
                       for x in jax.tree.leaves(tree)))

    def params_of(mc):
        from dsbd_jax.models import head as mhead
        from dsbd_jax.models.llama import init_params
        init = mhead.init_params if mhead.is_head(mc) else init_params
        return jax.eval_shape(lambda: init(mc, jax.random.key(0)))

    if decoder.method == "dsbd":
        from dsbd_jax.decoding.dsbd.state import init_state
        p = {"target": params_of(cfg.target), "draft": params_of(cfg.draft)}
        st = jax.eval_shape(lambda p, i, l, k: init_state(cfg, p, i, l, k), p, ids, lens, keys)
        return nbytes((st.target_cache, st.draft_cache))
    if decoder.method in ("spec", "tree"):
        from dsbd_jax.decoding import speculative
        extra = 0
        if decoder.method == "tree":
            from dsbd_jax.decoding.tree import draft_extra_slots
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
    """Peak bytes in use so far on this process's first device (``memory_stats``), or the
    reason there is none."""
    import jax
    dev = jax.local_devices()[0]
    stats = dev.memory_stats()
    if not stats or "peak_bytes_in_use" not in stats:
        return {"peak_device_bytes": None,
                "reason": f"{dev.platform} device does not report memory_stats"}
    return {"peak_device_bytes": int(stats["peak_bytes_in_use"]), "reason": None}


def prefill_seconds(model, P: int, ids, lens, repeats: int = 2) -> float:
    """Median wall seconds of ``model``'s prompt pass over the padded batch ``ids`` (compiled
    first, untimed): what a decoder's end-to-end time holds besides decoding."""
    import jax
    from dsbd_jax.decoding import common
    f = jax.jit(lambda p, i, n: common.prefill(model.config, p, i, n, P + 1)[1])
    jax.block_until_ready(f(model.params, ids, lens))
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(f(model.params, ids, lens))
        ts.append(time.perf_counter() - t0)
    return float(np.median(ts))


def agreed_done(done, labels, num_prompts: int):
    """Many processes: the (label, prompt) pairs process 0 found done in its records, on every
    process (only process 0 reads and writes the records), so that all run the same batches.
    One process: ``done`` as is."""
    import jax
    if jax.process_count() == 1:
        return done
    from jax.experimental import multihost_utils
    grid = np.zeros((len(labels), num_prompts), np.int32)
    for lab, i in done:
        if lab in labels and i < num_prompts:
            grid[labels.index(lab), i] = 1
    grid = np.asarray(multihost_utils.broadcast_one_to_all(grid))
    return {(labels[a], int(i)) for a, i in zip(*np.nonzero(grid))}


def role_dtypes(cfg: Dict[str, Any], configs) -> tuple:
    """``((target dtype, draft dtype), (why, why))`` for a bench config: its ``dtype`` when
    given, else each role's choice for the config's decoders
    (:func:`dsbd_jax.host.plan.dtype_choice`: a target run only by sampling and beam sampling is
    judged on their one-token passes alone, a draft on one row)."""
    from dsbd_jax.host.plan import PASSES, dtype_choice
    if cfg["dtype"] != "auto":
        why = f"dtype: {cfg['dtype']} in the config"
        return (cfg["dtype"], cfg["dtype"]), (why, why)
    methods = tuple(dict.fromkeys(m for m, _ in cfg["runs"] if m in PASSES)) or None
    label = ", ".join(methods) if methods else "any decoder"
    target = dtype_choice(configs[0], methods, "target")
    from dsbd_jax.models.head import is_head
    draft = (dtype_choice(configs[1], None, "draft")
             if configs[1] is not None and not is_head(configs[1])
             else (target[0], "a draft head runs in the target's dtype"))
    return ((target[0], draft[0]),
            (f"dtype auto for {label}: {target[1]}", f"dtype auto for a draft: {draft[1]}"))


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
    ``mesh``: a ``jax.sharding.Mesh`` from ``dsbd_jax.parallel.make_mesh``: every method runs
    sharded over it (:class:`dsbd_jax.parallel.ShardedDecoder`). ``kv_cache_bytes`` stays the
    total.

    Many processes (``jax.process_count() > 1``, a mesh over every process's devices): every
    process runs this with the same config; each decodes its share of every batch
    (``ShardedDecoder(..., whole_batch=True)``); only process 0 reads and writes ``out_dir``
    (the others return None), and the resume state is process 0's."""
    import jax
    import jax.numpy as jnp
    from dsbd_jax.decoding import common
    from dsbd_jax.models.head import is_head
    from dsbd_jax.models.kinds import int8_config
    from dsbd_jax.loading.heads import LoadedHead, read_draft_config
    from dsbd_jax.loading.checkpoint import choice_line
    from dsbd_jax.loading.load import load_model, read_config
    from dsbd_jax.decoding.methods import build, label, model_params
    from dsbd_jax.eval.tasks import metric_name, score
    from dsbd_jax.eval.energy import energy_meter
    from dsbd_jax.eval.timing import machine_info, peak_rss_gb, portable_settings

    CompileClock.install()
    out_dir = Path(out_dir)
    records_path = out_dir / "records.jsonl"
    writer = jax.process_index() == 0
    if writer:
        out_dir.mkdir(parents=True, exist_ok=True)
    # a changed config fails here, before the load
    resumed = resume_state(records_path, cfg) if writer else None
    done = resumed["done"] if resumed else set()
    t_start = time.perf_counter()
    eos = None if cfg["eos"] else ()
    base = dict(max_new_tokens=cfg["max_new_tokens"], eos_token_id=eos, **cfg["warping"])
    if mesh is not None and cfg.get("profile"):
        raise ValueError("profile: true profiles the single-device program; run it without a mesh")
    if models is None:
        dtype = cfg["dtype"] if cfg["dtype"] == "auto" else jnp.dtype(cfg["dtype"])
        # every method setting is checked against the model configs before the slow load
        # the draft: a draft model, or a draft head (a head directory or a trained head's name)
        kinds = cfg.get("weights", "float"), cfg.get("draft_weights", "float")
        tc = read_config(cfg["target"], dtype)
        configs = (tc, read_draft_config(cfg["draft"], tc, dtype) if cfg.get("draft") else None)
        if kinds[1] == "int8" and configs[1] is not None and is_head(configs[1]):
            raise ValueError(f"draft_weights: int8 quantises a draft model; {cfg['draft']} is "
                             "a draft head (drop draft_weights, or give a draft model)")
        configs = tuple(c if c is None or k == "float" else int8_config(c)
                        for c, k in zip(configs, kinds))
        for method, setting in cfg["runs"]:
            build(method, *configs, **base, **setting)
        dtypes, whys = role_dtypes(cfg, configs)
        target = load_model(cfg["target"], dtypes[0], tokenizer=True, progress=progress,
                            weights=kinds[0])
        log(choice_line("target", cfg["target"], target.info, whys[0], f"weights: {kinds[0]}"))
        if not cfg.get("draft"):
            draft = None
        elif is_head(configs[1]):
            draft = LoadedHead(cfg["draft"], target.config)
            log(choice_line("draft", cfg["draft"], {"dtype": target.info.get("dtype")},
                            whys[1], "a draft head keeps its own weights"))
        else:
            draft = load_model(cfg["draft"], dtypes[1], tokenizer=False, progress=progress,
                               weights=kinds[1])
            log(choice_line("draft", cfg["draft"], draft.info, whys[1],
                            f"draft_weights: {kinds[1]}"))
    else:
        target, draft = models
    if target.tokenizer is None:
        raise ValueError(f"{cfg['target']} has no tokenizer: the harness needs one for the chat "
                         "template and the task metrics")
    load_s = time.perf_counter() - t_start
    prompts = plan_prompts(cfg, target.tokenizer)
    decoders = []
    for method, setting in cfg["runs"]:
        dec = build(method, target.config, draft.config if draft else None, **base, **setting)
        params = model_params(dec, target.params, draft.params if draft else None)
        run = dec
        if mesh is not None:
            from dsbd_jax.parallel import ShardedDecoder
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
    done = agreed_done(done, [lab for lab, *_ in decoders], len(prompts))
    if not writer:
        records_path = Path(os.devnull)
    elif resumed is None:
        header = {"type": "run", "name": cfg["name"], "started": datetime.datetime.now().isoformat(),
                  "machine": machine_info(), "energy": meter.describe(),
                  # the dtype the figures were measured in (the load's choice where "auto")
                  "dtype": {name: (m.info or {}).get("dtype") for name, m in
                            (("target", target), ("draft", draft)) if m is not None},
                  # the weight kinds the figures were measured with ("float" or "int8")
                  "weights": {name: (m.info or {}).get("weights", "float") for name, m in
                              (("target", target), ("draft", draft))
                              if m is not None and not is_head(m.config)},
                  "draft_kind": None if draft is None else
                  ("head" if is_head(draft.config) else "model"),
                  "memory": {"device": mem0["reason"] or "memory_stats peak_bytes_in_use"},
                  # paths relative to the working directory, or names (no absolute path)
                  "config": portable_settings({k: v for k, v in cfg.items() if k != "runs"}),
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
    whole = {} if mesh is None else {"whole_batch": True}   # many processes: each its share
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
                        jax.block_until_ready(run(params, pid, keys, prompt_lengths=plen,
                                                  **whole))
                    compile_s = CompileClock.total() - c0
                    kv_bytes[(lab, P)] = kv_cache_bytes(dec, P, B)
                    warmed.add((lab, P))
                    if cfg.get("profile"):
                        from dsbd_jax.eval.profile import profile_decoder
                        p = profile_decoder(dec, params, pid, keys, plen)
                        prof = {"phase_ms_per_iteration": p["per_iteration_ms"],
                                "decode_ms_per_iteration": p["decode_per_iteration_ms"],
                                "overhead_frac": p["overhead_frac"]}
                for _ in range(2):  # a call that compiled is not timed: it runs again
                    c0 = CompileClock.total()
                    e0 = meter.read()
                    t0 = time.perf_counter()
                    out = jax.block_until_ready(run(params, pid, keys, prompt_lengths=plen,
                                                    **whole))
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
                    if name == "draft" and is_head(m.config):
                        continue  # a head's prompt pass reads the target's: inside the decoder
                    if mesh is None and (name, P) not in prefill_s:
                        prefill_s[(name, P)] = prefill_seconds(m, P, pid, plen)
                    pre += prefill_s.get((name, P), float("nan"))
                n = len(idx)
                lines = []
                for r in todo:
                    ex, ids, _ = prompts[idx[r]]
                    rec = record_of(out, target.tokenizer, r)
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
                if writer:
                    os.fsync(f.fileno())
                if bar is not None:
                    new = sum(int(out.lengths[r, int(out.best[r])]) for r in todo)
                    bar.set_postfix_str(f"{lab}: {new / seconds:.2f} tok/s, bucket {P}")
                    bar.update(len(todo))
    if bar is not None:
        bar.close()
    if not writer:
        return None
    summary = summary_of(records_path)
    summary.update(compiles={k: v for k, v in dsbd_jax.compile_count().items()},
                   wall_s=time.perf_counter() - t_start)
    with open(out_dir / "summary.json", "w") as f:
        json.dump(summary, f, indent=2)
    return summary
