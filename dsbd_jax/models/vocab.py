"""Vocabulary-truncated draft heads (FR-Spec, Zhao et al. 2025) and token-frequency tables.

:func:`truncate_head` gathers the draft's vocabulary projection once to ``N`` chosen rows
(``params["vocab_head"]``: ``rows`` int32 ``[N]``, ascending, and the kernel or embedding rows);
the forward pass multiplies by those rows only and scatters the logits back to ``[.., V]`` with
``-inf`` elsewhere. Invariant: the draft's ``q`` is zero outside the rows and nothing else
changes, so the output distribution stays the target's; with ``N = V`` the logits are
bit-identical to the untruncated model's. Prompt rows (:func:`with_prompt_rows`) add every token
of the batch's prompts at the start of each drafted program. Frequency tables are ``.npz`` files
(``counts`` int64 ``[V]``, ``meta``); :func:`top_rows` picks the ``N`` most frequent ids. The
parameter entries in full: ``docs/results/design_notes.md``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Iterable, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.models import weights
from dsbd_jax.models.products import TRANSPOSED, is_mixed, mixed_rows
from dsbd_jax.models.weights import Rows, program_kind

VOCAB_HEAD = "vocab_head"
TABLE_NAME = "dsbd_vocab.npz"  # a table's default file name beside a model (see table_path)


def split_head(params) -> Tuple[dict, Optional[dict]]:
    """``(params without "vocab_head", the vocab_head dict or None)``."""
    if isinstance(params, Mapping) and VOCAB_HEAD in params:
        return {k: v for k, v in params.items() if k != VOCAB_HEAD}, params[VOCAB_HEAD]
    return params, None


def head_rows(params) -> Optional[jax.Array]:
    """The token ids ``[N]`` a truncated draft proposes from, or ``None`` (full head)."""
    head = split_head(params)[1]
    return None if head is None else head["rows"]


def tied_logits(h: jax.Array, embedding: jax.Array) -> jax.Array:
    """``h [..., d]`` times a tied head (the embedding ``[V, d]``, transposed): ``[..., V]``, as
    ``nn.Embed.attend`` computes it, except for the operand order of a single row.

    One row (``h`` holds one vector: a one-token step at batch 1) is computed with the
    embedding as the left operand, ``E h^T``: XLA:CPU runs ``h E^T`` for one row slower than
    ``E h^T`` at a draft's vocabulary head, by a margin that varies with the jaxlib version
    (``benchmarks/probes/tied_head.py``; figures in ``docs/results/cpu.md``). Both orders give the same
    product up to float rounding. Two and more rows keep ``attend``'s ``h E^T``. Used by the
    full tied head and by a truncated tied head (:func:`truncated_logits`), so a truncated
    head with every row reproduces the full logits bit for bit.

    A 16-bit embedding runs the mixed-precision product over its ``[V, d]`` rows
    (:func:`dsbd_jax.models.products.mixed_rows`: float32 accumulation and result, one row
    padded to two)."""
    if is_mixed(embedding):
        return mixed_rows(h, embedding)
    if math.prod(h.shape[:-1]) == 1:
        col = jax.lax.dot_general(embedding, jnp.reshape(h, (1, h.shape[-1])),
                                  (((1,), (1,)), ((), ())))  # [V, 1]
        return jnp.reshape(col, h.shape[:-1] + (embedding.shape[0],))
    return jnp.dot(h, embedding.T)


def untie_head(params, config):
    """``(params, config)`` with a tied head as its own ``[d, V]`` kernel (``params["lm_head"]``,
    the embedding transposed and copied) and ``tie_word_embeddings=False``: the same model, at
    the cost of ``V * d`` more parameters (545 MB for the 0.5B Qwen draft in float32).

    Why: on the CPU under the per-host option ``eigen_dot``, a tied head with 2-16 rows takes
    several times as long as the same product with an ``[d, V]`` kernel
    (``benchmarks/probes/tied_head.py``; figures in ``docs/results/cpu.md``). Logits equal the tied
    model's to float rounding. An untied model is returned unchanged; a truncated head must be
    untied before truncation (untie first, then :func:`truncate_head`).

    In a 16-bit tree with transposed projection kernels the new head is stored as its ``[V, d]``
    rows (a :class:`~dsbd_jax.models.weights.Rows`, a copy of the embedding), the form
    ``load_model`` gives every untied head of such a model
    (:func:`dsbd_jax.models.kinds.transpose_head`): the result is the tree
    ``load_model(..., untie_head=True)`` gives."""
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a parameter dict, got {type(params).__name__}")
    if not config.tie_word_embeddings:
        return params, config
    if VOCAB_HEAD in params:
        raise ValueError("these parameters have a truncated head: untie the full model's "
                         "parameters, then truncate")
    embedding = params["embed"]["embedding"]
    form, dtype, _ = program_kind(params)
    if form == TRANSPOSED and dtype != "float32":
        head = {"kernel": Rows(jnp.array(embedding, copy=True))}  # a new [V, d] array
    else:
        head = {"kernel": jnp.transpose(embedding)}  # a new [d, V] array
    return dict(params, lm_head=head), dataclasses.replace(config, tie_word_embeddings=False)


def truncated_logits(h: jax.Array, head, vocab_size: int) -> jax.Array:
    """float32 logits ``[.., V]``: ``h [.., d]`` times the head's ``N`` rows, ``-inf`` elsewhere.
    The products are computed as ``nn.Dense`` / ``nn.Embed.attend`` compute the full head (same
    operand order and dtype), so ``N = V`` reproduces the full logits bit for bit. A 16-bit head
    runs in mixed precision as the full head does (:mod:`dsbd_jax.models.products`)."""
    if "kernel" in head:  # any kind of kernel leaf (dsbd_jax.models.weights)
        kernel = head["kernel"]
        part = weights.product(h, kernel if is_mixed(kernel) else weights.astype(kernel, h.dtype))
    else:
        embedding = head["embedding"]
        part = tied_logits(h, embedding if is_mixed(embedding) else embedding.astype(h.dtype))
    full = jnp.full(h.shape[:-1] + (vocab_size,), -jnp.inf, jnp.float32)
    return full.at[..., head["rows"]].set(part.astype(jnp.float32))


def check_rows(rows, vocab_size: int) -> np.ndarray:
    """``rows`` as sorted unique int32 token ids in ``[0, V)``; ``ValueError`` otherwise."""
    r = np.asarray(rows)
    if r.ndim != 1 or r.size == 0 or not np.issubdtype(r.dtype, np.integer):
        raise ValueError(f"head rows must be a non-empty 1-D array of token ids, got shape "
                         f"{r.shape} dtype {r.dtype}")
    if r.min() < 0 or r.max() >= vocab_size:
        raise ValueError(f"head rows must lie in [0, {vocab_size}), got ids {r.min()}..{r.max()}")
    if np.unique(r).size != r.size:
        raise ValueError("head rows must be distinct token ids")
    return np.sort(r).astype(np.int32)


def truncate_head(params, config, rows, prompt_rows: bool = False) -> dict:
    """The draft's parameters with its vocabulary head gathered once to ``rows`` (module doc).
    Works on both weight layouts and on every kind of head kernel: the kernel leaf keeps its
    own form for its ``N`` outputs (:func:`dsbd_jax.models.weights.take_outputs`; ``[V, d]``
    rows give ``[N, d]`` rows), so the result is the tree ``load_model(..., head_rows=...)``
    gives for the same rows. ``prompt_rows``: keep the full head matrix too
    (``"full_kernel" [d, V]``, or
    ``"full_embedding"``), so that each call adds its prompts' tokens to the rows
    (:func:`with_prompt_rows`; module doc)."""
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a parameter dict, got {type(params).__name__}")
    if VOCAB_HEAD in params:
        raise ValueError("these parameters already have a truncated head; truncate the full "
                         "model's parameters instead")
    rows = check_rows(rows, config.vocab_size)
    idx = jnp.asarray(rows)
    out = dict(params)
    if config.tie_word_embeddings:
        full = params["embed"]["embedding"]
        head = {"rows": idx, "embedding": jnp.take(full, idx, axis=0)}
        if prompt_rows:
            head["full_embedding"] = full
    else:
        lm_head = out.pop("lm_head", None)
        if isinstance(lm_head, Mapping) and "kernel" in lm_head:
            full = lm_head["kernel"]   # any kind: it keeps its form for the N outputs
            head = {"rows": idx, "kernel": weights.take_outputs(full, idx)}
            if prompt_rows:
                head["full_kernel"] = weights.plain(full)
        else:
            raise ValueError("config says the head is untied, but the parameters have no "
                             "lm_head kernel; got lm_head "
                             f"{sorted(lm_head) if isinstance(lm_head, Mapping) else lm_head!r}")
    out[VOCAB_HEAD] = head
    return out


def has_prompt_rows(params) -> bool:
    """Whether a truncated head adds each call's prompt tokens (``truncate_head(prompt_rows=)``)."""
    head = split_head(params)[1]
    return head is not None and ("full_kernel" in head or "full_embedding" in head)


