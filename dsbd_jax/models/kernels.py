"""Blocked projection kernels for XLA:CPU's few-row products, chosen per host (issue 21).

A projection ``y = x @ W`` with ``W [in, out]`` (Flax's layout, the default) runs on XLA:CPU as
one Eigen matrix product. With few rows (``M = 1..16``: one token, beams, draft forests) Eigen
packs the whole weight before multiplying, so the product costs about two weight reads instead
of one, and on some hosts it is 1.5-2x slower than torch (``benchmarks/matmul.py``). A **blocked
kernel** ``[out / n, in, n]`` stores the output columns in blocks of ``n``, each block a
contiguous ``[in, n]`` matrix. The product becomes one batched product over the blocks
(``cmk,ckn->cmn``, ``x`` broadcast to every block), each block small enough to stay in cache, and
the blocks are put back side by side. One row is padded to two (XLA:CPU takes a slower batched
matrix-vector path for a single row). The result is the same product up to float rounding (the
sums run in another order).

* :func:`project`: ``x [..., in]`` times a kernel in either form, told apart by its rank
  (2: ``[in, out]``; 3: blocked). The model's projections call it, so a parameter tree may mix
  both forms; a stacked tree (``params["layers"]``) carries the layer axis in front of either.
* :func:`block_params` / :func:`unblock_params`: convert the attention and MLP projection kernels
  of a tree (either weight layout) to blocks of given widths and back; :func:`blocks_of` reads
  the widths back. The embeddings, norms, biases and the vocabulary head are never blocked.
* :func:`choose_blocks`: the block width per projection for a model's shapes on this host (0 =
  not blocked), by a short measurement of each candidate (``CANDIDATES``) at ``M = 1, 4, 16``,
  cached per host in ``$DSBD_JAX_CACHE/kernel_blocks.json``. A width is taken only if it is
  ``GAIN`` faster in total than ``[in, out]`` and never ``MARGIN`` slower at any ``M``; products
  under ``MIN_ELEMENTS`` weights are never blocked (they are not bound by memory). Off the CPU it
  is always 0. ``$DSBD_JAX_KERNEL_BLOCKS`` forces a choice: ``auto`` (default), ``none``, or a
  width for every projection (e.g. ``64``).

**Opt-in.** ``load_model(..., kernel_blocks="auto")`` applies :func:`choose_blocks` on the CPU;
the default is plain kernels, because on the one host measured so far (2-core AVX-512) blocks
made whole forward passes slower (width 64: 1.74x at one token; width 128: 1.29x at one token,
0.88x at four rows; ``benchmarks/forward.py --blocks N``) and the measurement chose none. Code that
needs ``[in, out]`` kernels (distillation, export to Hugging Face files, sharding over a mesh)
calls :func:`unblock_params` first; ``ShardedDecoder.place`` and ``distill`` do it themselves.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from typing import Dict, Mapping, Optional, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.models.cpu_options import cache_file as _options_cache_file
from dsbd_jax.models.cpu_options import host_key, interleaved_min

logger = logging.getLogger("dsbd_jax")

ENV = "DSBD_JAX_KERNEL_BLOCKS"
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
CANDIDATES = (0, 32, 64, 128)
PROBE_ROWS = (1, 4, 16)
PROBE_LAYERS, PROBE_REPEATS = 6, 5
MIN_ELEMENTS = 1 << 21  # in * out below this: never blocked (fits in cache, not memory-bound)
GAIN = 0.10    # a width must be 10% faster than [in, out] over PROBE_ROWS in total ...
MARGIN = 0.05  # ... and never 5% slower at any M


# ---------------------------------------------------------------------------------------------
# the product
def block(w: jax.Array, n: int) -> jax.Array:
    """``[..., in, out]`` -> ``[..., out / n, in, n]`` (``n`` must divide ``out``)."""
    *lead, din, dout = w.shape
    if n < 1 or dout % n:
        raise ValueError(f"block width {n} does not divide the kernel's {dout} output columns")
    nl = len(lead)
    perm = tuple(range(nl)) + (nl + 1, nl, nl + 2)
    return jnp.transpose(jnp.reshape(w, (*lead, din, dout // n, n)), perm)


def unblock(w: jax.Array) -> jax.Array:
    """``[..., c, in, n]`` -> ``[..., in, c * n]`` (the inverse of :func:`block`)."""
    *lead, c, din, n = w.shape
    nl = len(lead)
    perm = tuple(range(nl)) + (nl + 1, nl, nl + 2)
    return jnp.reshape(jnp.transpose(w, perm), (*lead, din, c * n))


def project(x: jax.Array, kernel: jax.Array) -> jax.Array:
    """``x [..., in]`` times ``kernel`` (``[in, out]``, or blocked ``[out / n, in, n]``)."""
    if kernel.ndim == 2:  # the Flax Dense product, unchanged
        return jax.lax.dot_general(x, kernel, (((x.ndim - 1,), (0,)), ((), ())))
    c, din, n = kernel.shape
    lead = x.shape[:-1]
    xm = x.reshape(-1, din)
    m = xm.shape[0]
    if m == 1:
        xm = jnp.pad(xm, ((0, 1), (0, 0)))
    y = jnp.einsum("cmk,ckn->cmn", jnp.broadcast_to(xm, (c,) + xm.shape), kernel)
    y = y.transpose(1, 0, 2).reshape(xm.shape[0], c * n)[:m]
    return y.reshape(*lead, c * n)


def width_fits(n: int, dout: int) -> bool:
    """Whether blocks of ``n`` columns split ``dout`` output columns (into two or more)."""
    return n > 0 and dout % n == 0 and n < dout


def uniform_blocks(config, n: int) -> Dict[str, int]:
    """``{projection: n}`` for every projection of ``config`` that width ``n`` fits."""
    return {p: n for p, (_, dout) in projection_shapes(config).items() if width_fits(n, dout)}


# ---------------------------------------------------------------------------------------------
# parameter trees
def _is_blocked(w, stacked: bool) -> bool:
    """Whether a projection kernel is in blocked form (one more axis than ``[in, out]``)."""
    return w.ndim == (4 if stacked else 3)


def _projections(params):
    """``[(path tuple, stacked?)]`` of every projection kernel of a tree (either layout)."""
    out = []

    def walk(tree, path):
        for k, v in tree.items():
            if isinstance(v, Mapping):
                walk(v, path + (k,))
            elif k == "kernel" and path and path[-1] in PROJECTIONS:
                out.append((path + (k,), path[0] == "layers"))
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


def block_params(params, blocks: Mapping[str, int]):
    """``params`` with the kernel of every projection named in ``blocks`` (``{"down_proj": 64,
    ...}``; 0 = leave it) in blocks of that width. Already blocked kernels are re-blocked.
    A new tree; the input is not changed."""
    bad = sorted(set(blocks) - set(PROJECTIONS))
    if bad:
        raise ValueError(f"unknown projections {bad}; block_params knows {list(PROJECTIONS)}")
    for path, stacked in _projections(params):
        n = int(blocks.get(path[-2], 0))
        if n:
            w = _get(params, path)
            if _is_blocked(w, stacked):
                w = unblock(w)
            params = _replace(params, path, block(w, n))
    return params


def unblock_params(params):
    """``params`` with every blocked projection kernel back in ``[in, out]`` form (the same
    tree object when nothing is blocked)."""
    for path, stacked in _projections(params):
        w = _get(params, path)
        if _is_blocked(w, stacked):
            params = _replace(params, path, unblock(w))
    return params


def blocks_of(params) -> Dict[str, int]:
    """``{projection: block width}`` of the blocked kernels of a tree (empty: none blocked)."""
    out = {}
    for path, stacked in _projections(params):
        w = _get(params, path)
        if _is_blocked(w, stacked):
            out[path[-2]] = int(w.shape[-1])
    return out


def projection_shapes(config) -> Dict[str, tuple]:
    """``{projection: (in, out)}`` of a :class:`~dsbd_jax.models.config.ModelConfig`."""
    d, H, K, D, F = (config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim,
                     config.intermediate_size)
    return {"q_proj": (d, H * D), "k_proj": (d, K * D), "v_proj": (d, K * D),
            "o_proj": (H * D, d), "gate_proj": (d, F), "up_proj": (d, F), "down_proj": (F, d)}


# ---------------------------------------------------------------------------------------------
# the per-host choice
def measure(din: int, dout: int, dtype="float32", rows=PROBE_ROWS, layers=PROBE_LAYERS,
            repeats=PROBE_REPEATS, candidates: Sequence[int] = CANDIDATES
            ) -> Dict[int, Dict[int, float]]:
    """``{width: {M: min seconds}}`` of ``layers`` products ``[M, din] x [din, dout]`` with the
    kernel unblocked (width 0) or blocked, candidates interleaved round by round. The products
    are chained (each one's input is the previous one's output): XLA:CPU runs independent
    products side by side, which flatters the single-threaded blocked products (measured: 2.6
    against 4.6 ms per 8960x1536 product at M = 4 when 28 run independently, while the whole
    forward pass got slower with blocks; docs/results.md)."""
    rng = np.random.default_rng(0)
    dt = jnp.dtype(dtype)
    ws = [rng.standard_normal((din, dout), np.float32).astype(dt) for _ in range(layers)]
    def chain(x, ws):  # each product waits for the previous one, as in a forward pass
        for w in ws:
            y = project(x, w)
            x = jnp.tile(y, (1, -(-din // dout)))[:, :din]
        return x
    f = jax.jit(chain)
    trees = {n: [jnp.asarray(w) if n == 0 else block(jnp.asarray(w), n) for w in ws]
             for n in candidates if n == 0 or width_fits(n, dout)}
    best: Dict[int, Dict[int, float]] = {n: {} for n in trees}
    for M in rows:
        x = jnp.asarray(rng.standard_normal((M, din), np.float32).astype(dt))
        t = interleaved_min({n: functools.partial(f, x, tree) for n, tree in trees.items()},
                            repeats)
        for n in trees:
            best[n][M] = t[n]
    return best


def pick(times: Mapping[int, Mapping[int, float]]) -> int:
    """The width to use from :func:`measure`'s figures (0: keep ``[in, out]``)."""
    base = times[0]
    total = {n: sum(t.values()) for n, t in times.items()}
    ok = [n for n, t in times.items() if n and total[n] < (1 - GAIN) * total[0]
          and all(t[m] <= (1 + MARGIN) * base[m] for m in base)]
    return min(ok, key=total.get) if ok else 0


