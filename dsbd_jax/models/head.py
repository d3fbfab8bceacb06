"""Feature-level draft heads: a draft that reads the target's own hidden states (EAGLE-style).

A head is one decoder block of the target's family. To propose the token after ``x_j`` it reads
``x_j``'s embedding and the target's feature ``f_{j-1}`` (its final-normed hidden state or, with
``feature_layers``, the residual streams of chosen layers fused to ``d``); its normed output is
its guess of ``f_j``, turned into logits by the target's vocabulary head (or a truncated one)
and read as the feature of the next draft step. Its parameters hold only its own weights (the
embedding and the vocabulary head are the target's, read at call time); its KV cache has one
layer. Invariant: exactness does not depend on the head, since every drafted token is verified
against the distribution the head reported (``tests/decoding/test_head_exact.py``). The data
flow, drawn: ``docs/results/design_notes.md``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.models.cache import KVCache, empty_cache
from dsbd_jax.models.config import ModelConfig
from dsbd_jax.models import llama
from dsbd_jax.models import weights
from dsbd_jax.models.fused import unfuse_projections
from dsbd_jax.models.kinds import unblock_params
from dsbd_jax.models.vocab import VOCAB_HEAD, split_head

CONFIG_FILE = "head_config.json"
WEIGHTS_FILE = "head.safetensors"


@dataclasses.dataclass(frozen=True)
class HeadConfig:
    """A draft head for the target ``target`` (frozen, hashable: static under ``jit``).

    Attributes:
      target: the target's :class:`ModelConfig` (vocabulary, embedding, RoPE, the block's family).
      intermediate_size: the block's MLP width (``None``: the target's).
      feature_layers: ``()``: the target's final-normed hidden state; else the target layers
        whose outputs are fused (per-layer weight layout).

    Reads like a one-layer :class:`ModelConfig` (``vocab_size``, ``num_layers == 1``,
    ``num_kv_heads``, ``head_dim``, ``jnp_dtype``, ``max_position_embeddings``, ...), so caches and
    position checks treat it as a model.
    """

    target: ModelConfig
    intermediate_size: Optional[int] = None
    feature_layers: Tuple[int, ...] = ()

    def __post_init__(self):
        if not isinstance(self.target, ModelConfig):
            raise ValueError(f"HeadConfig.target must be a ModelConfig, got "
                             f"{type(self.target).__name__}")
        object.__setattr__(self, "feature_layers", tuple(int(i) for i in self.feature_layers))
        bad = [i for i in self.feature_layers if not 0 <= i < self.target.num_layers]
        if bad or len(set(self.feature_layers)) != len(self.feature_layers):
            raise ValueError(f"feature_layers must be distinct layer indices in "
                             f"[0, {self.target.num_layers}), got {self.feature_layers}")
        m = self.intermediate_size
        if m is not None and (not isinstance(m, int) or isinstance(m, bool) or m < 1):
            raise ValueError(f"intermediate_size must be a positive int or None, got {m!r}")

    @property
    def block(self) -> ModelConfig:
        """The head's block as a one-layer model of the target's family (full attention)."""
        t = self.target
        return dataclasses.replace(
            t, num_layers=1, intermediate_size=self.intermediate_size or t.intermediate_size,
            layer_types=None if t.layer_types is None else ("full_attention",),
            sliding_window=None, rope_local_theta=None)

    @property
    def feature_size(self) -> int:
        """``F``: the size of the target features the head reads."""
        return self.target.hidden_size * max(1, len(self.feature_layers))

    def __getattr__(self, name):
        # the one-layer model view (vocab_size, num_layers, num_kv_heads, head_dim, jnp_dtype,
        # max_position_embeddings, ...); dunder and own fields never come here while unset
        if name.startswith("__") or name in ("target", "intermediate_size", "feature_layers"):
            raise AttributeError(name)
        return getattr(self.block, name)

    def replace(self, **changes) -> "HeadConfig":
        """A copy with ``changes``: the head's own fields, and any model field (e.g.
        ``num_kv_heads``, as sharding repeats KV heads), which applies to the target's config
        the block is made from."""
        own = {k: changes.pop(k) for k in ("target", "intermediate_size", "feature_layers")
               if k in changes}
        target = own.pop("target", self.target)
        if changes:
            target = target.replace(**changes)
        return dataclasses.replace(self, target=target, **own)

    def to_dict(self) -> dict:
        return {"kind": "draft_head", "target": dataclasses.asdict(self.target),
                "intermediate_size": self.intermediate_size,
                "feature_layers": list(self.feature_layers)}

    @staticmethod
    def from_dict(d: dict) -> "HeadConfig":
        if d.get("kind") != "draft_head":
            raise ValueError(f"not a draft-head config (kind {d.get('kind')!r})")
        t = dict(d["target"])
        for k in ("rope_scaling",):
            if t.get(k) is not None:
                t[k] = tuple(tuple(x) if isinstance(x, list) else x for x in t[k])
                t[k] = tuple((a, tuple(b) if isinstance(b, list) else b) for a, b in t[k])
        for k in ("eos_token_id", "layer_types"):
            if isinstance(t.get(k), list):
                t[k] = tuple(t[k])
        return HeadConfig(ModelConfig(**t), d.get("intermediate_size"),
                          tuple(d.get("feature_layers", ())))


def is_head(config) -> bool:
    """Whether a draft config is a feature-level head (else a full draft model)."""
    return isinstance(config, HeadConfig)


# ---------------------------------------------------------------------------------------------
class _Head(nn.Module):
    """The head's computation. Submodule names match the parameter tree: ``embed`` and
    ``lm_head`` come from the target's tree at call time (:func:`forward`)."""

    config: HeadConfig

    @nn.compact
    def __call__(self, tokens, feats, positions, mask, cache: KVCache, logits_at, vocab_head,
                 fused_feats: bool):
        hc = self.config
        cfg = hc.block
        dt = cfg.jnp_dtype
        embed = nn.Embed(cfg.vocab_size, cfg.hidden_size, dtype=dt, param_dtype=dt, name="embed",
                         embedding_init=nn.initializers.normal(0.02))
        e = llama.embed_rows(embed, tokens)
        if cfg.embed_scale:
            e = e * jnp.asarray(math.sqrt(cfg.hidden_size), dt).astype(llama.ACT)
        f = feats.astype(llama.ACT)
        if fused_feats:  # the target's fused layers [F] -> [d]
            f = llama.Dense(cfg.hidden_size, False, dt, name="fuse")(f)
        x = llama.Dense(cfg.hidden_size, True, dt, name="fc")(jnp.concatenate([e, f], axis=-1))
        rope = llama.rope_cos_sin(cfg, positions)
        h, (k, v) = llama.DecoderLayer(cfg, name="layers_0")(
            x, (cache.k[0], cache.v[0], False), rope + rope, (mask, mask))
        out = llama._norm(cfg, "final_norm")(h)
        logits = llama._vocab_logits(cfg, embed, out, logits_at, vocab_head)
        return logits, KVCache(k[None], v[None]), out


