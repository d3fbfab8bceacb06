"""The kinds of projection kernel a model's parameter tree may hold, and the conversions between them.

Each kind is a kernel leaf (:mod:`dsbd_jax.models.weights`) and the model's projections call
:func:`dsbd_jax.models.weights.product`, so a tree may mix them: plain ``[in, out]`` arrays;
transposed ``[out / n, n, in]`` row blocks (:func:`transpose_params`) and a 16-bit vocabulary
head as rows (:func:`transpose_head`); eight-bit codes with a float32 scale per output
(:func:`int8_params`). :func:`unblock_params` converts every typed kernel back to ``[in, out]``
(distillation, export and sharding call it first). Which kind a host runs fastest is
:mod:`dsbd_jax.host.forms`'s business, not the model's. A new kind goes here, its leaf type in
:mod:`dsbd_jax.models.weights`, its product in :mod:`dsbd_jax.models.products`. Why 0.2.0's
blocked column kernels were removed: ``docs/results/design_notes.md``.
"""

from __future__ import annotations

import dataclasses
from typing import Dict, Mapping

import jax
import jax.numpy as jnp

from dsbd_jax.models import products, weights
from dsbd_jax.models.products import (T_MAX_WIDTH, TRANSPOSED, project,  # noqa: F401
                                      project_t, transpose_block, transposed_width,
                                      untranspose)
from dsbd_jax.models.weights import RowBlocks, Rows, form_of  # noqa: F401
from dsbd_jax.models.fused import FUSED, copy_dicts as _copy_dicts
from dsbd_jax.models.vocab import untie_head

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def transposed_widths(config) -> Dict[str, int]:
    """``{projection: row-block width}`` of :func:`transposed_width` for every projection."""
    return {p: transposed_width(dout) for p, (_, dout) in projection_shapes(config).items()}


# ---------------------------------------------------------------------------------------------
# parameter trees: each kernel a plain [in, out] array or a typed leaf (dsbd_jax.models.weights)
def _projections(params):
    """``[path tuple]`` of every projection kernel of a tree (either layout; any kind; fused
    ones too, :mod:`dsbd_jax.models.fused`: an int8 tree quantises them as they are)."""
    out = []
    names = set(PROJECTIONS) | set(FUSED)

    def walk(tree, path):
        for k, v in tree.items():
            if isinstance(v, Mapping):
                walk(v, path + (k,))
            elif k == "kernel" and path and path[-1] in names:
                out.append(path + (k,))
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


def _check_projections(names, fn: str) -> None:
    bad = sorted(set(names) - set(PROJECTIONS))
    if bad:
        raise ValueError(f"unknown projections {bad}; {fn} knows {list(PROJECTIONS)}")


def unblock_params(params, keep: tuple = ()):
    """``params`` with every typed kernel (transposed, a head's rows; any
    :class:`~dsbd_jax.models.weights.Kernel`) back as its plain ``[in, out]`` array (the same
    tree object when there is none); kernels of the kinds in ``keep`` stay as they are (an int8
    kernel's plain array is its quantised values in float32, four times its bytes)."""
    if not isinstance(params, Mapping):
        return params
    out = None
    for k, v in params.items():
        new = (unblock_params(v, keep) if isinstance(v, Mapping)
               else v if isinstance(v, keep) else weights.plain(v))
        if new is not v:
            out = dict(params) if out is None else out
            out[k] = new
    return params if out is None else out


HEAD = "lm_head"
VOCAB_HEAD = "vocab_head"  # dsbd_jax.models.vocab.VOCAB_HEAD (a truncated head)


def transpose_head(params):
    """``params`` with the vocabulary head's kernel stored as its ``[out, in]`` rows
    (:class:`~dsbd_jax.models.weights.Rows`): an untied ``lm_head`` ``[d, V]`` becomes
    ``[V, d]``, a truncated head's ``[d, N]`` becomes ``[N, d]`` (its ``"full_kernel"`` for
    prompt rows stays ``[d, V]``: only ``B * P`` columns of it are gathered per call). The form
    16-bit models run fastest (:func:`dsbd_jax.models.products.mixed_rows`: one product over
    contiguous rows); a tied head (the embedding ``[V, d]``) already has it. A new tree;
    :func:`unblock_params` converts back."""
    if not isinstance(params, Mapping):
        return params
    out = params
    for name in (HEAD, VOCAB_HEAD):
        head = out.get(name)
        if isinstance(head, Mapping) and "kernel" in head and not weights.is_kernel(head["kernel"]):
            out = {**out, name: {**head, "kernel": Rows(jnp.swapaxes(head["kernel"], -1, -2))}}
    return out


