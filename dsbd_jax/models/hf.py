"""Local Hugging Face checkpoint directories: ``config.json`` -> :class:`ModelConfig`, weights
from ``model.safetensors`` (or a sharded ``model.safetensors.index.json``), the tokenizer.

Architectures: ``LlamaForCausalLM`` and ``Qwen2ForCausalLM`` (:func:`config_from_hf` refuses
options the model does not implement, naming them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Optional, Union

import jax.numpy as jnp
import numpy as np

from dsbd_jax.models.checkpoint import LoadedModel, assemble_params, check_no_unexpected
from dsbd_jax.models.config import ModelConfig

SUPPORTED_HF_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM")
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


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
