"""dsbd-jax: Dynamic-Width Speculative Beam Decoding in JAX/Flax.

Models: :func:`load_model`, :func:`forward`, :func:`logits`, :class:`KVCache`.
Decoders (each one jitted ``lax.while_loop``): :func:`sample`, :func:`beam_sample`,
:func:`beam_search`, :func:`speculative_sample`, :func:`tree_speculative_sample`,
:func:`dsbd_generate`.

The names are imported on first use (PEP 562 ``__getattr__``), so ``import dsbd_jax`` (and the
``dsbd`` command's parser, its help and its refusals) does not import JAX.
"""

import importlib

__version__ = "0.3.0"

# each public name -> the module that defines it
_EXPORTS = {
    "beam_sample": "dsbd_jax.decoding.beam", "beam_search": "dsbd_jax.decoding.beam",
    "KVCache": "dsbd_jax.models.cache", "empty_cache": "dsbd_jax.models.cache",
    "Progress": "dsbd_jax.decoding.progress",
    "compile_count": "dsbd_jax.decoding._jit.compiles",
    "GenerateOutput": "dsbd_jax.decoding.common",
    "bucket_length": "dsbd_jax.decoding.common",
    "max_prompt_length": "dsbd_jax.decoding.common", "pad_prompts": "dsbd_jax.decoding.common",
    "BeamSampleConfig": "dsbd_jax.decoding.configs",
    "BeamSearchConfig": "dsbd_jax.decoding.configs", "SampleConfig": "dsbd_jax.decoding.configs",
    "SpeculativeConfig": "dsbd_jax.decoding.configs", "TreeConfig": "dsbd_jax.decoding.configs",
    "DSBDConfig": "dsbd_jax.decoding.configs",
    "ModelConfig": "dsbd_jax.models.config",
    "dsbd_generate": "dsbd_jax.decoding.dsbd",
    "LoadedModel": "dsbd_jax.loading", "list_presets": "dsbd_jax.loading",
    "load_model": "dsbd_jax.loading",
    "causal_mask": "dsbd_jax.models.llama", "forward": "dsbd_jax.models.llama",
    "init_params": "dsbd_jax.models.llama", "logits": "dsbd_jax.models.llama",
    "sample": "dsbd_jax.decoding.sampling",
    "speculative_sample": "dsbd_jax.decoding.speculative",
    "tree_speculative_sample": "dsbd_jax.decoding.tree",
    "warp_logits": "dsbd_jax.decoding.warping",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value      # later lookups skip this function
        return value
    raise AttributeError(f"module 'dsbd_jax' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
