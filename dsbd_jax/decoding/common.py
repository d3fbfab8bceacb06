"""Pieces shared by every decoder: output type, prompt batches, prefill, one-token steps,
EOS handling and compile counting.

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

import contextlib
import functools
import logging
from typing import Callable, Dict, NamedTuple, Optional, Sequence, Tuple

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import checkify

from dsbd_jax.models import cache as kvc
from dsbd_jax.models.config import ModelConfig
from dsbd_jax.models.kernels import PROJECTIONS, T_KEY, plain_shape
from dsbd_jax.models.llama import forward, init_params, params_layout
from dsbd_jax.models.vocab import split_head
from dsbd_jax.models.vocab import with_prompt_rows as _extend_head

# ---------------------------------------------------------------------------------------------
# compile counting: ``note_trace`` runs when a core's Python body is traced (once per new shapes
# or config); ``compile_count`` counts real XLA compilations, read from jax.monitoring's backend
# compile events (see ``dsbd_jax/decoding/compiles.py``).
from dsbd_jax.decoding.compiles import compile_count, core_name, note_core_call  # noqa: E402,F401

logger = logging.getLogger("dsbd_jax")


def note_trace(name: str, **shapes) -> None:
    """Log (DEBUG) that decoder ``name`` is being traced for ``shapes``; the INFO line comes
    with the compilation itself (``compiles.py``)."""
    logger.debug("tracing %s for %s", name, shapes)


# ---------------------------------------------------------------------------------------------
# ahead-of-time compilation: every public decoder validates its inputs on the host, then calls
# one jitted core (``@core`` on top of ``jax.jit``). Inside ``capture_core_calls()`` that call
# returns a ``CoreCall`` (the core and the exact arguments) instead of running, so a caller can
# lower or compile the very program a real call would run, without running it.
_CAPTURING: list = []


class CoreCall(NamedTuple):
    """A decoder's jitted core with the arguments its public function prepared."""

    core: Callable
    args: tuple
    kwargs: dict

    def lower(self):
        return self.core.lower(*self.args, **self.kwargs)

    def compile(self):
        """The compiled program. jax keeps it in the core's cache, so the public call with the
        same argument shapes and static config runs it without compiling again."""
        return self.lower().compile()


class _Core:
    """A jitted decoder core: runs as the ``jax.jit`` function it wraps (whose attributes,
    e.g. ``lower`` and ``clear_cache``, it forwards), or is captured as a ``CoreCall``."""

    def __init__(self, jitted, name: str):
        self._jitted = jitted
        self.__wrapped__ = jitted
        self.__name__ = getattr(jitted, "__name__", "core")
        self.__doc__ = getattr(jitted, "__doc__", None)
        self.decoder = name
        core_name(self.__name__, name)

    def __call__(self, *args, **kwargs):
        if _CAPTURING:
            return CoreCall(self._jitted, args, kwargs)
        note_core_call(self.decoder, args)
        return self._jitted(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._jitted, name)


def core(name: str) -> Callable[[Callable], _Core]:
    """Decorator: mark a ``jax.jit`` function as the core of the public decoder ``name`` (see
    ``capture_core_calls``; its compilations count as ``compile_count(name)``)."""
    return lambda jitted: _Core(jitted, name)


@contextlib.contextmanager
def capture_core_calls():
    """While active, calls of ``@core`` functions return a ``CoreCall`` instead of running."""
    _CAPTURING.append(True)
    try:
        yield
    finally:
        _CAPTURING.pop()


# ---------------------------------------------------------------------------------------------
# progress: decoders built with ``config.progress=True`` call the registered host functions once
# per loop trip (``jax.debug.callback``) with numpy values: ``iterations`` (loop trips so far),
# ``generated`` ([B] new tokens per prompt), ``target_calls`` and, for DSBD, ``accepted`` /
# ``verified`` (accepted candidates / verified layers so far, summed over prompts).
_PROGRESS_HOOKS: list = []


