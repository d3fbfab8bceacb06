"""Fused projections: one kernel for q, k and v, one for gate and up.

Stored concatenated along their outputs, as ``attn/qkv_proj`` (``[d, (H + 2K) D]``, the bias
likewise) and ``mlp/gate_up_proj`` (``[d, 2F]``), they run as two products whose outputs are
sliced apart. Invariant: each output column is the same dot product of the same operands, so the
model is the same one (on a GPU a layer launches fewer kernels). :func:`fuse_projections` and
:func:`fuse_projections_` (in place, one block at a time) fuse either layout, plain and
:class:`~dsbd_jax.models.weights.Int8` kernels; transposed row blocks have no fused form.
:func:`unfuse_projections` goes back (sharding rules, LoRA and exports name the separate
projections); :func:`is_fused` tells which a tree holds. ``load_model(fused_projections=...)``
stores them so (by default on an accelerator; ``docs/performance.md``, *Fused projections*).
"""

from __future__ import annotations

from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.models import weights

#: fused projection -> (the block's module, the separate projections in output order)
FUSED = {"qkv_proj": ("attn", ("q_proj", "k_proj", "v_proj")),
         "gate_up_proj": ("mlp", ("gate_proj", "up_proj"))}


def is_fused(params) -> bool:
    """Whether any block of ``params`` holds a fused projection (``qkv_proj``/``gate_up_proj``)."""
    return isinstance(params, Mapping) and any(
        isinstance(v, Mapping) and (k in FUSED or is_fused(v)) for k, v in params.items())


def fused_widths(config) -> dict:
    """``{fused projection: (output widths of its parts)}`` of a
    :class:`~dsbd_jax.models.config.ModelConfig`."""
    H, K, D, F = config.num_heads, config.num_kv_heads, config.head_dim, config.intermediate_size
    return {"qkv_proj": (H * D, K * D, K * D), "gate_up_proj": (F, F)}


def _concat(parts, name: str):
    if all(isinstance(p, weights.Int8) for p in parts):
        return weights.Int8(jnp.concatenate([p.codes for p in parts], axis=-2),
                            jnp.concatenate([p.scales for p in parts], axis=-1))
    if any(weights.is_kernel(p) for p in parts):
        kinds = sorted({type(p).__name__ for p in parts})
        raise ValueError(f"fuse_projections: {name}'s parts are {kinds} kernels; only plain "
                         f"[in, out] and Int8 kernels fuse (load plain kernels, "
                         f"kernel_blocks=None, to fuse transposed ones)")
    dtypes = {jnp.dtype(p.dtype) for p in parts}
    if len(dtypes) != 1:
        raise ValueError(f"fuse_projections: {name}'s parts have dtypes {sorted(map(str, dtypes))}")
    return jnp.concatenate(parts, axis=-1)


def _split(leaf, widths, what: str):
    cuts = np.cumsum(widths)[:-1].tolist()
    if isinstance(leaf, weights.Int8):
        codes = jnp.split(leaf.codes, cuts, axis=-2)
        scales = jnp.split(leaf.scales, cuts, axis=-1)
        return [weights.Int8(c, s) for c, s in zip(codes, scales)]
    if weights.is_kernel(leaf):
        raise ValueError(f"unfuse_projections: {what} is a {type(leaf).__name__} kernel")
    return jnp.split(leaf, cuts, axis=-1)


def _fuse_module_(module: dict, fused: str, parts: tuple, wait: bool) -> None:
    """IN PLACE: ``module`` (a block's ``attn`` or ``mlp`` dict) with ``parts`` replaced by
    ``fused``; left as it is where it has none of the parts (or is fused already)."""
    if not all(isinstance(module.get(p), Mapping) for p in parts):
        if any(p in module for p in parts) and fused not in module:
            missing = [p for p in parts if p not in module]
            raise ValueError(f"fuse_projections: a module has {[p for p in parts if p in module]}"
                             f" but not {missing}")
        return
    leaves = {}
    for key in ("kernel", "bias"):
        have = [key in module[p] for p in parts]
        if any(have) and not all(have):
            raise ValueError(f"fuse_projections: {key} in some of {list(parts)} only")
        if all(have):
            leaves[key] = _concat([module[p][key] for p in parts], f"{fused}/{key}")
            if wait:
                leaves[key] = jax.block_until_ready(leaves[key])
    for p in parts:
        del module[p]
    module[fused] = leaves


def _blocks(params):
    """Every dict of ``params`` that holds an ``attn`` or ``mlp`` module (the blocks, either
    layout; a draft head's block too)."""
    out = []

    def walk(tree):
        if any(isinstance(tree.get(m), Mapping) for m in ("attn", "mlp")):
            out.append(tree)
        for v in tree.values():
            if isinstance(v, Mapping):
                walk(v)
    walk(params)
    return out


def copy_dicts(tree):
    """``tree`` with every mapping copied into a new dict and the arrays shared."""
    return {k: copy_dicts(v) if isinstance(v, Mapping) else v for k, v in tree.items()}


def _fuse_all_(params: dict, wait: bool) -> dict:
    for block in _blocks(params):
        for fused, (module, parts) in FUSED.items():
            if isinstance(block.get(module), Mapping):
                block[module] = dict(block[module])   # the caller's module dicts stay as they were
                _fuse_module_(block[module], fused, parts, wait)
    return params


def fuse_projections_(params: dict) -> dict:
    """IN PLACE: every block's ``q_proj``/``k_proj``/``v_proj`` as one ``qkv_proj`` and its
    ``gate_proj``/``up_proj`` as one ``gate_up_proj`` (kernels and biases concatenated along
    the outputs), one module at a time, each new kernel waited for before the parts go (the
    peak is the model plus one module's kernels). Returns ``params``; a fused tree is left as
    it is. ``ValueError`` for kernels of a kind that has no fused form (transposed rows)."""
    if not isinstance(params, dict):
        raise TypeError(f"params must be a parameter dict, got {type(params).__name__}")
    return _fuse_all_(params, wait=True)


def fuse_projections(params) -> dict:
    """``params`` with fused projections (:func:`fuse_projections_` on a copy of the dicts; the
    input tree is unchanged). Traceable: under ``jit`` or ``jax.eval_shape`` too."""
    return _fuse_all_(copy_dicts(params), wait=False)


def unfuse_projections(params, config) -> dict:
    """``params`` with every fused projection split back into its parts (the input tree is
    unchanged; a tree without fused projections comes back as a copy of its dicts)."""
    tree = copy_dicts(params)
    if not is_fused(tree):
        return tree
    widths = fused_widths(config)
    for block in _blocks(tree):
        for fused, (module, parts) in FUSED.items():
            mod = block.get(module)
            if not isinstance(mod, Mapping) or fused not in mod:
                continue
            split = {key: _split(leaf, widths[fused], f"{fused}/{key}")
                     for key, leaf in mod.pop(fused).items()}
            for i, p in enumerate(parts):
                mod[p] = {key: split[key][i] for key in split}
    return tree
