"""Checks of :func:`dsbd_jax.loading.load.load_model`'s arguments that need no model: the
``kernel_blocks`` value (the removed blocked kernels' values warned about) and a
:class:`~dsbd_jax.host.plan.HostPlan` against the call's other arguments."""

from __future__ import annotations

import os
import warnings
from typing import Mapping

import jax.numpy as jnp

from dsbd_jax.host.plan import AUTO, HostPlan
from dsbd_jax.host.forms import MEASURED
from dsbd_jax.models.kinds import TRANSPOSED


def removed_blocks(kernel_blocks):
    """``kernel_blocks`` checked: ``"measured"``, ``"transposed"`` or ``None``; the values of
    the removed blocked kernels (``"auto"``, ``"halves"``, a width, ``{projection: width}``)
    give ``None`` (plain kernels) with a ``DeprecationWarning``; anything else is an error.
    ``$DSBD_JAX_KERNEL_BLOCKS``, which chose the widths, is warned about where it is set."""
    if os.environ.get("DSBD_JAX_KERNEL_BLOCKS"):
        warnings.warn("$DSBD_JAX_KERNEL_BLOCKS has no effect: blocked kernels were removed "
                      "(docs/results/cpu.md); $DSBD_JAX_KERNEL_FORM chooses the kernel form",
                      DeprecationWarning, stacklevel=3)
    if kernel_blocks is None or (isinstance(kernel_blocks, str)
                                 and kernel_blocks in (MEASURED, TRANSPOSED)):
        return kernel_blocks
    if isinstance(kernel_blocks, Mapping) or (isinstance(kernel_blocks, (str, int))
                                              and str(kernel_blocks) in ("auto", "halves")
                                              or str(kernel_blocks).isdigit()):
        warnings.warn(f"load_model(kernel_blocks={kernel_blocks!r}): blocked kernels were "
                      f"removed (no gain worth a form where measured, docs/results/cpu.md); "
                      f"loading plain kernels. Use kernel_blocks='measured' (the default) or "
                      f"None; this value will be an error in the next release",
                      DeprecationWarning, stacklevel=3)
        return None
    raise ValueError(f"kernel_blocks must be 'measured', 'transposed' or None, "
                     f"got {kernel_blocks!r}")


def check_plan(plan, dtype, kernel_blocks) -> None:
    """``TypeError`` / ``ValueError`` unless ``plan`` is a :class:`HostPlan` that nothing else
    in the call contradicts (a different dtype, or a kernel form asked for by ``kernel_blocks``)."""
    if not isinstance(plan, HostPlan):
        raise TypeError(f"plan must be a dsbd_jax.host.plan.HostPlan, got {type(plan).__name__}")
    if not (isinstance(dtype, str) and dtype == AUTO) and jnp.dtype(dtype).name != plan.dtype:
        raise ValueError(f"dtype={jnp.dtype(dtype).name} contradicts the plan's {plan.dtype}: "
                         f"leave dtype at 'auto' when passing a plan")
    if not (isinstance(kernel_blocks, str) and kernel_blocks == MEASURED):
        raise ValueError(f"the plan decides the kernel form ({plan.form}); leave kernel_blocks "
                         f"at 'measured' when passing a plan, got {kernel_blocks!r}")
