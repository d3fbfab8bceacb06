"""Loading: where a model's weights come from, and the tree a load gives.

- ``load``: the front door, :func:`load_model` (a Hugging Face directory or hub id, a GGUF file,
  a preset; its ``dtype``, ``weights`` and ``kernel_blocks`` choices made by
  :mod:`dsbd_jax.host`) and :class:`LoadedModel`; ``load_args`` checks its arguments.
- ``hf``, ``gguf``, ``presets``, ``hub``: the sources; ``checkpoint``: what they share;
  ``host_layout``: a preset's parameters in the form this host runs them.
- ``heads``: trained draft heads on disk; ``budget``: the memory a source will take.

A new source format goes here; a new kind of kernel in :mod:`dsbd_jax.models.kinds`, with its
loading option in ``load``. May import :mod:`dsbd_jax.models` and :mod:`dsbd_jax.host`, never
the decoders.
"""

from dsbd_jax.loading.load import LoadedModel, list_presets, load_model

__all__ = ["LoadedModel", "list_presets", "load_model"]
