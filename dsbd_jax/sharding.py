"""Sharded decoding over a device mesh (``jax.sharding``): data parallel over prompts, tensor
parallel over the model, for every decoder (DSBD included).

    mesh = make_mesh(data=2, model=4)                   # 8 devices: 2 prompt shards x 4 model shards
    dec = ShardedDecoder(dsbd_generate, config, mesh)
    params = dec.place({"target": target.params, "draft": draft.params})   # device_put, once
    out = dec(params, prompt_ids, key, prompt_lengths=lengths)             # same tokens as 1 device

The mesh has two named axes: ``data`` (prompts: the batch axis of prompts, keys, KV caches and
decode state) and ``model`` (tensor parallel: attention heads, MLP hidden units, vocabulary).
Multi-host works the same way: call ``jax.distributed.initialize()`` on every host first, then
``make_mesh`` spans ``jax.devices()`` (all hosts' devices) and every host runs the same program.

Sharding rules (logical axis -> mesh axis), decided per model config, for both weight layouts
(``"layers"`` with a leading layer axis, or ``"layers_0" .. "layers_{L-1}"`` without):

==============================  ==============================  ===============================
parameter (path suffix)         logical axes                    mesh axes
==============================  ==============================  ===============================
embed/embedding [V, d]          (vocab, embed)                  (model, -)
lm_head/kernel [d, V]           (embed, vocab)                  (-, model)
attn/q_proj/kernel [d, H*D]     (embed, q_heads)                (-, model)
attn/{k,v}_proj/kernel [d, K*D] (embed, kv_heads)               (-, model)
attn/*_proj/bias                (q_heads) / (kv_heads)          (model)
attn/o_proj/kernel [H*D, d]     (q_heads, embed)                (model, -)
mlp/{gate,up}_proj/kernel       (embed, mlp)                    (-, model)
mlp/down_proj/kernel [F, d]     (mlp, embed)                    (model, -)
*norm/weight [d]                (norm)                          (-)
KV cache [L, B, S, K, D]        (layers, batch, slots, kv, hd)  (-, data, -, model, -)
prompts [B, P], lengths, keys   (batch, ...)                    (data, ...)
==============================  ==============================  ===============================

Stacked leaves (under ``"layers"``) get a replicated leading layer axis. Weights are replicated
over ``data`` (no FSDP): every data shard holds one model-sharded copy. The draft model follows
the same rules with its own head counts.

Heads: query head ``h`` uses KV head ``h // (H / K)`` (grouped-query attention), so the model axis
splits attention by **KV-head groups**: with ``m`` model shards, shard ``i`` holds KV heads
``i*K/m .. (i+1)*K/m - 1`` and exactly the query heads that use them (a contiguous block of
``q_proj``'s output columns, as HF orders them). Attention then runs locally and only
``o_proj``'s partial sums are all-reduced (Megatron-style); the MLP likewise (``gate/up``
column-split, ``down`` row-split, one all-reduce).

Indivisible dimensions:

- ``m`` does not divide ``K`` (e.g. 2 KV heads, model axis 4): :class:`ShardedDecoder` repeats
  every KV head ``r = lcm(K, m) / K`` times (:func:`expand_kv_heads`: ``k_proj``/``v_proj``
  columns, and so the KV cache, hold ``K*r`` heads, ``K*r/m`` per shard), provided ``K*r``
  divides ``H``. Query head ``h`` then uses a copy of its own KV head, so the model computes the
  same function (vLLM and Megatron do the same). This costs ``r`` times the K/V projection
  weights in total but no more KV cache per device than replicating, and every shard attends
  locally. Without it XLA's propagation keeps the cache split over part of the model axis and
  all-gathers it every step (we measured that; the tests guard against it).
- Otherwise (``K*r`` does not divide ``H``; ``V`` or ``F`` not divisible by ``m``) that logical
  axis is **replicated** over the model axis and the reason is recorded in
  ``ShardingRules.notes`` and logged at INFO. ``strict=True`` raises a ``ValueError`` naming the
  dimension instead.
- A prompt batch that does not divide the data axis is padded by :class:`ShardedDecoder` with
  copies of its last prompt (``uneven_batch="pad"``), or run replicated over the data axis
  (``"replicate"``), or refused (``"error"``); see :class:`ShardedDecoder`.

KV caches: ``dsbd_jax.cache`` calls :func:`constrain_cache` on every cache it builds or updates;
while a :class:`ShardedDecoder` traces, that pins the cache to ``P(None, data, None, model,
None)`` (each axis where it divides), so the decode loop carries the caches in that layout, and
``cache.gather_rows`` (beam reselection) gathers within each data shard. Outside a
ShardedDecoder the hook is the identity: single-device programs are unchanged.

Communication: :func:`loop_collectives` reads the compiled program
(``.lower(...).compile().as_text()``) and lists every collective inside the decode loop with its
bytes; the tests check that no weight matrix and no whole KV cache is all-gathered there.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import logging
import math
import re
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from . import common
from .config import ModelConfig

logger = logging.getLogger("dsbd_jax")

DATA = "data"
MODEL = "model"

# ---------------------------------------------------------------------------------------------
# mesh


def parse_mesh(text: str) -> Dict[str, int]:
    """``"data=2,model=4"`` -> ``{"data": 2, "model": 4}``. A missing axis is 1, except that
    ``data`` may be left out to mean "all remaining devices" (returned as ``None``)."""
    sizes: Dict[str, Optional[int]] = {DATA: None, MODEL: 1}
    seen = set()
    for part in str(text).replace(" ", "").split(","):
        if not part:
            continue
        name, eq, value = part.partition("=")
        if not eq or name not in (DATA, MODEL) or name in seen:
            raise ValueError(f"bad mesh {text!r}: expected e.g. 'data=2,model=4' (axes data, model)")
        try:
            n = int(value)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"bad mesh {text!r}: axis {name} must be a positive int, got {value!r}")
        sizes[name] = n
        seen.add(name)
    return sizes


def make_mesh(data: Optional[int] = None, model: int = 1, devices: Optional[Sequence] = None
              ) -> Mesh:
    """A ``(data, model)`` mesh over ``devices`` (default ``jax.devices()``: every host's devices
    after ``jax.distributed.initialize()``). ``data=None`` uses all devices left over by
    ``model``. Device order follows ``jax.make_mesh`` (topology-aware) when all devices are used."""
    devs = list(jax.devices() if devices is None else devices)
    if isinstance(data, str):
        sizes = parse_mesh(data)
        data, model = sizes[DATA], sizes[MODEL]
    if model < 1 or len(devs) % model and data is None:
        raise ValueError(f"model={model} does not divide the {len(devs)} devices")
    data = len(devs) // model if data is None else data
    n = data * model
    if data < 1 or n > len(devs):
        raise ValueError(f"mesh data={data} x model={model} needs {n} devices; "
                         f"{len(devs)} available (on CPU: XLA_FLAGS="
                         f"--xla_force_host_platform_device_count={n})")
    auto = (jax.sharding.AxisType.Auto,) * 2
    if devices is None and n == len(devs):
        return jax.make_mesh((data, model), (DATA, MODEL), axis_types=auto)
    return Mesh(np.asarray(devs[:n], dtype=object).reshape(data, model), (DATA, MODEL),
                axis_types=auto)


def mesh_shape(mesh: Mesh) -> Tuple[int, int]:
    return int(mesh.shape[DATA]), int(mesh.shape[MODEL])


def mesh_label(mesh: Mesh) -> str:
    d, m = mesh_shape(mesh)
    return f"data={d},model={m}"


# ---------------------------------------------------------------------------------------------
# rules

# logical axes of each parameter, by path suffix, WITHOUT the stacked layer axis
LOGICAL_AXES: Dict[Tuple[str, ...], Tuple[str, ...]] = {
    ("embed", "embedding"): ("vocab", "embed"),
    ("lm_head", "kernel"): ("embed", "vocab"),
    ("attn", "q_proj", "kernel"): ("embed", "q_heads"),
    ("attn", "q_proj", "bias"): ("q_heads",),
    ("attn", "k_proj", "kernel"): ("embed", "kv_heads"),
    ("attn", "k_proj", "bias"): ("kv_heads",),
    ("attn", "v_proj", "kernel"): ("embed", "kv_heads"),
    ("attn", "v_proj", "bias"): ("kv_heads",),
    ("attn", "o_proj", "kernel"): ("q_heads", "embed"),
    ("mlp", "gate_proj", "kernel"): ("embed", "mlp"),
    ("mlp", "up_proj", "kernel"): ("embed", "mlp"),
    ("mlp", "down_proj", "kernel"): ("mlp", "embed"),
    ("input_norm", "weight"): ("norm",),
    ("post_norm", "weight"): ("norm",),
    ("final_norm", "weight"): ("norm",),
}


def _path_keys(path) -> Tuple[str, ...]:
    out = []
    for p in path:
        for attr in ("key", "name", "idx"):
            if hasattr(p, attr):
                out.append(str(getattr(p, attr)))
                break
        else:
            out.append(str(p))
    return tuple(out)


def logical_axes(path: Sequence[str], ndim: int) -> Tuple[Optional[str], ...]:
    """Logical axes of the parameter at ``path`` (a tuple of keys). Leaves under ``"layers"``
    (stacked layout) get a leading ``"layers"`` axis; ``"layers_<i>"`` leaves (per-layer layout)
    do not. ``ValueError`` for a parameter no rule covers or a rank that does not match."""
    path = tuple(path)
    axes = None
    for n in range(len(path), 0, -1):
        if path[-n:] in LOGICAL_AXES:
            axes = LOGICAL_AXES[path[-n:]]
            break
    if axes is None:
        raise ValueError(f"no sharding rule for parameter {'/'.join(path)} (shape rank {ndim}); "
                         f"add its path suffix to dsbd_jax.sharding.LOGICAL_AXES")
    if "layers" in path:
        axes = ("layers",) + axes
    if len(axes) != ndim:
        raise ValueError(f"parameter {'/'.join(path)} has rank {ndim}, its rule {axes} has "
                         f"{len(axes)} axes (stacked leaves live under 'layers', per-layer ones "
                         f"under 'layers_<i>')")
    return axes


@dataclasses.dataclass
class ShardingRules:
    """Logical-axis -> mesh-axis rules for one mesh (module doc). ``strict``: raise instead of
    replicating a dimension the model axis does not divide. ``notes`` collects the
    replications decided so far (one line each, naming the model and the dimension)."""

    mesh: Mesh
    strict: bool = False
    notes: List[str] = dataclasses.field(default_factory=list)

    @property
    def data_size(self) -> int:
        return mesh_shape(self.mesh)[0]

    @property
    def model_size(self) -> int:
        return mesh_shape(self.mesh)[1]

    def _split(self, what: str, size: int, name: str) -> Optional[str]:
        m = self.model_size
        if size % m == 0:
            return MODEL
        replicated = {"num_kv_heads": "k_proj/v_proj and the KV-cache heads are",
                      "num_heads": "q_proj/o_proj (all of attention) are",
                      "vocab_size": "the embedding and lm_head are",
                      "intermediate_size": "the MLP is"}[what]
        msg = (f"{name}: {what} = {size} does not divide the model axis ({m}); "
               f"{replicated} replicated over the model axis")
        if self.strict:
            raise ValueError(msg.split(";")[0] + f"; use a model axis that divides it "
                             f"(or strict=False to replicate)")
        if msg not in self.notes:
            self.notes.append(msg)
            logger.info("sharding: %s", msg)
        return None

    def axis_map(self, config: ModelConfig, name: str = "model") -> Dict[str, Optional[str]]:
        """The mesh axis of every logical axis for a model with this config."""
        m = self.model_size
        if config.num_kv_heads % m == 0:
            q_heads = kv_heads = MODEL
        else:
            # KV heads replicated; query heads still split when they divide (each shard computes
            # all K/V heads, attends with its own query heads); else all of attention replicated
            kv_heads = self._split("num_kv_heads", config.num_kv_heads, name)
            q_heads = self._split("num_heads", config.num_heads, name)
        return {"vocab": self._split("vocab_size", config.vocab_size, name),
                "embed": None, "norm": None, "layers": None,
                "q_heads": q_heads, "kv_heads": kv_heads,
                "mlp": self._split("intermediate_size", config.intermediate_size, name)}

    def kv_repeat(self, config: ModelConfig) -> int:
        """Copies of each KV head that make the KV heads divide the model axis: ``lcm(K, m) / K``
        when ``lcm(K, m)`` divides the query heads ``H`` (1 when ``m`` divides ``K``, or when no
        repetition works: then the KV heads are replicated)."""
        m, K, H = self.model_size, config.num_kv_heads, config.num_heads
        if K % m == 0:
            return 1
        Kp = math.lcm(K, m)
        return Kp // K if H % Kp == 0 else 1

    # parameters
    def param_specs(self, config: ModelConfig, params, name: str = "model"):
        """A pytree of ``PartitionSpec`` matching ``params`` (either weight layout)."""
        amap = self.axis_map(config, name)

        def spec(path, leaf):
            axes = logical_axes(_path_keys(path), np.ndim(leaf))
            return P(*(amap[a] for a in axes))
        return jax.tree_util.tree_map_with_path(spec, params)

    def param_shardings(self, config: ModelConfig, params, name: str = "model"):
        return jax.tree.map(lambda s: NamedSharding(self.mesh, s),
                            self.param_specs(config, params, name))

    # KV cache and batch
    def cache_spec(self, config: ModelConfig, name: str = "model") -> P:
        """``[L, B, S, K, D]``: batch over data, KV heads over model where they divide."""
        return P(None, DATA, None, self.axis_map(config, name)["kv_heads"], None)

    def batch_sharding(self, ndim: int) -> NamedSharding:
        """Leading (batch) axis over ``data``, the rest replicated."""
        return NamedSharding(self.mesh, P(DATA, *([None] * (ndim - 1))))

    def replicated(self) -> NamedSharding:
        return NamedSharding(self.mesh, P())


def expand_kv_heads(params, config: ModelConfig, repeat: int):
    """``params`` with every KV head repeated ``repeat`` times (``k_proj``/``v_proj`` kernel and
    bias columns, head-major as HF orders them: ``[.., K*D] -> [.., K*repeat*D]``, copy ``j`` of
    head ``k`` at ``k*repeat + j``). With ``num_kv_heads * repeat`` KV heads, query head ``h``
    uses head ``h // (H / (K*repeat))``, a copy of its original KV head ``h // (H / K)``: the model
    computes the same function. Works on both weight layouts."""
    if repeat == 1:
        return params
    K, D = config.num_kv_heads, config.head_dim

    def f(path, x):
        keys = _path_keys(path)
        if len(keys) >= 2 and keys[-2] in ("k_proj", "v_proj"):
            y = jnp.reshape(x, x.shape[:-1] + (K, D))
            return jnp.reshape(jnp.repeat(y, repeat, axis=-2), x.shape[:-1] + (K * repeat * D,))
        return x
    return jax.tree_util.tree_map_with_path(f, params)


def _model_configs(config) -> Dict[str, ModelConfig]:
    """``{"target": cfg}`` or ``{"target": cfg, "draft": cfg}`` from a decode config or a model
    config."""
    if isinstance(config, ModelConfig):
        return {"target": config}
    out = {"target": config.target}
    if getattr(config, "draft", None) is not None:
        out["draft"] = config.draft
    return out


def _split_params(params, configs: Mapping[str, ModelConfig]):
    """(is_pair, {name: tree}) for a target tree or a ``{"target": .., "draft": ..}`` dict."""
    if isinstance(params, Mapping) and "target" in params:
        return True, {k: params[k] for k in configs if k in params}
    return False, {"target": params}


def param_shardings(params, config, rules: ShardingRules):
    """NamedShardings for ``params`` (a target tree or ``{"target": .., "draft": ..}``) given a
    decode config (or a ModelConfig for a single tree)."""
    configs = _model_configs(config)
    pair, trees = _split_params(params, configs)
    out = {k: rules.param_shardings(configs[k], t, k) for k, t in trees.items()}
    return out if pair else out["target"]


def shard_params(params, config, mesh_or_rules):
    """``device_put`` the parameters with their shardings (do this once; reuse the result)."""
    rules = (mesh_or_rules if isinstance(mesh_or_rules, ShardingRules)
             else ShardingRules(mesh_or_rules))
    return jax.device_put(params, param_shardings(params, config, rules))


# ---------------------------------------------------------------------------------------------
# the KV-cache layout hook (dsbd_jax.cache calls constrain_cache / row_groups)

# (mesh, batch split over data?) while a ShardedDecoder traces; None otherwise
_TRACING: contextvars.ContextVar = contextvars.ContextVar("dsbd_jax_sharding", default=None)


@contextlib.contextmanager
def tracing_layout(mesh: Mesh, batch_split: bool):
    """While tracing a decoder: turn on the cache layout hook. (The call itself runs under
    ``jax.set_mesh(mesh)``, so the decoders' inner jitted programs are traced and cached apart
    from their single-device traces.)"""
    token = _TRACING.set((mesh, batch_split))
    try:
        yield
    finally:
        _TRACING.reset(token)


def cache_partition(shape: Sequence[int], mesh: Mesh, batch_split: bool = True) -> P:
    """``[L, B, S, K, D]`` -> ``P(None, data, None, model, None)``, each axis only where it
    divides (and the batch only when the prompt batch is split over ``data``)."""
    d, m = mesh_shape(mesh)
    _, B, _, K, _ = shape
    return P(None, DATA if batch_split and B % d == 0 else None, None,
             MODEL if K % m == 0 else None, None)


def constrain_cache(cache):
    """The sharding hook: pins every rank-5 array of ``cache`` to :func:`cache_partition` while a
    :class:`ShardedDecoder` traces; the identity otherwise."""
    ctx = _TRACING.get()
    if ctx is None:
        return cache
    mesh, split = ctx

    def pin(x):
        if getattr(x, "ndim", 0) != 5:
            return x
        return jax.lax.with_sharding_constraint(
            x, NamedSharding(mesh, cache_partition(x.shape, mesh, split)))
    return jax.tree.map(pin, cache)


def row_groups(rows: int) -> int:
    """How many data shards a batch of ``rows`` cache rows splits into while a ShardedDecoder
    traces with the batch split (1 otherwise): ``cache.gather_rows`` reselects within them."""
    ctx = _TRACING.get()
    if ctx is None or not ctx[1]:
        return 1
    d = mesh_shape(ctx[0])[0]
    return d if d > 1 and rows % d == 0 else 1


# ---------------------------------------------------------------------------------------------
# decoders


def _leaf_bytes(x) -> int:
    return int(math.prod(x.shape) * np.dtype(x.dtype).itemsize)


UNEVEN_BATCH = ("pad", "replicate", "error")


class ShardedDecoder:
    """A decoder (``sample``, ``beam_sample``, ``beam_search``, ``speculative_sample``,
    ``tree_speculative_sample``, ``dsbd_generate``) bound to its config and a mesh, jitted with
    input shardings (params by the rules, prompts / lengths / keys over ``data``); the decode
    loop's state follows by XLA's sharding propagation. Same arguments and output as the
    decoder, same tokens as on one device for the same key. One compile per prompt bucket
    (``compiles`` counts them).

    ``takes_key=False`` for ``beam_search`` (default: from the function's name). Use
    :meth:`place` once for the parameters. ``strict``: :class:`ShardingRules`.

    ``uneven_batch``: what a batch that the data axis does not divide gets.
    ``"pad"`` (default) appends copies of the last prompt (same row key) up to a multiple of the
    data axis and drops them from the output: tokens, log-likelihoods, every per-prompt stat and
    the loop counts (``iterations``, ``target_calls``, ``draft_calls``) are those of the
    unpadded batch, but stats *summed over prompts* (DSBD's ``layer_*`` sums and the rates
    computed from them) include the copies. ``"replicate"`` runs that batch replicated over the
    data axis (every output identical to one device; the data shards do the same work).
    ``"error"`` raises a ``ValueError`` naming the batch size and the data axis.
    """

    def __init__(self, fn: Callable, config, mesh: Mesh, takes_key: Optional[bool] = None,
                 strict: bool = False, uneven_batch: str = "pad"):
        if uneven_batch not in UNEVEN_BATCH:
            raise ValueError(f"uneven_batch must be one of {UNEVEN_BATCH}, got {uneven_batch!r}")
        self.fn, self.mesh = fn, mesh
        self.uneven_batch = uneven_batch
        self.rules = ShardingRules(mesh, strict=strict)
        # KV heads that do not divide the model axis are repeated (exact; module doc)
        self.source_config = config
        self.kv_repeat = {k: self.rules.kv_repeat(mc) for k, mc in _model_configs(config).items()}
        for k, r in self.kv_repeat.items():
            if r > 1:
                mc = _model_configs(config)[k]
                self.rules.notes.append(
                    f"{k}: num_kv_heads = {mc.num_kv_heads} does not divide the model axis "
                    f"({self.rules.model_size}); each KV head is repeated {r}x (k_proj/v_proj and "
                    f"the KV cache hold {mc.num_kv_heads * r} heads, "
                    f"{mc.num_kv_heads * r // self.rules.model_size} per model shard; same results)")
        if isinstance(config, ModelConfig):
            self.config = config.replace(num_kv_heads=config.num_kv_heads * self.kv_repeat["target"])
        else:
            self.config = config.replace(**{
                k: mc.replace(num_kv_heads=mc.num_kv_heads * self.kv_repeat[k])
                for k, mc in _model_configs(config).items()})
        name = getattr(fn, "__name__", "")
        self.takes_key = (name != "beam_search") if takes_key is None else takes_key
        self.name = name or "decoder"
        self.compiles = 0
        self._jits: Dict[Any, Callable] = {}
        self._compiled: Dict[Any, Any] = {}
        self._batch_leaves: Dict[Any, Any] = {}
        # decide (and log / raise for) indivisible dimensions up front
        for k, mc in _model_configs(self.config).items():
            self.rules.axis_map(mc, k)

    @classmethod
    def of(cls, decoder, mesh: Mesh, **kwargs) -> "ShardedDecoder":
        """From a ``methods.Decoder`` (what ``methods.build`` returns)."""
        return cls(decoder.fn, decoder.config, mesh, takes_key=decoder.takes_key, **kwargs)

    # -- placement ----------------------------------------------------------------------------
    def place(self, params):
        """The parameters placed on the mesh (``device_put`` with the rules' shardings), KV heads
        repeated first where ``kv_repeat`` says so."""
        configs = _model_configs(self.source_config)
        pair, trees = _split_params(params, configs)
        trees = {k: expand_kv_heads(t, configs[k], self.kv_repeat[k]) for k, t in trees.items()}
        return shard_params(trees if pair else trees["target"], self.config, self.rules)

    def _raw(self, params, ids, lengths, keys):
        if self.takes_key:
            return self.fn(params, ids, keys, self.config, prompt_lengths=lengths)
        return self.fn(params, ids, self.config, prompt_lengths=lengths)

    def _jitted(self, params, split_batch: bool = True):
        treedef = (jax.tree.structure(params), split_batch)
        if treedef not in self._jits:
            bs = self.rules.batch_sharding if split_batch else (lambda n: self.rules.replicated())
            shardings = (param_shardings(params, self.config, self.rules), bs(2), bs(1), bs(2))

            def counted(*args):
                self.compiles += 1
                common.note_trace(f"sharded {self.name}", mesh=mesh_label(self.mesh))
                with tracing_layout(self.mesh, split_batch):
                    return self._raw(*args)
            self._jits[treedef] = jax.jit(counted, in_shardings=shardings)
        return self._jits[treedef]

    def _inputs(self, prompt_ids, key, prompt_lengths):
        """Host side: check, compute the [B] row keys, pad the batch to a multiple of the data
        axis with copies of the last row. Returns (ids, lengths, raw keys [Bp, 2], B)."""
        ids = np.asarray(prompt_ids)
        common.check_prompt_batch(ids, prompt_lengths, self.config.target.vocab_size)
        B, Pl = ids.shape
        lengths = np.asarray(common.prompt_lengths_or_full(ids, prompt_lengths))
        if self.takes_key:
            common.check_key(key, B)
            keys = np.asarray(jax.random.key_data(common.row_keys(key, B)))
        else:
            keys = np.zeros((B, 2), np.uint32)
        pad = (-B) % self.rules.data_size
        if pad and self.uneven_batch == "error":
            raise ValueError(f"batch of {B} prompts does not divide the data axis "
                             f"({self.rules.data_size}); use uneven_batch='pad' or 'replicate'")
        if pad and self.uneven_batch == "pad":
            ids = np.concatenate([ids, np.repeat(ids[-1:], pad, 0)])
            lengths = np.concatenate([lengths, np.repeat(lengths[-1:], pad, 0)])
            keys = np.concatenate([keys, np.repeat(keys[-1:], pad, 0)])
        return ids.astype(np.int32), lengths.astype(np.int32), keys.astype(np.uint32), B

    def _split(self, ids) -> bool:
        return ids.shape[0] % self.rules.data_size == 0

    def _place_inputs(self, ids, lengths, keys):
        r = self.rules
        if not self._split(ids):
            return tuple(jax.device_put(x, r.replicated()) for x in (ids, lengths, keys))
        return (jax.device_put(ids, r.batch_sharding(2)), jax.device_put(lengths, r.batch_sharding(1)),
                jax.device_put(keys, r.batch_sharding(2)))

    def lower(self, params, prompt_ids, key=None, prompt_lengths=None):
        """``jax.stages.Lowered`` of the sharded program."""
        ids, lengths, keys, _ = self._inputs(prompt_ids, key if self.takes_key else None,
                                             prompt_lengths)
        with jax.set_mesh(self.mesh):
            return self._jitted(params, self._split(ids)).lower(
                params, *self._place_inputs(ids, lengths, keys))

    def _executable(self, params, ids, placed):
        """The compiled program for these input shapes (compiled once, ahead of time, and kept:
        the program that runs is the one :meth:`compiled` shows)."""
        split = self._split(ids)
        sig = (jax.tree.structure(params), ids.shape, split,
               tuple((x.shape, str(x.dtype)) for x in jax.tree.leaves(params)))
        if sig not in self._compiled:
            with jax.set_mesh(self.mesh):
                self._compiled[sig] = self._jitted(params, split).lower(params, *placed).compile()
        return self._compiled[sig]

    def compiled(self, params, prompt_ids, key=None, prompt_lengths=None):
        """``jax.stages.Compiled`` of the program a call with these arguments runs
        (``.as_text()``: its HLO, for :func:`loop_collectives`; ``.memory_analysis()``)."""
        ids, lengths, keys, _ = self._inputs(prompt_ids, key if self.takes_key else None,
                                             prompt_lengths)
        params = self._placed(params)
        return self._executable(params, ids, self._place_inputs(ids, lengths, keys))

    def _placed(self, params):
        """``params`` on the mesh with the rules' shardings (a no-op for :meth:`place`'s output)."""
        return jax.device_put(params, param_shardings(params, self.config, self.rules))

    def __call__(self, params, prompt_ids, key=None, prompt_lengths=None):
        ids, lengths, keys, B = self._inputs(prompt_ids, key, prompt_lengths)
        params = self._placed(params)
        placed = self._place_inputs(ids, lengths, keys)
        out = self._executable(params, ids, placed)(params, *placed)
        if ids.shape[0] == B:
            return out
        return self._unpad(params, ids, out, B)

    def _unpad(self, params, ids, out, B):
        """Drop the padding rows: leaves whose leading axis is the batch (found by tracing the
        output shapes at two batch sizes, once per shape)."""
        Bp, Pl = ids.shape
        sig = (jax.tree.structure(params), Bp, Pl)
        if sig not in self._batch_leaves:
            d = self.rules.data_size
            abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)

            def shapes(b):
                return jax.eval_shape(self._raw, abstract,
                                      jax.ShapeDtypeStruct((b, Pl), jnp.int32),
                                      jax.ShapeDtypeStruct((b,), jnp.int32),
                                      jax.ShapeDtypeStruct((b, 2), jnp.uint32))
            a, b = shapes(Bp), shapes(Bp + d)
            self._batch_leaves[sig] = jax.tree.map(
                lambda x, y: bool(x.shape) and x.shape[0] == Bp and y.shape[0] == Bp + d, a, b)
        flags = self._batch_leaves[sig]
        return jax.tree.map(lambda x, f: x[:B] if f else x, out, flags)

    # -- figures ------------------------------------------------------------------------------
    def param_bytes_per_device(self, params) -> Dict[str, int]:
        """Bytes of the placed parameters on each device (by ``addressable_shards``)."""
        per: Dict[str, int] = {}
        for x in jax.tree.leaves(params):
            for s in x.addressable_shards:
                per[str(s.device)] = per.get(str(s.device), 0) + _leaf_bytes(s.data)
        return per


def sharded(fn: Callable, config, mesh: Mesh, **kwargs) -> ShardedDecoder:
    """Shorthand for :class:`ShardedDecoder`."""
    return ShardedDecoder(fn, config, mesh, **kwargs)


# ---------------------------------------------------------------------------------------------
# reading the compiled program

COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute",
               "collective-broadcast", "ragged-all-to-all")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
                "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
                "f8e4m3fn": 1, "f8e5m2": 1, "s4": 1, "u4": 1}
_SHAPE = re.compile(r"\b([a-z]+[0-9]*[a-z0-9]*)\[([0-9,]*)\]")
_COMP = re.compile(r"^(ENTRY\s+)?%?([\w.\-]+)\s.*\{\s*$")
_CALLS = re.compile(r"\b(?:body|condition|to_apply|calls|true_computation|false_computation|"
                    r"branch_computations)=(\{[^}]*\}|%?[\w.\-]+)")
_WHILE = re.compile(r"\bwhile\(")
_TRIP = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def shapes_in(text: str) -> List[Tuple[str, Tuple[int, ...]]]:
    """Every ``dtype[dims]`` array type in a piece of HLO text."""
    out = []
    for dt, dims in _SHAPE.findall(text):
        if dt in _DTYPE_BYTES:
            out.append((dt, tuple(int(x) for x in dims.split(",") if x)))
    return out


def _nbytes(shapes) -> int:
    return int(sum(_DTYPE_BYTES[dt] * math.prod(dims) for dt, dims in shapes))


def parse_hlo(text: str):
    """``{computation: [instruction lines]}`` and the name of the entry computation."""
    comps: Dict[str, List[str]] = {}
    entry, cur = None, None
    for line in text.splitlines():
        s = line.strip()
        if cur is None:
            m = _COMP.match(s)
            if m and "=" not in s.split("(")[0]:
                cur = m.group(2)
                comps[cur] = []
                if m.group(1):
                    entry = cur
            continue
        if s == "}":
            cur = None
            continue
        comps[cur].append(s)
    return comps, entry


def _callees(line: str) -> List[str]:
    out = []
    for group in _CALLS.findall(line):
        out += [c.strip().lstrip("%") for c in group.strip("{}").split(",") if c.strip()]
    return out


def _type_text(rhs: str) -> str:
    """The result type at the start of an instruction's right-hand side."""
    rhs = rhs.strip()
    if not rhs.startswith("("):
        return rhs.split(" ", 1)[0]
    depth = 0
    for j, ch in enumerate(rhs):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0:
            return rhs[:j + 1]
    return rhs


def _instructions(comps) -> Dict[str, str]:
    """Instruction name -> its result type text, over the whole module."""
    types = {}
    for lines in comps.values():
        for line in lines:
            lhs, eq, rhs = line.partition(" = ")
            if eq:
                types[lhs.replace("ROOT", "").strip().lstrip("%")] = _type_text(rhs)
    return types


def _collective_op(line: str) -> Optional[str]:
    rhs = line.split("=", 1)[1] if "=" in line else line
    for op in COLLECTIVES:
        if re.search(rf"\s{re.escape(op)}(-start)?\(", " " + rhs.split(", replica_groups")[0]):
            return op
    return None


def _operand_text(line: str) -> str:
    """The text between the op's parentheses (operands with their types)."""
    rhs = line.split("=", 1)[1]
    i = rhs.index("(", rhs.index(next(op for op in COLLECTIVES if op in rhs)))
    depth, j = 0, i
    while j < len(rhs):
        depth += rhs[j] == "("
        depth -= rhs[j] == ")"
        if depth == 0:
            break
        j += 1
    return rhs[i + 1:j]


def _result_text(line: str) -> str:
    rhs = line.split("=", 1)[1].strip()
    op = next(op for op in COLLECTIVES if op in rhs)
    return rhs[:rhs.index(op)]


def loop_collectives(hlo_text: str) -> Dict[str, Any]:
    """Collectives inside the decode loop(s) of a compiled program.

    The decode loops are the ``while`` ops reached from the entry computation without passing
    through another ``while`` and without a known trip count (the layer scans of the prefills
    have one). Everything those loops' bodies and conditions call is searched; a collective in a
    nested loop with a known trip count (the layer scan of a forward pass) counts that many times
    per iteration. Returns ``{"ops": [{op, operand_shapes, result_shapes, bytes, count}],
    "bytes_per_iteration", "decode_loops", "loop_state_shapes"}`` (``bytes``: operand bytes on one
    device; ``loop_state_shapes``: the per-device array types the decode loops carry).
    """
    comps, entry = parse_hlo(hlo_text)
    types = _instructions(comps)

    def find_decode_loops(comp, seen):
        loops = []
        for line in comps.get(comp, []):
            callees = _callees(line)
            if _WHILE.search(line):
                if not _TRIP.search(line):
                    loops.append(line)
                continue  # do not look inside loops with a known trip count
            for c in callees:
                if c not in seen:
                    seen.add(c)
                    loops += find_decode_loops(c, seen)
        return loops

    loops = find_decode_loops(entry, {entry})
    ops: Dict[Tuple, Dict[str, Any]] = {}

    def walk(comp, mult, stack):
        for line in comps.get(comp, []):
            op = _collective_op(line)
            if op is not None and "=" in line:
                operands = []
                for name in re.findall(r"%([\w.\-]+)", _operand_text(line)):
                    operands += shapes_in(types.get(name, ""))
                if not operands:  # operands printed with their types
                    operands = shapes_in(_operand_text(line))
                result = shapes_in(_result_text(line))
                key = (op, tuple(operands), tuple(result))
                entry_ = ops.setdefault(key, dict(op=op, operand_shapes=operands,
                                                  result_shapes=result,
                                                  bytes=_nbytes(operands), count=0))
                entry_["count"] += mult
            inner = mult
            if _WHILE.search(line):
                trip = _TRIP.search(line)
                inner = mult * (int(trip.group(1)) if trip else 1)
            for c in _callees(line):
                if c in comps and c not in stack:
                    walk(c, inner, stack | {c})

    state_shapes = []
    for line in loops:
        for c in _callees(line):
            walk(c, 1, {c})
        state_shapes += shapes_in(line.split("while(")[0])
    op_list = sorted(ops.values(), key=lambda o: -o["bytes"] * o["count"])
    return dict(ops=op_list, decode_loops=len(loops), loop_state_shapes=state_shapes,
                bytes_per_iteration=int(sum(o["bytes"] * o["count"] for o in op_list)))


def _dims_key(shape) -> Tuple[int, ...]:
    return tuple(sorted(int(d) for d in shape if d != 1))


def forbidden_shapes(params, cache_shapes: Sequence[Tuple[int, ...]], mesh: Optional[Mesh] = None
                     ) -> Dict[Tuple[int, ...], str]:
    """What must never be communicated inside the decode loop, as sorted non-unit dims -> name:
    every weight matrix (whole and, for stacked leaves, one layer) and every KV cache (whole or
    one layer; its batch axis whole or one data shard's, its heads whole or one model shard's)."""
    out: Dict[Tuple[int, ...], str] = {}
    for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
        name = "/".join(_path_keys(path))
        stacked = "layers" in _path_keys(path)
        if np.ndim(x) - stacked >= 2:  # matrices (a stack of norm vectors is not one)
            out[_dims_key(x.shape)] = name
            if stacked:
                out[_dims_key(x.shape[1:])] = name + " (one layer)"
    d, m = mesh_shape(mesh) if mesh is not None else (1, 1)
    for shape in cache_shapes:
        L, B, S, K, D = shape
        for b in ({B, B // d} if B % d == 0 else {B}):
            for k in ({K, K // m} if K % m == 0 else {K}):
                out[_dims_key((L, b, S, k, D))] = f"KV cache {tuple(shape)}"
                out[_dims_key((b, S, k, D))] = f"KV cache {tuple(shape)} (one layer)"
    return out


def gathered_weights_or_caches(report: Dict[str, Any], params, cache_shapes: Sequence[Tuple[int, ...]],
                               mesh: Optional[Mesh] = None) -> List[Dict[str, Any]]:
    """The decode-loop collectives (from :func:`loop_collectives`) whose result has the shape of a
    weight matrix or of a KV cache (:func:`forbidden_shapes`), each with ``"what"`` it matches.
    An empty list is what the tests require."""
    forbidden = forbidden_shapes(params, cache_shapes, mesh)
    bad = []
    for o in report["ops"]:
        for _, dims in o["result_shapes"] + o["operand_shapes"]:
            if _dims_key(dims) in forbidden:
                bad.append(dict(o, what=forbidden[_dims_key(dims)]))
                break
    return bad
