"""Random weights at a model's shapes, and the forward passes the decoders run, timed.

The probe behind ``dtype="auto"`` (:func:`dsbd_jax.host.plan.dtype_choice`): a model cut to a
few of its blocks, with its vocabulary head cut by the same fraction (so the head keeps its
share of a pass), timed on the passes the decoders run: one new token (a decode step), four rows (a step of
four beams or prompts, a speculative chain) and a forest of new tokens (a DSBD forest), over a
cache.
``benchmarks/pass_floor.py`` builds its weights with :func:`random_params` too.
"""

from __future__ import annotations

from typing import Dict, Iterable, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.models import kinds
from dsbd_jax.models.cache import empty_cache
from dsbd_jax.models.config import ModelConfig
from dsbd_jax.host.cpu_options import interleaved_min, tuned_jit

PROBE_LAYERS = 4       # blocks of the cut model
PROBE_ROWS = (1, 4, 12)  # new tokens per pass: a decode step, 4 rows (beams), a 12-node forest
PROBE_SLOTS = 512      # cached slots the passes attend to
MIN_VOCAB = 256


def random_params(config: ModelConfig, form: str, seed: int = 0) -> dict:
    """Random parameters of ``config`` (its dtype) in the per-layer layout with the projection
    kernels in ``form`` (``"plain"`` or ``"transposed"``), as ``load_model`` stores them
    (transposed: a 16-bit head as ``[V, d]`` rows).

    The tree, shapes and dtypes are ``llama.init_params``'s (traced, not run) and so are the
    values' laws: normal(0.02) kernels and embedding, zero biases, unit norms, drawn with numpy
    one leaf at a time (``init_params`` run on XLA:CPU compiles its random draws for seconds)."""
    from dsbd_jax.models.llama import init_params
    shapes = jax.eval_shape(lambda key: init_params(config, key, "per_layer"),
                            jax.random.PRNGKey(seed))
    rng = np.random.default_rng(seed)

    def fill(path, leaf):
        name = path[-1].key
        if name == "bias":
            x = np.zeros(leaf.shape, np.float32)
        elif name == "weight":  # RMSNorm
            x = np.ones(leaf.shape, np.float32)
        else:
            x = 0.02 * rng.standard_normal(leaf.shape, np.float32)
        return jnp.asarray(x, leaf.dtype)
    params = kinds._copy_dicts(jax.tree_util.tree_map_with_path(fill, shapes))
    if form == kinds.TRANSPOSED:
        params = kinds.transpose_params_(params, kinds.transposed_widths(config),
                                           head=jnp.dtype(config.dtype).itemsize == 2)
    return params


def cut_config(config: ModelConfig, layers: int = PROBE_LAYERS) -> ModelConfig:
    """``config`` cut to ``layers`` blocks, its vocabulary (and so its head) cut by the same
    fraction, at least :data:`MIN_VOCAB` rows."""
    n = max(1, min(layers, config.num_layers))
    vocab = max(MIN_VOCAB, round(config.vocab_size * n / config.num_layers))
    return config.replace(num_layers=n, vocab_size=min(vocab, config.vocab_size),
                          max_position_embeddings=max(config.max_position_embeddings,
                                                      PROBE_SLOTS + 64))


def pass_call(config: ModelConfig, params, tokens: int, slots: int = PROBE_SLOTS):
    """A zero-argument call of one forward over ``[1, tokens]`` new tokens after ``slots``
    cached slots, logits at every new token (as the decoders ask), compiled under the host's
    XLA:CPU options (``cpu_options.tuned_jit``, as the decoders are)."""
    from dsbd_jax.models.llama import forward
    T = tokens
    positions = slots - T + jnp.arange(T, dtype=jnp.int32)[None]
    mask = jnp.ones((1, T, slots + T), bool)
    f = tuned_jit(lambda p, c, t: forward(config, p, t, positions, mask, c)[0])
    cache = empty_cache(config, 1, slots)
    tok = jnp.ones((1, T), jnp.int32)
    return lambda: f(params, cache, tok)


def time_passes(config: ModelConfig, dtypes: Iterable[str], forms: Mapping[str, str],
                rows=PROBE_ROWS, layers: int = PROBE_LAYERS, slots: int = PROBE_SLOTS,
                repeats: int = 5, weights: str = "float") -> Dict[str, Dict[int, float]]:
    """``{dtype: {tokens: min seconds}}`` of the passes of :func:`cut_config` (``layers``
    blocks) in each dtype, its kernels in ``forms[dtype]`` (``weights="int8"``: then made
    :class:`~dsbd_jax.models.weights.Int8`, as ``load_model(..., weights="int8")`` stores
    them), over ``[1, tokens]`` new tokens for each of ``rows``, every call interleaved round by
    round with the others."""
    calls = {}
    for dt in dtypes:
        cfg = cut_config(config.replace(dtype=dt), layers)
        params = random_params(cfg, forms[dt])
        if weights == "int8":
            params, cfg = kinds.int8_params_(params, cfg)
        for T in rows:
            calls[(dt, T)] = pass_call(cfg, params, T, slots)
    best = interleaved_min(calls, repeats)
    out: Dict[str, Dict[int, float]] = {}
    for (dt, T), s in best.items():
        out.setdefault(dt, {})[T] = s
    return out
