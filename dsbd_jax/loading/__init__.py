"""Loading: where a model's weights come from, and the tree a load gives.

- ``load``: the front door, :func:`load_model` (a Hugging Face directory or hub id, a GGUF file,
  a preset; ``dtype``, ``weights`` and ``kernel_blocks`` choices made by :mod:`dsbd_jax.host`)
  and :class:`LoadedModel`; ``load_args`` checks its arguments.
- ``hf`` (safetensors checkpoints), ``gguf`` (GGUF files), ``presets`` (the offline weight
  packages and the converted-weights cache), ``hub`` (Hugging Face hub snapshots) and
  ``checkpoint`` (what they share: parameter names and shapes, assembling a parameter tree, the
  cache's file format).
- ``heads``: trained draft heads on disk (their files, their names in the cache) and a draft
  source read as a head or a model.
- ``budget``: the memory a source will take, read from its files before loading.

A new source format (a loader) goes here; a new kind of kernel goes in :mod:`dsbd_jax.models`
(:mod:`dsbd_jax.models.kinds`) with its loading option in ``load``.

May import: :mod:`dsbd_jax.models` and :mod:`dsbd_jax.host`, never the decoders.
"""

from dsbd_jax.loading.load import LoadedModel, list_presets, load_model

__all__ = ["LoadedModel", "list_presets", "load_model"]
