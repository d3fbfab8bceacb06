"""Model configuration: a frozen, hashable dataclass (static under ``jax.jit``)."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional, Tuple

import jax.numpy as jnp

SUPPORTED_DTYPES = ("float32", "bfloat16", "float16")
SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Llama-family decoder configuration (Llama 2/3, Qwen2, SmolLM).

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
