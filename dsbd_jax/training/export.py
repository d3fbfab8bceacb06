"""Write a model as a Hugging Face checkpoint directory that ``load_model`` reads back:
``config.json`` (the inverse of :func:`dsbd_jax.loading.hf.config_from_hf`), ``model.safetensors``
(float32, HF tensor names and orientation) and the tokenizer's files when one is given."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np

from dsbd_jax.loading.checkpoint import _PATH_TO_HF
from dsbd_jax.models.config import ModelConfig
from dsbd_jax.models.kinds import unblock_params
from dsbd_jax.models.llama import convert_layout

_ARCH = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}


def hf_config_dict(config: ModelConfig) -> dict:
    """A ``config.json`` dict that ``config_from_hf`` maps back to ``config``."""
    if config.architecture not in _ARCH:
        raise ValueError(f"cannot export architecture {config.architecture!r}")
    d = {"architectures": [_ARCH[config.architecture]], "model_type": config.architecture,
         "vocab_size": config.vocab_size, "hidden_size": config.hidden_size,
         "intermediate_size": config.intermediate_size, "num_hidden_layers": config.num_layers,
         "num_attention_heads": config.num_heads, "num_key_value_heads": config.num_kv_heads,
         "head_dim": config.head_dim, "rms_norm_eps": config.rms_norm_eps,
         "rope_theta": config.rope_theta, "tie_word_embeddings": config.tie_word_embeddings,
         "max_position_embeddings": config.max_position_embeddings, "hidden_act": "silu",
         "bos_token_id": config.bos_token_id, "pad_token_id": config.pad_token_id,
         "eos_token_id": list(config.eos_token_id) if config.eos_token_id else None,
         "torch_dtype": "float32"}
    if config.rope_scaling is not None:
        d["rope_scaling"] = dict(config.rope_scaling)
    if config.architecture == "llama" and config.attention_bias:
        raise ValueError("a llama model with attention biases has no HF equivalent")
    return d


def save_hf(directory, config: ModelConfig, params, tokenizer=None) -> Path:
    """Write ``params`` (either layout; no truncated head) as an HF checkpoint directory."""
    from safetensors.numpy import save_file
    if "vocab_head" in params:
        raise ValueError("export the full model, not one with a truncated head")
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    params = convert_layout(unblock_params(params), "stacked")
    tensors = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        keys = tuple(str(getattr(p, "key", p)) for p in path)
        name, transpose = _PATH_TO_HF[keys]
        x = np.asarray(leaf, np.float32)
        for i, xi in (enumerate(x) if keys[0] == "layers" else [(None, x)]):
            tensors[name.format(i=i)] = np.ascontiguousarray(xi.T if transpose else xi)
    save_file(tensors, str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(hf_config_dict(config), indent=1))
    if tokenizer is not None:
        tokenizer.save_pretrained(str(directory))
    return directory
