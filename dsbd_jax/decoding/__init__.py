"""Decoding: every decoder as one jitted ``lax.while_loop`` with fixed shapes.

``configs`` (one frozen config per decoder), ``common`` (``GenerateOutput``, prompts, prefill),
``warping`` (temperature / top-k / top-p and the draws), ``rules`` (the accept test, residuals,
removal and the Gumbel draw: every verification's rules, once), ``progress`` (progress
channels), the baselines ``sampling``, ``beam``, ``speculative``, ``tree``, DSBD's room
``dsbd``, and ``methods`` (names and settings). ``_jit`` (private) makes each decoder a
checked, stored program.

May import: ``dsbd_jax.models``; ``dsbd_jax.host`` only through ``_jit`` (and ``configs``, for
the compiler-option names); never ``loading``, ``parallel``, ``eval`` or ``cli``
(``pyproject.toml``'s contracts).
"""

from dsbd_jax.decoding.beam import beam_sample, beam_search
from dsbd_jax.decoding._jit import compile_count
from dsbd_jax.decoding.common import GenerateOutput, bucket_length, max_prompt_length, pad_prompts
from dsbd_jax.decoding.configs import (BeamSampleConfig, BeamSearchConfig, DSBDConfig,
                                       SampleConfig, SpeculativeConfig, TreeConfig)
from dsbd_jax.decoding.dsbd import dsbd_generate
from dsbd_jax.decoding.progress import Progress
from dsbd_jax.decoding.sampling import sample
from dsbd_jax.decoding.speculative import speculative_sample
from dsbd_jax.decoding.tree import tree_speculative_sample
from dsbd_jax.decoding.warping import warp_logits

__all__ = ["BeamSampleConfig", "BeamSearchConfig", "DSBDConfig", "GenerateOutput",
           "Progress", "SampleConfig", "SpeculativeConfig", "TreeConfig", "beam_sample", "beam_search",
           "bucket_length", "compile_count", "dsbd_generate", "max_prompt_length", "pad_prompts",
           "sample", "speculative_sample", "tree_speculative_sample", "warp_logits"]
