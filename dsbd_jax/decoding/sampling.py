"""Multinomial sampling (and greedy decoding): the plain autoregressive baseline.

Each token of each row is drawn from the row's warped next-token distribution (greedy when
``temperature == 0`` or ``top_k == 1``); ``num_beams = W`` gives W independent samples a prompt.
Also the input handling the baselines share (``beam`` uses it): ``params``, per-row keys, the
host-side checks.

Invariant: row b uses ``fold_in(key, b)`` (or ``key[b]``) and step t ``fold_in(row_key, t)``, so a
prompt gives the same tokens alone as inside a batch.
"""

from __future__ import annotations

import functools
from typing import Any, Mapping

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.models import cache as kvc
from dsbd_jax.decoding import common
from dsbd_jax.decoding._jit import decoder, inputs, loop, step_progress
from dsbd_jax.decoding.common import GenerateOutput
from dsbd_jax.decoding.configs import SampleConfig, check_config
from dsbd_jax.decoding._jit.inputs import check_key, row_keys  # noqa: F401  (re-exported)
from dsbd_jax.decoding.warping import draw_from, warp_logits


# ---------------------------------------------------------------------------------------------
# shared input handling
def target_params(params: Any):
    """The target model's parameter tree from ``params`` (the tree itself, ``{"target": tree, ...}``
    or an object with a ``.params`` attribute such as ``loading.LoadedModel``)."""
    if isinstance(params, Mapping) and "target" in params:
        params = params["target"]
    if hasattr(params, "params") and not isinstance(params, Mapping):
        params = params.params
    return params


@functools.partial(jax.jit, static_argnums=1)
def _row_keys_jit(key, batch):
    return row_keys(key, batch)


def prepare_keys(key, batch: int) -> jax.Array:
    """Host side: the ``[B]`` row keys, so the jitted decoders see one key shape whether they were
    given one key or a batch (no recompilation between the two)."""
    return _row_keys_jit(key, batch)


def step_keys(keys: jax.Array, step) -> jax.Array:
    """``fold_in(row_key, step)`` for every row key ``[B]``."""
    return jax.vmap(jax.random.fold_in, in_axes=(0, None))(keys, step)


def check_inputs(params, prompt_ids, config: SampleConfig, prompt_lengths, key=None) -> None:
    """Host-side checks shared by the baseline decoders; raise ``ValueError`` (never NaN later).
    The config's type is each decoder's own check (``configs.check_config``)."""
    inputs.check_prompt_batch(prompt_ids, prompt_lengths, config.target.vocab_size)
    shape = np.shape(prompt_ids)
    inputs.check_positions({"target": config.target}, shape[1], config.max_new_tokens)
    p = target_params(params)
    embed = None
    if isinstance(p, Mapping):
        embed = p.get("embed", {}).get("embedding") if isinstance(p.get("embed"), Mapping) else None
    if embed is None:
        raise ValueError("params must be the target model's parameter tree (or {'target': tree})")
    if tuple(embed.shape) != (config.target.vocab_size, config.target.hidden_size):
        raise ValueError(f"params do not match config.target: embedding {tuple(embed.shape)} vs "
                         f"{(config.target.vocab_size, config.target.hidden_size)}")
    if key is not None:
        check_key(key, shape[0])


def as_array(x):
    """``x`` unchanged if it is a jax array (or tracer), else ``np.asarray(x)`` (lists, tuples)."""
    return x if isinstance(x, (jax.Array, np.ndarray)) else np.asarray(x)


def keyed_arguments(name: str, params, prompt_ids, key, config, prompt_lengths):
    """The host side of a keyed baseline decoder (``sample``, ``beam_sample``): its checks,
    then its core's ``(params, prompt_ids, lengths, row keys)`` and the config."""
    check_config(name, config)
    prompt_ids = as_array(prompt_ids)
    check_inputs(params, prompt_ids, config, prompt_lengths, key=key)
    lengths = common.prompt_lengths_or_full(prompt_ids, prompt_lengths)
    return (target_params(params), jnp.asarray(prompt_ids, jnp.int32), lengths,
            prepare_keys(key, np.shape(prompt_ids)[0])), config


def is_greedy(config: SampleConfig) -> bool:
    return config.temperature == 0.0 or config.top_k == 1


