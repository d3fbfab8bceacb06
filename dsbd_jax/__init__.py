"""dsbd-jax: Dynamic-Width Speculative Beam Decoding in JAX/Flax."""

from .cache import KVCache, empty_cache
from .config import ModelConfig
from .model import causal_mask, forward, init_params, logits

__version__ = "0.1.0"