def with_prompt_rows(params, prompt_ids: jax.Array):
    """``params`` whose truncated head also has a row for every token of ``prompt_ids [B, P]``
    (gathered from the full matrix; see the module doc). Unchanged when the head has no
    prompt rows (a full head, or ``truncate_head(prompt_rows=False)``). Jittable."""
    if not has_prompt_rows(params):
        return params
    head = params[VOCAB_HEAD]
    extra = jnp.reshape(jnp.asarray(prompt_ids), (-1,)).astype(head["rows"].dtype)
    new = {"rows": jnp.concatenate([head["rows"], extra])}
    if "full_kernel" in head and isinstance(head["kernel"], weights.Int8):  # eight-bit rows
        # each output row is quantised on its own, so the extra rows get the codes and scales
        # a quantisation of the whole head would have given them
        more = weights.Int8.quantize(jnp.take(head["full_kernel"], extra, axis=1))
        new["kernel"] = weights.Int8(
            jnp.concatenate([head["kernel"].codes, more.codes], axis=0),
            jnp.concatenate([head["kernel"].scales, more.scales], axis=0))
    elif "full_kernel" in head and isinstance(head["kernel"], Rows):  # [N, d] rows
        new["kernel"] = Rows(jnp.concatenate(
            [head["kernel"].value, jnp.take(head["full_kernel"], extra, axis=1).T], axis=0))
    elif "full_kernel" in head:
        new["kernel"] = jnp.concatenate(
            [weights.plain(head["kernel"]), jnp.take(head["full_kernel"], extra, axis=1)],
            axis=1)
    else:
        new["embedding"] = jnp.concatenate(
            [head["embedding"], jnp.take(head["full_embedding"], extra, axis=0)], axis=0)
    return {**params, VOCAB_HEAD: new}


