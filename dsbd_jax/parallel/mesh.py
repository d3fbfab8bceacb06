"""The device mesh: two named axes, ``data`` (prompts: the batch axis of prompts, keys, KV caches
and decode state) and ``model`` (tensor parallel: attention heads, MLP hidden units,
vocabulary).

Many processes (one per host, JAX's multi-controller runtime): call
``dsbd_jax.parallel.distributed.initialize()`` on every process first (it reads
``JAX_COORDINATOR_ADDRESS``, ``JAX_NUM_PROCESSES``, ``JAX_PROCESS_ID``), then :func:`make_mesh`
spans ``jax.devices()`` (every process's devices), every process runs the same program, and
``ShardedDecoder`` takes each process's own prompts and returns its rows (``docs/design.md``,
"Many processes"). Run here: 2 processes x 4 virtual CPU devices on one machine
(``tests/parallel/test_multihost.py``); not yet on several machines or accelerators.
"""

from __future__ import annotations

from typing import Dict, Optional, Sequence, Tuple

import jax
import numpy as np
from jax.sharding import Mesh

DATA = "data"
MODEL = "model"


def parse_mesh(text: str) -> Dict[str, int]:
    """``"data=2,model=4"`` -> ``{"data": 2, "model": 4}``. A missing axis is 1, except that
    ``data`` may be left out to mean "all remaining devices" (returned as ``None``)."""
    sizes: Dict[str, Optional[int]] = {DATA: None, MODEL: 1}
    seen = set()
    for part in str(text).replace(" ", "").split(","):
        if not part:
            continue
        name, eq, value = part.partition("=")
        if not eq or name not in (DATA, MODEL) or name in seen:
            raise ValueError(f"bad mesh {text!r}: expected e.g. 'data=2,model=4' (axes data, model)")
        try:
            n = int(value)
        except ValueError:
            n = 0
        if n < 1:
            raise ValueError(f"bad mesh {text!r}: axis {name} must be a positive int, got {value!r}")
        sizes[name] = n
        seen.add(name)
    return sizes


def make_mesh(data: Optional[int] = None, model: int = 1, devices: Optional[Sequence] = None
              ) -> Mesh:
    """A ``(data, model)`` mesh over ``devices`` (default ``jax.devices()``: every host's devices
    after ``jax.distributed.initialize()``). ``data=None`` uses all devices left over by
    ``model``. Device order follows ``jax.make_mesh`` (topology-aware) when all devices are used."""
    devs = list(jax.devices() if devices is None else devices)
    if isinstance(data, str):
        sizes = parse_mesh(data)
        data, model = sizes[DATA], sizes[MODEL]
    if model < 1 or len(devs) % model and data is None:
        raise ValueError(f"model={model} does not divide the {len(devs)} devices")
    data = len(devs) // model if data is None else data
    n = data * model
    if data < 1 or n > len(devs):
        raise ValueError(f"mesh data={data} x model={model} needs {n} devices; "
                         f"{len(devs)} available (on CPU: XLA_FLAGS="
                         f"--xla_force_host_platform_device_count={n})")
    auto = (jax.sharding.AxisType.Auto,) * 2
    if devices is None and n == len(devs):
        return jax.make_mesh((data, model), (DATA, MODEL), axis_types=auto)
    return Mesh(np.asarray(devs[:n], dtype=object).reshape(data, model), (DATA, MODEL),
                axis_types=auto)


def mesh_shape(mesh: Mesh) -> Tuple[int, int]:
    return int(mesh.shape[DATA]), int(mesh.shape[MODEL])


def mesh_label(mesh: Mesh) -> str:
    d, m = mesh_shape(mesh)
    return f"data={d},model={m}"
