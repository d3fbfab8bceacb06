"""Models: what a decoder runs, and where its weights come from.

- ``config``: :class:`ModelConfig`, the frozen, hashable description of one model.
- ``llama``: the Flax Llama-family decoder (``forward`` with explicit positions, mask and KV
  cache; ``logits``; ``init_params``), its two weight layouts and their conversion.
- ``cache``: the fixed-shape :class:`KVCache` ``[layers, batch, slots, kv_heads, head_dim]`` and
  the commits the decoders make on it.
- ``axes``: logical axis names of the arrays made here, resolved to a device mesh only under
  the caller's mesh context (no module state).
- ``loading``: the front door, ``load_model(source)`` for a Hugging Face directory, a GGUF file
  or a preset; ``hf`` (safetensors checkpoints), ``gguf`` (GGUF files), ``presets`` (the offline
  weight packages) and ``checkpoint`` (what they share: parameter names and shapes, assembling a
  parameter tree, the converted-weights cache format).

May import: jax, flax, numpy, transformers, gguf, and nothing else of ``dsbd_jax``
(the bottom layer; the contract in ``pyproject.toml`` enforces it).
"""

from dsbd_jax.models.cache import KVCache, empty_cache
from dsbd_jax.models.config import ModelConfig
from dsbd_jax.models.llama import causal_mask, convert_layout, forward, init_params, logits, params_layout
from dsbd_jax.models.loading import LoadedModel, list_presets, load_model

__all__ = ["KVCache", "LoadedModel", "ModelConfig", "causal_mask", "convert_layout", "empty_cache",
           "forward", "init_params", "list_presets", "load_model", "logits", "params_layout"]
