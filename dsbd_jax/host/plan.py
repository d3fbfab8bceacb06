"""How this host runs a model: one answer for the dtype, the kernel form and the compiler options.

:func:`plan` answers three per-host choices for a config (:class:`HostPlan`), each measured once
per host and shape and cached under the host's key in ``$DSBD_JAX_CACHE/host_plan.json``: the
dtype (:func:`choose_dtype`: float32, or bfloat16 storage with float32 accumulation), the kernel
form (:func:`dsbd_jax.host.forms.choose_form`) and the compiler options
(:func:`dsbd_jax.host.cpu_options.choice`). ``dtype="auto"`` starts from the CPU's flags
(:func:`prior_dtype`) and the other dtype wins only when it is ``DECISIVE`` faster, a margin
run-to-run noise does not cross, so every run of a host chooses the same; off the CPU it is
bfloat16, and tiny models stay float32. ``$DSBD_JAX_DTYPE`` forces one.
:func:`dsbd_jax.loading.load.load_model` applies the plan and ``dsbd host`` prints it. More:
``docs/results/design_notes.md``.
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

from dsbd_jax.host import forms
from dsbd_jax.host import pass_probe
from dsbd_jax.host.cpu_options import cached_choice, choice, cpu_flags, options_name
from dsbd_jax.models.products import TRANSPOSED

logger = logging.getLogger("dsbd_jax")

ENV = "DSBD_JAX_DTYPE"
AUTO = "auto"
DTYPES = ("float32", "bfloat16")
PROBE_ROWS = pass_probe.PROBE_ROWS        # new tokens per timed pass: a decode step, a forest
PROBE_LAYERS = pass_probe.PROBE_LAYERS    # blocks of the cut model (its head cut alike)
PROBE_REPEATS = 5
DECISIVE = 0.20  # the dtype the flags do not suggest must be 20% faster over the passes


@dataclasses.dataclass(frozen=True)
class HostPlan:
    """How this host runs a model of one shape (:func:`plan`).

    ``dtype``: ``"float32"`` or ``"bfloat16"``; ``form``: ``"plain"`` or ``"transposed"``
    projection kernels; ``options``: the name (in :data:`dsbd_jax.host.cpu_options.CANDIDATES`)
    of the compiler options the model's programs compile under
    (:func:`dsbd_jax.host.cpu_options.options_name`); ``head_transposed``: the vocabulary head
    stored as ``[V, d]`` rows; ``why``: how the dtype was decided."""
    dtype: str
    form: str
    options: str
    head_transposed: bool
    why: str


def prior_dtype(flags=None) -> tuple:
    """``(dtype, why)`` the CPU's flags suggest (``cpu_options.cpu_flags``): bfloat16 with
    AMX-BF16 (16-bit tile products: a forest costs about a token) or AVX512-BF16 (bfloat16 dot
    products: the host's probe and its decoders run faster in bfloat16 end to end, see the
    precision results page), else float32 (without either the 16-bit products are emulated)."""
    flags = cpu_flags() if flags is None else flags
    if "amx_bf16" in flags:
        return "bfloat16", "the CPU has AMX-BF16"
    if "avx512_bf16" in flags:
        return "bfloat16", "the CPU has AVX512-BF16"
    return "float32", "the CPU has neither AMX-BF16 nor AVX512-BF16"


def measure_dtypes(config, rows=PROBE_ROWS, layers=PROBE_LAYERS,
                   repeats=PROBE_REPEATS) -> Dict[str, Dict[int, float]]:
    """``{dtype: {tokens: min seconds}}`` of the forward passes of ``config`` cut to ``layers``
    blocks (and its head cut alike; :func:`dsbd_jax.host.pass_probe.cut_config`) over
    ``[1, tokens]`` new tokens for each of ``rows``, in float32 and in bfloat16, each dtype in
    the kernel form ``load_model`` gives it on this host and compiled under that form's
    options, interleaved round by round."""
    by_dtype = {dt: forms.choose_form(config.replace(dtype=dt), dt) for dt in DTYPES}
    return pass_probe.time_passes(config, DTYPES, by_dtype, rows=rows, layers=layers,
                                  repeats=repeats)


def pick_dtype(times: Mapping[str, Mapping[int, float]], prior: str) -> str:
    """``prior``, unless the other dtype's passes take ``DECISIVE`` less time in total."""
    other = "float32" if prior == "bfloat16" else "bfloat16"
    total = {dt: sum(times[dt].values()) for dt in (prior, other)}
    return other if total[other] < (1 - DECISIVE) * total[prior] else prior


def _shape(config) -> tuple:
    return (config.hidden_size, config.intermediate_size, config.num_layers, config.num_heads,
            config.num_kv_heads, config.head_dim, config.vocab_size,
            bool(config.tie_word_embeddings))


def dtype_key(config) -> str:
    """The entry of a model shape's dtype choice in the host's plan cache
    (:func:`dsbd_jax.host.cpu_options.cached_choice`): each form's options, the shape."""
    return (f"dtype by passes | options plain {choice('plain')}, transposed "
            f"{choice(TRANSPOSED)} | " + "x".join(str(int(v)) for v in _shape(config)))


def _figures(times: Mapping, config) -> str:
    n = pass_probe.cut_config(config).num_layers
    ms = {d: " / ".join(f"{float(v):.2f}" for v in times[d].values()) for d in DTYPES}
    return (f"passes of {n} of {config.num_layers} blocks over "
            f"{' / '.join(str(t) for t in times['float32'])} new tokens: float32 "
            f"{ms['float32']} ms, bfloat16 {ms['bfloat16']} ms; the other dtype must be "
            f"{DECISIVE:.0%} faster")


@functools.lru_cache(maxsize=None)
def _choose_dtype(config) -> tuple:
    """``(dtype, how)`` for a model shape on this CPU host (cached; measured once)."""
    prior, why = prior_dtype()
    got = cached_choice(dtype_key(config), lambda d: d in DTYPES,
                        lambda: measure_dtypes(config), lambda t: pick_dtype(t, prior),
                        valid_ms=lambda ms: set(ms) == set(DTYPES))
    return got.choice, (f"{why}; {_figures(got.min_ms, config)} "
                        f"({'measured, ' if got.measured else ''}{got.where})")


def choose_dtype(config) -> str:
    """``"float32"`` or ``"bfloat16"`` for ``config``'s shape on this host (module docstring).
    Logged once per shape, with the figures."""
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
    if config.hidden_size * config.intermediate_size < forms.MIN_ELEMENTS:
        return "float32", "a small model (not bound by memory; exact float32 logits)"
    return _logged(config.replace(dtype="float32"))


@functools.lru_cache(maxsize=None)
def _logged(config) -> tuple:
    t0 = time.perf_counter()
    dt, how = _choose_dtype(config)
    note = "" if dt == "bfloat16" else (
        "; models load in float32 (dtype='bfloat16' or $DSBD_JAX_DTYPE=bfloat16 forces half "
        "the memory)")
    logger.info("dtype for %dx%d models on this host: %s (%s, %.1f s)%s", config.hidden_size,
                config.intermediate_size, dt, how, time.perf_counter() - t0, note)
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
        form = forms.choose_form(config.replace(dtype=name), name)
    head_t = form == TRANSPOSED and jnp.dtype(name).itemsize == 2
    row_head = head_t or bool(config.tie_word_embeddings)
    options = options_name(form, name, row_head) if jax.default_backend() == "cpu" else "default"
    return HostPlan(name, form, options, head_t, why)
