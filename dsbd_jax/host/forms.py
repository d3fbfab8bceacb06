"""The per-host choice of kernel form (plain or transposed) and of a draft's kernel kind.

The kinds and their conversions are the model's (:mod:`dsbd_jax.models.kinds`); this module
measures which of them this host runs faster. The form follows the host and the options follow
the form: :func:`dsbd_jax.host.cpu_options.choice` is measured per form, and :func:`choose_form`
times both forms, each under its own options, on a model's MLP shape (chained pairs at ``M = 1,
4, 16``), starting from :func:`prior_form` (transposed for 16-bit kernels, plain for float32),
which the other form must beat by ``GAIN`` in total without being ``MARGIN`` slower at any
``M``; cached per host and shape in ``$DSBD_JAX_CACHE/host_plan.json`` and applied by
``load_model(..., kernel_blocks="measured")``. :func:`choose_weights`: whether a draft's kernels
run faster as int8 codes here. More: ``docs/results/design_notes.md``.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import Dict, Mapping

import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.host.cpu_options import cache_file as plan_file
from dsbd_jax.host.cpu_options import (cached_choice, choice, compiler_options,
                                       interleaved_min, mlp_pairs)
from dsbd_jax.models import weights
from dsbd_jax.models.kinds import FLOAT, INT8, WEIGHT_KINDS
from dsbd_jax.models.products import TRANSPOSED

logger = logging.getLogger("dsbd_jax")

PROBE_ROWS = (1, 4, 16)
PROBE_REPEATS = 5
MIN_ELEMENTS = 1 << 21  # in * out below this: plain kernels, not measured (fits in cache)
GAIN = 0.10    # a form must be 10% faster than the prior form over PROBE_ROWS in total ...
MARGIN = 0.05  # ... and never 5% slower at any M

def measure_weights(din: int, dout: int, dtype="float32", rows=PROBE_ROWS, layers=None,
                    repeats=PROBE_REPEATS) -> Dict[str, Dict[int, float]]:
    """``{"float": {M: s}, "int8": {M: s}}``: ``layers`` chained MLP pairs ``[M, din] x [din,
    dout] x [dout, din]`` with the float kernels a load of ``dtype`` gives this shape here (its
    form, :func:`choose_form`, under that form's options) and with the same weights as
    :class:`~dsbd_jax.models.weights.Int8` kernels (under XLA's own products), interleaved."""
    layers = layers or FORM_LAYERS
    form = _choose_form(din, dout, str(jnp.dtype(dtype)))
    chain, ups, downs = mlp_pairs(form, din, dout, layers, dtype)
    _, pu, pd = mlp_pairs("plain", din, dout, layers, "float32")
    qu, qd = [weights.Int8.quantize(w) for w in pu], [weights.Int8.quantize(w) for w in pd]

    def int8_chain(x, ups, downs):
        for u, d in zip(ups, downs):
            x = weights.product(weights.product(x, u), d)
        return x
    calls = {FLOAT: (jax.jit(chain, compiler_options=compiler_options(form, dtype)), ups, downs),
             INT8: (jax.jit(int8_chain, compiler_options=compiler_options("plain", INT8)), qu,
                    qd)}
    rng = np.random.default_rng(0)
    best: Dict[str, Dict[int, float]] = {k: {} for k in calls}
    for M in rows:
        x = jnp.asarray(rng.standard_normal((M, din), np.float32).astype(jnp.dtype(dtype)))
        xq = x.astype(jnp.float32)
        t = interleaved_min({k: functools.partial(f, x if k == FLOAT else xq, us, ds)
                             for k, (f, us, ds) in calls.items()}, repeats)
        for k in calls:
            best[k][M] = t[k]
    return best


# the rows a draft's products run: one to four (a draft chain, W_S draft beams), not 16
DRAFT_ROWS = (1, 4)


def pick_weights(times: Mapping[str, Mapping[int, float]], rows=None) -> str:
    """``"int8"`` if its total over ``rows`` (default: every probe row of ``times``) is ``GAIN``
    below the float kernels' and it is never ``MARGIN`` slower at any of them; else
    ``"float"``."""
    base, alt = times[FLOAT], times[INT8]
    rows = tuple(base) if rows is None else tuple(rows)
    faster = sum(alt[m] for m in rows) < (1 - GAIN) * sum(base[m] for m in rows)
    never_slower = all(alt[m] <= (1 + MARGIN) * base[m] for m in rows)
    return INT8 if faster and never_slower else FLOAT


def _weights_key(din: int, dout: int, dtype: str) -> str:
    return (f"weights | options plain {choice('plain')}, transposed {choice(TRANSPOSED)} | "
            f"{din}x{dout} {dtype}")


@functools.lru_cache(maxsize=None)
def _weights_figures(din: int, dout: int, dtype: str):
    """This host's MLP products of a shape, float against int8 (:func:`measure_weights`), as
    cached (``{kind: {"M": ms}}``) and where they came from."""
    got = cached_choice(_weights_key(din, dout, dtype), lambda k: k in WEIGHT_KINDS,
                        lambda: measure_weights(din, dout, dtype), pick_weights,
                        valid_ms=lambda ms: all(str(m) in ms.get(k, {}) for k in WEIGHT_KINDS
                                                for m in PROBE_ROWS))
    return got.min_ms, ("measured, " if got.measured else "") + got.where


def weights_choice(config, dtype=None, rows=DRAFT_ROWS) -> tuple:
    """``(kind, why)``: ``"int8"`` or ``"float"``, the kind of a DRAFT's kernels this host runs
    faster for ``config``'s MLP shape at the ``rows`` a draft's products have (its float
    kernels in the form and dtype a load gives them, against int8 kernels; measured once per
    host and shape, cached in ``$DSBD_JAX_CACHE/host_plan.json``; :func:`pick_weights` over
    ``rows`` only: a draft never runs the 16-row products the probe also times), and why in
    words. Float off the CPU and for models whose MLP has under ``MIN_ELEMENTS`` weights. Only
    for drafts: an int8 target is another model, and never chosen for the user."""
    if jax.default_backend() != "cpu":
        return FLOAT, f"int8 draft not used here: the {jax.default_backend()} backend"
    if config.hidden_size * config.intermediate_size < MIN_ELEMENTS:
        return FLOAT, "int8 draft not used here: a small model (not measured)"
    dt = str(jnp.dtype(dtype if dtype is not None else config.jnp_dtype))
    ms, where = _weights_figures(config.hidden_size, config.intermediate_size, dt)
    times = {k: {int(m): float(v) for m, v in ms[k].items()} for k in WEIGHT_KINDS}
    kind = pick_weights(times, rows)
    figures = ", ".join(f"{m} row{'s' if m > 1 else ''}: float {times[FLOAT][m]:.1f} / int8 "
                        f"{times[INT8][m]:.1f} ms" for m in rows)
    rule = f"int8 must be {GAIN:.0%} faster in total and never {MARGIN:.0%} slower"
    head = ("int8 draft: its MLP products run faster so here" if kind == INT8 else
            "int8 draft not used here: its MLP products are not clearly faster so")
    return kind, f"{head} ({figures}; {rule}; {where})"


def choose_weights(config, dtype=None, rows=DRAFT_ROWS) -> str:
    """The kind of :func:`weights_choice` (``"int8"`` or ``"float"``)."""
    return weights_choice(config, dtype, rows)[0]


# ---------------------------------------------------------------------------------------------
# the per-host choice of form: plain or transposed kernels, each under its own options
def _cached(entry: str, valid, measure, pick):
    """A choice of this host's plan cache (:func:`dsbd_jax.host.cpu_options.cached_choice`)."""
    got = cached_choice(entry, valid, measure, pick)
    if not got.stored:  # a read-only home
        logger.info("kernel choice: %s", got.where)
    return got.choice


FORM_ENV = "DSBD_JAX_KERNEL_FORM"
MEASURED = "measured"  # load_model(kernel_blocks="measured"): the form this choice picks
FORM_LAYERS = 4  # chained MLP pairs per probe (a pair per layer, as in a forward pass)


def measure_forms(din: int, dout: int, dtype="float32", rows=PROBE_ROWS, layers=FORM_LAYERS,
                  repeats=PROBE_REPEATS) -> Dict[str, Dict[int, float]]:
    """``{form: {M: min seconds}}`` of ``layers`` chained MLP pairs ``[M, din] x [din, dout] x
    [dout, din]`` (:func:`dsbd_jax.host.cpu_options.mlp_pairs`) with plain and with
    transposed kernels, each compiled under the compiler options chosen for its own form
    (:func:`dsbd_jax.host.cpu_options.choice`), interleaved round by round."""
    calls = {}
    for form in ("plain", TRANSPOSED):
        chain, ups, downs = mlp_pairs(form, din, dout, layers, dtype)
        calls[form] = (jax.jit(chain, compiler_options=compiler_options(form, dtype)), ups, downs)
    rng = np.random.default_rng(0)
    dt = jnp.dtype(dtype)
    best: Dict[str, Dict[int, float]] = {form: {} for form in calls}
    for M in rows:
        x = jnp.asarray(rng.standard_normal((M, din), np.float32).astype(dt))
        t = interleaved_min({form: functools.partial(f, x, us, ds)
                             for form, (f, us, ds) in calls.items()}, repeats)
        for form in calls:
            best[form][M] = t[form]
    return best


def prior_form(dtype) -> str:
    """The form a measurement must beat: ``"transposed"`` for 16-bit kernels (XLA:CPU runs a
    16-bit product of an ``[in, out]`` kernel on a slow path, of ``[out, in]`` rows with float32
    accumulation on a fast one), ``"plain"`` for float32."""
    return TRANSPOSED if jnp.dtype(dtype).itemsize == 2 else "plain"


def pick_form(times: Mapping[str, Mapping[int, float]], prior: str = "plain") -> str:
    """The other form than ``prior`` if its total over the probe rows is ``GAIN`` below
    ``prior``'s and it is never ``MARGIN`` slower at any ``M``; else ``prior``. Two forms within
    the margins keep the prior, so the choice does not flip between fresh runs of a host."""
    other = "plain" if prior == TRANSPOSED else TRANSPOSED
    base, alt = times[prior], times[other]
    faster = sum(alt.values()) < (1 - GAIN) * sum(base.values())
    never_slower = all(alt[m] <= (1 + MARGIN) * base[m] for m in base)
    return other if faster and never_slower else prior


def form_key(din: int, dout: int, dtype: str) -> str:
    """The entry of a shape's form choice in the host's plan cache: the options of each form
    (each form is measured under its own), the shape, the dtype and the prior form."""
    return (f"form | options plain {choice('plain')}, transposed "
            f"{choice(TRANSPOSED)} | {din}x{dout} {dtype} | prior {prior_form(dtype)}")


@functools.lru_cache(maxsize=None)
def _choose_form(din: int, dout: int, dtype: str) -> str:
    if din * dout < MIN_ELEMENTS:
        return "plain"
    prior = prior_form(dtype)
    return _cached(form_key(din, dout, dtype), lambda f: f in ("plain", TRANSPOSED),
                   lambda: measure_forms(din, dout, dtype),
                   functools.partial(pick_form, prior=prior))


def choose_form(config, dtype=None) -> str:
    """``"plain"`` or ``"transposed"``: the faster form of projection kernels for ``config``'s
    MLP shape on this host, each form timed under its own compiler options (a few seconds once
    per host and shape, then cached in ``$DSBD_JAX_CACHE/host_plan.json``); the dtype's
    :func:`prior_form` unless the other form is clearly faster (:func:`pick_form`). Plain off the
    CPU and for models whose MLP has under ``MIN_ELEMENTS`` weights. ``$DSBD_JAX_KERNEL_FORM``
    forces ``plain`` or ``transposed`` (default ``auto``)."""
    forced = os.environ.get(FORM_ENV, "auto").strip() or "auto"
    if forced not in ("auto", "plain", TRANSPOSED):
        raise ValueError(f"${FORM_ENV} must be 'auto', 'plain' or 'transposed', got {forced!r}")
    if forced != "auto":
        return forced
    if jax.default_backend() != "cpu":
        return "plain"
    dt = str(jnp.dtype(dtype if dtype is not None else config.jnp_dtype))
    t0 = time.perf_counter()
    form = _choose_form(config.hidden_size, config.intermediate_size, dt)
    logger.info("kernel form for %dx%d %s: %s (%.1f s; cache %s)", config.hidden_size,
                config.intermediate_size, dt, form, time.perf_counter() - t0, plan_file())
    return form