def head_transposed(params) -> bool:
    """Whether the vocabulary head is stored as ``[out, in]`` rows (:func:`transpose_head`)."""
    return any(isinstance(params.get(n), Mapping) and isinstance(params[n].get("kernel"), Rows)
               for n in (HEAD, VOCAB_HEAD)) if isinstance(params, Mapping) else False


def transpose_params(params, widths: Mapping[str, int]):
    """``params`` with the kernel of every projection named in ``widths`` (``{"up_proj": 1280,
    ...}``, e.g. :func:`transposed_widths`) transposed into row blocks of that width
    (:class:`~dsbd_jax.models.weights.RowBlocks`); any kind is accepted as input (a new tree;
    the input is not changed). :func:`unblock_params` converts back."""
    return transpose_params_(_copy_dicts(unblock_params(params)), widths)


def transpose_params_(params: dict, widths: Mapping[str, int], head: bool = False) -> dict:
    """:func:`transpose_params` (and with ``head``, :func:`transpose_head`) IN PLACE, one kernel
    at a time, each new kernel waited for and the old one dropped before the next: besides the
    model the device holds at most one kernel twice (the loaders use it; a tree built beside
    the input would hold both copies of every kernel until it returned). Returns ``params``."""
    _check_projections(widths, "transpose_params")
    plain = unblock_params(params)
    if plain is not params:   # typed already: back to [in, out] first
        params.update(_copy_dicts(plain))
    for path in _projections(params):
        n = int(widths.get(path[-2], 0))
        if n:
            parent = _get(params, path[:-1])
            w = parent.pop(path[-1])
            parent["kernel"] = RowBlocks(jax.block_until_ready(transpose_block(w, n)))
            del w
    return transpose_head_(params) if head else params


def transpose_head_(params: dict) -> dict:
    """:func:`transpose_head` IN PLACE (the head's old ``[d, V]`` kernel is dropped once its
    rows replace it). Returns ``params``."""
    params.update(transpose_head(params))
    return params


# ---------------------------------------------------------------------------------------------
# eight-bit weights (weights.Int8)
FLOAT, INT8 = "float", "int8"
WEIGHT_KINDS = (FLOAT, INT8)  # load_model(..., weights=): the projections' and head's kind


AUTO_WEIGHTS = "auto"  # load_model(weights="auto"): int8 where this host runs it clearly faster


def check_weights(kind, what: str = "weights") -> str:
    """``kind`` if it is one of :data:`WEIGHT_KINDS` or ``"auto"``, else a ``ValueError`` naming
    ``what`` (the argument or option the caller wrote)."""
    if not isinstance(kind, str) or kind not in WEIGHT_KINDS + (AUTO_WEIGHTS,):
        raise ValueError(f"{what} must be one of {list(WEIGHT_KINDS + (AUTO_WEIGHTS,))}, "
                         f"got {kind!r}")
    return kind


def int8_params_(params: dict, config) -> tuple:
    """``(params, config)`` with every projection kernel and the vocabulary head's kernel as
    :class:`~dsbd_jax.models.weights.Int8` (eight-bit codes, a float32 scale per output), IN
    PLACE, one kernel at a time (each new kernel waited for, the float one dropped: the peak is
    the model plus one kernel). Kernels of any kind are accepted (transposed ones are read as
    their plain arrays).

    A tied head (the embedding doubling as the head) is untied first
    (:func:`dsbd_jax.models.vocab.untie_head`): its ``[V, d]`` codes are the head's product, the
    float embedding stays for the token lookups, and ``config.tie_word_embeddings`` becomes
    ``False``. A truncated head's ``N`` rows are quantised as they are (its ``"full_kernel"``,
    read only for a call's prompt rows, stays float; a truncated tied head's ``"embedding"``
    rows become the head's kernel). Norms and biases keep their float dtype; a float32
    embedding table is stored in bfloat16 (:func:`sixteen_bit_embedding_`: a lookup reads one
    row and casts it to the activations' dtype, so the table needs no more bits than the
    products that follow it; half its memory: 0.27 GB of the 0.5B draft). In a 16-bit model
    it stays as it is. :func:`unblock_params` gives back float kernels (the quantised values,
    not the original ones)."""
    if not isinstance(params, dict):
        raise TypeError(f"params must be a parameter dict, got {type(params).__name__}")
    if config.tie_word_embeddings and VOCAB_HEAD not in params:
        params, config = untie_head(params, config)
    return sixteen_bit_embedding_(int8_kernels_(params)), int8_config(config)