# ---------------------------------------------------------------------------------------------
# frequency tables
def count_tokens(sequences: Iterable[Sequence[int]], vocab_size: int) -> np.ndarray:
    """int64 ``[V]`` occurrence counts of the token ids in ``sequences``."""
    counts = np.zeros(vocab_size, np.int64)
    for seq in sequences:
        ids = np.asarray(seq, np.int64).ravel()
        if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
            raise ValueError(f"token ids must lie in [0, {vocab_size}), got {ids.min()}..{ids.max()}")
        counts += np.bincount(ids, minlength=vocab_size)
    return counts


def rollout_counts(data, vocab_size: int) -> np.ndarray:
    """float64 ``[V]`` expected counts from stored target distributions: ``data`` is a
    ``dsbd distill`` run's ``data_train.npz`` (or its dict: ``idx`` / ``p [n, T, k]``, the
    target's top-k ids and warped probabilities at every continuation position, ``mask [n, T]``).
    Every real position adds its probabilities, so it weighs one token, spread over what the
    target would have sampled there: tokens that text counts miss (those that follow the chat
    template, the target's own phrasing) get their share."""
    if not isinstance(data, Mapping):
        with np.load(data) as z:
            missing = {"idx", "p", "mask"} - set(z.files)
            if missing:
                raise ValueError(f"{data} holds no stored target distributions (no "
                                 f"{sorted(missing)}; expected a dsbd distill run's data_train.npz)")
            data = {k: z[k] for k in ("idx", "p", "mask")}
    idx = np.asarray(data["idx"], np.int64)
    w = np.asarray(data["p"], np.float64) * np.asarray(data["mask"], bool)[..., None]
    if idx.shape != w.shape:
        raise ValueError(f"idx {idx.shape} and p {w.shape} differ in shape")
    if idx.size and (idx.min() < 0 or idx.max() >= vocab_size):
        raise ValueError(f"token ids must lie in [0, {vocab_size}), got {idx.min()}..{idx.max()}")
    return np.bincount(idx.ravel(), weights=w.ravel(), minlength=vocab_size)