def _tree(config: HeadConfig, head_params, target_params):
    """The parameter tree the module reads: the head's own weights, the target's embedding and
    (untied, when the head keeps no truncated rows) its ``lm_head``."""
    own, vocab_head = split_head(head_params)
    target, _ = split_head(target_params)
    tree = {k: v for k, v in own.items()}
    tree["embed"] = target["embed"]
    if vocab_head is None and not config.tie_word_embeddings:
        tree["lm_head"] = target["lm_head"]
    return tree, vocab_head


def forward(config: HeadConfig, head_params, target_params, tokens, feats, positions, mask,
            cache: Optional[KVCache] = None, logits_at=None, fused_feats: bool = False):
    """The head over ``T`` new tokens (the shapes of :func:`dsbd_jax.models.llama.forward`).

    Args:
      feats: ``[B, T, d]`` the feature of the position before each token (the head's own
        output, or a target feature already mapped by :func:`target_features`); with
        ``fused_feats=True``, ``[B, T, F]`` raw target features, mapped here.
      cache: the head's one-layer cache ``[1, B, S, K, D]`` (``None``: empty).
    Returns:
      ``(logits [B, T or n, V] float32, KVCache [1, B, T, K, D] of the new tokens,
      features [B, T, d])``.
    """
    tokens, cache = llama.checked_inputs(config, tokens, mask, cache)
    tree, vocab_head = _tree(config, head_params, target_params)
    with jax.named_scope(f"draft_head_d{config.hidden_size}"):
        return _Head(config).apply({"params": tree}, tokens, feats,
                                   jnp.asarray(positions, jnp.int32), mask, cache, logits_at,
                                   vocab_head, fused_feats)


def target_features(config: HeadConfig, head_params, feats):
    """Raw target features ``[..., F]`` -> the ``[..., d]`` features the head chains: the
    identity for the final hidden state, the head's ``fuse`` projection for fused layers."""
    if not config.feature_layers:
        return feats.astype(llama.ACT)
    kernel = head_params["fuse"]["kernel"]
    return jnp.einsum("...f,fd->...d", feats.astype(llama.ACT), kernel.astype(llama.ACT))


def features_of_prompt(feats: jax.Array) -> jax.Array:
    """``[B, T, d]`` target features at positions ``0 .. T-1`` -> the feature each token reads:
    token ``j`` reads position ``j - 1``'s (zeros for ``j = 0``)."""
    return jnp.concatenate([jnp.zeros_like(feats[:, :1]), feats[:, :-1]], axis=1)


