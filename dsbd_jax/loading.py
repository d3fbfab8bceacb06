"""Load real weights into the Flax model: Hugging Face checkpoints, GGUF files, named presets.

``load_model(source, dtype)`` returns a :class:`LoadedModel` (config, parameter pytree,
tokenizer). ``source`` is one of

* a local Hugging Face checkpoint directory (``config.json`` + ``model.safetensors`` or a
  sharded ``model.safetensors.index.json``) of a ``LlamaForCausalLM`` or ``Qwen2ForCausalLM``;
* a GGUF file (architectures ``llama`` and ``qwen2``, any quantisation ``gguf`` dequantises);
* a preset name from :func:`list_presets` (offline weights shipped as pip packages; see
  :mod:`dsbd_jax.presets`).

Parameters are built one stacked tensor at a time (all layers of e.g. ``q_proj``), converted to
``dtype`` and put on the device before the next is read, so the host holds at most one stacked
float32 tensor besides the finished parameters.

Layout (see :func:`dsbd_jax.model.init_params`): Dense kernels are ``[in, out]`` (the HF weight
transposed) with a leading layer axis under ``params['layers']``; norms ``weight``; the
embedding ``embed/embedding [V, d]``; ``lm_head/kernel [d, V]`` only for untied models.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple, Union

import jax
import jax.numpy as jnp
import numpy as np

from .config import ModelConfig

logger = logging.getLogger("dsbd_jax")

SUPPORTED_HF_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


@dataclasses.dataclass
class LoadedModel:
    """A model ready for :func:`dsbd_jax.model.forward`.

    config:    the (hashable) :class:`ModelConfig`
    params:    plain pytree (nested dicts) of jax arrays in ``config.dtype``
    tokenizer: a ``transformers`` tokenizer, or ``None`` when the source has none (or it was
               not requested)
    source:    what was loaded (path or preset name), for messages
    info:      extra facts about the load (presets: seconds per step, cache paths)
    """

    config: ModelConfig
    params: Dict[str, Any]
    tokenizer: Any = None
    source: str = ""
    info: Dict[str, Any] = dataclasses.field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# parameter paths <-> HF tensor names

# our path (inside params) -> (HF name with {i} for the layer, transpose?)
_PATH_TO_HF: Dict[Tuple[str, ...], Tuple[str, bool]] = {
    ("embed", "embedding"): ("model.embed_tokens.weight", False),
    ("final_norm", "weight"): ("model.norm.weight", False),
    ("lm_head", "kernel"): ("lm_head.weight", True),
    ("layers", "input_norm", "weight"): ("model.layers.{i}.input_layernorm.weight", False),
    ("layers", "post_norm", "weight"): ("model.layers.{i}.post_attention_layernorm.weight", False),
    ("layers", "mlp", "gate_proj", "kernel"): ("model.layers.{i}.mlp.gate_proj.weight", True),
    ("layers", "mlp", "up_proj", "kernel"): ("model.layers.{i}.mlp.up_proj.weight", True),
    ("layers", "mlp", "down_proj", "kernel"): ("model.layers.{i}.mlp.down_proj.weight", True),
}
for _p in ("q", "k", "v", "o"):
    _PATH_TO_HF[("layers", "attn", f"{_p}_proj", "kernel")] = (
        f"model.layers.{{i}}.self_attn.{_p}_proj.weight", True)
    if _p != "o":
        _PATH_TO_HF[("layers", "attn", f"{_p}_proj", "bias")] = (
            f"model.layers.{{i}}.self_attn.{_p}_proj.bias", False)


@functools.lru_cache(maxsize=32)
def _param_shapes(config: ModelConfig):
    from .model import init_params

    shapes = jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0), "stacked"))
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]:
        out[tuple(k.key for k in path)] = tuple(leaf.shape)
    return out


def param_shapes(config: ModelConfig) -> Dict[Tuple[str, ...], Tuple[int, ...]]:
    """Every parameter path of the model and its shape (from ``init_params``, nothing allocated)."""
    return dict(_param_shapes(config))


def expected_tensor_names(config: ModelConfig):
    """The HF tensor names the model's parameters are built from."""
    names = set()
    for path in param_shapes(config):
        hf_name, _ = _PATH_TO_HF[path]
        layers = range(config.num_layers) if path[0] == "layers" else [None]
        names.update(hf_name.format(i=i) for i in layers)
    return names


