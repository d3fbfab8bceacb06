"""dsbd-jax: Dynamic-Width Speculative Beam Decoding in JAX/Flax.

Models: :func:`load_model`, :func:`forward`, :func:`logits`, :class:`KVCache`.
Decoders (each one jitted ``lax.while_loop``): :func:`sample`, :func:`beam_sample`,
:func:`beam_search`, :func:`speculative_sample`, :func:`tree_speculative_sample`,
:func:`dsbd_generate`.
"""

from .beam import beam_sample, beam_search
from .cache import KVCache, empty_cache
from .common import (DecodeConfig, GenerateOutput, bucket_length, compile_count, max_prompt_length,
                     pad_prompts)
from .config import ModelConfig
from .dsbd import DSBDConfig, dsbd_generate
from .loading import LoadedModel, list_presets, load_model
from .model import causal_mask, forward, init_params, logits
from .sampling import sample
from .speculative import speculative_sample
from .tree import tree_speculative_sample
from .warping import warp_logits

__version__ = "0.1.0"

__all__ = [
    "DSBDConfig", "DecodeConfig", "GenerateOutput", "KVCache", "LoadedModel", "ModelConfig",
    "beam_sample", "beam_search", "bucket_length", "causal_mask", "compile_count",
    "dsbd_generate", "empty_cache", "forward", "init_params", "list_presets", "load_model",
    "logits", "max_prompt_length", "pad_prompts", "sample", "speculative_sample", "tree_speculative_sample",
    "warp_logits",
]
