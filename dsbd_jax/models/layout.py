"""Weight layouts of a model's parameter tree: ``"stacked"`` (``layers``: every leaf with a
leading layer axis, one ``lax.scan`` over it) or ``"per_layer"`` (``layers_0 .. layers_{L-1}``),
and converting between them."""

from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

LAYOUTS = ("stacked", "per_layer")


def default_layout(backend: Optional[str] = None) -> str:
    """``"per_layer"`` on CPU and GPU (faster there: ``benchmarks/forward.py`` and
    ``benchmarks/accelerator.py`` time both layouts), ``"stacked"`` elsewhere (TPU: compile time
    stays flat in depth). ``backend`` defaults to ``jax.default_backend()``."""
    backend = jax.default_backend() if backend is None else backend
    return "per_layer" if backend in ("cpu", "gpu", "cuda", "rocm") else "stacked"


def check_layout(layout: Optional[str]) -> str:
    """``layout`` if valid, :func:`default_layout` for ``None``; ``ValueError`` otherwise."""
    if layout is None:
        return default_layout()
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS} (or None: by backend), got {layout!r}")
    return layout


def params_layout(params) -> str:
    """Which layout a parameter tree has (``"stacked"`` if it has ``layers``, else
    ``"per_layer"`` if it has ``layers_0``); ``ValueError`` for anything else."""
    if "layers" in params:
        return "stacked"
    if "layers_0" in params:
        return "per_layer"
    raise ValueError("params have neither 'layers' (stacked layout) nor 'layers_0' (per-layer "
                     f"layout); top-level keys: {sorted(params)}")


def num_layers_of(params) -> int:
    if params_layout(params) == "stacked":
        return int(jax.tree.leaves(params["layers"])[0].shape[0])
    return sum(1 for k in params if k.startswith("layers_"))


def convert_layout(params, layout: str):
    """The same parameters in ``layout`` (a no-op if they already have it). Converting stacked
    to per-layer slices each leaf (a copy); per-layer to stacked stacks them (a copy)."""
    layout = check_layout(layout)
    have = params_layout(params)
    if have == layout:
        return params
    rest = {k: v for k, v in params.items() if k != "layers" and not k.startswith("layers_")}
    if layout == "per_layer":
        L = num_layers_of(params)
        layers = {f"layers_{i}": jax.tree.map(lambda x, i=i: x[i], params["layers"])
                  for i in range(L)}
    else:
        L = num_layers_of(params)
        layers = {"layers": jax.tree.map(lambda *xs: jnp.stack(xs),
                                         *[params[f"layers_{i}"] for i in range(L)])}
    return {**rest, **layers}


def unstack_layers_(params: dict) -> dict:
    """Stacked -> per-layer IN PLACE, one leaf at a time (the loaders use it: besides the model
    the device holds at most one stacked weight twice). Returns ``params``."""
    if params_layout(params) != "stacked":
        return params
    stacked = params.pop("layers")
    L = num_layers_of({"layers": stacked})
    out = [dict() for _ in range(L)]

    def walk(tree, dsts):
        for name in list(tree):
            leaf = tree.pop(name)
            if isinstance(leaf, dict):
                walk(leaf, [d.setdefault(name, {}) for d in dsts])
            else:
                for i, d in enumerate(dsts):
                    d[name] = leaf[i]
            del leaf
    walk(stacked, out)
    params.update({f"layers_{i}": out[i] for i in range(L)})
    return params
