"""The benchmark harness's plan: the config file, its prompts and how they run in batches.

The harness (``dsbd bench CONFIG``) is four modules: this one (the config file, the prompts,
:func:`plan_batches`, :func:`prompt_keys`), :mod:`.run` (:func:`.run.run_bench`), :mod:`.records`
(the JSON lines and resuming) and :mod:`.summary` (rows, comparisons, paired differences). The
config's keys (``configs/quick_cpu.yaml``) and what each record holds:
``docs/results/design_notes.md``.

Invariant: prompts run in batches of one power-of-two length bucket (a short last batch filled
with copies of its last prompt), batches outer and methods inner, so each method compiles once
per bucket and every method covers the same problems; each prompt has its own PRNG key
(:func:`prompt_keys`), so its sample does not depend on its batch mates.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

_TOP_KEYS = {"name", "models", "models_file", "target", "draft", "dtype", "datasets", "max_new_tokens", "warping",
             "eos", "seed", "warmup", "methods", "description", "profile", "batch_size",
             "weights", "draft_weights"}
# weights / draft_weights: a model's weight kind (load_model's weights=); absent means float, and
# stays absent, so a run started before these keys existed still resumes
_WEIGHT_KINDS = ("float", "int8")
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
    cfg.setdefault("dtype", "auto")
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
    for k in ("weights", "draft_weights"):
        if k in cfg and cfg[k] not in _WEIGHT_KINDS:
            raise ValueError(f"{where}: {k} must be one of {list(_WEIGHT_KINDS)}, got {cfg[k]!r}")
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
    from dsbd_jax.eval.tasks import TASKS
    for d in cfg["datasets"]:
        if not isinstance(d, dict) or d.get("task") not in TASKS:
            raise ValueError(f"{where}: each datasets entry needs task: one of {TASKS}, got {d!r}")
    cfg["runs"] = expand_methods(cfg.get("methods") or [], where=where)
    if not cfg["runs"]:
        raise ValueError(f"{where}: methods: needs at least one entry")
    from dsbd_jax.decoding.methods import NEEDS_DRAFT
    needs_draft = any(m in NEEDS_DRAFT for m, _ in cfg["runs"])
    if needs_draft and not cfg.get("draft"):
        raise ValueError(f"{where}: dsbd/spec/tree need a draft model (draft: or models:)")
    return cfg


def expand_methods(entries: Sequence[Dict[str, Any]], where: str = "config"
                   ) -> List[Tuple[str, Dict[str, Any]]]:
    """``[{method: dsbd, gamma: [2, 3], ...}, ...]`` -> ``[(method, setting), ...]``: list values
    expand to their product (``tree_widths`` stays a list); DSBD settings with
    ``min_width > draft_width`` are skipped. Unknown methods/settings raise ``ValueError``."""
    from dsbd_jax.decoding.methods import check_settings
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
            from dsbd_jax.decoding.dsbd import DSBDConfig
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
# prompts and batches
def default_batch_size() -> int:
    """The harness's batch size when a config gives none: 4 on CPU (decoding is bandwidth-bound
    there, so 4 prompts per forward pass cost little more than one; measured in
    ``docs/results/quality.md``), 16 on GPU/TPU."""
    import jax
    return 4 if jax.default_backend() == "cpu" else 16


def plan_prompts(cfg, tokenizer) -> List[Tuple[Any, List[int], int]]:
    """``(example, token ids, datasets entry index)`` of every prompt, in config order."""
    from dsbd_jax.eval.datasets import encode_chat
    from dsbd_jax.eval.tasks import load_examples
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
