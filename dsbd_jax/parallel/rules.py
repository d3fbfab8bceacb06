"""Sharding rules (logical axis -> mesh axis), decided per model config, for both weight layouts.

The model axis splits attention by KV-head groups: with ``m`` model shards, shard ``i`` holds KV
heads ``i*K/m .. (i+1)*K/m - 1`` and exactly the query heads that use them, so attention runs
locally and only ``o_proj``'s (and the MLP's ``down_proj``'s) partial sums are all-reduced.
Weights are replicated over ``data``; a truncated draft head is replicated. Where ``m`` does not
divide ``K``, :func:`expand_kv_heads` repeats each KV head (the same function); any other
indivisible axis is replicated, the reason in ``ShardingRules.notes`` (``strict=True`` raises
instead). KV caches follow :meth:`ShardingRules.logical_rules` (``batch`` -> ``data``,
``kv_heads`` -> ``model``). The table of every parameter's axes: ``docs/results/design_notes.md``.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Dict, List, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from dsbd_jax.models.axes import LOGICAL_AXES, logical_axes, path_keys  # noqa: F401
from dsbd_jax.models.config import ModelConfig
from dsbd_jax.models.weights import output_axis_of
from dsbd_jax.parallel.mesh import DATA, MODEL, mesh_shape

logger = logging.getLogger("dsbd_jax")

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
                "embed": None, "norm": None, "layers": None, "head_rows": None,
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
            axes = logical_axes(path_keys(path), np.ndim(leaf))
            return P(*(amap[a] for a in axes))
        return jax.tree_util.tree_map_with_path(spec, params)

    def placer(self, config: ModelConfig, name: str = "model"):
        """``place(path, host, dtype)`` for ``load_model(place=...)``: the host tensor ``host``
        (``path``: its key tuple, either layout) put onto its shards of the mesh by these rules;
        each process makes only its own devices' slices (``jax.make_array_from_callback``)."""
        amap = self.axis_map(config, name)

        def place(path, host, dtype):
            spec = P(*(amap[a] for a in logical_axes(tuple(path), np.ndim(host))))
            return jax.make_array_from_callback(
                tuple(host.shape), NamedSharding(self.mesh, spec),
                lambda index: np.asarray(host[index]).astype(dtype))
        return place

    def param_shardings(self, config: ModelConfig, params, name: str = "model"):
        return jax.tree.map(lambda s: NamedSharding(self.mesh, s),
                            self.param_specs(config, params, name))

    # KV cache and batch
    def cache_spec(self, config: ModelConfig, name: str = "model") -> P:
        """``[L, B, S, K, D]``: batch over data, KV heads over model where they divide."""
        return P(None, DATA, None, self.axis_map(config, name)["kv_heads"], None)

    def logical_rules(self, batch_split: bool = True) -> Tuple[Tuple[str, Optional[str]], ...]:
        """Logical-axis rules for the arrays the decoders make (``dsbd_jax.models.axes``; enter
        them with ``flax.linen.logical_axis_rules`` under ``jax.set_mesh(self.mesh)``): the batch
        over ``data`` when the prompt batch is split over it, KV heads over ``model``; an axis the
        mesh axis does not divide stays whole."""
        return (("batch", DATA if batch_split else None), ("kv_heads", MODEL))

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
    computes the same function. Works on both weight layouts, and on int8 kernels (their codes'
    output rows and their scales repeated alike)."""
    if repeat == 1:
        return params
    K, D = config.num_kv_heads, config.head_dim

    def heads(x, axis):   # the K * D axis ``axis`` of x, each head repeated
        x = jnp.moveaxis(x, axis, -1)
        y = jnp.reshape(x, x.shape[:-1] + (K, D))
        y = jnp.reshape(jnp.repeat(y, repeat, axis=-2), x.shape[:-1] + (K * repeat * D,))
        return jnp.moveaxis(y, -1, axis)

    def f(path, x):
        keys = path_keys(path)
        if len(keys) >= 2 and keys[-2] in ("k_proj", "v_proj"):
            return heads(x, -1)
        axis = output_axis_of(keys)           # an int8 kernel's fields: codes, scales
        if axis is not None and len(keys) >= 3 and keys[-3] in ("k_proj", "v_proj"):
            return heads(x, axis)
        return x
    return jax.tree_util.tree_map_with_path(f, params)


def model_configs(config) -> Dict[str, ModelConfig]:
    """``{"target": cfg}`` or ``{"target": cfg, "draft": cfg}`` from a decode config or a model
    config."""
    if isinstance(config, ModelConfig):
        return {"target": config}
    out = {"target": config.target}
    if getattr(config, "draft", None) is not None:
        out["draft"] = config.draft
    return out


def split_params(params, configs: Mapping[str, ModelConfig]):
    """(is_pair, {name: tree}) for a target tree or a ``{"target": .., "draft": ..}`` dict."""
    if isinstance(params, Mapping) and "target" in params:
        return True, {k: params[k] for k in configs if k in params}
    return False, {"target": params}


def param_shardings(params, config, rules: ShardingRules):
    """NamedShardings for ``params`` (a target tree or ``{"target": .., "draft": ..}``) given a
    decode config (or a ModelConfig for a single tree)."""
    configs = model_configs(config)
    pair, trees = split_params(params, configs)
    out = {k: rules.param_shardings(configs[k], t, k) for k, t in trees.items()}
    return out if pair else out["target"]


def shard_params(params, config, mesh_or_rules):
    """``device_put`` the parameters with their shardings (do this once; reuse the result)."""
    rules = (mesh_or_rules if isinstance(mesh_or_rules, ShardingRules)
             else ShardingRules(mesh_or_rules))
    return jax.device_put(params, param_shardings(params, config, rules))
