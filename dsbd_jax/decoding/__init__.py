"""Decoding: every decoder as one jitted ``lax.while_loop`` with fixed shapes.

- ``configs``: one frozen config per decoder (``SampleConfig``, ``BeamSampleConfig``,
  ``BeamSearchConfig``, ``SpeculativeConfig``, ``TreeConfig``, ``DSBDConfig``) and
  ``DecodeConfig``, every baseline decoder's settings in one.
- ``common``: :class:`GenerateOutput`, prompt padding and checks, prefill and compile
  bookkeeping shared by every decoder; ``calls``: how a call runs, and its progress channel.
- ``warping``: temperature / top-k / top-p, the inverse-CDF draw and the residual.
- baselines: ``sampling`` (ancestral), ``beam`` (beam sampling, beam search), ``speculative``
  (one draft chain), ``tree`` (a draft tree).
- DSBD: ``forest`` builds the draft forest, ``verify`` runs the multi-candidate verification per
  layer, ``width`` is the dynamic-width rule, ``dsbd`` is the loop that ties them together.
- ``methods``: names, settings and labels of the decoders (what the CLI and the harness build).

May import: ``dsbd_jax.models`` (and jax, flax, numpy); never ``parallel``, ``eval`` or ``cli``.
"""

from dsbd_jax.decoding.beam import beam_sample, beam_search
from dsbd_jax.decoding.common import (DecodeConfig, GenerateOutput, bucket_length, compile_count,
                                      max_prompt_length, pad_prompts)
from dsbd_jax.decoding.configs import (BeamSampleConfig, BeamSearchConfig, SampleConfig,
                                       SpeculativeConfig, TreeConfig)
from dsbd_jax.decoding.dsbd import DSBDConfig, dsbd_generate
from dsbd_jax.decoding.sampling import sample
from dsbd_jax.decoding.speculative import speculative_sample
from dsbd_jax.decoding.tree import tree_speculative_sample
from dsbd_jax.decoding.warping import warp_logits

__all__ = ["BeamSampleConfig", "BeamSearchConfig", "DSBDConfig", "DecodeConfig", "GenerateOutput",
           "SampleConfig", "SpeculativeConfig", "TreeConfig", "beam_sample", "beam_search",
           "bucket_length", "compile_count", "dsbd_generate", "max_prompt_length", "pad_prompts",
           "sample", "speculative_sample", "tree_speculative_sample", "warp_logits"]