def check_no_unexpected(present, config: ModelConfig, where: str) -> None:
    """Refuse checkpoints with tensors the model would silently ignore (e.g. an o_proj bias)."""
    extra = set(present) - expected_tensor_names(config)
    extra = {n for n in extra if not n.endswith("rotary_emb.inv_freq")
             and not (n == "lm_head.weight" and config.tie_word_embeddings)}
    if extra:
        shown = ", ".join(sorted(extra)[:6]) + (" ..." if len(extra) > 6 else "")
        raise ValueError(f"{where} has {len(extra)} tensor(s) this model does not use "
                         f"(unsupported variant?): {shown}")


def _set_path(tree: dict, path: Tuple[str, ...], value) -> None:
    for k in path[:-1]:
        tree = tree.setdefault(k, {})
    tree[path[-1]] = value


def path_name(path: Tuple[str, ...]) -> str:
    return ".".join(path)


def _progress(iterable, total, desc, enabled):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, file=sys.stderr, unit="tensor", leave=False)


def assemble_params(config: ModelConfig, get: Callable[[str, Optional[int]], np.ndarray],
                    dtype, save_dir: Optional[Path] = None, progress: bool = False,
                    desc: str = "converting") -> Dict[str, Any]:
    """Build the parameter pytree from a tensor getter.

    ``get(hf_name, layer)`` returns the tensor ``hf_name`` (``{i}`` replaced by ``layer``) in HF
    layout as a numpy array. Each stacked parameter is assembled on the host, optionally saved
    as float32 ``<save_dir>/<path>.npy``, converted to ``dtype``, put on the device and
    dropped from the host before the next one.
    """
    dtype = jnp.dtype(dtype)
    shapes = param_shapes(config)
    params: Dict[str, Any] = {}
    for path in _progress(list(shapes), len(shapes), desc, progress):
        if path not in _PATH_TO_HF:
            raise RuntimeError(f"no checkpoint mapping for parameter {path_name(path)}")
        hf_name, transpose = _PATH_TO_HF[path]
        shape = shapes[path]
        host_dtype = np.float32 if save_dir is not None else dtype
        stacked = path[0] == "layers"
        host = np.empty(shape, host_dtype)
        for layer in range(config.num_layers) if stacked else [None]:
            w = get(hf_name, layer)
            if transpose:
                w = w.T
            want = shape[1:] if stacked else shape
            if tuple(w.shape) != tuple(want):
                name = hf_name.format(i=layer)
                raise ValueError(f"tensor {name} has shape {tuple(w.shape)} (after layout change), "
                                 f"expected {tuple(want)} for {path_name(path)} from the config")
            if stacked:
                host[layer] = w
            else:
                host[...] = w
            del w
        if save_dir is not None:
            np.save(save_dir / f"{path_name(path)}.npy", host)
        _set_path(params, path, _to_device(host, dtype))
        del host
    return params


def _to_device(host: np.ndarray, dtype) -> jax.Array:
    """Copy to the device; a dtype change happens there (XLA converts far faster than numpy)."""
    x = jnp.asarray(host)
    return x if x.dtype == dtype else x.astype(dtype)


# ---------------------------------------------------------------------------------------------
# Hugging Face checkpoints

