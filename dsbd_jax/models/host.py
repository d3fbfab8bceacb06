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
  times both on chained MLP product pairs of the model's shape at ``M`` = 1, 4, 16 rows
  (:func:`measure_dtypes`) and takes bfloat16 only where it is ``GAIN`` faster in total and never
  ``MARGIN`` slower at any ``M``; off the CPU (GPU, TPU) it is bfloat16; models whose MLP has
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
from dsbd_jax.models.cpu_options import (choice, compiler_options, host_key, interleaved_min,
                                         mlp_pairs, options_name, read_cache, write_cache)
from dsbd_jax.models.products import TRANSPOSED

logger = logging.getLogger("dsbd_jax")

ENV = "DSBD_JAX_DTYPE"
AUTO = "auto"
DTYPES = ("float32", "bfloat16")
PROBE_ROWS = (1, 4, 16)
PROBE_LAYERS, PROBE_REPEATS = 4, 5
GAIN = 0.10    # bfloat16 must be 10% faster than float32 over PROBE_ROWS in total ...
MARGIN = 0.05  # ... and never 5% slower at any M


@dataclasses.dataclass(frozen=True)
class HostPlan:
    """How this host runs a model of one shape (:func:`plan`).

    ``dtype``: ``"float32"`` or ``"bfloat16"``; ``form``: ``"plain"`` or ``"transposed"``
    projection kernels; ``options``: the name (in :data:`dsbd_jax.models.cpu_options.CANDIDATES`)
    of the compiler options the model's programs compile under
    (:func:`dsbd_jax.models.cpu_options.options_name`); ``head_transposed``: the vocabulary head
    stored as ``[V, d]`` rows; ``why``: how the dtype was decided."""
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


def pick_dtype(times: Mapping[str, Mapping[int, float]]) -> str:
    """``"bfloat16"`` if its total over the probe rows is ``GAIN`` below float32's and it is
    never ``MARGIN`` slower at any ``M``; else ``"float32"``."""
    base, cand = times["float32"], times["bfloat16"]
    total_ok = sum(cand.values()) < (1 - GAIN) * sum(base.values())
    rows_ok = all(cand[m] <= (1 + MARGIN) * base[m] for m in base)
    return "bfloat16" if total_ok and rows_ok else "float32"


def dtype_key(din: int, dout: int) -> str:
    """The cache key of a shape's dtype choice: the host, each form's options, the shape."""
    return (f"dtype | {host_key()} | options plain {choice('plain')}, transposed "
            f"{choice(TRANSPOSED)} | {din}x{dout}")


@functools.lru_cache(maxsize=None)
def _choose_dtype(din: int, dout: int) -> tuple:
    """``(dtype, how)`` for an MLP shape on this CPU host (cached; measured once)."""
    key, cached = dtype_key(din, dout), read_cache(cache_file())
    got = cached.get(key, {})
    if got.get("choice") in DTYPES:
        return got["choice"], f"cached in {cache_file()}"
    times = measure_dtypes(din, dout)
    dt = pick_dtype(times)
    error = write_cache(cache_file(), key, dt, times)
    where = f"written to {cache_file()}" if error is None else f"not cached ({error})"
    ms = {d: "/".join(f"{1e3 * s:.2f}" for s in times[d].values()) for d in DTYPES}
    return dt, (f"measured ({where}): MLP pairs at M={'/'.join(map(str, PROBE_ROWS))} take "
                f"float32 {ms['float32']} ms, bfloat16 {ms['bfloat16']} ms")


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
    return _logged(config.hidden_size, config.intermediate_size)


@functools.lru_cache(maxsize=None)
def _logged(din: int, dout: int) -> tuple:
    t0 = time.perf_counter()
    dt, how = _choose_dtype(din, dout)
    note = "" if dt == "bfloat16" else (
        "; bfloat16 products are not faster than float32 on this host, so models load in "
        "float32 (dtype='bfloat16' or $DSBD_JAX_DTYPE=bfloat16 forces half the memory)")
    logger.info("dtype for %dx%d models on this host: %s (%s, %.1f s)%s", din, dout, dt, how,
                time.perf_counter() - t0, note)
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