# ---------------------------------------------------------------------------------------------
@flax.struct.dataclass
class SampleState:
    step: jax.Array         # scalar int32: tokens generated so far
    cache: kvc.KVCache      # [L, B*W, S, K, D]
    logits: jax.Array       # [B*W, V] logits of the next token
    sequences: jax.Array    # [B*W, N] int32 (pad where not generated)
    log_likelihoods: jax.Array  # [B*W] float32
    finished: jax.Array     # [B*W] bool
    target_calls: jax.Array  # scalar int32


def _sample_core(params, prompt_ids, prompt_lengths, key, config: SampleConfig) -> GenerateOutput:
    B, P = prompt_ids.shape
    W, N = config.num_beams, config.max_new_tokens
    V = config.target.vocab_size
    pad = config.pad_id
    greedy = is_greedy(config)
    keys = row_keys(key, B)
    cache, logits = common.prefill(config.target, params, prompt_ids, prompt_lengths, P + N)
    row_len = jnp.repeat(prompt_lengths, W)  # [B*W] prompt length of each sample row
    state = SampleState(
        step=jnp.zeros((), jnp.int32), cache=kvc.repeat_rows(cache, W),
        logits=jnp.repeat(logits, W, axis=0),
        sequences=jnp.full((B * W, N), pad, jnp.int32),
        log_likelihoods=jnp.zeros((B * W,), jnp.float32),
        finished=jnp.zeros((B * W,), bool), target_calls=jnp.ones((), jnp.int32))

    def cond(s: SampleState):
        return (s.step < N) & ~jnp.all(s.finished)

    def body(s: SampleState):
        t = s.step
        logp = jax.nn.log_softmax(s.logits, axis=-1)
        logp = common.absorb_finished(logp, s.finished, pad)  # [B*W, V]
        if greedy:
            tok = jnp.argmax(logp, axis=-1).astype(jnp.int32)
        else:
            warped = warp_logits(logp, config.temperature, config.top_k, config.top_p)
            u = jax.vmap(lambda k: jax.random.uniform(k, (W,)))(step_keys(keys, t))  # [B, W]
            tok = draw_from(jnp.exp(warped), u.reshape(B * W, 1))[:, 0]
            tok = tok.reshape(B * W).astype(jnp.int32)
        ll = s.log_likelihoods + jnp.take_along_axis(logp, tok[:, None], axis=-1)[:, 0]
        seqs = s.sequences.at[:, t].set(tok)
        finished = s.finished | common.is_eos(tok, config.eos_ids)

        def advance(c):
            lg, cc = common.decode_step(config.target, params, c, tok, row_len + t)
            return lg, cc, s.target_calls + 1

        more = (t + 1 < N) & ~jnp.all(finished)
        logits, cache, calls = jax.lax.cond(more, advance,
                                            lambda c: (s.logits, c, s.target_calls), s.cache)
        return SampleState(step=t + 1, cache=cache, logits=logits, sequences=seqs,
                           log_likelihoods=ll, finished=finished, target_calls=calls)

    s = loop(config, cond, body, state, step_progress(
        B, N, lambda s: jnp.all(s.finished.reshape(B, W), axis=-1)))
    sequences = s.sequences.reshape(B, W, N)
    ll = s.log_likelihoods.reshape(B, W)
    lengths, best = common.best_and_lengths(sequences, ll, config.eos_ids)
    stats = dict(target_calls=s.target_calls, draft_calls=jnp.zeros((), jnp.int32),
                 iterations=s.step, generated_tokens=jnp.max(lengths, axis=-1))
    return GenerateOutput(sequences=sequences, lengths=lengths, log_likelihoods=ll, best=best,
                          stats=stats)


@decoder(_sample_core)
def sample(params, prompt_ids, key, config: SampleConfig, prompt_lengths=None) -> GenerateOutput:
    """Multinomial sampling from the warped target (greedy if temperature 0 or top_k 1).

    Args:
      params: the target's parameter tree (or ``{"target": tree}``).
      prompt_ids: ``[B, P]`` int, right-padded; ``prompt_lengths``: ``[B]`` (None: all full).
      key: one PRNG key (row b uses ``fold_in(key, b)``) or ``[B]`` keys (row b uses ``key[b]``).
      config: ``SampleConfig``; ``num_beams`` = independent samples per prompt.
    Returns:
      ``GenerateOutput`` with sequences ``[B, num_beams, max_new_tokens]`` (pad after EOS),
      unwarped target log-likelihoods, and stats ``target_calls`` (prefill + decode steps),
      ``draft_calls`` (0), ``iterations`` (decode steps) and ``generated_tokens [B]`` (the
      longest sample's length).
    """
    return keyed_arguments("sample", params, prompt_ids, key, config, prompt_lengths)