def sixteen_bit_embedding_(params: dict) -> dict:
    """IN PLACE: a float32 embedding table (``params["embed"]["embedding"]``) as bfloat16, the
    float32 one dropped; a 16-bit one (or none) is left as it is. Returns ``params``."""
    embed = params.get("embed")
    table = embed.get("embedding") if isinstance(embed, Mapping) else None
    if table is not None and jnp.dtype(table.dtype) == jnp.float32:
        params["embed"] = {**embed, "embedding": jax.block_until_ready(
            jnp.asarray(table).astype(jnp.bfloat16))}
        del table
    return params


def int8_kernels_(params: dict, extra=()) -> dict:
    """IN PLACE: every projection kernel, the kernels of the modules named in ``extra`` (e.g. a
    draft head's ``fc``) and an untied or truncated vocabulary head's kernel as
    :class:`~dsbd_jax.models.weights.Int8`, one kernel at a time (the body of
    :func:`int8_params_`, which first unties a tied head). Returns ``params``."""
    paths = _projections(params) + [(k, "kernel") for k in extra
                                    if isinstance(params.get(k), Mapping)]
    for path in paths:
        parent = _get(params, path[:-1])
        w = parent.pop(path[-1])
        parent["kernel"] = jax.block_until_ready(weights.Int8.quantize(w))
        del w
    for name in (HEAD, VOCAB_HEAD):
        head = params.get(name)
        if not isinstance(head, Mapping):
            continue
        if "embedding" in head:   # a truncated tied head: its [N, d] rows
            head = dict(head)
            head["kernel"] = weights.Int8(*products.quantize_rows(head.pop("embedding")))
            params[name] = head
        elif "kernel" in head and not isinstance(head["kernel"], weights.Int8):
            params[name] = {**head, "kernel": weights.Int8.quantize(head["kernel"])}
    if VOCAB_HEAD in params and "full_embedding" in params[VOCAB_HEAD]:
        head = dict(params[VOCAB_HEAD])   # prompt rows come from [d, V] columns now
        head["full_kernel"] = jnp.transpose(head.pop("full_embedding"))
        params[VOCAB_HEAD] = head
    return params


def int8_config(config):
    """The config of ``config``'s model with int8 weights (:func:`int8_params_`): its head is
    never tied (the codes are the head's product)."""
    return dataclasses.replace(config, tie_word_embeddings=False)


def int8_params(params, config) -> tuple:
    """:func:`int8_params_` on a copy of the tree's dicts (the input is not changed; its arrays
    are shared until replaced)."""
    return int8_params_(_copy_dicts(params), config)


def int8_kernels(params, extra=()) -> dict:
    """:func:`int8_kernels_` on a copy of the tree's dicts (typed kernels read as their plain
    arrays; the input is not changed)."""
    return int8_kernels_(_copy_dicts(unblock_params(params)), extra)


def is_int8(params) -> bool:
    """Whether any kernel of the tree is an :class:`~dsbd_jax.models.weights.Int8`."""
    return any(isinstance(leaf, weights.Int8) for leaf in weights.leaves(params))


def _widths(params, kind) -> Dict[str, int]:
    """``{projection: block width}`` of the tree's projection kernels of ``kind``."""
    kernels = {path[-2]: _get(params, path) for path in _projections(params)}
    return {p: w.width for p, w in kernels.items() if isinstance(w, kind)}


def transposed_of(params) -> Dict[str, int]:
    """``{projection: row-block width}`` of the transposed kernels of a tree (empty: none)."""
    return _widths(params, RowBlocks)


def projection_shapes(config) -> Dict[str, tuple]:
    """``{projection: (in, out)}`` of a :class:`~dsbd_jax.models.config.ModelConfig`."""
    d, H, K, D, F = (config.hidden_size, config.num_heads, config.num_kv_heads, config.head_dim,
                     config.intermediate_size)
    return {"q_proj": (d, H * D), "k_proj": (d, K * D), "v_proj": (d, K * D),
            "o_proj": (H * D, d), "gate_proj": (d, F), "up_proj": (d, F), "down_proj": (F, d)}
