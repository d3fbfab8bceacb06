"""Dynamic-Width Speculative Beam Decoding (Qin et al., AAAI 2025), as docs/algorithm.md fixes it.

``dsbd_generate`` runs the whole generation in ONE jit: a ``lax.while_loop`` whose body,
:func:`iteration`, reads as the paper's steps (module ``steps``): draft a forest, score it with
one target pass, verify it layer by layer, emit the output beams, commit their caches, count.
Every step is a beam-sampling step of the width the rule picked for it, so the output has
exactly beam sampling's distribution on the target; with ``threshold = 1`` and ``num_beams``
None it is beam sampling of width ``min_width`` (Theorem 3.1).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np

from dsbd_jax.decoding import common
from dsbd_jax.decoding._jit import decoder, inputs, jit, loop
from dsbd_jax.decoding.common import GenerateOutput
from dsbd_jax.decoding.configs import DSBDConfig, check_config
from dsbd_jax.decoding.dsbd import steps
from dsbd_jax.decoding.dsbd.state import DSBDState, init_state, num_slots, to_output


def iteration(config: DSBDConfig, params, prompt_lengths, state: DSBDState,
              table=None) -> DSBDState:
    """One DSBD iteration for every prompt; finished prompts are left unchanged. ``table``: the
    random numbers made before the loop (``steps.random_table``), or ``None``."""
    N = state.sequences.shape[2]
    active = ~state.done
    budget = jnp.where(active, N - state.generated, 0)
    forest, dbuf, lay, rand, base, in_idx, beams_in = steps.draft_forest(
        config, params, prompt_lengths, state, table)
    scored = steps.score_forest(config, params, state, forest, lay, base, in_idx, beams_in)
    verdict = steps.verify(config, rand, scored, forest, budget, lay)
    beams = steps.emit_beams(config, state, forest, scored, verdict, lay, in_idx, beams_in,
                             active)
    caches = steps.commit_caches(config, state, dbuf, scored.tkv, beams, base, lay, active)
    return steps.advance(config, state, beams, verdict, budget, active, caches)


def _progress(s: DSBDState):
    """What a progress channel hears after each iteration."""
    return dict(iterations=s.stats.iterations, generated=s.generated, done=s.done,
                target_calls=s.stats.target_calls, accepted=jnp.sum(s.stats.layer_accepted),
                verified=jnp.sum(s.stats.layer_verified))


def _dsbd_core(params, prompt_ids, prompt_lengths, keys, config: DSBDConfig) -> GenerateOutput:
    params = inputs.with_prompt_rows(params, prompt_ids)
    state = init_state(config, params, prompt_ids, prompt_lengths, keys)
    table = steps.random_table(config, state.keys)
    body = functools.partial(iteration, config, params, prompt_lengths, table=table)
    state = loop(config, lambda s: jnp.any(~s.done), body, state, _progress)
    return to_output(config, state)


def check_inputs(params, prompt_ids, config, prompt_lengths, key=None) -> None:
    """Host-side validation (concrete values, clear ``ValueError``s) before the jitted core;
    ``key`` is required."""
    check_config("dsbd_generate", config)
    if not isinstance(params, dict) or "target" not in params or "draft" not in params:
        raise ValueError('params must be a dict {"target": ..., "draft": ...}')
    for name, mc in (("target", config.target), ("draft", config.draft)):
        try:
            rows = params[name]["embed"]["embedding"].shape[0]
        except (KeyError, TypeError, AttributeError):
            rows = None
        if rows is not None and rows != mc.vocab_size:
            raise ValueError(f"{name} parameters have a vocabulary of {rows}, the config says "
                             f"{mc.vocab_size}")
    inputs.check_prompt_batch(prompt_ids, prompt_lengths, config.target.vocab_size)
    B, P = np.shape(prompt_ids)
    inputs.check_positions({"target": config.target, "draft": config.draft}, P,
                           config.max_new_tokens, num_slots(config, P) - P - config.max_new_tokens)
    inputs.check_key(key, B)


def _prepare(params, prompt_ids, key, config: DSBDConfig, prompt_lengths):
    """Validate (host side) and return the core's ``(params, prompt_ids, lengths, keys)``."""
    check_inputs(params, prompt_ids, config, prompt_lengths, key=key)
    prompt_ids = jnp.asarray(prompt_ids, jnp.int32)
    lengths = common.prompt_lengths_or_full(prompt_ids, prompt_lengths)
    params = {"target": params["target"], "draft": params["draft"]}
    # [B] row keys before the jit: a single key and a batch of keys share one compiled program
    keys = inputs.row_keys(key, prompt_ids.shape[0])
    return params, prompt_ids, lengths, keys


