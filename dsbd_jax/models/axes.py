"""Logical axis names, and the one function that states an array's layout: :func:`constrain`.

Arrays made in this package name their axes (``CACHE = ("layers", "batch", "slots",
"kv_heads", "head_dim")``) and pass through ``constrain(x, names)`` where they are made. What
that does is decided by the caller's context at trace time (``jax.set_mesh`` and
``flax.linen.logical_axis_rules``), never by state of this package: with both, ``x`` is pinned
to the rules' partition where the mesh axis divides it; without, ``x`` is returned unchanged.
Invariant: the rules are not part of JAX's trace context, so callers derive them from the mesh
and the input shapes only (as ``ShardedDecoder`` does), and one trace never serves two layouts.
More: ``docs/results/design_notes.md``.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Sequence, Tuple

import flax.linen as nn
import jax
from jax.sharding import PartitionSpec as P

from dsbd_jax.models.fused import FUSED

#: axes of a KV cache ``[layers, batch, slots, kv_heads, head_dim]``
CACHE: Tuple[str, ...] = ("layers", "batch", "slots", "kv_heads", "head_dim")


def _mesh_axes(name: str):
    """The mesh axis (or tuple of axes) the active rules give ``name``; None if unmapped."""
    for logical, axis in nn.get_logical_axis_rules():
        if logical == name:
            return axis
    return None


def _axis_size(mesh, axis) -> int:
    axes = axis if isinstance(axis, (tuple, list)) else (axis,)
    return math.prod(int(mesh.shape[a]) for a in axes)


def partition(names: Sequence[str], shape: Sequence[int]) -> Optional[P]:
    """The ``PartitionSpec`` the caller's mesh and rules give an array with these axis names and
    this shape (an axis stays unsplit where its mesh axis does not divide it); None when no mesh
    or no rules are active."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or not nn.get_logical_axis_rules():
        return None
    if len(names) != len(shape):
        raise ValueError(f"axis names {tuple(names)} do not match shape {tuple(shape)}")
    spec = []
    for name, dim in zip(names, shape):
        axis = _mesh_axes(name)
        spec.append(axis if axis is not None and dim % _axis_size(mesh, axis) == 0 else None)
    return P(*spec)


def constrain(x: jax.Array, names: Sequence[str]) -> jax.Array:
    """``x`` pinned to :func:`partition` under the caller's mesh and rules; ``x`` itself without
    them."""
    spec = partition(names, x.shape)
    if spec is None:
        return x
    return jax.lax.with_sharding_constraint(x, spec)


def shards(name: str, size: int) -> int:
    """Into how many pieces the caller's mesh and rules split a logical axis ``name`` of length
    ``size`` (1 without a mesh or rules, or where the mesh axis does not divide ``size``)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return 1
    axis = _mesh_axes(name)
    if axis is None:
        return 1
    n = _axis_size(mesh, axis)
    return n if n > 1 and size % n == 0 else 1


#: logical axes of each parameter, by path suffix, WITHOUT the stacked layer axis (the
#: parameter tree's layout is this layer's: ``dsbd_jax.parallel`` maps the names to a mesh)
LOGICAL_AXES: Dict[Tuple[str, ...], Tuple[str, ...]] = {
    ("embed", "embedding"): ("vocab", "embed"),
    ("lm_head", "kernel"): ("embed", "vocab"),
    ("vocab_head", "rows"): ("head_rows",),
    ("vocab_head", "kernel"): ("embed", "head_rows"),
    ("vocab_head", "embedding"): ("head_rows", "embed"),
    ("vocab_head", "full_kernel"): ("embed", "vocab"),
    ("vocab_head", "full_embedding"): ("vocab", "embed"),
    ("attn", "q_proj", "kernel"): ("embed", "q_heads"),
    ("attn", "q_proj", "bias"): ("q_heads",),
    ("attn", "k_proj", "kernel"): ("embed", "kv_heads"),
    ("attn", "k_proj", "bias"): ("kv_heads",),
    ("attn", "v_proj", "kernel"): ("embed", "kv_heads"),
    ("attn", "v_proj", "bias"): ("kv_heads",),
    ("attn", "o_proj", "kernel"): ("q_heads", "embed"),
    ("mlp", "gate_proj", "kernel"): ("embed", "mlp"),
    ("mlp", "up_proj", "kernel"): ("embed", "mlp"),
    ("mlp", "down_proj", "kernel"): ("mlp", "embed"),
    ("input_norm", "weight"): ("norm",),
    ("post_norm", "weight"): ("norm",),
    ("attn_out_norm", "weight"): ("norm",),
    ("mlp_out_norm", "weight"): ("norm",),
    ("attn", "q_norm", "weight"): ("norm",),
    ("attn", "k_norm", "weight"): ("norm",),
    ("final_norm", "weight"): ("norm",),
    # a draft head's own projections (dsbd_jax.models.head), small: replicated
    ("fc", "kernel"): ("embed", "embed"),
    ("fc", "bias"): ("norm",),
    ("fuse", "kernel"): ("embed", "embed"),
}


def path_keys(path) -> Tuple[str, ...]:
    out = []
    for p in path:
        for attr in ("key", "name", "idx"):
            if hasattr(p, attr):
                out.append(str(getattr(p, attr)))
                break
        else:
            out.append(str(p))
    return tuple(out)


def logical_axes(path: Sequence[str], ndim: int) -> Tuple[Optional[str], ...]:
    """Logical axes of the parameter at ``path`` (a tuple of keys). Leaves under ``"layers"``
    (stacked layout) get a leading ``"layers"`` axis; ``"layers_<i>"`` leaves (per-layer layout)
    do not. An int8 kernel's ``codes`` (``[.., out, in]``) and ``scales`` (``[.., out]``) take
    the plain kernel's axes in their own order. ``ValueError`` for a parameter no rule covers or a rank that does not match."""
    path = tuple(path)
    if len(path) >= 2 and path[-2] == "kernel" and path[-1] in ("codes", "scales"):
        # an int8 kernel (models.weights.Int8): codes [.., out, in], a scale per output [.., out]
        plain = logical_axes(path[:-1], ndim + (path[-1] == "scales"))   # [.., in, out]
        return plain[:-2] + ((plain[-1], plain[-2]) if path[-1] == "codes" else (plain[-1],))
    axes = None
    for n in range(len(path), 0, -1):
        if path[-n:] in LOGICAL_AXES:
            axes = LOGICAL_AXES[path[-n:]]
            break
    if axes is None and any(k in FUSED for k in path):
        raise ValueError(f"{'/'.join(path)}: fused projections are not sharded; load with "
                         f"fused_projections=False or dsbd_jax.models.fused.unfuse_projections")
    if axes is None:
        raise ValueError(f"no sharding rule for parameter {'/'.join(path)} (shape rank {ndim}); "
                         f"add its path suffix to dsbd_jax.models.axes.LOGICAL_AXES")
    if "layers" in path:
        axes = ("layers",) + axes
    if len(axes) != ndim:
        raise ValueError(f"parameter {'/'.join(path)} has rank {ndim}, its rule {axes} has "
                         f"{len(axes)} axes (stacked leaves live under 'layers', per-layer ones "
                         f"under 'layers_<i>')")
    return axes
