"""Model configuration: a frozen, hashable dataclass (static under ``jax.jit``)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Tuple

import jax.numpy as jnp

SUPPORTED_DTYPES = ("float32", "bfloat16", "float16")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")
NORM_STYLES = ("llama", "gemma")  # weight * x  /  (1 + weight) * x, computed in float32
ACTIVATIONS = ("silu", "gelu_tanh")
LAYER_TYPES = ("full_attention", "sliding_attention")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Llama-family decoder configuration (Llama 2/3, Qwen2/3, SmolLM, Mistral, Gemma 2/3).

    The family variants are switches on the one model (all off: Llama):

    * ``qk_norm``: RMSNorm over ``head_dim`` on every query and key head (Qwen3, Gemma 3).
    * ``norm_style``: ``"llama"`` (``w * x``) or ``"gemma"`` (``(1 + w) * x`` in float32).
    * ``sandwich_norms``: extra norms on the attention and MLP outputs (Gemma 2/3).
    * ``hidden_act``: the gated MLP's activation, ``"silu"`` or ``"gelu_tanh"`` (Gemma).
    * ``embed_scale``: embeddings multiplied by ``sqrt(hidden_size)`` (Gemma).
    * ``query_pre_attn_scalar``: attention scores scaled by ``scalar ** -0.5`` instead of
      ``head_dim ** -0.5`` (Gemma).
    * ``attn_logit_softcap`` / ``final_logit_softcap``: ``cap * tanh(x / cap)`` on attention
      scores / output logits (Gemma 2).
    * ``sliding_window``: a key is visible to a query only when ``q_pos - k_pos < window``, on
      the layers that ``layer_types`` marks ``"sliding_attention"`` (``None``: every layer,
      Mistral); ``rope_local_theta``: the RoPE base of those layers (Gemma 3; their RoPE is
      unscaled), ``None``: the same RoPE as the global layers.

    Hashable, so it can be passed as a static argument to ``jax.jit``.
    ``rope_scaling`` is a sorted tuple of ``(key, value)`` pairs (a dict is not hashable);
    use :meth:`rope_scaling_dict` to read it.
    """

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Optional[Tuple[Tuple[str, Any], ...]] = None
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    max_position_embeddings: int = 4096
    dtype: str = "float32"
    architecture: str = "llama"
    bos_token_id: Optional[int] = None
    eos_token_id: Optional[Tuple[int, ...]] = None
    pad_token_id: Optional[int] = None
    qk_norm: bool = False
    norm_style: str = "llama"
    sandwich_norms: bool = False
    hidden_act: str = "silu"
    embed_scale: bool = False
    query_pre_attn_scalar: Optional[float] = None
    attn_logit_softcap: Optional[float] = None
    final_logit_softcap: Optional[float] = None
    sliding_window: Optional[int] = None
    layer_types: Optional[Tuple[str, ...]] = None
    rope_local_theta: Optional[float] = None

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.dtype not in SUPPORTED_DTYPES:
            raise ValueError(f"dtype must be one of {SUPPORTED_DTYPES}, got {self.dtype!r}")
        if self.rope_scaling is not None:
            rope_type = self.rope_scaling_dict().get("rope_type", "default")
            if rope_type not in SUPPORTED_ROPE_TYPES:
                raise ValueError(
                    f"unsupported rope_scaling type {rope_type!r}; supported: {SUPPORTED_ROPE_TYPES}")
        if self.norm_style not in NORM_STYLES:
            raise ValueError(f"norm_style must be one of {NORM_STYLES}, got {self.norm_style!r}")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"hidden_act must be one of {ACTIVATIONS}, got {self.hidden_act!r}")
        if self.sliding_window is not None and (not isinstance(self.sliding_window, int)
                                                or self.sliding_window < 1):
            raise ValueError(f"sliding_window must be a positive int or None, "
                             f"got {self.sliding_window!r}")
        if self.layer_types is not None:
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
            bad = sorted(set(self.layer_types) - set(LAYER_TYPES))
            if bad or len(self.layer_types) != self.num_layers:
                raise ValueError(f"layer_types must name {self.num_layers} layers, each one of "
                                 f"{LAYER_TYPES}; got {self.layer_types!r}")
        for name in ("attn_logit_softcap", "final_logit_softcap", "query_pre_attn_scalar"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"ModelConfig.{name} must be positive or None, got {value!r}")
        if isinstance(self.eos_token_id, int):
            object.__setattr__(self, "eos_token_id", (self.eos_token_id,))
        elif isinstance(self.eos_token_id, list):
            object.__setattr__(self, "eos_token_id", tuple(self.eos_token_id))

    @property
    def jnp_dtype(self):
        return jnp.dtype(self.dtype)

    @property
    def num_groups(self) -> int:
        """Query heads per key/value head (1: MHA, num_heads: MQA)."""
        return self.num_heads // self.num_kv_heads

    @property
    def local_layers(self) -> Tuple[bool, ...]:
        """Per layer: does it attend through the sliding window (and use the local RoPE)?"""
        if self.sliding_window is None:
            return (False,) * self.num_layers
        if self.layer_types is None:
            return (True,) * self.num_layers
        return tuple(t == "sliding_attention" for t in self.layer_types)

    @property
    def has_local_layers(self) -> bool:
        return any(self.local_layers)

    def local_rope_config(self) -> "ModelConfig":
        """The config whose RoPE the sliding-window layers use."""
        if self.rope_local_theta is None:
            return self
        return dataclasses.replace(self, rope_theta=float(self.rope_local_theta), rope_scaling=None)

    def rope_scaling_dict(self) -> dict:
        return dict(self.rope_scaling) if self.rope_scaling is not None else {}

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    @staticmethod
    def freeze_rope_scaling(rope_scaling: Optional[Mapping[str, Any]]):
        """Turn a HF ``rope_scaling`` dict into the hashable form stored here."""
        if not rope_scaling:
            return None
        items = []
        for k, v in sorted(rope_scaling.items()):
            if isinstance(v, list):
                v = tuple(v)
            items.append((k, v))
        items = dict(items)
        if "type" in items and "rope_type" not in items:
            items["rope_type"] = items.pop("type")
        elif "type" in items:
            items.pop("type")
        if items.get("rope_type", "default") == "default" and len(items) <= 1:
            return None
        return tuple(sorted(items.items()))
