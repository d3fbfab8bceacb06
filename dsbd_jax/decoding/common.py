"""Pieces shared by every decoder: output type, prompt batches, prefill, one-token steps,
EOS handling, the settings (``DecodeConfig``) and compile counting. How a call runs (the jitted
core, ahead-of-time capture, progress) is :mod:`dsbd_jax.decoding.calls`; checking and guarding
a call's inputs is :mod:`dsbd_jax.decoding.inputs`.

Prompt convention: a batch of prompts is **right-padded** ``prompt_ids [B, P]`` with
``prompt_lengths [B]`` (each >= 1). A token at cache slot ``s`` has RoPE position ``s``; the
prompt fills slots ``0 .. len-1`` and generated tokens follow contiguously, so masks are built
from per-row lengths alone. ``pad_prompts`` pads a list of token lists to a length bucket so that
prompts of one bucket share one compiled program.

EOS convention (docs/algorithm.md): a row that emitted an EOS token is *finished*; it keeps
extending with ``pad_token_id`` at log-probability 0 (an absorbing state), so beam
distributions keep fixed shapes. ``lengths`` counts new tokens up to and including the EOS.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional, Sequence, Tuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.models import cache as kvc
from dsbd_jax.models.config import ModelConfig
from dsbd_jax.models.llama import forward

# ---------------------------------------------------------------------------------------------
# compile counting: ``note_trace`` runs when a core's Python body is traced (once per new shapes
# or config); ``compile_count`` counts real XLA compilations, read from jax.monitoring's backend
# compile events (see ``dsbd_jax/decoding/compiles.py``).
from dsbd_jax.decoding.compiles import compile_count  # noqa: E402,F401
# Progress (and the deprecated progress_hook): documented here for library users; they live
# with the calls they report from
from dsbd_jax.decoding.calls import Progress, progress_hook  # noqa: E402,F401

logger = logging.getLogger("dsbd_jax")


def note_trace(name: str, **shapes) -> None:
    """Log (DEBUG) that decoder ``name`` is being traced for ``shapes``; the INFO line comes
    with the compilation itself (``compiles.py``)."""
    logger.debug("tracing %s for %s", name, shapes)


# ---------------------------------------------------------------------------------------------
@flax.struct.dataclass
class GenerateOutput:
    """What every decoder returns.

    Attributes:
        sequences:       [B, W, N] int32 new tokens (``pad_token_id`` after EOS / past lengths)
        lengths:         [B, W] int32 new tokens up to and including EOS (N if none)
        log_likelihoods: [B, W] float32 unwarped target log p(new tokens | prompt)
        best:            [B] int32 index of the beam with the highest log-likelihood
        stats:           dict of arrays: ``target_calls``, ``draft_calls``, ``iterations`` (scalars
                         for the whole batch), ``generated_tokens`` ([B]) and method-specific ones.
        invalid:         [B] bool, True for a prompt that failed a value check inside a jit (ids
                         outside the vocabulary, length outside ``[1, P]``): its beams are empty
                         (sequences pad, lengths 0, log-likelihoods -inf, best 0,
                         ``generated_tokens`` 0). A direct call raises instead (see README).
    """

    sequences: jax.Array
    lengths: jax.Array
    log_likelihoods: jax.Array
    best: jax.Array
    stats: Dict[str, jax.Array]
    invalid: Optional[jax.Array] = None


def bucket_length(n: int, minimum: int = 16, maximum: Optional[int] = None) -> int:
    """The padded length for a prompt of ``n`` tokens: the next power of two >= minimum, but
    never more than ``maximum`` (the longest padded prompt the models allow, see
    :func:`max_prompt_length`) when ``n`` itself fits. ``ValueError`` if ``n > maximum``."""
    if maximum is not None and n > maximum:
        raise ValueError(f"prompt too long: {n} tokens, but at most {maximum} fit (the models' "
                         f"max_position_embeddings minus max_new_tokens and the look-ahead)")
    b = minimum
    while b < n:
        b *= 2
    return b if maximum is None else min(b, maximum)


def max_prompt_length(config) -> int:
    """The longest (padded) prompt a decoder with ``config`` (a ``DecodeConfig`` or
    ``DSBDConfig``) accepts: the smallest ``max_position_embeddings`` of its models minus
    ``max_new_tokens`` and, for the speculative methods (those with a draft), the ``gamma + 1``
    positions of the look-ahead; what :func:`check_positions` enforces."""
    models = [config.target] + ([config.draft] if config.draft is not None else [])
    lookahead = config.gamma + 1 if config.draft is not None else 0
    return min(m.max_position_embeddings for m in models) - config.max_new_tokens - lookahead


def pad_prompts(prompts: Sequence[Sequence[int]], pad_id: int = 0, length: Optional[int] = None,
                max_length: Optional[int] = None) -> Tuple[np.ndarray, np.ndarray]:
    """Right-pad token lists to ``length`` (default: the bucket of the longest, capped at
    ``max_length``; pass ``max_prompt_length(config)`` so a prompt that fits is never padded
    past what the models allow).

    Returns ``(prompt_ids [B, P] int32, prompt_lengths [B] int32)``.
    """
    if len(prompts) == 0:
        raise ValueError("pad_prompts needs at least one prompt")
    lens = [len(p) for p in prompts]
    if min(lens) < 1:
        raise ValueError("every prompt needs at least one token")
    P = bucket_length(max(lens), maximum=max_length) if length is None else length
    if P < max(lens):
        raise ValueError(f"length {P} is shorter than the longest prompt ({max(lens)} tokens)")
    ids = np.full((len(prompts), P), pad_id, np.int32)
    for i, p in enumerate(prompts):
        ids[i, : len(p)] = np.asarray(p, np.int32)
    return ids, np.asarray(lens, np.int32)


def prompt_lengths_or_full(prompt_ids, prompt_lengths) -> jax.Array:
    """``prompt_lengths`` as an int32 array, or every row full length if it is None."""
    B, P = prompt_ids.shape
    if prompt_lengths is None:
        return jnp.full((B,), P, jnp.int32)
    return jnp.asarray(prompt_lengths, jnp.int32)


# The value checks' messages: raised on the host by a direct call, and by ``checkify`` (same
# text) inside a user's jit (``guard_prompts``).
LENGTHS_MSG = "prompt_lengths must be in [1, {}], got range [{}, {}]"
IDS_MSG = "prompt token ids must be in [0, {}), got range [{}, {}]"


def check_prompt_lengths(prompt_ids, prompt_lengths) -> None:
    """Host-side check (call outside jit, where the values are concrete)."""
    if prompt_ids.ndim != 2:
        raise ValueError(f"prompt_ids must be [batch, length], got shape {tuple(prompt_ids.shape)}")
    if prompt_lengths is None or isinstance(prompt_lengths, jax.core.Tracer):
        return
    lens = np.asarray(prompt_lengths)
    if lens.shape != (prompt_ids.shape[0],):
        raise ValueError(f"prompt_lengths must have shape [{prompt_ids.shape[0]}], got {lens.shape}")
    if lens.min() < 1 or lens.max() > prompt_ids.shape[1]:
        raise ValueError(LENGTHS_MSG.format(prompt_ids.shape[1], lens.min(), lens.max()))


# ---------------------------------------------------------------------------------------------
@jax.named_scope("prefill")
def prefill(config: ModelConfig, params, prompt_ids, prompt_lengths, slots: int,
            feature_layers=None):
    """Run the prompts once. Returns ``(cache [L, B, slots, K, D], last_logits [B, V])``, and
    with ``feature_layers`` (a draft head's, :mod:`dsbd_jax.models.head`) the target's features
    of every prompt position ``[B, P, F]`` as a third element.

    Slots ``0 .. len-1`` of each row hold the prompt; later slots are zero.
    """
    B, P = prompt_ids.shape
    if slots < P:
        raise ValueError(f"cache of {slots} slots cannot hold a prompt of {P} tokens")
    from dsbd_jax.models.llama import causal_mask
    positions = jnp.broadcast_to(jnp.arange(P, dtype=jnp.int32), (B, P))
    mask = causal_mask(prompt_lengths, P)
    out = forward(config, params, prompt_ids, positions, mask, None,
                  logits_at=(prompt_lengths - 1)[:, None], feature_layers=feature_layers)
    cache = kvc.empty_cache(config, B, slots)
    cache = kvc.write(cache, out[1], jnp.zeros((B,), jnp.int32))
    return (cache, out[0][:, 0]) + tuple(out[2:])


def decode_step(config: ModelConfig, params, cache: kvc.KVCache, tokens, lengths,
                feature_layers=None):
    """Feed one token per row at slot ``lengths[r]``; returns ``(logits [R, V], cache)``, and
    the token's features ``[R, F]`` third with ``feature_layers`` (as
    :func:`dsbd_jax.models.llama.forward`'s).

    ``lengths`` is the number of filled slots before this token (the token's position).
    """
    R = tokens.shape[0]
    S = cache.num_slots
    slot_ok = jnp.arange(S)[None, :] < lengths[:, None]
    mask = jnp.concatenate([slot_ok, jnp.ones((R, 1), bool)], axis=-1)[:, None, :]
    out = forward(config, params, tokens[:, None], lengths[:, None], mask, cache,
                  feature_layers=feature_layers)
    step = (out[0][:, 0], kvc.write(cache, out[1], lengths))
    return step if feature_layers is None else step + (out[2][:, 0],)


# ---------------------------------------------------------------------------------------------
def eos_tuple(eos_token_id) -> Tuple[int, ...]:
    """EOS ids (``None``, an int, or a sequence of ints) as a tuple of ints (``()``: none)."""
    return () if eos_token_id is None else tuple(np.atleast_1d(eos_token_id).tolist())


def eos_array(eos_token_id) -> jax.Array:
    ids = eos_tuple(eos_token_id)
    return jnp.asarray(ids if ids else (-1,), jnp.int32)


def is_eos(tokens, eos_token_id) -> jax.Array:
    """Boolean array: tokens that are one of the EOS ids (never true if there is none)."""
    return jnp.any(tokens[..., None] == eos_array(eos_token_id), axis=-1)


def absorb_finished(logprobs: jax.Array, finished: jax.Array, pad_token_id: int) -> jax.Array:
    """Finished rows become a point mass on ``pad_token_id`` (log-prob 0): ``[..., V]``."""
    V = logprobs.shape[-1]
    point = jnp.where(jnp.arange(V) == pad_token_id, 0.0, -jnp.inf)
    return jnp.where(finished[..., None], point, logprobs)


def best_and_lengths(sequences, log_likelihoods, eos_token_id):
    """``lengths [B, W]`` (up to and including the first EOS) and ``best [B]``."""
    N = sequences.shape[-1]
    eos = is_eos(sequences, eos_token_id)
    first = jnp.argmax(eos, axis=-1)
    lengths = jnp.where(jnp.any(eos, axis=-1), first + 1, N).astype(jnp.int32)
    best = jnp.argmax(log_likelihoods, axis=-1).astype(jnp.int32)
    return lengths, best


# ---------------------------------------------------------------------------------------------
import dataclasses  # noqa: E402

from dsbd_jax.decoding.warping import validate_warping  # noqa: E402


@dataclasses.dataclass(frozen=True)
class DecodeConfig:
    """Settings of every baseline decoder; frozen and hashable (a static argument under jit).

    ``target`` / ``draft`` are the model configs (``draft`` only for the speculative methods).
    ``eos_token_id``: ``None`` (default) means the target's (``eos_ids`` is what applies; the
    field keeps what it was given, its type made a tuple); ``pad_token_id`` (what finished rows emit)
    defaults to the target's pad id, else the first EOS id, else 0.
    ``gamma`` is the speculative look-ahead; ``tree_widths`` the children per level of the
    token tree (length gamma; default ``(2,) * gamma``). ``length_penalty`` and
    ``early_stopping`` are Hugging Face's, used by ``beam_search`` only. ``progress``: a
    :class:`~dsbd_jax.decoding.calls.Progress` channel reports every loop trip to the functions
    listening on it (a separate compiled program); ``True`` (deprecated) reports to
    :func:`progress_hook` functions.
    """

    target: ModelConfig
    draft: Optional[ModelConfig] = None
    max_new_tokens: int = 32
    num_beams: int = 1
    temperature: float = 1.0
    top_k: Optional[int] = None
    top_p: float = 1.0
    replacement: bool = True
    eos_token_id: Optional[Tuple[int, ...]] = None
    pad_token_id: Optional[int] = None
    gamma: int = 4
    tree_widths: Optional[Tuple[int, ...]] = None
    length_penalty: float = 1.0
    early_stopping: bool = False
    progress: Any = False

    def __post_init__(self):
        if not isinstance(self.target, ModelConfig):
            raise ValueError("DecodeConfig.target must be a ModelConfig")
        if self.draft is not None:
            from dsbd_jax.models.head import HeadConfig
            if isinstance(self.draft, HeadConfig):
                t = self.draft.target
                if (t.hidden_size, t.vocab_size, t.num_layers) != (
                        self.target.hidden_size, self.target.vocab_size, self.target.num_layers):
                    raise ValueError(
                        f"the draft head was made for another target (hidden {t.hidden_size}, "
                        f"vocabulary {t.vocab_size}, {t.num_layers} layers; this target: "
                        f"{self.target.hidden_size}, {self.target.vocab_size}, "
                        f"{self.target.num_layers})")
            elif not isinstance(self.draft, ModelConfig):
                raise ValueError("DecodeConfig.draft must be a ModelConfig, a HeadConfig or None")
            if self.draft.vocab_size != self.target.vocab_size:
                raise ValueError(
                    f"draft and target vocabularies differ ({self.draft.vocab_size} vs "
                    f"{self.target.vocab_size}); speculative decoding needs one vocabulary")
        if not (isinstance(self.progress, (bool, Progress)) or self.progress is None):
            raise ValueError(f"progress must be a dsbd_jax.decoding.calls.Progress channel or "
                             f"a bool, got {type(self.progress).__name__}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        self._check_num_beams()
        validate_warping(self.temperature, self.top_k, self.top_p)
        if not isinstance(self.gamma, int) or self.gamma < 1:
            raise ValueError(f"gamma must be an int >= 1, got {self.gamma!r}")
        if self.eos_token_id is not None:  # only its type made canonical (hashable): a tuple
            object.__setattr__(self, "eos_token_id", eos_tuple(self.eos_token_id))
        if self.tree_widths is not None:
            tw = tuple(self.tree_widths)
            if len(tw) != self.gamma or any((not isinstance(w, int)) or w < 1 for w in tw):
                raise ValueError(f"tree_widths must be {self.gamma} ints >= 1 (one per level), got {tw}")
            object.__setattr__(self, "tree_widths", tw)
        for tok in self.eos_ids:
            if not 0 <= tok < self.target.vocab_size:
                raise ValueError(f"eos_token_id {tok} is outside the vocabulary")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.target.vocab_size:
            raise ValueError(f"pad_token_id {self.pad_token_id} is outside the vocabulary")

    def _check_num_beams(self) -> None:
        """``num_beams`` is an int >= 1 (a subclass with other rules overrides this)."""
        if not isinstance(self.num_beams, int) or self.num_beams < 1:
            raise ValueError(f"num_beams (width) must be an int >= 1, got {self.num_beams!r}")

    @property
    def eos_ids(self) -> Tuple[int, ...]:
        """The EOS ids that apply: ``eos_token_id`` as given, the target's where it is ``None``;
        ``()``: none (the field keeps the value it was given)."""
        return eos_tuple(self.eos_token_id if self.eos_token_id is not None
                         else self.target.eos_token_id)

    @property
    def pad_id(self) -> int:
        if self.pad_token_id is not None:
            return self.pad_token_id
        if self.target.pad_token_id is not None and self.target.pad_token_id < self.target.vocab_size:
            return self.target.pad_token_id
        return self.eos_ids[0] if self.eos_ids else 0

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


def take_rows(x: jax.Array, idx: jax.Array) -> jax.Array:
    """Per-row gather: ``x [B, K, ...]``, ``idx [B, J, ...]`` -> ``[B, J, ...]`` (``x[b][idx[b]]``)."""
    return jax.vmap(lambda a, i: a[i])(x, idx)
