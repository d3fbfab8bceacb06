"""Parallel: every decoder sharded over a ``(data, model)`` device mesh.

- ``mesh``: building and naming the mesh (``make_mesh``, ``parse_mesh``, ``mesh_label``).
- ``rules``: the mesh axis of each logical axis of the parameters, caches and inputs, per model
  config (indivisible dimensions replicated, or KV heads repeated).
- ``decoder``: :class:`ShardedDecoder`, a decoder jitted with those shardings, traced under the
  mesh and the logical-axis rules (no module of the package holds a switch).
- ``distributed``: joining the processes, and the small host-side exchange of ``ShardedDecoder``.

May import: ``dsbd_jax.models`` and ``dsbd_jax.decoding``; never ``eval`` or ``cli``. The HLO
reading that tests and benchmarks use (collectives in the decode loop) is ``dsbd_jax.eval.hlo``,
not part of this runtime API.
"""

from dsbd_jax.parallel.decoder import UNEVEN_BATCH, ShardedDecoder, sharded
from dsbd_jax.parallel.mesh import DATA, MODEL, make_mesh, mesh_label, mesh_shape, parse_mesh
from dsbd_jax.parallel.rules import (LOGICAL_AXES, ShardingRules, expand_kv_heads, logical_axes,
                                     param_shardings, shard_params)

__all__ = ["DATA", "LOGICAL_AXES", "MODEL", "UNEVEN_BATCH", "ShardedDecoder", "ShardingRules",
           "expand_kv_heads", "logical_axes", "make_mesh", "mesh_label", "mesh_shape",
           "param_shardings", "parse_mesh", "shard_params", "sharded"]
