"""Local Hugging Face checkpoint directories: ``config.json`` -> :class:`ModelConfig`, weights
from ``model.safetensors`` (or a sharded ``model.safetensors.index.json``), the tokenizer.

Architectures: :data:`SUPPORTED_HF_ARCHITECTURES` (Llama, Qwen2, Qwen3, Mistral, Gemma 2,
Gemma 3 text), each a set of :class:`ModelConfig` switches on the one model;
:func:`config_from_hf` refuses options the model does not implement, naming them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, Optional, Union

import jax.numpy as jnp
import numpy as np

from dsbd_jax.loading.checkpoint import LoadedModel, assemble_params, check_no_unexpected
from dsbd_jax.models.config import ModelConfig

SUPPORTED_HF_ARCHITECTURES = ("LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                              "MistralForCausalLM", "Gemma2ForCausalLM", "Gemma3ForCausalLM")
_MODEL_TYPES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                "qwen3": "Qwen3ForCausalLM", "mistral": "MistralForCausalLM",
                "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM"}
_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_tanh": "gelu_tanh"}
_ROPE_NEEDS = {"default": (), "linear": ("factor",),
               "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                          "original_max_position_embeddings")}


def _rope(rope: Dict[str, Any], default_theta: float):
    """``(theta, frozen rope_scaling)`` from a HF rope dict (errors for unsupported types)."""
    rope = dict(rope or {})
    theta = float(rope.pop("rope_theta", default_theta))
    if "type" in rope and "rope_type" not in rope:
        rope["rope_type"] = rope.pop("type")
    rope_type = rope.get("rope_type", "default")
    if rope_type not in _ROPE_NEEDS:
        raise ValueError(f"unsupported rope_scaling rope_type {rope_type!r}; supported: "
                         f"{', '.join(_ROPE_NEEDS)}")
    lacking = [k for k in _ROPE_NEEDS[rope_type] if k not in rope]
    if lacking:
        raise ValueError(f"rope_scaling of type {rope_type!r} lacks {lacking}")
    rope = {k: rope[k] for k in ("rope_type",) + _ROPE_NEEDS[rope_type] if k in rope}
    return theta, ModelConfig.freeze_rope_scaling(rope)


def _family(arch: str, hf: Dict[str, Any]) -> Dict[str, Any]:
    """The :class:`ModelConfig` switches of one architecture (module doc of ``config``)."""
    gemma = arch in ("Gemma2ForCausalLM", "Gemma3ForCausalLM")
    if arch == "Qwen2ForCausalLM" and hf.get("use_sliding_window", False):
        raise ValueError("unsupported option use_sliding_window=true (Qwen2 sliding-window "
                         "attention is not implemented)")
    if arch == "Qwen3ForCausalLM" and hf.get("use_sliding_window", False):
        raise ValueError("unsupported option use_sliding_window=true (Qwen3 sliding-window "
                         "attention is not implemented)")
    if arch != "Qwen2ForCausalLM" and hf.get("attention_bias", False):
        raise ValueError(f"unsupported option attention_bias=true for {arch} (it also adds an "
                         f"o_proj bias, which the model does not implement)")
    if hf.get("use_bidirectional_attention"):
        raise ValueError("unsupported option use_bidirectional_attention=true")
    out: Dict[str, Any] = dict(
        architecture={"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2",
                      "Qwen3ForCausalLM": "qwen3", "MistralForCausalLM": "mistral",
                      "Gemma2ForCausalLM": "gemma2", "Gemma3ForCausalLM": "gemma3"}[arch],
        attention_bias=arch == "Qwen2ForCausalLM",  # Qwen2 always has q/k/v biases
        qk_norm=arch in ("Qwen3ForCausalLM", "Gemma3ForCausalLM"))
    if arch == "MistralForCausalLM" and hf.get("sliding_window") is not None:
        out["sliding_window"] = int(hf["sliding_window"])
    if gemma:
        # transformers' Gemma 3 attention never applies attn_logit_softcapping (and the released
        # configs set it to null): follow the reference
        cap = hf.get("attn_logit_softcapping") if arch == "Gemma2ForCausalLM" else None
        final = hf.get("final_logit_softcapping")
        out.update(norm_style="gemma", sandwich_norms=True, embed_scale=True,
                   query_pre_attn_scalar=float(hf.get("query_pre_attn_scalar", 256)),
                   attn_logit_softcap=None if cap is None else float(cap),
                   final_logit_softcap=None if final is None else float(final))
        window = hf.get("sliding_window")
        types = hf.get("layer_types")
        if window is not None:
            out["sliding_window"] = int(window)
            n = int(hf["num_hidden_layers"])
            if types is None:  # the configs' defaults: every 2nd (Gemma 2) / 6th (Gemma 3) global
                every = 2 if arch == "Gemma2ForCausalLM" else int(
                    hf.get("sliding_window_pattern", 6))
                types = ["sliding_attention" if (i + 1) % every else "full_attention"
                         for i in range(n)]
            out["layer_types"] = tuple(types)
    return out


def config_from_hf(hf: Dict[str, Any], dtype: str = "float32") -> ModelConfig:
    """Map a Hugging Face ``config.json`` dict to :class:`ModelConfig` (errors for what the
    model does not implement)."""
    archs = hf.get("architectures") or []
    arch = archs[0] if archs else _MODEL_TYPES.get(hf.get("model_type"), hf.get("model_type"))
    if len(archs) > 1 or arch not in SUPPORTED_HF_ARCHITECTURES:
        raise ValueError(f"unsupported architecture {archs or arch!r}; supported: "
                         f"{', '.join(SUPPORTED_HF_ARCHITECTURES)}")
    act = hf.get("hidden_activation") or hf.get("hidden_act", "silu")
    if act not in _ACTIVATIONS:
        raise ValueError(f"unsupported hidden_act {act!r}; implemented: {', '.join(_ACTIVATIONS)}")
    if hf.get("mlp_bias", False):
        raise ValueError("unsupported option mlp_bias=true (the MLP has no biases here)")
    if float(hf.get("partial_rotary_factor", 1.0)) != 1.0:
        raise ValueError(f"unsupported option partial_rotary_factor={hf['partial_rotary_factor']}")
    family = _family(arch, hf)
    # transformers >= 5 writes rope_parameters (with rope_theta inside; Gemma 3: one dict per
    # layer type); older configs have rope_theta / rope_scaling / rope_local_base_freq on top.
    rope = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
    local_theta = hf.get("rope_local_base_freq")
    if "full_attention" in rope or "sliding_attention" in rope:
        local = rope.get("sliding_attention") or {}
        if local.get("rope_type", "default") != "default":
            raise ValueError(f"unsupported rope_type {local['rope_type']!r} for sliding layers")
        local_theta = local.get("rope_theta", local_theta)
        rope = dict(rope.get("full_attention") or {})
    theta, scaling = _rope(rope, float(hf.get("rope_theta", 10000.0)))
    if arch == "Gemma3ForCausalLM":
        family["rope_local_theta"] = float(local_theta if local_theta is not None else 10000.0)
    heads = int(hf["num_attention_heads"])
    hidden = int(hf["hidden_size"])
    head_dim = hf.get("head_dim") or hidden // heads
    eos = hf.get("eos_token_id")
    if isinstance(eos, int):
        eos = (eos,)
    elif eos is not None:
        eos = tuple(int(e) for e in eos)
    tied = hf.get("tie_word_embeddings", arch.startswith("Gemma"))
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
        rope_scaling=scaling,
        tie_word_embeddings=bool(tied),
        max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
        dtype=dtype,
        hidden_act=_ACTIVATIONS[act],
        bos_token_id=hf.get("bos_token_id"),
        eos_token_id=eos or None,
        pad_token_id=hf.get("pad_token_id"),
        **family,
    )


class _SafetensorsSource:
    """All tensors of a (possibly sharded) safetensors checkpoint, read one at a time.

    Each read opens its file for that tensor only: ``safe_open`` memory-maps the file, and the
    pages a read touches stay in the process's RSS while the map lives, so one long-lived
    handle would end a load holding the whole file besides the parameters (measured:
    ``benchmarks/load_memory.py``)."""

    def __init__(self, directory: Path):
        from safetensors import safe_open

        index = directory / "model.safetensors.index.json"
        single = directory / "model.safetensors"
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
        elif single.exists():
            with safe_open(str(single), framework="numpy") as f:
                weight_map = {k: "model.safetensors" for k in f.keys()}
        else:
            raise FileNotFoundError(
                f"{directory} has neither model.safetensors nor model.safetensors.index.json")
        self.directory = directory
        self.weight_map = weight_map

    def get(self, hf_name: str, layer: Optional[int] = None) -> np.ndarray:
        from safetensors import safe_open

        name = hf_name.format(i=layer)
        if name not in self.weight_map:
            raise ValueError(f"checkpoint lacks tensor {name!r}")
        with safe_open(str(self.directory / self.weight_map[name]), framework="numpy") as f:
            return f.get_tensor(name)

    def close(self):
        pass


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
                       progress: bool = False, place=None) -> LoadedModel:
    """Load a local Hugging Face checkpoint directory (see module docstring). ``place``: where
    each tensor goes (``checkpoint.assemble_params``)."""
    directory = Path(directory)
    config = hf_config(directory, jnp.dtype(dtype).name)
    source = _SafetensorsSource(directory)
    try:
        check_no_unexpected(source.weight_map, config, f"checkpoint {directory}")
        params = assemble_params(config, source.get, dtype, progress=progress,
                                 desc=f"loading {directory.name}", place=place)
    finally:
        source.close()
    tok = hf_tokenizer(directory, required=tokenizer is True) if tokenizer else None
    return LoadedModel(config, params, tok, str(directory))
