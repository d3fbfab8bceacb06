"""A model's parameters checked against its config at trace time (shapes are static): every
leaf a Llama-family tree of that config needs, its kernels of any kind (each typed kernel leaf
answers with its plain shape: :func:`dsbd_jax.models.weights.shape_of`), with a truncated
vocabulary head (:mod:`dsbd_jax.models.vocab`) in place of ``lm_head``, separate or fused projections
(:mod:`dsbd_jax.models.fused`). The decoders call :func:`check_params`
on every input tree; the forms stay this layer's business."""

from __future__ import annotations

import functools
from typing import Optional

import jax
import numpy as np

from dsbd_jax.models.config import ModelConfig
from dsbd_jax.models import weights
from dsbd_jax.models.fused import fuse_projections, is_fused
from dsbd_jax.models.kinds import PROJECTIONS
from dsbd_jax.models.llama import init_params, params_layout
from dsbd_jax.models.vocab import split_head


@functools.lru_cache(maxsize=64)
def _expected_shapes(config: ModelConfig, layout: str, fused: bool = False):
    make = lambda: init_params(config, jax.random.key(0), layout)  # noqa: E731
    tree = jax.eval_shape((lambda: fuse_projections(make())) if fused else make)
    return {jax.tree_util.keystr(p): tuple(x.shape)
            for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def check_params(name: str, config: ModelConfig, params) -> None:
    """Trace-time check (shapes are static): ``ValueError`` in one line naming the model
    (``"target"`` / ``"draft"``) and the first leaf whose path or shape differs from what
    ``config`` needs."""
    try:
        layout = params_layout(params)
    except (ValueError, TypeError, AttributeError):
        raise ValueError(f"{name} parameters are not a Llama parameter tree (no 'layers' or "
                         f"'layers_0')") from None
    params, head = split_head(params)
    want = dict(_expected_shapes(config, layout, is_fused(params)))
    if head is not None:  # a truncated vocabulary head (dsbd_jax.models.vocab) replaces lm_head
        want.pop("['lm_head']['kernel']", None)
        n = int(np.shape(head["rows"])[0]) if "rows" in head else 0
        mat = "kernel" if "kernel" in head else "embedding"
        need = (config.hidden_size, n) if mat == "kernel" else (n, config.hidden_size)
        full = {"full_kernel": (config.hidden_size, config.vocab_size),
                "full_embedding": (config.vocab_size, config.hidden_size)}
        bad_full = [k for k in head if k in full and tuple(np.shape(head[k])) != full[k]]
        if (not 0 < n <= config.vocab_size or mat not in head or bad_full
                or set(head) - {"rows", mat} - set(full)
                or weights.shape_of(head[mat]) != need):
            raise ValueError(f"{name} parameters do not match config.{name}: the truncated head "
                             f"['vocab_head'] needs rows [N] with 0 < N <= {config.vocab_size} "
                             f"and a {mat} of shape {need}, got "
                             f"{ {k: weights.shape_of(v) for k, v in head.items()} }")
    got = {jax.tree_util.keystr(p): weights.shape_of(x)
           for p, x in weights.leaves_with_path(params)}
    for path, shape in want.items():
        if path not in got:
            raise ValueError(f"{name} parameters do not match config.{name}: leaf {path} is "
                             f"missing (expected shape {shape})")
        if got[path] != shape:
            raise ValueError(f"{name} parameters do not match config.{name}: leaf {path} expected "
                             f"shape {shape}, got {got[path]}")
    extra = sorted(set(got) - set(want))
    if extra:
        raise ValueError(f"{name} parameters do not match config.{name}: unexpected leaf {extra[0]}")


def plain_projection(path) -> Optional[str]:
    """The projection (one of :data:`PROJECTIONS`) whose plain ``[.., in, out]`` kernel is the
    leaf at ``path`` (keys, or a ``jax.tree_util`` key path), else ``None``: how code outside
    this layer finds the projection weights without reading the kernel forms' keys."""
    keys = [str(getattr(p, "key", p)) for p in path]
    if len(keys) >= 2 and keys[-1] == "kernel" and keys[-2] in PROJECTIONS:
        return keys[-2]
    return None
