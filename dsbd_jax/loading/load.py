"""Load real weights into the Flax model: Hugging Face checkpoints, GGUF files, named presets.

``load_model(source, dtype)`` returns a :class:`LoadedModel` (config, parameter pytree,
tokenizer); ``source`` is a local Hugging Face checkpoint directory (:mod:`dsbd_jax.loading.hf`),
a GGUF file (:mod:`dsbd_jax.loading.gguf`), a preset of :func:`list_presets`
(:mod:`dsbd_jax.loading.presets`) or a hub id ``"org/name"`` or ``"org/name@rev"``
(:mod:`dsbd_jax.loading.hub`). :func:`read_config` and :func:`load_tokenizer` read a source's
config and tokenizer without its weights. Invariant: parameters are built one stacked tensor at
a time, converted and put on the device before the next is read, so the host holds at most one
stacked float32 tensor besides the finished parameters. The modules below this one import in
one direction only: ``checkpoint`` <- ``hf``, ``gguf`` <- ``presets`` <- ``load``.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import os
import time
from pathlib import Path
from typing import Any, Optional, Tuple, Union

import jax
import jax.numpy as jnp

from dsbd_jax.host.compilation_cache import enable_compilation_cache
from dsbd_jax.loading.checkpoint import LoadedModel, notice
from dsbd_jax.models.config import ModelConfig
from dsbd_jax.loading.gguf import (GGUFSource, gguf_config, is_gguf_file, load_gguf,
                                   read_header, tokenizer_from_gguf)
from dsbd_jax.loading.hf import config_from_hf, hf_config, hf_tokenizer, load_hf_checkpoint
from dsbd_jax.host.plan import AUTO, HostPlan, dtype_choice, resolve_dtype
from dsbd_jax.host.plan import plan as host_plan
from dsbd_jax.loading.hub import is_hub_id, snapshot
from dsbd_jax.host.forms import MEASURED, choose_form, weights_choice
from dsbd_jax.models.kinds import AUTO_WEIGHTS, FLOAT, INT8, TRANSPOSED, check_weights, head_transposed, int8_params_, transpose_params_, transposed_of, transposed_widths
from dsbd_jax.models.llama import check_layout, unstack_layers_
from dsbd_jax.loading.load_args import check_fused, check_plan as _check_plan, fuse_loaded_, removed_blocks as _removed_blocks
from dsbd_jax.loading.host_layout import host_layout_dir_name, load_host_layout, save_host_layout
from dsbd_jax.loading.presets import (PRESETS, cache_params_default, cache_root, load_preset,
                                     preset_config, preset_dir, preset_tokenizer)
from dsbd_jax.models.vocab import find_table, load_table, top_rows, truncate_head
from dsbd_jax.models.vocab import untie_head as untie

__all__ = ["LoadedModel", "config_from_hf", "list_presets", "load_model", "load_tokenizer",
           "read_config"]


def list_presets():
    """Names of the offline model presets (see :mod:`dsbd_jax.loading.presets`)."""
    return sorted(PRESETS)


def local_model_dir(name: str, cache_dir=None) -> Optional[Path]:
    """Where a model saved under a name lives (``CACHE/models/NAME``, e.g. a distilled draft
    registered by ``dsbd distill``); ``None`` for a name that is a path."""
    if not name or "/" in name or os.sep in name or name in (".", ".."):
        return None
    return cache_root(cache_dir) / "models" / name


def _resolve(source, revision: Optional[str] = None) -> Tuple[str, Any]:
    """``("preset", name)``, ``("hf", directory)`` or ``("gguf", path)`` (a hub id becomes its
    local snapshot directory, a saved name its directory under ``CACHE/models``); ``ValueError``
    for anything else."""
    name = os.fspath(source) if isinstance(source, os.PathLike) else source
    if not isinstance(name, str):
        raise TypeError(f"source must be a path, preset name or hub id, "
                        f"got {type(source).__name__}")
    if name in PRESETS:
        return "preset", name
    local = local_model_dir(name)
    if local is not None and local.is_dir():
        return "hf", local
    path = Path(name).expanduser()
    if path.is_dir():
        return "hf", path
    if path.is_file():
        if is_gguf_file(path):
            return "gguf", path
        raise ValueError(f"{path} is neither a GGUF file nor a checkpoint directory")
    if is_hub_id(name):
        return "hf", snapshot(name, revision)
    raise ValueError(f"unknown model source {name!r}: not an existing directory or GGUF file, "
                     f"not a hub id (org/name) and not a preset (presets: "
                     f"{', '.join(list_presets())})")


def check_source(source, what: str = "source") -> None:
    """``ValueError`` naming ``what`` (the argument or option the user wrote) unless ``source``
    names a model :func:`load_model` can find: a preset name, a model saved under a name, an
    existing directory or GGUF file, or a hub id (its form only: nothing is fetched). Reads no
    file and converts nothing, so a bad name is refused at once, before any other model is
    read."""
    name = os.fspath(source) if isinstance(source, os.PathLike) else source
    if not isinstance(name, str):
        raise TypeError(f"{what} must be a path, preset name or hub id, got "
                        f"{type(source).__name__}")
    if name in PRESETS or is_hub_id(name):
        return
    local = local_model_dir(name)
    path = Path(name).expanduser()
    if (local is not None and local.is_dir()) or path.is_dir() or path.is_file():
        return
    hint = (f"; `dsbd make-tiny-pair {path.parent}` writes a tiny random pair there"
            if path.name in ("target", "draft") else "")
    raise ValueError(f"{what} {name!r}: no such model: not an existing directory or GGUF file, "
                     f"not a hub id (org/name) and not a preset (presets: "
                     f"{', '.join(list_presets())}){hint}")


def read_config(source, dtype=jnp.float32, revision: Optional[str] = None) -> ModelConfig:
    """The :class:`ModelConfig` of a model source without loading its weights (a HF
    directory's ``config.json``, a GGUF file's metadata, a preset's cached config or GGUF
    metadata), so settings can be checked against it before the slow load. ``dtype="auto"``:
    the dtype :func:`load_model` would choose on this host (:mod:`dsbd_jax.host.plan`)."""
    kind, where = _resolve(source, revision)
    if isinstance(dtype, str) and dtype == AUTO:
        return read_config(source, resolve_dtype(AUTO, read_config(source, revision=revision)),
                           revision)
    dtype_name = jnp.dtype(dtype).name
    if kind == "preset":
        return preset_config(where, dtype_name)
    if kind == "hf":
        return hf_config(where, dtype_name)
    return gguf_config(where, dtype_name)


def load_tokenizer(source, revision: Optional[str] = None):
    """The ``transformers`` tokenizer of a model source (no weights loaded), or ``None`` when
    it has none."""
    kind, where = _resolve(source, revision)
    if kind == "preset":
        return preset_tokenizer(where)
    if kind == "hf":
        return hf_tokenizer(where)
    header = read_header(where)
    if header is not None:
        has_tok = "tokenizer.ggml.tokens" in header[0]
    else:
        src = GGUFSource(where)
        try:
            has_tok = src.has_tokenizer()
        finally:
            src.close()
    return tokenizer_from_gguf(where) if has_tok else None


SLOW_STEP_S = 0.5   # a load's step this long or longer names itself with its time (timed_step)


@functools.lru_cache(maxsize=1)
def _libc_trim():
    try:
        return ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):   # not glibc (macOS, musl): nothing to hand back
        return None


def release_freed_memory() -> bool:
    """Hand the memory a load freed back to the operating system (glibc's ``malloc_trim``;
    ``False`` where the C library has none). A load frees as much as it keeps (the stacked
    arrays split into layers, each kernel replaced by its transposed copy); glibc keeps those
    freed blocks in its heap, and the process keeps them resident (gigabytes for the offline
    pair) until a trim hands them back (``benchmarks/load_memory.py`` measures a load's memory).
    :func:`load_model` calls it after each step and at the end; it changes no value."""
    trim = _libc_trim()
    return bool(trim(0)) if trim is not None else False


@contextlib.contextmanager
def timed_step(what: str, progress: bool, result=lambda: None):
    """Time one step of a load; if it takes ``SLOW_STEP_S`` or more, say ``"<what> in X s"``
    (:func:`notice`: stderr with ``progress``, and INFO). ``result()`` gives the arrays the step
    made: they are waited for inside the step, so jax's asynchronous work is timed where it is
    caused (not in the first generation)."""
    t0 = time.perf_counter()
    yield
    jax.block_until_ready(result())
    release_freed_memory()
    dt = time.perf_counter() - t0
    if dt >= SLOW_STEP_S:
        notice(f"{what} in {dt:.1f} s", progress)


def load_model(source, dtype="auto", *, tokenizer: Union[bool, str] = "auto",
               cache_dir: Optional[Union[str, os.PathLike]] = None,
               progress: bool = True, cache_params: Optional[bool] = None,
               layout: Optional[str] = None, revision: Optional[str] = None,
               head_rows: Optional[int] = None,
               vocab_table: Optional[Union[str, os.PathLike]] = None,
               prompt_rows: bool = False,
               kernel_blocks: Optional[str] = "measured",
               untie_head: bool = False, place=None,
               plan: Optional[HostPlan] = None, weights: str = FLOAT,
               fused_projections: Union[bool, str] = "auto") -> LoadedModel:
    """Load a model from a HF checkpoint directory, a GGUF file, a preset name or a hub id.

    Args:
      source: directory, ``.gguf`` path, one of :func:`list_presets`, or a Hugging Face hub id
        ``"org/name"`` (see :mod:`dsbd_jax.loading.hub`).
      revision: hub ids only: branch, tag or commit (default: ``main``).
      dtype: the parameters' dtype. ``"auto"`` (default): bfloat16 where this host (or
        accelerator) runs it faster than float32, else float32, measured once per host and
        shape (:func:`dsbd_jax.host.plan.choose_dtype`; ``$DSBD_JAX_DTYPE`` forces one).
        ``jnp.float32`` runs everything in float32. ``jnp.bfloat16`` / ``jnp.float16`` store the
        weights and KV cache in 16 bits and run the products in mixed precision (float32
        accumulation); activations, norms, attention and logits stay float32.
        ``info["dtype"]`` and ``info["dtype_why"]`` record the choice.
      plan: a :class:`dsbd_jax.host.plan.HostPlan` (``dsbd_jax.host.plan.plan(config)``, or
        one made on another host and passed on): its dtype and kernel form are applied as they
        are, nothing is measured. ``None`` (default): with ``kernel_blocks="measured"`` the
        plan is worked out here, once, by :func:`dsbd_jax.host.plan.plan` (the dtype for
        ``dtype="auto"``, the form for that dtype). ``info["plan"]`` records the plan applied
        (``None`` where ``kernel_blocks`` or ``place`` decided the form instead). A plan's
        compiler options go to the decoders as a value: their configs' ``options``
        (``DSBDConfig(..., options=plan.options)``); without it a program's options follow
        from its kernels' kinds and this host's choice for them
        (:func:`dsbd_jax.host.cpu_options.options_of`).
      tokenizer: ``"auto"`` (load one if the source has one), ``True`` (required), ``False``.
      cache_dir: presets (and JAX's compilation cache, ``<cache_dir>/xla``, turned on here unless
        ``$DSBD_JAX_COMPILATION_CACHE=0``: :mod:`dsbd_jax.host.compilation_cache`); default
        ``$DSBD_JAX_CACHE`` or ``~/.cache/dsbd_jax``. A preset is cached once more in the form
        this load leaves it in (layout, kernel form, dtype; ``host_layout.save_host_layout``), and a
        later load with the same form reads that.
      cache_params: presets only; ``False`` does not write the float32 parameter cache (the
        GGUF is dequantised on every load instead); default ``$DSBD_JAX_CACHE_PARAMS`` (``0``
        turns it off), else ``True``. A load that leaves the model in a form of its own (per
        layer, transposed, int8: ``params-v1-host-*``) caches that form only, never the float
        parameters it was made from as well: one stored copy per model and form
        (``dsbd cache`` lists them).
      progress: show tqdm progress bars and one line per step on stderr (no logging set-up
        needed): a first preset load says it converts, every load where from and how long.
      layout: weight layout, ``"per_layer"`` or ``"stacked"`` (``None``: by backend, see
        :func:`dsbd_jax.models.llama.default_layout`); :func:`dsbd_jax.models.llama.convert_layout` converts.
      head_rows: truncate the vocabulary head to the ``head_rows`` most frequent tokens of
        ``vocab_table`` (plus the EOS ids), for use as a draft (:mod:`dsbd_jax.models.vocab`);
        ``None``: the full head. ``info["head_rows"]`` and ``info["vocab_table"]`` record it.
      vocab_table: a frequency table (``dsbd vocab build``); default: the one beside the model
        (:func:`dsbd_jax.models.vocab.find_table`).
      prompt_rows: with ``head_rows``, also keep the full head so that every drafted decoder
        adds the tokens of its prompts to the rows (``truncate_head(prompt_rows=True)``;
        ``info["prompt_rows"]``).
      kernel_blocks: the stored form of the attention and MLP projection kernels, for XLA:CPU's
        few-row products (:mod:`dsbd_jax.models.kinds`). ``"measured"`` (default): plain
        ``[in, out]`` kernels or transposed ones (``[out, in]`` rows in blocks,
        :func:`dsbd_jax.models.kinds.transpose_params`), whichever this host runs faster for
        this model's MLP shape, each form under its own compiler options
        (:func:`dsbd_jax.host.forms.choose_form` through the host's plan: a few seconds once
        per host and shape, cached; plain off the CPU and for small models;
        ``$DSBD_JAX_KERNEL_FORM`` forces one).
        Where transposed kernels win, their few-row products make the forward passes and the
        decoders faster (what each host picks: ``docs/performance.md``; figures:
        ``docs/results/cpu.md``). ``"transposed"``: transposed whatever the measurement says.
        ``None``: plain kernels. ``info["kernel_transposed"]`` records what was applied. Every
        form gives the same outputs up to float rounding. The blocked kernels of ``"auto"``,
        ``"halves"`` and ``{projection: width}`` were removed (no gain worth a form
        where measured: ``docs/results/cpu.md``); those values load plain kernels with a
        ``DeprecationWarning``, for one release.
      place: ``place(path, host, dtype) -> jax.Array`` for each tensor as it is read (path: the
        stacked-layout key tuple), e.g. ``ShardedDecoder.placer("target")``, which puts it
        straight onto this process's shards of a mesh, so a process holds its shards plus one
        tensor, never the whole model. The kernels then stay plain (``kernel_blocks="measured"``
        means None); the other options run on the placed arrays.
      untie_head: give a tied head (the embedding doubling as the head: the hub's Qwen2.5-0.5B,
        Llama-3.2-1B, Gemma) its own ``[d, V]`` kernel (:func:`dsbd_jax.models.vocab.untie_head`;
        ``V * d`` more memory). On the CPU under the per-host option ``eigen_dot`` a tied head
        with 2-16 rows (a draft at batch 2+, beams) is several times slower than an untied one
        (``docs/results/cpu.md``). Applied before ``head_rows``; ``info["untied_head"]`` says
        whether it changed the model. A model without a tied head is left as it is.
      weights: the kind of the projection and vocabulary-head kernels. ``"float"`` (default):
        the dtype's (``dtype``, ``kernel_blocks``). ``"int8"``: eight-bit codes with a float32
        scale per output (:class:`dsbd_jax.models.weights.Int8`, made from the float weights
        by :func:`dsbd_jax.models.kinds.int8_params_`), multiplied by XLA's integer product
        with the activations quantised per row; the embedding, norms and KV cache stay in
        ``dtype``, a tied head is untied (its codes are the head's product), and the kernel
        form does not apply (``info["kernel_transposed"]`` is empty). **An int8 model is a
        different model from the float one**: as a draft it never changes what a drafted
        decoder outputs (the verification is against the target); as a target, every decoder
        samples from the int8 model's distributions (``docs/loading.md``, *Eight-bit
        weights*). A preset is cached in its int8 form (codes a quarter of float32's bytes),
        later loads read that. ``"auto"``, for drafts: int8 where this host runs the model's
        MLP products clearly faster in int8 than in the float form a load gives them
        (:func:`dsbd_jax.host.forms.choose_weights`: measured once per host and shape,
        cached), else float; never for a target, whose kind is the user's choice.
        ``info["weights"]`` records the kind, ``info["weights_why"]`` how it was chosen. Not
        with ``place`` (a mesh takes float kernels; ``"auto"`` then gives float).
    """
    layout = check_layout(layout)
    weights = check_weights(weights)
    if weights == AUTO_WEIGHTS and place is not None:
        weights = FLOAT           # a mesh takes float kernels
    if weights == INT8 and place is not None:
        raise ValueError("load_model(weights='int8') cannot place onto a mesh (place=...): "
                         "sharded programs take float kernels; load with weights='float'")
    kernel_blocks = _removed_blocks(kernel_blocks)
    check_fused(fused_projections, place, plan)
    enable_compilation_cache(cache_dir)
    if plan is not None:
        _check_plan(plan, dtype, kernel_blocks)
    elif isinstance(kernel_blocks, str) and kernel_blocks == MEASURED and place is None:
        t0 = time.perf_counter()
        plan = host_plan(read_config(source, revision=revision), dtype)
        if time.perf_counter() - t0 > 1.0:  # measured now (later loads read the caches)
            notice(f"planned this host's run in {time.perf_counter() - t0:.0f} s: {plan.dtype} "
                   f"({plan.why}), {plan.form} kernels, compiler options {plan.options} "
                   f"(cached; `dsbd host` prints the figures)", progress)
    if plan is not None:
        dtype, dtype_why = plan.dtype, plan.why
        kernel_blocks = TRANSPOSED if plan.form == TRANSPOSED and place is None else None
    elif isinstance(dtype, str) and dtype == AUTO:
        t0 = time.perf_counter()
        config = read_config(source, revision=revision)
        dtype, dtype_why = dtype_choice(config)
        if time.perf_counter() - t0 > 1.0:
            notice(f"chose {dtype} for this host in {time.perf_counter() - t0:.0f} s "
                   f"({dtype_why})", progress)
    else:
        dtype_why = "given"
    plan_info = None if plan is None else dataclasses.asdict(plan)
    weights_why = "given"
    if weights == AUTO_WEIGHTS:
        t0 = time.perf_counter()
        weights, weights_why = weights_choice(read_config(source, dtype, revision), dtype)
        if time.perf_counter() - t0 > 1.0:
            notice(f"measured the draft's weight kind for this host in "
                   f"{time.perf_counter() - t0:.0f} s: {weights} (cached)", progress)
    if weights == INT8 or fused_projections is True:
        kernel_blocks = None      # int8 codes have one form, fused kernels plain ones
    if prompt_rows and head_rows is None:
        raise ValueError("prompt_rows extends a truncated head: give head_rows too")
    if vocab_table is not None and head_rows is None:
        raise ValueError("vocab_table is given but head_rows is not: say how many rows to keep")
    if place is not None and kernel_blocks == MEASURED:
        kernel_blocks = None      # the sharded program takes plain [in, out] kernels
    host_form = _host_form(source, dtype, layout, kernel_blocks, place, head_rows, untie_head,
                           cache_params, cache_dir, revision, weights)
    if host_form is not None:
        model = _load_host_form(host_form, dtype, tokenizer, cache_dir, progress)
        if model is not None:
            model.info["untied_head"] = False
            model.info["kernel_transposed"] = transposed_of(model.params)
            model.info["head_transposed"] = head_transposed(model.params)
            model.info["dtype"], model.info["dtype_why"] = jnp.dtype(dtype).name, dtype_why
            model.info["plan"] = plan_info
            model.info["weights"], model.info["weights_why"] = weights, weights_why
            fuse_loaded_(model, fused_projections, place)
            release_freed_memory()
            return model
    # a load that ends in a host form caches that form alone (one stored copy per model and form)
    model = _load_model(source, dtype, tokenizer=tokenizer, cache_dir=cache_dir,
                        progress=progress,
                        cache_params=False if host_form is not None else cache_params,
                        revision=revision, place=place)
    params = lambda: model.params  # noqa: E731
    if layout == "per_layer":
        with timed_step("split the stacked layers into per-layer arrays", progress, params):
            unstack_layers_(model.params)
    untie_head = untie_head or weights == INT8   # an int8 head is a product, never tied
    model.info["untied_head"] = bool(untie_head and model.config.tie_word_embeddings)
    if untie_head:
        with timed_step("gave the tied head its own kernel", progress, params):
            model.params, model.config = untie(model.params, model.config)
    if head_rows is not None:
        table = Path(vocab_table) if vocab_table is not None else find_table(source, cache_dir)
        counts, _ = load_table(table)
        if counts.shape[0] != model.config.vocab_size:
            raise ValueError(f"{table} counts {counts.shape[0]} tokens, the model has "
                             f"{model.config.vocab_size}")
        rows = top_rows(counts, head_rows, keep=model.config.eos_token_id or ())
        with timed_step(f"truncated the vocabulary head to {head_rows} rows", progress, params):
            model.params = truncate_head(model.params, model.config, rows,
                                         prompt_rows=prompt_rows)
        model.info.update(head_rows=int(head_rows), vocab_table=str(table),
                          prompt_rows=bool(prompt_rows))
    if kernel_blocks in (TRANSPOSED, MEASURED):
        t0 = time.perf_counter()
        form = TRANSPOSED if kernel_blocks == TRANSPOSED else choose_form(model.config, dtype)
        if time.perf_counter() - t0 > 1.0:  # measured now (later loads read the cache)
            notice(f"measured the projection kernel form for this host in "
                   f"{time.perf_counter() - t0:.0f} s: {form} (cached; "
                   f"DSBD_JAX_KERNEL_FORM=plain|transposed forces one)", progress)
        if form == TRANSPOSED:
            with timed_step("stored the projection kernels transposed (faster few-row products "
                            "on this host; DSBD_JAX_KERNEL_FORM=plain skips it)", progress, params):
                # in place, one kernel at a time (16-bit: the head as [V, d] rows too): the
                # load's peak is the model plus one kernel, not two copies of the model
                transpose_params_(model.params, transposed_widths(model.config),
                                  head=jnp.dtype(dtype).itemsize == 2)
    if weights == INT8:
        with timed_step("quantised the projections and the head to int8", progress, params):
            model.params, model.config = int8_params_(model.params, model.config)
    model.info["kernel_transposed"] = transposed_of(model.params)
    model.info["head_transposed"] = head_transposed(model.params)
    model.info["dtype"], model.info["dtype_why"] = jnp.dtype(dtype).name, dtype_why
    model.info["plan"] = plan_info
    model.info["weights"], model.info["weights_why"] = weights, weights_why
    if host_form is not None and (layout != "stacked" or model.info["kernel_transposed"]
                                  or weights == INT8):
        name, folder, key = host_form
        with timed_step(f"cached {name} in this host's form ({folder}: later loads only read "
                        f"it)", progress):
            model.info["host_form_cache"] = str(save_host_layout(
                name, folder, model.params, model.config, dtype, key, cache_dir))
    fuse_loaded_(model, fused_projections, place)
    release_freed_memory()
    return model


def _host_form(source, dtype, layout, kernel_blocks, place, head_rows, untie_head,
               cache_params, cache_dir, revision, weights=FLOAT):
    """``(preset, folder, key)`` of the cache of a preset in the form this load leaves it in
    (layout, kernel form, head rows, dtype: :func:`host_layout.save_host_layout`), or ``None``
    where there is none: not a preset, the parameter cache off, or a load that places,
    truncates or unties. The form is part of the key, so a cache made for one form
    never answers for another. An int8 load (``weights="int8"``) is always cached (its own
    folder, ``-int8``), whatever its layout."""
    if place is not None or head_rows is not None or untie_head:
        return None
    if cache_params is False or (cache_params is None and not cache_params_default()):
        return None
    kind, where = _resolve(source, revision)
    if kind != "preset":
        return None
    dtype_name = jnp.dtype(dtype).name
    config = preset_config(where, dtype_name, cache_dir)
    if weights == INT8:
        key = {"leaves": "typed kernels", "dtype": dtype_name, "layout": layout,
               "weights": INT8, "format": 2}   # 2: a float32 model's embedding in bfloat16
        return where, host_layout_dir_name(dtype_name, layout, INT8, False), key
    form = (TRANSPOSED if kernel_blocks == TRANSPOSED else
            choose_form(config, dtype) if kernel_blocks == MEASURED else "plain")
    row_head = form == TRANSPOSED and jnp.dtype(dtype).itemsize == 2
    if layout == "stacked" and form != TRANSPOSED:
        return None                 # the form of the parameter cache itself
    key = {"leaves": "typed kernels", "dtype": dtype_name, "layout": layout, "form": form,
           "row_head": row_head,
           "widths": transposed_widths(config) if form == TRANSPOSED else {}}
    return where, host_layout_dir_name(dtype_name, layout, form, row_head), key


def _load_host_form(host_form, dtype, tokenizer, cache_dir, progress) -> Optional[LoadedModel]:
    """The preset read from its cache in this host's form (:func:`_host_form`), or ``None``
    when that cache is missing or was made from another file or form."""
    name, folder, key = host_form
    t0 = time.perf_counter()
    got = load_host_layout(name, folder, dtype, key, cache_dir)
    if got is None:
        return None
    config, params = got
    jax.block_until_ready(params)
    info = {"cache_dir": str(preset_dir(name, cache_dir)), "built_cache": False,
            "host_form_cache": str(preset_dir(name, cache_dir) / folder),
            "cached_load_s": time.perf_counter() - t0}
    tok = None
    if tokenizer:
        t1 = time.perf_counter()
        tok = preset_tokenizer(name, cache_dir, progress)
        info["tokenizer_s"] = time.perf_counter() - t1
    info["total_s"] = time.perf_counter() - t0
    notice(f"loaded preset {name} ({jnp.dtype(dtype).name}) in {info['total_s']:.1f} s (from "
           f"{info['host_form_cache']}, in this host's form)", progress)
    return LoadedModel(config, params, tok, name, info)


def _load_model(source, dtype, *, tokenizer, cache_dir, progress, cache_params,
                revision, place=None) -> LoadedModel:
    jnp.dtype(dtype)  # validates
    kind, where = _resolve(source, revision)
    if kind == "preset":
        return load_preset(where, dtype, tokenizer=tokenizer, cache_dir=cache_dir,
                           progress=progress, cache_params=cache_params, place=place)
    t0 = time.perf_counter()
    if kind == "hf":
        model = load_hf_checkpoint(where, dtype, tokenizer=tokenizer, progress=progress,
                                   place=place)
    else:
        model = load_gguf(where, dtype, tokenizer=tokenizer, progress=progress, place=place)
    notice(f"loaded {'checkpoint' if kind == 'hf' else 'GGUF'} {where} in "
           f"{time.perf_counter() - t0:.1f} s", progress)
    return model
