"""Models: what a decoder runs. Nothing here reads a file or measures the host.

- ``config``: :class:`ModelConfig`, the frozen, hashable description of one model.
- ``llama``: the Flax Llama-family decoder (``forward`` with explicit positions, mask and KV
  cache; ``logits``; ``init_params``), its two weight layouts and their conversion (``layout``).
- ``head``: feature-level draft heads (EAGLE-style): a block that reads the target's features.
- ``cache``: the fixed-shape :class:`KVCache` ``[layers, batch, slots, kv_heads, head_dim]`` and
  the commits the decoders make on it.
- ``weights``, ``products``, ``kinds``: the kinds of projection kernel a parameter tree may
  hold (plain ``[in, out]``, transposed row blocks, int8 codes), their products, and the
  conversions between them. A new kind of kernel goes here.
- ``fused``: q/k/v and gate/up stored as one kernel each (the same model, fewer products).
- ``vocab``: tied, untied and truncated vocabulary heads.
- ``param_check``: a parameter tree checked against its config (what every decoder runs
  first).
- ``axes``: logical axis names of the arrays made here, resolved to a device mesh only under
  the caller's mesh context (no module state).

Where weights come from (Hugging Face directories, GGUF files, presets, trained heads) is
:mod:`dsbd_jax.loading`; what this host runs fastest (dtype, kernel form, compiler options,
DSBD's forest budget) is :mod:`dsbd_jax.host`.

May import: jax, flax, numpy, and nothing else of ``dsbd_jax`` (the bottom layer; the
contract in ``pyproject.toml`` enforces it).
"""

from dsbd_jax.models.cache import KVCache, empty_cache
from dsbd_jax.models.config import ModelConfig
from dsbd_jax.models.llama import causal_mask, convert_layout, forward, init_params, logits, params_layout

__all__ = ["KVCache", "ModelConfig", "causal_mask", "convert_layout", "empty_cache",
           "forward", "init_params", "logits", "params_layout"]

