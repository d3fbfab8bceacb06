"""What every weight source shares: the loaded-model record, the parameter layout, the build.

* :class:`LoadedModel`: config, parameter pytree, tokenizer (what :func:`load_model` returns).
* Parameter paths <-> Hugging Face tensor names (``_PATH_TO_HF``), the parameter shapes of a
  config, and :func:`check_no_unexpected` for tensors a checkpoint has but the model ignores.
* :func:`assemble_params`: the parameter pytree from any tensor getter in HF layout, one
  stacked tensor at a time (used by :mod:`dsbd_jax.loading.hf` and :mod:`dsbd_jax.loading.gguf`).
* The preset cache's format: :func:`config_to_json`, :func:`config_from_json`,
  :func:`load_saved_params`.

Layout (:func:`dsbd_jax.models.llama.init_params`): Dense kernels ``[in, out]`` (the HF weight
transposed) with a leading layer axis under ``params['layers']``; ``lm_head`` only if untied.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import sys
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Tuple

import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.models.config import ModelConfig
from dsbd_jax.models.llama import init_params


@dataclasses.dataclass
class LoadedModel:
    """A model ready for :func:`dsbd_jax.models.llama.forward`.

    Attributes:
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


def choice_line(role: str, source, info, dtype_why: Optional[str] = None,
                weights_why: Optional[str] = None) -> str:
    """One line on what a loaded model (``info``: its :class:`LoadedModel` ``info``) runs as in
    ``role`` (``"target"``, ``"draft"``): its dtype and weight kind, and why each (``info``'s
    reasons unless the caller, which chose them, gives its own). Every command that loads a
    model prints it."""
    why = dtype_why or info.get("dtype_why", "given")
    kind_why = weights_why or info.get("weights_why", "given")
    return (f"{role} {source}: {info.get('dtype', '?')} ({why}); "
            f"{info.get('weights', 'float')} weights ({kind_why})")


def weights_label(info) -> str:
    """A loaded model's dtype, and ``int8 weights`` where its kernels are eight-bit."""
    return info.get("dtype", "?") + (", int8 weights" if info.get("weights") == "int8" else "")


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
for _n in ("q", "k"):
    _PATH_TO_HF[("layers", "attn", f"{_n}_norm", "weight")] = (
        f"model.layers.{{i}}.self_attn.{_n}_norm.weight", False)
# Gemma 2/3 (sandwich_norms): post_attention_layernorm normalises the attention OUTPUT there
_SANDWICH_TO_HF = {
    ("layers", "attn_out_norm", "weight"): ("model.layers.{i}.post_attention_layernorm.weight",
                                            False),
    ("layers", "post_norm", "weight"): ("model.layers.{i}.pre_feedforward_layernorm.weight", False),
    ("layers", "mlp_out_norm", "weight"): ("model.layers.{i}.post_feedforward_layernorm.weight",
                                           False),
}
for _p in ("q", "k", "v", "o"):
    _PATH_TO_HF[("layers", "attn", f"{_p}_proj", "kernel")] = (
        f"model.layers.{{i}}.self_attn.{_p}_proj.weight", True)
    if _p != "o":
        _PATH_TO_HF[("layers", "attn", f"{_p}_proj", "bias")] = (
            f"model.layers.{{i}}.self_attn.{_p}_proj.bias", False)


@functools.lru_cache(maxsize=32)
def _param_shapes(config: ModelConfig):
    shapes = jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0), "stacked"))
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]:
        out[tuple(k.key for k in path)] = tuple(leaf.shape)
    return out


def hf_tensor(config: ModelConfig, path: Tuple[str, ...]) -> Tuple[str, bool]:
    """``(HF name with {i}, transpose?)`` of the parameter at ``path`` for this config."""
    if config.sandwich_norms and path in _SANDWICH_TO_HF:
        return _SANDWICH_TO_HF[path]
    if path not in _PATH_TO_HF:
        raise RuntimeError(f"no checkpoint mapping for parameter {path_name(path)}")
    return _PATH_TO_HF[path]


def param_shapes(config: ModelConfig) -> Dict[Tuple[str, ...], Tuple[int, ...]]:
    """Every parameter path of the model and its shape (from ``init_params``, nothing allocated)."""
    return dict(_param_shapes(config))


def expected_tensor_names(config: ModelConfig):
    """The HF tensor names the model's parameters are built from."""
    names = set()
    for path in param_shapes(config):
        hf_name, _ = hf_tensor(config, path)
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


def notice(message: str, enabled: bool) -> None:
    """A load step the user should see without any logging set-up: one line on stderr when
    ``enabled`` (the loaders' ``progress``; through ``tqdm.write`` so bars stay intact), and
    always at INFO on the ``dsbd_jax`` logger."""
    logging.getLogger("dsbd_jax").info(message)
    if enabled:
        from tqdm.auto import tqdm
        tqdm.write(f"dsbd_jax: {message}", file=sys.stderr)


def _progress(iterable, total, desc, enabled):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, file=sys.stderr, unit="tensor", leave=False)