def cache_file():
    return _options_cache_file().with_name("kernel_blocks.json")


def _read_cache() -> dict:
    try:
        return json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return {}


def _forced() -> Optional[str]:
    v = os.environ.get(ENV, "auto").strip() or "auto"
    if v not in ("auto", "none") and not v.isdigit():
        raise ValueError(f"${ENV} must be 'auto', 'none' or a block width such as 64, got {v!r}")
    return v


@functools.lru_cache(maxsize=None)
def _choose(din: int, dout: int, dtype: str) -> int:
    if din * dout < MIN_ELEMENTS:
        return 0
    key, cached = f"{host_key()} | {din}x{dout} {dtype}", _read_cache()
    if key in cached and cached[key].get("choice") in CANDIDATES:
        return int(cached[key]["choice"])
    times = measure(din, dout, dtype)
    n = pick(times)
    cached[key] = {"choice": n, "min_ms": {str(w): {str(m): round(1e3 * s, 3) for m, s in t.items()}
                                           for w, t in times.items()}}
    try:
        cache_file().parent.mkdir(parents=True, exist_ok=True)
        cache_file().write_text(json.dumps(cached, indent=2))
    except OSError as e:  # a read-only home: keep the choice for this process only
        logger.info("kernel blocks: not cached (%s)", e)
    return n


def choose_blocks(config, dtype=None) -> Dict[str, int]:
    """``{projection: width}`` for ``config``'s shapes on this host (see the module docstring);
    only the blocked projections appear. Logged once per shape."""
    forced = _forced()
    if jax.default_backend() != "cpu" or forced == "none":
        return {}
    shapes = projection_shapes(config)
    if forced != "auto":
        return uniform_blocks(config, int(forced))
    dt = str(jnp.dtype(dtype if dtype is not None else config.jnp_dtype))
    t0 = time.perf_counter()
    out = {p: _choose(din, dout, dt) for p, (din, dout) in shapes.items()}
    out = {p: n for p, n in out.items() if n}
    logger.info("kernel blocks for %s: %s (%.1f s; cache %s)", dt, out or "none",
                time.perf_counter() - t0, cache_file())
    return out
