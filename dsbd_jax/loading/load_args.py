"""Checks of :func:`dsbd_jax.loading.load.load_model`'s arguments that need no model: the
``kernel_blocks`` value (the removed blocked kernels' values warned about), a
:class:`~dsbd_jax.host.plan.HostPlan` against the call's other arguments and
``fused_projections``; and the fusing of a loaded model's projections (:func:`fuse_loaded_`)."""

from __future__ import annotations

import os
import warnings
from typing import Mapping

import jax
import jax.numpy as jnp

from dsbd_jax.host.plan import AUTO, HostPlan
from dsbd_jax.host.forms import MEASURED
from dsbd_jax.models.fused import fuse_projections_
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


def check_fused(fused_projections, place, plan) -> None:
    """``load_model``'s ``fused_projections`` checked before any weight is read: ``True``,
    ``False`` or ``"auto"``; ``True`` (which loads plain kernels: fused kernels have no
    transposed form) neither with ``place`` nor with a plan of transposed kernels."""
    if not (fused_projections is True or fused_projections is False
            or (isinstance(fused_projections, str) and fused_projections == "auto")):
        raise ValueError(f"fused_projections must be True, False or 'auto', "
                         f"got {fused_projections!r}")
    if fused_projections is True and place is not None:
        raise ValueError("load_model(fused_projections=True) cannot place onto a mesh "
                         "(place=...): the sharding rules name the separate projections")
    if fused_projections is True and plan is not None and plan.form == TRANSPOSED:
        raise ValueError("load_model(fused_projections=True) takes plain kernels; the plan "
                         "given asks for transposed ones")


def fuses_by_default(transposed: bool) -> bool:
    """What ``fused_projections="auto"`` does for a model on one device: fuse off the CPU,
    unless its kernels are transposed rows (which have no fused form)."""
    return not transposed and jax.default_backend() != "cpu"


def fuse_loaded_(model, fused_projections, place) -> None:
    """IN PLACE: a loaded model's projections fused (:mod:`dsbd_jax.models.fused`) as
    ``load_model(fused_projections=...)`` asks (checked by :func:`check_fused`), recorded in
    ``info["fused_projections"]``. ``"auto"``: fused off the CPU (fewer kernels per layer on a
    GPU: ``docs/performance.md``, *Fused projections*) unless the model is placed onto a mesh
    or its kernels are transposed rows; separate on the CPU, where fusing measured no faster."""
    fuse = fused_projections is True or (
        isinstance(fused_projections, str) and place is None
        and fuses_by_default(bool(model.info.get("kernel_transposed"))))
    if fuse:
        fuse_projections_(model.params)
    model.info["fused_projections"] = bool(fuse)
