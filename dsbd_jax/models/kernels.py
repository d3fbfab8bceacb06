"""Blocked projection kernels for XLA:CPU's few-row products, chosen per host.

A projection ``y = x @ W`` with ``W [in, out]`` (Flax's layout, the default) runs on XLA:CPU as
one Eigen matrix product. With few rows (``M = 1..16``: one token, beams, draft forests) Eigen
packs the whole weight before multiplying, so the product costs about two weight reads instead
of one, and on some hosts it is slower than torch's product (``benchmarks/matmul.py``). A **blocked
kernel** ``[out / n, in, n]`` stores the output columns in blocks of ``n``, each block a
contiguous ``[in, n]`` matrix. The product becomes one batched product over the blocks
(``cmk,ckn->cmn``, ``x`` broadcast to every block), each block small enough to stay in cache, and
the blocks are put back side by side. One row is padded to two (XLA:CPU takes a slower batched
matrix-vector path for a single row). The result is the same product up to float rounding (the
sums run in another order).

* Each form is a kind of kernel leaf (:mod:`dsbd_jax.models.weights`): a plain ``[in, out]``
  array, or a typed leaf that says its form (:class:`~dsbd_jax.models.weights.ColBlocks`,
  :class:`~dsbd_jax.models.weights.RowBlocks`, :class:`~dsbd_jax.models.weights.Rows`). The
  model's projections call :func:`dsbd_jax.models.weights.product`, so a parameter tree may
  mix the forms; a stacked tree (``params["layers"]``) carries the layer axis in front of any.
* :func:`block_params` / :func:`unblock_params`: convert the attention and MLP projection kernels
  of a tree (either weight layout) to blocks of given widths and back; :func:`blocks_of` reads
  the widths back. The embeddings, norms, biases and the vocabulary head are never blocked.
* :func:`choose_blocks`: the block width per projection for a model's shapes on this host (0 =
  not blocked), by a short measurement of each candidate (``CANDIDATES``) at ``M = 1, 4, 16``,
  cached per host in ``$DSBD_JAX_CACHE/host_plan.json``. A width is taken only if it is
  ``GAIN`` faster in total than ``[in, out]`` and never ``MARGIN`` slower at any ``M``; products
  under ``MIN_ELEMENTS`` weights are never blocked (they are not bound by memory). Off the CPU it
  is always 0. ``$DSBD_JAX_KERNEL_BLOCKS`` forces a choice: ``auto`` (default), ``none``, a
  width for every projection (e.g. ``64``), or ``halves`` (two blocks per projection). The
  products are measured under the host's ``compiler_options`` (the options the passes run
  under), and the cache key names them.
* **Transposed kernels**: :func:`transpose_params` stores a projection's kernel as
  its ``[out, in]`` rows, cut into blocks ``[out / n, n, in]`` (:func:`transposed_widths`),
  a :class:`~dsbd_jax.models.weights.RowBlocks`; :func:`project_t` runs one row as a
  matrix-vector product over contiguous rows and more rows as one batched product per block. :func:`unblock_params`
  converts back. The products live in :mod:`dsbd_jax.models.products`.
* **The form follows the host, the options follow the form**. The best compiler
  options depend on the kernels' form: on a host, plain kernels may run fastest on Eigen
  (``eigen_dot``) and transposed kernels on XLA's default YNNPACK, where their few-row products
  beat the plain kernels'. So :func:`dsbd_jax.models.cpu_options.choice` is
  measured per form, and ``tuned_jit`` compiles a call whose arguments hold transposed kernels
  under the transposed form's options. :func:`choose_form` then times both forms, each under
  its own options, on a model's MLP shape (chained pairs at ``M = 1, 4, 16``; transposed only
  if ``GAIN`` faster in total and never ``MARGIN`` slower), cached per host and shape;
  ``load_model(..., kernel_blocks="measured")``, the default, applies it (``benchmarks/forward.py``
  and ``benchmarks/kernel_blocks.py`` measure the forward passes and the decoders in both forms;
  what each host picks: ``docs/performance.md``).

**Blocked kernels are opt-in.** ``load_model(..., kernel_blocks="auto")`` applies
:func:`choose_blocks` on the CPU. They are not the default: their products can be faster on
their own while whole forward passes get slower with blocks (``benchmarks/forward.py --blocks N``;
figures in ``docs/results/cpu.md``). Code that needs ``[in, out]`` kernels (distillation, export
to Hugging Face files, sharding over a mesh) calls :func:`unblock_params` first;
``ShardedDecoder.place`` and ``distill`` do it themselves.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from typing import Dict, Mapping, Optional, Sequence, Union

import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.models.cpu_options import cache_file as plan_file
from dsbd_jax.models.cpu_options import (cached_choice, choice, compiler_options,
                                         interleaved_min, mlp_pairs)
from dsbd_jax.models import weights
from dsbd_jax.models.products import (T_MAX_WIDTH, TRANSPOSED, block, project,  # noqa: F401
                                      project_t, transpose_block, transposed_width, unblock,
                                      untranspose)
from dsbd_jax.models.weights import ColBlocks, RowBlocks, Rows, form_of  # noqa: F401

logger = logging.getLogger("dsbd_jax")

ENV = "DSBD_JAX_KERNEL_BLOCKS"
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# two blocks of half the output columns each (the width depends on the shape): a forced choice
# only (DSBD_JAX_KERNEL_BLOCKS=halves, load_model(kernel_blocks="halves")); its products are
# faster chained at M = 1..16 but whole forward passes are not (benchmarks/forward.py --blocks
# halves, docs/results/cpu.md), so the measurement does not offer it
HALVES = "halves"
CANDIDATES = (0, 32, 64, 128)
PROBE_ROWS = (1, 4, 16)
PROBE_LAYERS, PROBE_REPEATS = 6, 5
MIN_ELEMENTS = 1 << 21  # in * out below this: never blocked (fits in cache, not memory-bound)
GAIN = 0.10    # a width must be 10% faster than [in, out] over PROBE_ROWS in total ...
MARGIN = 0.05  # ... and never 5% slower at any M


def transposed_widths(config) -> Dict[str, int]:
    """``{projection: row-block width}`` of :func:`transposed_width` for every projection."""
    return {p: transposed_width(dout) for p, (_, dout) in projection_shapes(config).items()}


def width_fits(n: int, dout: int) -> bool:
    """Whether blocks of ``n`` columns split ``dout`` output columns (into two or more)."""
    return n > 0 and dout % n == 0 and n < dout


def width_of(candidate: Union[int, str], dout: int) -> int:
    """The block width of a candidate (a width, or ``"halves"``) for ``dout`` output columns;
    0 when it does not fit (``[in, out]`` kept)."""
    n = dout // 2 if candidate == HALVES else int(candidate)
    return n if width_fits(n, dout) else 0


def uniform_blocks(config, n: Union[int, str]) -> Dict[str, int]:
    """``{projection: width}`` for every projection of ``config`` that the width ``n`` (an int,
    its digits, or ``"halves"``: half of each projection's output columns) fits."""
    if n != HALVES and not str(n).isdigit():
        raise ValueError(f"a block width must be a positive int or {HALVES!r}, got {n!r}")
    out = {p: width_of(n, dout) for p, (_, dout) in projection_shapes(config).items()}
    return {p: w for p, w in out.items() if w}


# ---------------------------------------------------------------------------------------------
# parameter trees: each kernel a plain [in, out] array or a typed leaf (dsbd_jax.models.weights)
def _projections(params):
    """``[path tuple]`` of every projection kernel of a tree (either layout; any kind)."""
    out = []

    def walk(tree, path):
        for k, v in tree.items():
            if isinstance(v, Mapping):
                walk(v, path + (k,))
            elif k == "kernel" and path and path[-1] in PROJECTIONS:
                out.append(path + (k,))
    walk(params, ())
    return out


def _replace(params, path, value):
    if len(path) == 1:
        return {**params, path[0]: value}
    return {**params, path[0]: _replace(params[path[0]], path[1:], value)}


def _get(params, path):
    for k in path:
        params = params[k]
    return params


def _check_projections(names, fn: str) -> None:
    bad = sorted(set(names) - set(PROJECTIONS))
    if bad:
        raise ValueError(f"unknown projections {bad}; {fn} knows {list(PROJECTIONS)}")


def _copy_dicts(tree):
    """``tree`` with every mapping copied into a new dict and the arrays shared."""
    return {k: _copy_dicts(v) if isinstance(v, Mapping) else v for k, v in tree.items()}


def block_params(params, blocks: Mapping[str, int]):
    """``params`` with the kernel of every projection named in ``blocks`` (``{"down_proj": 64,
    ...}``; 0 = leave it) in blocks of that width (:class:`~dsbd_jax.models.weights.ColBlocks`).
    A kernel of another kind is made plain first. A new tree; the input is not changed."""
    _check_projections(blocks, "block_params")
    for path in _projections(params):
        n = int(blocks.get(path[-2], 0))
        if n:
            params = _replace(params, path, ColBlocks(block(weights.plain(_get(params, path)), n)))
    return params


def unblock_params(params):
    """``params`` with every typed kernel (blocked, transposed, a head's rows; any
    :class:`~dsbd_jax.models.weights.Kernel`) back as its plain ``[in, out]`` array (the same
    tree object when there is none)."""
    if not isinstance(params, Mapping):
        return params
    out = None
    for k, v in params.items():
        new = unblock_params(v) if isinstance(v, Mapping) else weights.plain(v)
        if new is not v:
            out = dict(params) if out is None else out
            out[k] = new
    return params if out is None else out


HEAD = "lm_head"
VOCAB_HEAD = "vocab_head"  # dsbd_jax.models.vocab.VOCAB_HEAD (a truncated head)


def transpose_head(params):
    """``params`` with the vocabulary head's kernel stored as its ``[out, in]`` rows
    (:class:`~dsbd_jax.models.weights.Rows`): an untied ``lm_head`` ``[d, V]`` becomes
    ``[V, d]``, a truncated head's ``[d, N]`` becomes ``[N, d]`` (its ``"full_kernel"`` for
    prompt rows stays ``[d, V]``: only ``B * P`` columns of it are gathered per call). The form
    16-bit models run fastest (:func:`dsbd_jax.models.products.mixed_rows`: one product over
    contiguous rows); a tied head (the embedding ``[V, d]``) already has it. A new tree;
    :func:`unblock_params` converts back."""
    if not isinstance(params, Mapping):
        return params
    out = params
    for name in (HEAD, VOCAB_HEAD):
        head = out.get(name)
        if isinstance(head, Mapping) and "kernel" in head and not weights.is_kernel(head["kernel"]):
            out = {**out, name: {**head, "kernel": Rows(jnp.swapaxes(head["kernel"], -1, -2))}}
    return out


def head_transposed(params) -> bool:
    """Whether the vocabulary head is stored as ``[out, in]`` rows (:func:`transpose_head`)."""
    return any(isinstance(params.get(n), Mapping) and isinstance(params[n].get("kernel"), Rows)
               for n in (HEAD, VOCAB_HEAD)) if isinstance(params, Mapping) else False


def transpose_params(params, widths: Mapping[str, int]):
    """``params`` with the kernel of every projection named in ``widths`` (``{"up_proj": 1280,
    ...}``, e.g. :func:`transposed_widths`) transposed into row blocks of that width
    (:class:`~dsbd_jax.models.weights.RowBlocks`); any kind is accepted as input (a new tree;
    the input is not changed). :func:`unblock_params` converts back."""
    return transpose_params_(_copy_dicts(unblock_params(params)), widths)


def transpose_params_(params: dict, widths: Mapping[str, int], head: bool = False) -> dict:
    """:func:`transpose_params` (and with ``head``, :func:`transpose_head`) IN PLACE, one kernel
    at a time, each new kernel waited for and the old one dropped before the next: besides the
    model the device holds at most one kernel twice (the loaders use it; a tree built beside
    the input would hold both copies of every kernel until it returned). Returns ``params``."""
    _check_projections(widths, "transpose_params")
    plain = unblock_params(params)
    if plain is not params:   # typed already: back to [in, out] first
        params.update(_copy_dicts(plain))
    for path in _projections(params):
        n = int(widths.get(path[-2], 0))
        if n:
            parent = _get(params, path[:-1])
            w = parent.pop(path[-1])
            parent["kernel"] = RowBlocks(jax.block_until_ready(transpose_block(w, n)))
            del w
    return transpose_head_(params) if head else params


def transpose_head_(params: dict) -> dict:
    """:func:`transpose_head` IN PLACE (the head's old ``[d, V]`` kernel is dropped once its
    rows replace it). Returns ``params``."""
    params.update(transpose_head(params))
    return params


def _widths(params, kind) -> Dict[str, int]:
    """``{projection: block width}`` of the tree's projection kernels of ``kind``."""
    kernels = {path[-2]: _get(params, path) for path in _projections(params)}
    return {p: w.width for p, w in kernels.items() if isinstance(w, kind)}


def transposed_of(params) -> Dict[str, int]:
    """``{projection: row-block width}`` of the transposed kernels of a tree (empty: none)."""
    return _widths(params, RowBlocks)


def blocks_of(params) -> Dict[str, int]:
    """``{projection: block width}`` of the blocked kernels of a tree (empty: none blocked)."""
    return _widths(params, ColBlocks)


def projection_shapes(config) -> Dict[str, tuple]:
    """``{projection: (in, out)}`` of a :class:`~dsbd_jax.models.config.ModelConfig`."""
    d, H, K, D, F = (config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim,
                     config.intermediate_size)
    return {"q_proj": (d, H * D), "k_proj": (d, K * D), "v_proj": (d, K * D),
            "o_proj": (H * D, d), "gate_proj": (d, F), "up_proj": (d, F), "down_proj": (F, d)}


# ---------------------------------------------------------------------------------------------
# the per-host choice
def measure(din: int, dout: int, dtype="float32", rows=PROBE_ROWS, layers=PROBE_LAYERS,
            repeats=PROBE_REPEATS, candidates: Sequence[Union[int, str]] = CANDIDATES
            ) -> Dict[int, Dict[int, float]]:
    """``{width: {M: min seconds}}`` of ``layers`` products ``[M, din] x [din, dout]`` with the
    kernel unblocked (width 0) or blocked (each candidate that fits, ``"halves"`` as its width),
    candidates interleaved round by round, compiled with this host's ``compiler_options``
    (:mod:`dsbd_jax.models.cpu_options`: the options the model's passes run under). The products
    are chained (each one's input is the previous one's output): XLA:CPU runs independent
    products side by side, which flatters the single-threaded blocked products (independent
    blocked products can look faster while the whole forward pass gets slower with blocks;
    docs/results/cpu.md)."""
    rng = np.random.default_rng(0)
    dt = jnp.dtype(dtype)
    ws = [rng.standard_normal((din, dout), np.float32).astype(dt) for _ in range(layers)]
    def chain(x, ws):  # each product waits for the previous one, as in a forward pass
        for w in ws:
            y = project(x, w)
            x = jnp.tile(y, (1, -(-din // dout)))[:, :din]
        return x
    f = jax.jit(chain, compiler_options=compiler_options("plain", dtype))
    widths = sorted({0} | {width_of(c, dout) for c in candidates})
    trees = {n: [jnp.asarray(w) if n == 0 else block(jnp.asarray(w), n) for w in ws]
             for n in widths}
    best: Dict[int, Dict[int, float]] = {n: {} for n in trees}
    for M in rows:
        x = jnp.asarray(rng.standard_normal((M, din), np.float32).astype(dt))
        t = interleaved_min({n: functools.partial(f, x, tree) for n, tree in trees.items()},
                            repeats)
        for n in trees:
            best[n][M] = t[n]
    return best


def pick(times: Mapping, base=0):
    """The candidate to use from measured figures ``{candidate: {M: seconds}}``: the fastest in
    total among those ``GAIN`` faster in total than ``base`` and never ``MARGIN`` slower at any
    ``M``, else ``base`` (:func:`measure`'s widths, 0 = keep ``[in, out]``; :func:`pick_form`)."""
    ref = times[base]
    total = {n: sum(t.values()) for n, t in times.items()}
    ok = [n for n, t in times.items() if n != base and total[n] < (1 - GAIN) * total[base]
          and all(t[m] <= (1 + MARGIN) * ref[m] for m in ref)]
    return min(ok, key=total.get) if ok else base


def _cached(entry: str, valid, measure, pick):
    """A choice of this host's plan cache (:func:`dsbd_jax.models.cpu_options.cached_choice`)."""
    got = cached_choice(entry, valid, measure, pick)
    if not got.stored:  # a read-only home
        logger.info("kernel choice: %s", got.where)
    return got.choice


def _forced() -> Optional[str]:
    v = os.environ.get(ENV, "auto").strip() or "auto"
    if v not in ("auto", "none", HALVES) and not v.isdigit():
        raise ValueError(f"${ENV} must be 'auto', 'none', 'halves' or a block width such as 64, "
                         f"got {v!r}")
    return v


def choose_key(din: int, dout: int, dtype: str) -> str:
    """The entry of a shape's choice in the host's plan cache: the compiler options in use (the
    products are measured under them), the shape, the dtype and the block candidates (a new
    candidate is measured, not hidden behind an old choice)."""
    return (f"blocks | options {choice()} | {din}x{dout} {dtype} | "
            f"blocks {','.join(str(c) for c in CANDIDATES)}")


@functools.lru_cache(maxsize=None)
def _choose(din: int, dout: int, dtype: str) -> int:
    if din * dout < MIN_ELEMENTS:
        return 0
    return _cached(choose_key(din, dout, dtype),
                   lambda n: isinstance(n, int) and (n == 0 or width_fits(n, dout)),
                   lambda: measure(din, dout, dtype), pick)


def choose_blocks(config, dtype=None) -> Dict[str, int]:
    """``{projection: width}`` for ``config``'s shapes on this host (see the module docstring);
    only the blocked projections appear. Logged once per shape."""
    forced = _forced()
    if jax.default_backend() != "cpu" or forced == "none":
        return {}
    shapes = projection_shapes(config)
    if forced != "auto":
        return uniform_blocks(config, forced)
    dt = str(jnp.dtype(dtype if dtype is not None else config.jnp_dtype))
    t0 = time.perf_counter()
    out = {p: _choose(din, dout, dt) for p, (din, dout) in shapes.items()}
    out = {p: n for p, n in out.items() if n}
    logger.info("kernel blocks for %s: %s (%.1f s; cache %s)", dt, out or "none",
                time.perf_counter() - t0, plan_file())
    return out


# ---------------------------------------------------------------------------------------------
# the per-host choice of form: plain or transposed kernels, each under its own options
FORM_ENV = "DSBD_JAX_KERNEL_FORM"
MEASURED = "measured"  # load_model(kernel_blocks="measured"): the form this choice picks
FORM_LAYERS = 4  # chained MLP pairs per probe (a pair per layer, as in a forward pass)


def measure_forms(din: int, dout: int, dtype="float32", rows=PROBE_ROWS, layers=FORM_LAYERS,
                  repeats=PROBE_REPEATS) -> Dict[str, Dict[int, float]]:
    """``{form: {M: min seconds}}`` of ``layers`` chained MLP pairs ``[M, din] x [din, dout] x
    [dout, din]`` (:func:`dsbd_jax.models.cpu_options.mlp_pairs`) with plain and with
    transposed kernels, each compiled under the compiler options chosen for its own form
    (:func:`dsbd_jax.models.cpu_options.choice`), interleaved round by round."""
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


def pick_form(times: Mapping[str, Mapping[int, float]]) -> str:
    """``"transposed"`` if its total over the probe rows is ``GAIN`` below the plain kernels'
    and it is never ``MARGIN`` slower at any ``M``; else ``"plain"``."""
    return pick({f: times[f] for f in ("plain", TRANSPOSED)}, base="plain")


def form_key(din: int, dout: int, dtype: str) -> str:
    """The entry of a shape's form choice in the host's plan cache: the options of each form
    (each form is measured under its own), the shape and the dtype."""
    return (f"form | options plain {choice('plain')}, transposed "
            f"{choice(TRANSPOSED)} | {din}x{dout} {dtype}")


@functools.lru_cache(maxsize=None)
def _choose_form(din: int, dout: int, dtype: str) -> str:
    if din * dout < MIN_ELEMENTS:
        return "plain"
    return _cached(form_key(din, dout, dtype), lambda f: f in ("plain", TRANSPOSED),
                   lambda: measure_forms(din, dout, dtype), pick_form)


def choose_form(config, dtype=None) -> str:
    """``"plain"`` or ``"transposed"``: the faster form of projection kernels for ``config``'s
    MLP shape on this host, each form timed under its own compiler options (a few seconds once
    per host and shape, then cached in ``$DSBD_JAX_CACHE/host_plan.json``). Plain off the
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
