"""How this host runs a model: one answer for the dtype, the kernel form and the compiler options.

Three per-host choices decide how fast a model runs on XLA:CPU, each measured once per host and
shape and cached under ``$DSBD_JAX_CACHE`` (default ``~/.cache/dsbd_jax``):

* **the dtype** (:func:`choose_dtype`): float32, or bfloat16 storage with float32 accumulation.
  A bfloat16 model stores its weights and KV cache in 16 bits and runs every projection and the
  head as a mixed-precision product (:func:`dsbd_jax.models.products.is_mixed`: the input cast
  to 16 bits, float32 accumulation, a float32 result); the norms, RoPE, attention, softmax and
  the logits stay float32, and so do warping, beam scores and verification. On hosts with fast
  16-bit products (AMX-BF16; accelerators) a 2-16-row product then costs about what one row
  does, at half the memory; on hosts without them it can be slower than float32. So ``"auto"``
  estimates one forward pass of the model's shape in both dtypes at ``M`` = 1, 4, 16 rows
  (:func:`measure_pass`: chained MLP product pairs scaled to the model's layers, plus its
  vocabulary head in the form the model computes it) and takes bfloat16 only where it is
  ``GAIN`` faster in total and never ``MARGIN`` slower at any ``M``; off the CPU (GPU, TPU) it
  is bfloat16; models whose MLP has
  under :data:`dsbd_jax.models.kernels.MIN_ELEMENTS` weights (the tests' tiny models) stay
  float32 on the CPU. ``$DSBD_JAX_DTYPE``
  (``auto``, ``float32``, ``bfloat16``) forces one.
* **the kernel form** (:func:`dsbd_jax.models.kernels.choose_form`): projection kernels as
  ``[in, out]`` or as ``[out, in]`` rows, measured for the chosen dtype. A 16-bit model in the
  transposed form also stores its vocabulary head as ``[V, d]`` rows
  (:func:`dsbd_jax.models.kernels.transpose_head`).
* **the compiler options** (:func:`dsbd_jax.models.cpu_options.choice`), per kernel form.

:func:`plan` answers all three for a config (:class:`HostPlan`); :func:`dsbd_jax.models.loading.load_model`
applies it (``dtype="auto"``, ``kernel_blocks="measured"``, the defaults), and ``dsbd host``
prints it with the figures behind it.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from typing import Dict, Mapping, Optional

import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.models import kernels
from dsbd_jax.models.cpu_options import (CANDIDATES, choice, compiler_options, host_key,
                                         interleaved_min, mlp_pairs, options_name, read_cache,
                                         write_cache)
from dsbd_jax.models.products import TRANSPOSED

logger = logging.getLogger("dsbd_jax")

ENV = "DSBD_JAX_DTYPE"
AUTO = "auto"
DTYPES = ("float32", "bfloat16")
PROBE_ROWS = (1, 4, 16)
PROBE_LAYERS, PROBE_REPEATS = 4, 5
# the head is timed on at most this many of its rows and scaled to the vocabulary (a product's
# time grows linearly with its output rows at this size)
PROBE_HEAD_ROWS = 32768
GAIN = 0.03     # bfloat16's estimated pass must be 3% faster than float32's over PROBE_ROWS ...
MARGIN = 0.10   # ... and never 10% slower at any M


@dataclasses.dataclass(frozen=True)
class HostPlan:
    """How this host runs a model of one shape (:func:`plan`).

    ``dtype``: ``"float32"`` or ``"bfloat16"``; ``form``: ``"plain"`` or ``"transposed"``
    projection kernels; ``options``: the name of the compiler options the model's programs
    compile under (:func:`dsbd_jax.models.cpu_options.options_name`) (:data:`dsbd_jax.models.cpu_options.CANDIDATES`); ``head_transposed``: the
    vocabulary head stored as ``[V, d]`` rows; ``why``: how the dtype was decided."""
    dtype: str
    form: str
    options: str
    head_transposed: bool
    why: str


def cache_file():
    """The JSON cache of the dtype choices (beside the kernel and options caches)."""
    return kernels.cache_file().with_name("host_dtype.json")


def measure_dtypes(din: int, dout: int, rows=PROBE_ROWS, layers=PROBE_LAYERS,
                   repeats=PROBE_REPEATS) -> Dict[str, Dict[int, float]]:
    """``{dtype: {M: min seconds}}`` of ``layers`` chained MLP pairs ``[M, din] x [din, dout] x
    [dout, din]`` (:func:`dsbd_jax.models.cpu_options.mlp_pairs`, the model's own products) in
    float32 and in bfloat16, each in its own measured kernel form and compiled under that form's
    options, interleaved round by round."""
    calls = {}
    for dt in DTYPES:
        form = kernels._choose_form(din, dout, dt)  # "plain" under MIN_ELEMENTS
        chain, ups, downs = mlp_pairs(form, din, dout, layers, dt)
        calls[dt] = (jax.jit(chain, compiler_options=compiler_options(form, dt)), ups, downs)
    rng = np.random.default_rng(0)
    best: Dict[str, Dict[int, float]] = {dt: {} for dt in calls}
    for M in rows:
        x = jnp.asarray(rng.standard_normal((M, din), np.float32))
        t = interleaved_min({dt: functools.partial(f, x.astype(dt), us, ds)
                             for dt, (f, us, ds) in calls.items()}, repeats)
        for dt in calls:
            best[dt][M] = t[dt]
    return best


def measure_head(din: int, vocab: int, tied: bool, rows=PROBE_ROWS, head_rows=PROBE_HEAD_ROWS,
                 repeats=PROBE_REPEATS) -> Dict[str, Dict[int, float]]:
    """``{dtype: {M: min seconds}}`` of the vocabulary head's product ``[M, din] x [din, vocab]``
    in float32 and in bfloat16, each in the form a loaded model computes it: float32 untied as
    its ``[d, V]`` kernel, float32 tied as :func:`dsbd_jax.models.vocab.tied_logits` over the
    ``[V, d]`` embedding, bfloat16 as mixed-precision rows
    (:func:`dsbd_jax.models.products.mixed_rows`). Timed on ``min(vocab, head_rows)`` rows and
    scaled to ``vocab``."""
    from dsbd_jax.models.products import mixed_rows
    from dsbd_jax.models.vocab import tied_logits
    n = min(vocab, head_rows)
    rng = np.random.default_rng(1)
    w = rng.standard_normal((n, din), np.float32) / np.float32(np.sqrt(din))
    heads = {"float32": jnp.asarray(w if tied else np.ascontiguousarray(w.T)),
             "bfloat16": jnp.asarray(w.astype(jnp.bfloat16))}
    del w
    fns = {"float32": tied_logits if tied else jnp.matmul, "bfloat16": mixed_rows}
    # under the options a loaded model's programs get (cpu_options.options_name)
    options = {"float32": options_name("plain", "float32", row_head=tied),
               "bfloat16": options_name(TRANSPOSED, "bfloat16", row_head=True)}
    calls = {dt: jax.jit(fns[dt], compiler_options=dict(CANDIDATES[options[dt]]))
             for dt in DTYPES}
    best: Dict[str, Dict[int, float]] = {dt: {} for dt in DTYPES}
    for M in rows:
        x = jnp.asarray(rng.standard_normal((M, din), np.float32))
        t = interleaved_min({dt: functools.partial(calls[dt], x, heads[dt]) for dt in DTYPES},
                            repeats)
        for dt in DTYPES:
            best[dt][M] = t[dt] * vocab / n
    return best


def measure_pass(din: int, dout: int, num_layers: int, vocab: int, tied: bool,
                 rows=PROBE_ROWS) -> Dict[str, Dict[int, float]]:
    """``{dtype: {M: seconds}}``: an estimate of one forward pass of ``M`` rows, the model's
    ``num_layers`` MLPs (:func:`measure_dtypes` on ``PROBE_LAYERS`` pairs, scaled) plus its
    vocabulary head (:func:`measure_head`), in float32 and in bfloat16. Attention's
    projections (about a fifth of a layer's weights at these shapes) and the KV cache are left
    out; both favour bfloat16 where its products are as fast (half the bytes to read)."""
    mlp = measure_dtypes(din, dout, rows)
    head = measure_head(din, vocab, tied, rows)
    return {dt: {M: mlp[dt][M] * num_layers / PROBE_LAYERS + head[dt][M] for M in rows}
            for dt in DTYPES}


def pick_dtype(times: Mapping[str, Mapping[int, float]]) -> str:
    """``"bfloat16"`` if its total over the probe rows is ``GAIN`` below float32's and it is
    never ``MARGIN`` slower at any ``M``; else ``"float32"``. (Checked against whole decoders on
    the 2-core Intel host of ``results/speed_bf16.json``, where every decoder ran 1.07-1.18x
    faster in bfloat16 end to end: there the pass estimates of both models pass this rule.)"""
    base, cand = times["float32"], times["bfloat16"]
    total_ok = sum(cand.values()) < (1 - GAIN) * sum(base.values())
    rows_ok = all(cand[m] <= (1 + MARGIN) * base[m] for m in base)
    return "bfloat16" if total_ok and rows_ok else "float32"


def pass_shape(config) -> tuple:
    """``(hidden, intermediate, layers, vocab, tied)``: the shape :func:`measure_pass` needs."""
    return (config.hidden_size, config.intermediate_size, config.num_layers, config.vocab_size,
            bool(config.tie_word_embeddings))


def dtype_key(shape: tuple) -> str:
    """The cache key of a shape's dtype choice (:func:`pass_shape`): the host, each form's
    options, the shape."""
    din, dout, layers, vocab, tied = shape
    return (f"dtype | {host_key()} | options plain {choice('plain')}, transposed "
            f"{choice(TRANSPOSED)} | pass {din}x{dout} x{layers} head {vocab}"
            + (" tied" if tied else ""))


@functools.lru_cache(maxsize=None)
def _choose_dtype(shape: tuple) -> tuple:
    """``(dtype, how)`` for a model shape (:func:`pass_shape`) on this CPU host (cached;
    measured once)."""
    key, cached = dtype_key(shape), read_cache(cache_file())
    got = cached.get(key, {})
    if got.get("choice") in DTYPES:
        return got["choice"], f"cached in {cache_file()}"
    times = measure_pass(*shape)
    dt = pick_dtype(times)
    error = write_cache(cache_file(), key, dt, times)
    where = f"written to {cache_file()}" if error is None else f"not cached ({error})"
    ms = {d: "/".join(f"{1e3 * s:.1f}" for s in times[d].values()) for d in DTYPES}
    return dt, (f"measured ({where}): an estimated pass (MLPs and head) at "
                f"M={'/'.join(map(str, PROBE_ROWS))} takes float32 {ms['float32']} ms, "
                f"bfloat16 {ms['bfloat16']} ms")


def choose_dtype(config) -> str:
    """``"float32"`` or ``"bfloat16"`` for ``config``'s shape on this host (module docstring).
    Logged once per shape, with the figures when measured."""
    return dtype_choice(config)[0]


def dtype_choice(config) -> tuple:
    """``(dtype name, how it was decided)`` for ``config``'s shape (:func:`choose_dtype`)."""
    forced = os.environ.get(ENV, AUTO).strip() or AUTO
    if forced not in (AUTO,) + DTYPES:
        raise ValueError(f"${ENV} must be 'auto', 'float32' or 'bfloat16', got {forced!r}")
    if forced != AUTO:
        return forced, f"${ENV}={forced}"
    if jax.default_backend() != "cpu":
        return "bfloat16", f"{jax.default_backend()} backend"
    if config.hidden_size * config.intermediate_size < kernels.MIN_ELEMENTS:
        return "float32", "a small model (not bound by memory; exact float32 logits)"
    return _logged(pass_shape(config))


@functools.lru_cache(maxsize=None)
def _logged(shape: tuple) -> tuple:
    t0 = time.perf_counter()
    dt, how = _choose_dtype(shape)
    note = "" if dt == "bfloat16" else (
        "; bfloat16 products are not faster than float32 on this host, so models load in "
        "float32 (dtype='bfloat16' or $DSBD_JAX_DTYPE=bfloat16 forces half the memory)")
    logger.info("dtype for %dx%d models (%d layers, %d-row head) on this host: %s (%s, "
                "%.1f s)%s", *shape[:4], dt, how, time.perf_counter() - t0, note)
    return dt, how


def resolve_dtype(dtype, config) -> str:
    """The dtype name a load uses: ``dtype`` itself (a name or a jnp dtype), or for ``"auto"``
    (or ``None``) :func:`choose_dtype` of ``config``."""
    return choose_dtype(config) if _is_auto(dtype) else jnp.dtype(dtype).name


def _is_auto(dtype) -> bool:
    return dtype is None or (isinstance(dtype, str) and dtype == AUTO)


def plan(config, dtype=AUTO, form: Optional[str] = None) -> HostPlan:
    """How this host runs a model of ``config``'s shape: the dtype (``"auto"``: measured, see the
    module docstring; or forced), the kernel form for that dtype (``form`` forces one), the
    compiler options of that form and whether the head is stored as rows."""
    name, why = dtype_choice(config) if _is_auto(dtype) else (jnp.dtype(dtype).name, "given")
    if form is None:
        form = kernels.choose_form(config.replace(dtype=name), name)
    head_t = form == TRANSPOSED and jnp.dtype(name).itemsize == 2
    row_head = head_t or bool(config.tie_word_embeddings)
    options = options_name(form, name, row_head) if jax.default_backend() == "cpu" else "default"
    return HostPlan(name, form, options, head_t, why)