def config_from_hf(hf: Dict[str, Any], dtype: str = "float32") -> ModelConfig:
    """Map a Hugging Face ``config.json`` dict to :class:`ModelConfig` (errors for what the
    model does not implement)."""
    archs = hf.get("architectures") or []
    arch = archs[0] if archs else _MODEL_TYPES.get(hf.get("model_type"), hf.get("model_type"))
    if len(archs) > 1 or arch not in SUPPORTED_HF_ARCHITECTURES:
        raise ValueError(f"unsupported architecture {archs or arch!r}; supported: "
                         f"{', '.join(SUPPORTED_HF_ARCHITECTURES)}")
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"unsupported hidden_act {act!r}; only 'silu' is implemented")
    if hf.get("mlp_bias", False):
        raise ValueError("unsupported option mlp_bias=true (the MLP has no biases here)")
    if arch == "Qwen2ForCausalLM":
        if hf.get("use_sliding_window", False):
            raise ValueError("unsupported option use_sliding_window=true (Qwen2 sliding-window "
                             "attention is not implemented)")
        bias = True  # Qwen2 always has q/k/v biases
        arch_name = "qwen2"
    else:
        if hf.get("attention_bias", False):
            raise ValueError("unsupported option attention_bias=true for LlamaForCausalLM (it "
                             "also adds an o_proj bias, which the model does not implement)")
        bias = False
        arch_name = "llama"
    if float(hf.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError(f"unsupported option partial_rotary_factor={hf['partial_rotary_factor']}")
    # transformers >= 5 writes rope_parameters (with rope_theta inside); older configs have
    # rope_theta and rope_scaling at the top level.
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    theta = float(rope.pop("rope_theta", hf.get("rope_theta", 10000.0)))
    if "type" in rope and "rope_type" not in rope:
        rope["rope_type"] = rope.pop("type")
    rope_type = rope.get("rope_type", "default")
    needed = {"default": (), "linear": ("factor",),
              "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                         "original_max_position_embeddings")}
    if rope_type not in needed:
        raise ValueError(f"unsupported rope_scaling rope_type {rope_type!r}; supported: "
                         f"{', '.join(needed)}")
    lacking = [k for k in needed[rope_type] if k not in rope]
    if lacking:
        raise ValueError(f"rope_scaling of type {rope_type!r} lacks {lacking}")
    rope = {k: rope[k] for k in ("rope_type",) + needed[rope_type] if k in rope}
    heads = int(hf["num_attention_heads"])
    hidden = int(hf["hidden_size"])
    head_dim = hf.get("head_dim") or hidden // heads
    eos = hf.get("eos_token_id")
    if isinstance(eos, int):
        eos = (eos,)
    elif eos is not None:
        eos = tuple(int(e) for e in eos)
    return ModelConfig(
        vocab_size=int(hf["vocab_size"]),
        hidden_size=hidden,
        intermediate_size=int(hf["intermediate_size"]),
        num_layers=int(hf["num_hidden_layers"]),
        num_heads=heads,
        num_kv_heads=int(hf.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling=ModelConfig.freeze_rope_scaling(rope),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=bias,
        max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
        dtype=dtype,
        architecture=arch_name,
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=eos or None,
        pad_token_id=hf.get("pad_token_id"),
    )


class _SafetensorsSource:
    """All tensors of a (possibly sharded) safetensors checkpoint, read one at a time."""

    def __init__(self, directory: Path):
        from safetensors import safe_open

        index = directory / "model.safetensors.index.json"
        single = directory / "model.safetensors"
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
        elif single.exists():
            weight_map = None
        else:
            raise FileNotFoundError(
                f"{directory} has neither model.safetensors nor model.safetensors.index.json")
        files = sorted(set(weight_map.values())) if weight_map else ["model.safetensors"]
        self.handles = {f: safe_open(str(directory / f), framework="numpy") for f in files}
        if weight_map is None:
            weight_map = {k: "model.safetensors" for k in self.handles["model.safetensors"].keys()}
        self.weight_map = weight_map

    def get(self, hf_name: str, layer: Optional[int] = None) -> np.ndarray:
        name = hf_name.format(i=layer)
        if name not in self.weight_map:
            raise ValueError(f"checkpoint lacks tensor {name!r}")
        return self.handles[self.weight_map[name]].get_tensor(name)

    def close(self):
        self.handles = {}


def hf_config(directory: Path, dtype_name: str = "float32") -> ModelConfig:
    """The :class:`ModelConfig` of a Hugging Face checkpoint directory (its ``config.json``)."""
    cfg_path = directory / "config.json"
    if not cfg_path.exists():
        raise FileNotFoundError(f"{directory} is not a Hugging Face checkpoint (no config.json)")
    return config_from_hf(json.loads(cfg_path.read_text()), dtype_name)


def hf_tokenizer(directory: Path, required: bool = False):
    """The directory's ``transformers`` tokenizer; ``None`` when it has no tokenizer files
    (unless ``required``: then ``transformers`` raises)."""
    has_tok = any((directory / f).exists() for f in ("tokenizer.json", "tokenizer_config.json",
                                                     "tokenizer.model"))
    if not (has_tok or required):
        return None
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(directory))


def load_hf_checkpoint(directory, dtype=jnp.float32, tokenizer: Union[bool, str] = "auto",
                       progress: bool = False) -> LoadedModel:
    """Load a local Hugging Face checkpoint directory (see module docstring)."""
    directory = Path(directory)
    config = hf_config(directory, jnp.dtype(dtype).name)
    source = _SafetensorsSource(directory)
    try:
        check_no_unexpected(source.weight_map, config, f"checkpoint {directory}")
        params = assemble_params(config, source.get, dtype, progress=progress,
                                 desc=f"loading {directory.name}")
    finally:
        source.close()
    tok = hf_tokenizer(directory, required=tokenizer is True) if tokenizer else None
    return LoadedModel(config, params, tok, str(directory))


# ---------------------------------------------------------------------------------------------
# GGUF files

def load_gguf(path, dtype=jnp.float32, tokenizer: Union[bool, str] = "auto",
              progress: bool = False, save_dir: Optional[Path] = None) -> LoadedModel:
    """Load a GGUF file (see :mod:`dsbd_jax.gguf_loader`).

    ``tokenizer``: ``"auto"`` builds the ``transformers`` tokenizer from the file's
    ``tokenizer.ggml.*`` metadata when present (slow for large vocabularies), ``False`` skips it.
    ``save_dir``: also write the float32 parameters there (used by the preset cache).
    """
    from .gguf_loader import GGUFSource

    path = Path(path)
    src = GGUFSource(path)
    try:
        config = src.config(jnp.dtype(dtype).name)
        has_tok = src.has_tokenizer()
        check_no_unexpected(src.hf_names(), config, f"GGUF file {path}")
        logger.info("dequantising %s (%s, %d layers)", path.name, src.architecture,
                    config.num_layers)
        params = assemble_params(config, src.get, dtype, save_dir=save_dir, progress=progress,
                                 desc=f"dequantising {path.name}")
    finally:
        src.close()
    tok = None
    if tokenizer is True or (tokenizer == "auto" and has_tok):
        tok = tokenizer_from_gguf(path)
    return LoadedModel(config, params, tok, str(path))


def gguf_config(path, dtype_name: str = "float32") -> ModelConfig:
    """The :class:`ModelConfig` of a GGUF file, from its metadata (no tensor is read)."""
    from .gguf_loader import GGUFSource

    src = GGUFSource(Path(path))
    try:
        return src.config(dtype_name)
    finally:
        src.close()


def tokenizer_from_gguf(path):
    """``transformers`` tokenizer built from a GGUF file's metadata (needs the file's folder)."""
    from transformers import AutoTokenizer

    path = Path(path)
    logger.info("building tokenizer from %s", path.name)
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


# ---------------------------------------------------------------------------------------------
# config (de)serialisation for caches

def config_to_json(config: ModelConfig) -> Dict[str, Any]:
    d = dataclasses.asdict(config)
    d.pop("dtype")
    if d["rope_scaling"] is not None:
        d["rope_scaling"] = [list(kv) for kv in d["rope_scaling"]]
    if d["eos_token_id"] is not None:
        d["eos_token_id"] = list(d["eos_token_id"])
    return d


def config_from_json(d: Dict[str, Any], dtype: str = "float32") -> ModelConfig:
    d = dict(d)
    if d.get("rope_scaling") is not None:
        d["rope_scaling"] = tuple(
            (k, tuple(v) if isinstance(v, list) else v) for k, v in d["rope_scaling"])
    if d.get("eos_token_id") is not None:
        d["eos_token_id"] = tuple(d["eos_token_id"])
    return ModelConfig(dtype=dtype, **d)


def load_saved_params(directory: Path, config: ModelConfig, dtype) -> Dict[str, Any]:
    """Parameters written by ``assemble_params(save_dir=...)`` (memory-mapped, one at a time)."""
    shapes = param_shapes(config)
    params: Dict[str, Any] = {}
    for path, shape in shapes.items():
        host = np.load(directory / f"{path_name(path)}.npy", mmap_mode="r")
        if tuple(host.shape) != shape:
            raise ValueError(f"cached {path_name(path)} has shape {host.shape}, expected {shape}; "
                             f"delete {directory} to rebuild it")
        _set_path(params, path, _to_device(host, jnp.dtype(dtype)))
        del host
    return params


# ---------------------------------------------------------------------------------------------
def list_presets():
    """Names of the offline model presets (see :mod:`dsbd_jax.presets`)."""
    from .presets import PRESETS

    return sorted(PRESETS)


def _resolve(source) -> Tuple[str, Any]:
    """``("preset", name)``, ``("hf", directory)`` or ``("gguf", path)``; ``ValueError`` for
    anything else."""
    from .presets import PRESETS

    name = os.fspath(source) if isinstance(source, os.PathLike) else source
    if not isinstance(name, str):
        raise TypeError(f"source must be a path or preset name, got {type(source).__name__}")
    if name in PRESETS:
        return "preset", name
    path = Path(name).expanduser()
    if path.is_dir():
        return "hf", path
    if path.is_file():
        from .gguf_loader import is_gguf_file

        if is_gguf_file(path):
            return "gguf", path
        raise ValueError(f"{path} is neither a GGUF file nor a checkpoint directory")
    raise ValueError(f"unknown model source {name!r}: not an existing directory or GGUF file, "
                     f"and not a preset (presets: {', '.join(list_presets())})")


def read_config(source, dtype=jnp.float32) -> ModelConfig:
    """The :class:`ModelConfig` of a model source without loading its weights (a HF
    directory's ``config.json``, a GGUF file's metadata, a preset's cached config or GGUF
    metadata), so settings can be checked against it before the slow load."""
    kind, where = _resolve(source)
    dtype_name = jnp.dtype(dtype).name
    if kind == "preset":
        from .presets import preset_config

        return preset_config(where, dtype_name)
    if kind == "hf":
        return hf_config(where, dtype_name)
    return gguf_config(where, dtype_name)


def load_tokenizer(source):
    """The ``transformers`` tokenizer of a model source (no weights loaded), or ``None`` when
    it has none."""
    kind, where = _resolve(source)
    if kind == "preset":
        from .presets import preset_tokenizer

        return preset_tokenizer(where)
    if kind == "hf":
        return hf_tokenizer(where)
    from .gguf_loader import GGUFSource

    src = GGUFSource(where)
    try:
        has_tok = src.has_tokenizer()
    finally:
        src.close()
    return tokenizer_from_gguf(where) if has_tok else None


def load_model(source, dtype=jnp.float32, *, tokenizer: Union[bool, str] = "auto",
               cache_dir: Optional[Union[str, os.PathLike]] = None,
               progress: bool = True, cache_params: Optional[bool] = None,
               layout: Optional[str] = None) -> LoadedModel:
    """Load a model from a HF checkpoint directory, a GGUF file or a preset name.

    Args:
      source: directory, ``.gguf`` path, or one of :func:`list_presets`.
      dtype: parameter/compute dtype (``jnp.float32``, ``jnp.bfloat16``, ``jnp.float16``).
      tokenizer: ``"auto"`` (load one if the source has one), ``True`` (required), ``False``.
      cache_dir: presets only; default ``$DSBD_JAX_CACHE`` or ``~/.cache/dsbd_jax``.
      cache_params: presets only; ``False`` does not write the float32 parameter cache (the
        GGUF is dequantised on every load instead); default ``$DSBD_JAX_CACHE_PARAMS`` (``0``
        turns it off), else ``True``.
      progress: show tqdm progress bars (stderr) for the long steps.
      layout: weight layout, ``"per_layer"`` or ``"stacked"`` (``None``: by backend, see
        :func:`dsbd_jax.model.default_layout`); :func:`dsbd_jax.model.convert_layout` converts.
    """
    from .model import check_layout

    layout = check_layout(layout)
    model = _load_model(source, dtype, tokenizer=tokenizer, cache_dir=cache_dir,
                        progress=progress, cache_params=cache_params)
    if layout == "per_layer":
        from .model import unstack_layers_

        unstack_layers_(model.params)
    return model


def _load_model(source, dtype, *, tokenizer, cache_dir, progress, cache_params) -> LoadedModel:
    jnp.dtype(dtype)  # validates
    kind, where = _resolve(source)
    if kind == "preset":
        from .presets import load_preset

        return load_preset(where, dtype, tokenizer=tokenizer, cache_dir=cache_dir,
                           progress=progress, cache_params=cache_params)
    if kind == "hf":
        return load_hf_checkpoint(where, dtype, tokenizer=tokenizer, progress=progress)
    return load_gguf(where, dtype, tokenizer=tokenizer, progress=progress)