@contextlib.contextmanager
def progress_hook(fn: Callable[[Dict[str, np.ndarray]], None]):
    """Call ``fn(values)`` after every loop trip of decoders configured with ``progress=True``
    while the ``with`` block runs (e.g. to update a progress bar)."""
    _PROGRESS_HOOKS.append(fn)
    try:
        yield fn
    finally:
        _PROGRESS_HOOKS.remove(fn)


def _dispatch_progress(values) -> None:
    values = {k: np.asarray(v) for k, v in values.items()}
    for fn in list(_PROGRESS_HOOKS):
        fn(values)


def step_progress(batch: int) -> Callable:
    """Progress values of the one-token-per-step decoders (sampling, beam sampling/search): one
    loop trip = one token for every prompt."""
    return lambda s: dict(iterations=s.step, generated=jnp.full((batch,), s.step),
                          target_calls=s.target_calls)


def with_progress(config, body: Callable, values: Callable) -> Callable:
    """``body`` of a ``lax.while_loop``, reporting ``values(new_state)`` after each trip when
    ``config.progress`` (no callback is traced otherwise, so the program is unchanged)."""
    if not getattr(config, "progress", False):
        return body

    def reporting(state):
        state = body(state)
        jax.debug.callback(_dispatch_progress, values(state))
        return state
    return reporting


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


def decode_step(config: ModelConfig, params, cache: kvc.KVCache, tokens, lengths):
    """Feed one token per row at slot ``lengths[r]``; returns ``(logits [R, V], cache)``.

    ``lengths`` is the number of filled slots before this token (the token's position).
    """
    R = tokens.shape[0]
    S = cache.num_slots
    slot_ok = jnp.arange(S)[None, :] < lengths[:, None]
    mask = jnp.concatenate([slot_ok, jnp.ones((R, 1), bool)], axis=-1)[:, None, :]
    logits, new = forward(config, params, tokens[:, None], lengths[:, None], mask, cache)
    return logits[:, 0], kvc.write(cache, new, lengths)