# ---------------------------------------------------------------------------------------------
def init_params(config: HeadConfig, key: jax.Array, target_params=None, scale: float = 1.0):
    """Head parameters. Random (``normal(0.02)``, unit norms) or, with ``target_params``, the
    block copied from the target's last layer and the final norm from the target's, with ``fc``
    initialised to pass the feature through (``x = f``: the block starts as the target's last
    layer applied to the target's own feature). ``scale`` multiplies the random weights."""
    cfg = config.block
    d = cfg.hidden_size
    B, T = 1, 1
    mask = jnp.ones((B, T, T), bool)
    dummy_target = {"embed": {"embedding": jnp.zeros((cfg.vocab_size, d), cfg.jnp_dtype)}}
    if not cfg.tie_word_embeddings:
        dummy_target["lm_head"] = {"kernel": jnp.zeros((d, cfg.vocab_size), cfg.jnp_dtype)}
    fused = bool(config.feature_layers)
    feats = jnp.zeros((B, T, config.feature_size if fused else d), jnp.float32)
    variables = _Head(config).init(key, jnp.zeros((B, T), jnp.int32), feats,
                                   jnp.zeros((B, T), jnp.int32), mask, empty_cache(config, B, 0),
                                   None, None, fused)
    params = {k: v for k, v in variables["params"].items() if k not in ("embed", "lm_head")}
    if scale != 1.0:
        params = jax.tree.map(lambda x: x * scale if x.ndim >= 2 else x, params)
    if target_params is not None:
        t, _ = split_head(target_params)
        t = unfuse_projections(t, config.target)   # a fused target's block: separate kernels
        t = llama.convert_layout(t, "per_layer") if "layers" in t else t
        L = llama.num_layers_of(t)
        last = t[f"layers_{L - 1}"]
        if cfg.intermediate_size == config.target.intermediate_size:
            params["layers_0"] = jax.tree.map(lambda x: jnp.asarray(x), dict(last))
        else:  # the MLP is narrower: keep the attention and norms, leave the MLP random
            params["layers_0"] = {**params["layers_0"],
                                  **{k: v for k, v in last.items() if k != "mlp"}}
        params["final_norm"] = t["final_norm"]
        eye = jnp.concatenate([jnp.zeros((d, d)), jnp.eye(d)], axis=0).astype(cfg.jnp_dtype)
        params["fc"] = {"kernel": eye, "bias": jnp.zeros((d,), cfg.jnp_dtype)}
    return params


def check_params(config: HeadConfig, params) -> None:
    """Trace-time shape check of a head's parameters (``ValueError`` naming the first leaf)."""
    want = jax.eval_shape(lambda: init_params(config, jax.random.key(0)))
    own, vocab_head = split_head(params) if isinstance(params, dict) else (params, None)
    want_leaves = {jax.tree_util.keystr(p): tuple(x.shape)
                   for p, x in jax.tree_util.tree_flatten_with_path(want)[0]}
    try:
        have = {jax.tree_util.keystr(p): weights.shape_of(x)     # kernels of any kind
                for p, x in weights.leaves_with_path(own)}
    except Exception:  # noqa: BLE001
        have = {}
    for path, shape in want_leaves.items():
        if have.get(path) != shape:
            raise ValueError(f"draft head parameters do not match the HeadConfig: {path} should "
                             f"have shape {shape}, got {have.get(path)}")
    if vocab_head is not None and "rows" not in vocab_head:
        raise ValueError("draft head's vocab_head needs 'rows' (dsbd_jax.models.vocab)")


def num_params(params) -> int:
    return int(sum(np.prod(np.shape(x)) for x in jax.tree.leaves(params)))


def int8(params: dict) -> dict:
    """The head with its block's projections, its ``fc`` and its truncated vocabulary rows (when
    it keeps some) as int8 kernels (:class:`dsbd_jax.models.weights.Int8`,
    :func:`dsbd_jax.models.kinds.int8_kernels_`); the ``fuse`` projection of fused features
    and the target's own embedding and vocabulary head, read at call time, stay float. A new
    tree (the input's arrays shared until replaced). Like any draft, an int8 head leaves every
    output distribution unchanged; only acceptance can move."""
    from dsbd_jax.models import kinds
    return kinds.int8_kernels(params, extra=("fc",))


__all__ = ["HeadConfig", "is_head", "forward", "target_features", "features_of_prompt",
           "init_params", "check_params", "num_params", "truncate", "int8",
           "VOCAB_HEAD"]


def truncate(config: HeadConfig, head_params, target_params, rows) -> dict:
    """The head with a truncated vocabulary head: the target's head gathered once to ``rows``
    (:func:`dsbd_jax.models.vocab.truncate_head`); the head then proposes only those tokens."""
    from dsbd_jax.models.vocab import truncate_head
    own, _ = split_head(head_params)
    target, _ = split_head(target_params)
    return {**own, VOCAB_HEAD: truncate_head(target, config.target, rows)[VOCAB_HEAD]}
