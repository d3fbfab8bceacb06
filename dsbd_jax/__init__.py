"""dsbd-jax: Dynamic-Width Speculative Beam Decoding in JAX/Flax.

Models: :func:`load_model`, :func:`forward`, :func:`logits`, :class:`KVCache`.
Decoders (each one jitted ``lax.while_loop``): :func:`sample`, :func:`beam_sample`,
:func:`beam_search`, :func:`speculative_sample`, :func:`tree_speculative_sample`,
:func:`dsbd_generate`.
"""

from dsbd_jax.decoding.beam import beam_sample, beam_search
from dsbd_jax.models.cache import KVCache, empty_cache
from dsbd_jax.decoding._jit.compiles import compile_count
from dsbd_jax.decoding.common import GenerateOutput, bucket_length, max_prompt_length, pad_prompts
from dsbd_jax.decoding.progress import Progress
from dsbd_jax.decoding.configs import (BeamSampleConfig, BeamSearchConfig, SampleConfig,
                                       SpeculativeConfig, TreeConfig)
from dsbd_jax.models.config import ModelConfig
from dsbd_jax.decoding.configs import DSBDConfig
from dsbd_jax.decoding.dsbd import dsbd_generate
from dsbd_jax.loading import LoadedModel, list_presets, load_model
from dsbd_jax.models.llama import causal_mask, forward, init_params, logits
from dsbd_jax.decoding.sampling import sample
from dsbd_jax.decoding.speculative import speculative_sample
from dsbd_jax.decoding.tree import tree_speculative_sample
from dsbd_jax.decoding.warping import warp_logits

__version__ = "0.2.0"

__all__ = [
    "DSBDConfig", "GenerateOutput", "KVCache", "LoadedModel", "ModelConfig",
    "Progress", "SampleConfig", "BeamSampleConfig", "BeamSearchConfig", "SpeculativeConfig",
    "TreeConfig",
    "beam_sample", "beam_search", "bucket_length", "causal_mask", "compile_count",
    "dsbd_generate", "empty_cache", "forward", "init_params", "list_presets", "load_model",
    "logits", "max_prompt_length", "pad_prompts", "sample", "speculative_sample", "tree_speculative_sample",
    "warp_logits",
]
