"""A decoder's inputs: PRNG keys (one, or one per row), prompt batches, positions and parameters,
checked at trace time with errors that name the bad input, and guarded at run time (``checkify``
under the user's ``jit``: a bad prompt marks its rows invalid, never a silent wrong answer)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from dsbd_jax.models.param_check import check_params  # noqa: F401  (the decoders' check)
from dsbd_jax.models.vocab import with_prompt_rows as _extend_head
from dsbd_jax.decoding.common import (IDS_MSG, LENGTHS_MSG, GenerateOutput,
                                      check_prompt_lengths, note_trace)


# ---------------------------------------------------------------------------------------------
# PRNG keys: one key (row b uses fold_in(key, b)) or a batch of keys [B] (row b uses key[b]).
def is_typed_key(key) -> bool:
    dtype = getattr(key, "dtype", None)
    return dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key)


def check_key(key, batch: int) -> None:
    """``ValueError`` unless ``key`` is one PRNG key or a batch of ``batch`` keys (typed keys from
    ``jax.random.key`` or raw ``uint32`` keys from ``jax.random.PRNGKey``)."""
    shape = tuple(np.shape(key))
    if is_typed_key(key):
        ok = shape in ((), (batch,))
    else:
        ok = shape in ((2,), (batch, 2)) and jnp.issubdtype(getattr(key, "dtype", np.float32),
                                                             jnp.unsignedinteger)
    if not ok:
        raise ValueError(
            f"key must be one PRNG key (jax.random.key or PRNGKey) or a batch of {batch} keys, "
            f"got shape {shape} dtype {getattr(key, 'dtype', type(key))}")


def row_keys(key, batch: int) -> jax.Array:
    """Typed per-row keys ``[B]``: ``fold_in(key, b)`` for one key, ``key[b]`` for a batch.
    Raw ``uint32`` keys are wrapped first (same bits, so the same samples)."""
    key = key if isinstance(key, jax.Array) else jnp.asarray(key)
    if not is_typed_key(key):
        key = jax.random.wrap_key_data(key.astype(jnp.uint32))
    if key.shape == ():
        return jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(batch))
    return key


def check_prompt_batch(prompt_ids, prompt_lengths, vocab_size: int) -> None:
    """Host-side ``ValueError`` for a malformed prompt batch: not a non-empty ``[B, P]`` integer
    array, lengths out of ``[1, P]``, or token ids (within each row's length) outside the
    vocabulary. Padding past a row's length may hold anything."""
    shape = np.shape(prompt_ids)
    if len(shape) != 2 or shape[0] < 1 or shape[1] < 1:
        raise ValueError(f"prompt_ids must be a non-empty [batch, length] array, got shape {shape}")
    dtype = prompt_ids.dtype if hasattr(prompt_ids, "dtype") else np.asarray(prompt_ids).dtype
    if not jnp.issubdtype(dtype, jnp.integer):
        raise ValueError(f"prompt_ids must hold integer token ids, got dtype {dtype}")
    check_prompt_lengths(jnp.asarray(prompt_ids), prompt_lengths)
    if isinstance(prompt_ids, jax.core.Tracer):
        return
    ids = np.asarray(prompt_ids)
    if prompt_lengths is None or isinstance(prompt_lengths, jax.core.Tracer):
        used = ids
    else:
        used = ids[np.arange(ids.shape[1])[None, :] < np.asarray(prompt_lengths)[:, None]]
    if used.size and (used.min() < 0 or used.max() >= vocab_size):
        raise ValueError(IDS_MSG.format(vocab_size, used.min(), used.max()))


def check_positions(models, prompt_len: int, max_new_tokens: int, lookahead: int = 0) -> None:
    """``ValueError`` if the padded prompt + new tokens (+ speculative look-ahead) need more
    positions than a model supports. ``models``: ``{"target": ModelConfig, ...}``."""
    need = prompt_len + max_new_tokens + lookahead
    for name, mc in models.items():
        if need > mc.max_position_embeddings:
            extra = f" + {lookahead} look-ahead" if lookahead else ""
            raise ValueError(f"prompt too long: {prompt_len} padded prompt + {max_new_tokens} new"
                             f"{extra} positions exceed the {name}'s max_position_embeddings "
                             f"({mc.max_position_embeddings})")


# ---------------------------------------------------------------------------------------------
# checks inside the jitted cores (they also run under a user's own jit, where the host checks
# above see tracers and cannot look at values; the parameters' check is the models layer's:
# dsbd_jax.models.param_check)
def with_prompt_rows(params, prompt_ids):
    """``{"target": .., "draft": ..}`` with the draft's truncated head extended by the prompts'
    tokens where it keeps prompt rows (:func:`dsbd_jax.models.vocab.with_prompt_rows`); the
    drafted cores call it right after :func:`guard_inputs`."""
    return {**params, "draft": _extend_head(params["draft"], prompt_ids)}


def guard_inputs(name: str, config, params, prompt_ids, prompt_lengths):
    """First lines of every jitted core. Checks the parameters against the config at trace time
    (``check_params``, per model) and the prompt values in the program (``guard_prompts``).
    Returns ``(invalid [B], prompt_ids, prompt_lengths)``, the prompts made harmless."""
    note_trace(name, batch=prompt_ids.shape[0], prompt=prompt_ids.shape[1])
    if isinstance(params, dict) and "draft" in params:
        check_params("target", config.target, params["target"])
        from dsbd_jax.models import head as _head
        if _head.is_head(config.draft):
            _head.check_params(config.draft, params["draft"])
        else:
            check_params("draft", config.draft, params["draft"])
    else:
        check_params("target", config.target, params)
    return guard_prompts(prompt_ids, prompt_lengths, config.target.vocab_size)


def guard_prompts(prompt_ids, prompt_lengths, vocab_size: int):
    """In-program value checks of a prompt batch: ``checkify.debug_check`` with the host checks'
    messages (active only under ``checkify.checkify``), and ``invalid [B]`` for the output.
    Invalid rows are replaced by a one-token prompt of id 0 so they run harmlessly (their output
    is blanked by ``mark_invalid``); valid rows keep their tokens, their padding set to 0
    (:func:`mask_padding`). Only tokens within a row's length are checked."""
    B, P = prompt_ids.shape
    len_bad = (prompt_lengths < 1) | (prompt_lengths > P)
    used = jnp.arange(P)[None, :] < prompt_lengths[:, None]
    ids_bad = jnp.any(used & ((prompt_ids < 0) | (prompt_ids >= vocab_size)), axis=1)
    checkify.debug_check(~jnp.any(len_bad), LENGTHS_MSG.format(P, "{}", "{}"),
                         jnp.min(prompt_lengths), jnp.max(prompt_lengths))
    checkify.debug_check(~jnp.any(ids_bad), IDS_MSG.format(vocab_size, "{}", "{}"),
                         jnp.min(jnp.where(used, prompt_ids, vocab_size - 1)),
                         jnp.max(jnp.where(used, prompt_ids, 0)))
    invalid = len_bad | ids_bad
    prompt_ids = mask_padding(jnp.where(invalid[:, None], 0, prompt_ids), prompt_lengths)
    prompt_lengths = jnp.where(invalid, 1, prompt_lengths)
    return invalid, prompt_ids, prompt_lengths


def mask_padding(prompt_ids, prompt_lengths) -> jax.Array:
    """``prompt_ids [B, P]`` with every token past its row's length (``prompt_lengths [B]``) set
    to 0: padding is never read, whatever it holds (ids >= vocab_size, negative, huge), so a
    prompt padded with anything runs exactly as the same prompt padded with 0. Jittable; every
    core calls it (through :func:`guard_prompts`) before any embedding lookup."""
    P = prompt_ids.shape[1]
    used = jnp.arange(P)[None, :] < prompt_lengths[:, None]
    return jnp.where(used, prompt_ids, 0).astype(prompt_ids.dtype)


def mark_invalid(out: GenerateOutput, invalid: jax.Array, pad_id: int) -> GenerateOutput:
    """``out`` with ``invalid`` set and the invalid prompts' beams emptied (``GenerateOutput``)."""
    row = lambda x: invalid.reshape((-1,) + (1,) * (x.ndim - 1))  # noqa: E731
    stats = dict(out.stats)
    for k in ("generated_tokens", "num_beams_out"):
        if k in stats:
            stats[k] = jnp.where(invalid, 0, stats[k])
    return out.replace(
        sequences=jnp.where(row(out.sequences), pad_id, out.sequences),
        lengths=jnp.where(row(out.lengths), 0, out.lengths),
        log_likelihoods=jnp.where(row(out.log_likelihoods), -jnp.inf, out.log_likelihoods),
        best=jnp.where(invalid, 0, out.best), stats=stats, invalid=invalid)
