"""Preallocated, fixed-shape KV cache and the operations the decoders need on it.

A cache is a plain pytree (``KVCache``) with the batch axis at position 1: ``k, v: [layers,
batch, slots, kv_heads, head_dim]``. It does not record how many slots are filled (the decoders
keep per-row lengths and build masks from them), and the model never writes to it: the
functions below commit the new keys and values (static shapes, per-row offsets as arrays, so
nothing recompiles). Every cache they return states its axes (:data:`dsbd_jax.models.axes.CACHE`)
through :func:`dsbd_jax.models.axes.constrain`: the identity unless the caller traces under a
mesh and logical-axis rules (as :class:`dsbd_jax.parallel.ShardedDecoder` does), and then
``gather_rows`` reselects rows within each batch shard (no cache crosses devices).
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from dsbd_jax.models import axes


@flax.struct.dataclass
class KVCache:
    k: jax.Array  # [L, B, S, K, D]
    v: jax.Array  # [L, B, S, K, D]

    @property
    def num_slots(self) -> int:
        return self.k.shape[2]

    @property
    def batch(self) -> int:
        return self.k.shape[1]

    def nbytes(self) -> int:
        return int(self.k.size * self.k.dtype.itemsize + self.v.size * self.v.dtype.itemsize)


def _layout(cache: KVCache) -> KVCache:
    """The cache with its axes stated (:func:`axes.constrain`: a no-op without a mesh)."""
    return KVCache(axes.constrain(cache.k, axes.CACHE), axes.constrain(cache.v, axes.CACHE))


def empty_cache(config, batch: int, slots: int, dtype=None) -> KVCache:
    """Zero cache of ``slots`` positions for ``batch`` rows."""
    dtype = config.jnp_dtype if dtype is None else dtype
    shape = (config.num_layers, batch, slots, config.num_kv_heads, config.head_dim)
    return _layout(KVCache(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype)))


@jax.named_scope("cache")
def write(cache: KVCache, new: KVCache, start: jax.Array) -> KVCache:
    """Write all T new entries of each row at slots ``start[b] .. start[b] + T - 1``.

    ``new``: KVCache ``[L, B, T, K, D]``; ``start``: ``[B]`` int. Slots past the end are dropped
    by ``dynamic_update_slice`` clamping, so callers must keep ``start + T <= slots``.
    """
    def one(c, n, s):  # c: [L, S, K, D], n: [L, T, K, D]
        return jax.lax.dynamic_update_slice(c, n.astype(c.dtype), (0, s, 0, 0))

    f = jax.vmap(one, in_axes=(1, 1, 0), out_axes=1)
    start = jnp.asarray(start, jnp.int32)
    return _layout(KVCache(f(cache.k, new.k, start), f(cache.v, new.v, start)))


@jax.named_scope("cache")
def write_selected(cache: KVCache, new: KVCache, select: jax.Array, start: jax.Array,
                   count: jax.Array) -> KVCache:
    """Copy chosen new entries into contiguous slots (EAGLE-style accepted-path commit).

    For row b, entries ``new[:, b, select[b, j]]`` for ``j < count[b]`` go to slot
    ``start[b] + j``; slots for ``j >= count[b]`` keep their old content.
    ``select``: ``[B, n]`` indices into the T axis of ``new``; ``start``, ``count``: ``[B]``.
    """
    n = select.shape[1]
    slots = cache.num_slots
    j = jnp.arange(n)
    dest = jnp.where(j[None, :] < count[:, None], start[:, None] + j[None, :], slots)  # [B, n]

    def one(c, nw, sel, d):  # c: [L, S, K, D], nw: [L, T, K, D]
        picked = jnp.take(nw, sel, axis=1).astype(c.dtype)  # [L, n, K, D]
        return c.at[:, d].set(picked, mode="drop")

    f = jax.vmap(one, in_axes=(1, 1, 0, 0), out_axes=1)
    return _layout(KVCache(f(cache.k, new.k, select, dest), f(cache.v, new.v, select, dest)))


@jax.named_scope("cache")
def gather_rows(cache: KVCache, rows: jax.Array) -> KVCache:
    """Reorder/duplicate batch rows (beam reselection): ``out[:, i] = cache[:, rows[i]]``.

    When the caller's mesh and rules split the batch axis (a data-sharded ``ShardedDecoder``),
    the rows are taken within each batch shard, so ``rows[i]`` must lie in the same shard as
    ``i`` (true for beams: a prompt's beams are consecutive rows and a shard holds whole
    prompts)."""
    g = axes.shards("batch", cache.batch)
    if g == 1:
        return _layout(jax.tree.map(lambda x: jnp.take(x, rows, axis=1), cache))
    n = cache.batch // g
    local = jnp.reshape(rows, (g, n)) - (jnp.arange(g) * n)[:, None]

    def f(x):
        xs = x.reshape(x.shape[0], g, n, *x.shape[2:])
        out = jax.vmap(lambda a, i: jnp.take(a, i, axis=1), in_axes=(1, 0), out_axes=1)(xs, local)
        return out.reshape(x.shape)
    return _layout(jax.tree.map(f, cache))


@jax.named_scope("cache")
def repeat_rows(cache: KVCache, times: int) -> KVCache:
    """Each row repeated ``times`` times consecutively (share a prompt's prefill across beams)."""
    return _layout(jax.tree.map(lambda x: jnp.repeat(x, times, axis=1), cache))