def top_rows(counts, n: int, keep: Sequence[int] = ()) -> np.ndarray:
    """Sorted int32 ids of the ``n`` most frequent tokens (ties: the lower id), ``keep`` always
    among them (it takes the places of the least frequent)."""
    counts = np.asarray(counts)
    V = counts.shape[0]
    if not isinstance(n, (int, np.integer)) or not 1 <= n <= V:
        raise ValueError(f"the number of head rows must be an int in [1, {V}], got {n!r}")
    keep = sorted({int(k) for k in keep if 0 <= int(k) < V})
    if len(keep) > n:
        raise ValueError(f"{len(keep)} ids to keep do not fit in {n} rows")
    order = np.lexsort((np.arange(V), -counts))  # by count descending, then id ascending
    order = order[~np.isin(order, keep)][:n - len(keep)]
    return np.sort(np.concatenate([order, np.asarray(keep, np.int64)]).astype(np.int32))


def _counts_array(counts) -> np.ndarray:
    """int64 when every count is whole, else float64 (expected counts, :func:`rollout_counts`)."""
    counts = np.asarray(counts)
    if np.issubdtype(counts.dtype, np.integer) or np.all(counts == np.round(counts)):
        return counts.astype(np.int64)
    return counts.astype(np.float64)


def save_table(path, counts, meta: Optional[dict] = None) -> Path:
    """Write a frequency table (``counts [V]``: int64, or float64 when it holds expected
    counts; ``meta`` JSON); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    counts = _counts_array(counts)
    if counts.ndim != 1 or np.any(counts < 0) or not np.all(np.isfinite(counts)):
        raise ValueError("a frequency table holds one finite count >= 0 per token id")
    with open(path, "wb") as f:
        np.savez_compressed(f, counts=counts,
                            meta=np.asarray(json.dumps(meta or {}, sort_keys=True)))
    return path


def load_table(path) -> Tuple[np.ndarray, dict]:
    """``(counts [V], meta dict)`` of a table written by :func:`save_table` (int64 counts, or
    float64 where the table holds expected counts)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no vocabulary frequency table at {path} (build one with `dsbd vocab`)")
    with np.load(path) as z:
        if "counts" not in z:
            raise ValueError(f"{path} is not a vocabulary frequency table (no 'counts')")
        return _counts_array(z["counts"]), json.loads(str(z["meta"]))


def table_path(source, cache_dir=None) -> Path:
    """Where a model's frequency table lives by default, beside the model: ``DIR/dsbd_vocab.npz``
    for a checkpoint directory, ``FILE.dsbd_vocab.npz`` for a GGUF file, and
    ``CACHE/vocab/NAME.npz`` for a preset (``CACHE``: ``cache_dir``, else ``$DSBD_JAX_CACHE``,
    else ``~/.cache/dsbd_jax``; the table shipped with the package is used when that file does
    not exist, see :func:`find_table`)."""
    p = Path(os.fspath(source)).expanduser()
    if p.is_dir():
        return p / TABLE_NAME
    if p.is_file():
        return p.with_name(p.name + "." + TABLE_NAME)
    base = Path(cache_dir or os.environ.get("DSBD_JAX_CACHE") or "~/.cache/dsbd_jax").expanduser()
    return base / "vocab" / f"{os.fspath(source)}.npz"


def shipped_table(name: str) -> Optional[Path]:
    """The frequency table shipped with the package for preset ``name`` (or ``None``)."""
    p = Path(__file__).resolve().parent / "vocab_tables" / f"{name}.npz"
    return p if p.is_file() else None


def find_table(source, cache_dir=None) -> Path:
    """The table to use for ``source``: the one at :func:`table_path` if it exists, else the one
    shipped for a preset; ``ValueError`` naming where it looked when there is none."""
    p = table_path(source, cache_dir)
    if p.is_file():
        return p
    shipped = shipped_table(os.fspath(source))
    if shipped is not None:
        return shipped
    raise ValueError(f"no vocabulary frequency table for {source!r} (looked at {p}); build one "
                     f"with `dsbd vocab build` or pass a table path")