def assemble_params(config: ModelConfig, get: Callable[[str, Optional[int]], np.ndarray],
                    dtype, save_dir: Optional[Path] = None, progress: bool = False,
                    desc: str = "converting", place: Optional[Placer] = None) -> Dict[str, Any]:
    """Build the parameter pytree from a tensor getter.

    ``get(hf_name, layer)`` returns the tensor ``hf_name`` (``{i}`` replaced by ``layer``) in HF
    layout as a numpy array. Each stacked parameter is assembled on the host, optionally saved
    as ``<save_dir>/<path>.npy`` (float32, or in ``dtype`` when that is a 16-bit float: half the
    disk; bfloat16 as its 16-bit pattern, :func:`save_host`), converted to ``dtype``, put on the
    device (or placed by ``place(path, host, dtype)``, e.g. onto this process's shards of a
    mesh) and dropped from the host before the next one.
    """
    place = place or _to_device
    dtype = jnp.dtype(dtype)
    shapes = param_shapes(config)
    params: Dict[str, Any] = {}
    for path in _progress(list(shapes), len(shapes), desc, progress):
        hf_name, transpose = hf_tensor(config, path)
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
            save_host(save_dir / f"{path_name(path)}.npy", host, dtype)
        _set_path(params, path, place(path, host, dtype))
        del host
    return params


def save_host(path: Path, host: np.ndarray, dtype) -> None:
    """Write a parameter to a ``.npy`` file: float32 for a float32 model, else in the model's
    16-bit dtype (bfloat16, which numpy's format does not know, as its uint16 bit pattern;
    :func:`load_host` reads either back); an integer ``dtype`` (an int8 kernel's codes) writes
    the integers as they are."""
    dtype = jnp.dtype(dtype)
    if not jnp.issubdtype(dtype, jnp.floating):   # integer arrays (int8 codes) as they are
        host = np.asarray(host, dtype)
    elif dtype.itemsize == 2:
        host = np.asarray(jnp.asarray(host).astype(dtype))
        if dtype == jnp.bfloat16:
            host = host.view(np.uint16)
    else:
        host = np.asarray(host, np.float32)
    np.save(path, host)


def load_host(path: Path) -> np.ndarray:
    """A parameter written by :func:`save_host`, memory-mapped (bfloat16 from its bit pattern)."""
    host = np.load(path, mmap_mode="r")
    return host.view(jnp.bfloat16) if host.dtype == np.uint16 else host


# place(path, host [shape], dtype) -> the parameter as a jax.Array (``path``: the stacked-layout
# key tuple, e.g. ("layers", "mlp", "up_proj", "kernel"))
Placer = Callable[[Tuple[str, ...], np.ndarray, Any], jax.Array]


def _to_device(path, host: np.ndarray, dtype) -> jax.Array:
    """Copy to the device; a dtype change happens there (XLA converts far faster than numpy).
    A read-only array (a memory-mapped cache file) is handed over as it is: on the CPU the
    device buffer aliases the mapped file, so a cached load reads no bytes until a pass does."""
    x = jnp.asarray(host) if host.flags.writeable else jax.device_put(host)
    return x if x.dtype == dtype else x.astype(dtype)


# ---------------------------------------------------------------------------------------------
# config (de)serialisation for caches

def config_to_json(config: ModelConfig) -> Dict[str, Any]:
    d = dataclasses.asdict(config)
    d.pop("dtype")
    if d["rope_scaling"] is not None:
        d["rope_scaling"] = [list(kv) for kv in d["rope_scaling"]]
    if d["eos_token_id"] is not None:
        d["eos_token_id"] = list(d["eos_token_id"])
    if d["layer_types"] is not None:
        d["layer_types"] = list(d["layer_types"])
    return d


def config_from_json(d: Dict[str, Any], dtype: str = "float32") -> ModelConfig:
    d = dict(d)
    if d.get("rope_scaling") is not None:
        d["rope_scaling"] = tuple(
            (k, tuple(v) if isinstance(v, list) else v) for k, v in d["rope_scaling"])
    if d.get("eos_token_id") is not None:
        d["eos_token_id"] = tuple(d["eos_token_id"])
    if d.get("layer_types") is not None:
        d["layer_types"] = tuple(d["layer_types"])
    return ModelConfig(dtype=dtype, **d)


def convert_saved_params(src: Path, dst: Path, config: ModelConfig, dtype,
                         place: Optional[Placer] = None) -> Dict[str, Any]:
    """Parameters saved in ``src`` (float32) written again to ``dst`` in ``dtype``
    (:func:`save_host`) one at a time, and returned in ``dtype`` (on the device, or placed by
    ``place`` as in :func:`assemble_params`)."""
    place = place or _to_device
    params: Dict[str, Any] = {}
    for path, shape in param_shapes(config).items():
        host = load_host(src / f"{path_name(path)}.npy")
        if tuple(host.shape) != shape:
            raise ValueError(f"cached {path_name(path)} has shape {host.shape}, expected {shape}; "
                             f"delete {src} to rebuild it")
        save_host(dst / f"{path_name(path)}.npy", host, dtype)
        _set_path(params, path, place(path, host, jnp.dtype(dtype)))
        del host
    return params


def load_saved_params(directory: Path, config: ModelConfig, dtype,
                      place: Optional[Placer] = None) -> Dict[str, Any]:
    """Parameters written by ``assemble_params(save_dir=...)`` (memory-mapped, one at a time;
    ``place``: as in :func:`assemble_params`)."""
    place = place or _to_device
    shapes = param_shapes(config)
    params: Dict[str, Any] = {}
    for path, shape in shapes.items():
        host = load_host(directory / f"{path_name(path)}.npy")
        if tuple(host.shape) != shape:
            raise ValueError(f"cached {path_name(path)} has shape {host.shape}, expected {shape}; "
                             f"delete {directory} to rebuild it")
        _set_path(params, path, place(path, host, jnp.dtype(dtype)))
        del host
    return params