@decoder(_dsbd_core)
def dsbd_generate(params, prompt_ids, key, config: DSBDConfig, prompt_lengths=None
                  ) -> GenerateOutput:
    """Dynamic-width speculative beam decoding (module doc; docs/algorithm.md).

    Args:
      params: ``{"target": target params, "draft": draft params}``.
      prompt_ids: ``[B, P]`` int, right-padded; ``prompt_lengths``: ``[B]`` (None: all ``P``).
      key: one PRNG key (row b uses ``fold_in(key, b)``) or ``[B]`` keys (row b uses ``key[b]``);
        iteration i of row b uses ``fold_in(row_key, i)``.
      config: ``DSBDConfig``.
    Returns:
      ``GenerateOutput``: ``sequences [B, max_width, N]`` holds the final beams in slots
      ``0 .. num_beams_out - 1`` in the order of the last output layer (accepted candidates
      first, in draft order, then the correction or extra-layer draws); unused or dead slots
      have ``log_likelihoods == -inf``, ``lengths == 0`` and pad tokens. ``log_likelihoods``
      are unwarped target log-probabilities. A prompt stops when all its live beams are
      finished (EOS is absorbing) or after exactly ``max_new_tokens`` tokens.
      ``stats``: ``iterations`` (loop trips), ``target_calls`` / ``draft_calls`` (passes after
      the prefills), ``generated_tokens [B]``, ``row_iterations [B]``, ``accepted_layers
      [B]``, ``mean_accepted_layers [B]`` and ``mean_layers_per_iteration [B]`` (floats, per
      iteration), ``depth_hist [B, gamma + 2]`` (full-budget iterations by the depth they
      produced: Theorem 3.2), ``step_widths [B, N]`` (beams at each step), the per-layer sums
      ``layer_verified / layer_passed / layer_candidates / layer_accepted / layer_width_sum
      [gamma]``, the rates ``layer_acceptance_rate``, ``candidate_acceptance_rate``,
      ``mean_layer_width`` ``[gamma]`` and ``mean_accepted_width``, and ``num_beams_out [B]``.
    """
    return _prepare(params, prompt_ids, key, config, prompt_lengths), config


@jit
def _first_forest_core(params, prompt_ids, prompt_lengths, keys, config: DSBDConfig):
    prompt_ids = inputs.mask_padding(prompt_ids, prompt_lengths)
    params = inputs.with_prompt_rows(params, prompt_ids)
    state = init_state(config, params, prompt_ids, prompt_lengths, keys)
    return steps.draft_forest(config, params, prompt_lengths, state)[0]


def first_forest(params, prompt_ids, key, config: DSBDConfig, prompt_lengths=None):
    """The draft forest of the first iteration, for inspection: a ``forest.Forest`` whose
    ``tokens [B, gamma, W_S]`` are the drafted tokens of each layer, ``parent [B, gamma, W_S]``
    the slot of each node's parent in the layer before (layer 0: the input beam), ``valid`` the
    nodes drawn with positive probability and ``q`` the joint each layer was drawn from (with
    a top-k and i.i.d. draws, its values at ``q_index``: module ``tops``). Same arguments as
    :func:`dsbd_generate` (and the same draws as its first iteration)."""
    return _first_forest_core(*_prepare(params, prompt_ids, key, config, prompt_lengths),
                              config=config)