# ---------------------------------------------------------------------------------------------
def eos_array(eos_token_id) -> jax.Array:
    ids = () if eos_token_id is None else tuple(np.atleast_1d(eos_token_id).tolist())
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
    ``eos_token_id`` defaults to the target's; ``pad_token_id`` (what finished rows emit)
    defaults to the target's pad id, else the first EOS id, else 0.
    ``gamma`` is the speculative look-ahead; ``tree_widths`` the children per level of the
    token tree (length gamma; default ``(2,) * gamma``). ``length_penalty`` and
    ``early_stopping`` are Hugging Face's, used by ``beam_search`` only. ``progress=True``
    reports every loop trip to :func:`progress_hook` functions (a separate compiled program).
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
    progress: bool = False

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
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an int >= 1, got {self.max_new_tokens!r}")
        if not isinstance(self.num_beams, int) or self.num_beams < 1:
            raise ValueError(f"num_beams (width) must be an int >= 1, got {self.num_beams!r}")
        validate_warping(self.temperature, self.top_k, self.top_p)
        if not isinstance(self.gamma, int) or self.gamma < 1:
            raise ValueError(f"gamma must be an int >= 1, got {self.gamma!r}")
        eos = self.eos_token_id if self.eos_token_id is not None else self.target.eos_token_id
        if isinstance(eos, (int, np.integer)):
            eos = (int(eos),)
        object.__setattr__(self, "eos_token_id", tuple(eos) if eos is not None else None)
        if self.tree_widths is not None:
            tw = tuple(self.tree_widths)
            if len(tw) != self.gamma or any((not isinstance(w, int)) or w < 1 for w in tw):
                raise ValueError(f"tree_widths must be {self.gamma} ints >= 1 (one per level), got {tw}")
            object.__setattr__(self, "tree_widths", tw)
        for tok in (self.eos_token_id or ()):
            if not 0 <= tok < self.target.vocab_size:
                raise ValueError(f"eos_token_id {tok} is outside the vocabulary")
        if self.pad_token_id is not None and not 0 <= self.pad_token_id < self.target.vocab_size:
            raise ValueError(f"pad_token_id {self.pad_token_id} is outside the vocabulary")

    @property
    def pad_id(self) -> int:
        if self.pad_token_id is not None:
            return self.pad_token_id
        if self.target.pad_token_id is not None and self.target.pad_token_id < self.target.vocab_size:
            return self.target.pad_token_id
        return self.eos_token_id[0] if self.eos_token_id else 0

    def replace(self, **changes):
        return dataclasses.replace(self, **changes)


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
# above see tracers and cannot look at values)
@functools.lru_cache(maxsize=64)
def _expected_shapes(config: ModelConfig, layout: str):
    tree = jax.eval_shape(lambda: init_params(config, jax.random.key(0), layout))
    return {jax.tree_util.keystr(p): tuple(x.shape)
            for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def check_params(name: str, config: ModelConfig, params) -> None:
    """Trace-time check (shapes are static): ``ValueError`` in one line naming the model
    (``"target"`` / ``"draft"``) and the first leaf whose path or shape differs from what
    ``config`` needs."""
    try:
        layout = params_layout(params)
    except (ValueError, TypeError, AttributeError):
        raise ValueError(f"{name} parameters are not a Llama parameter tree (no 'layers' or "
                         f"'layers_0')") from None
    params, head = split_head(params)
    want = dict(_expected_shapes(config, layout))
    if head is not None:  # a truncated vocabulary head (dsbd_jax.models.vocab) replaces lm_head
        want.pop("['lm_head']['kernel']", None)
        n = int(np.shape(head["rows"])[0]) if "rows" in head else 0
        mat = next((m for m in ("kernel", T_KEY) if m in head), "embedding")
        need = (config.hidden_size, n) if mat == "kernel" else (n, config.hidden_size)
        full = {"full_kernel": (config.hidden_size, config.vocab_size),
                "full_embedding": (config.vocab_size, config.hidden_size)}
        bad_full = [k for k in head if k in full and tuple(np.shape(head[k])) != full[k]]
        if (not 0 < n <= config.vocab_size or mat not in head or bad_full
                or set(head) - {"rows", mat} - set(full)
                or tuple(np.shape(head[mat])) != need):
            raise ValueError(f"{name} parameters do not match config.{name}: the truncated head "
                             f"['vocab_head'] needs rows [N] with 0 < N <= {config.vocab_size} "
                             f"and a {mat} of shape {need}, got "
                             f"{ {k: tuple(np.shape(v)) for k, v in head.items()} }")
    got = {jax.tree_util.keystr(p): tuple(np.shape(x))
           for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
    for path, shape in want.items():
        key = "kernel"
        projection = any(f"['{p}']['kernel']" in path for p in PROJECTIONS)
        if projection and path not in got:  # stored transposed (kernels.transpose_params)?
            stored = path[:-len("['kernel']")] + f"['{T_KEY}']"
            if stored in got:
                got[path], key = got.pop(stored), T_KEY
        if path == "['lm_head']['kernel']" and path not in got and \
                f"['lm_head']['{T_KEY}']" in got:  # [V, d] rows (kernels.transpose_head)
            got[path] = got.pop(f"['lm_head']['{T_KEY}']")[::-1]
        if path not in got:
            raise ValueError(f"{name} parameters do not match config.{name}: leaf {path} is "
                             f"missing (expected shape {shape})")
        have = plain_shape(key, got[path], len(shape)) if projection else got[path]
        if have != shape:
            raise ValueError(f"{name} parameters do not match config.{name}: leaf {path} expected "
                             f"shape {shape}, got {got[path]}")
    extra = sorted(set(got) - set(want))
    if extra:
        raise ValueError(f"{name} parameters do not match config.{name}: unexpected leaf {extra[0]}")


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


def take_rows(x: jax.Array, idx: jax.Array) -> jax.Array:
    """Per-row gather: ``x [B, K, ...]``, ``idx [B, J, ...]`` -> ``[B, J, ...]`` (``x[b][idx[b]]``)."""
    return jax.vmap(lambda a, i: a[i])(x, idx)
