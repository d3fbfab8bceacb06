"""Models: what a decoder runs. Nothing here reads a file or measures the host.

``config`` (:class:`ModelConfig`, frozen and hashable), ``llama`` (the Flax Llama-family decoder;
its two weight layouts in ``layout``), ``head`` (feature-level draft heads), ``cache`` (the
fixed-shape :class:`KVCache` and its commits), ``weights`` / ``products`` / ``kinds`` (the kinds
of projection kernel, their products and conversions; a new kind goes here), ``fused`` (q/k/v
and gate/up as one kernel each), ``vocab`` (truncated heads), ``param_check`` and ``axes``
(logical axis names, resolved only under the caller's mesh). Sources: :mod:`dsbd_jax.loading`.

May import: jax, flax, numpy, and nothing else of ``dsbd_jax`` (the bottom layer, enforced in
``pyproject.toml``). What this host runs fastest: :mod:`dsbd_jax.host`.
"""

from dsbd_jax.models.cache import KVCache, empty_cache
from dsbd_jax.models.config import ModelConfig
from dsbd_jax.models.llama import causal_mask, convert_layout, forward, init_params, logits, params_layout

__all__ = ["KVCache", "ModelConfig", "causal_mask", "convert_layout", "empty_cache",
           "forward", "init_params", "logits", "params_layout"]

