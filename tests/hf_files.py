"""Tiny Hugging Face checkpoints written with numpy, no torch: a config (``hf_config``), random
tensors in HF naming and layout (``hf_tensors``) and the safetensors files, sharded or not
(``write_hf``). Shared by the loading, fused-projection and tied-head tests."""

from __future__ import annotations

import json

import numpy as np

L, D, FF, H, K, HD, V = 2, 32, 64, 4, 2, 8, 64


def hf_config(arch="LlamaForCausalLM", **kw):
    cfg = {"architectures": [arch], "model_type": "qwen2" if "Qwen2" in arch else "llama",
           "vocab_size": V, "hidden_size": D, "intermediate_size": FF, "num_hidden_layers": L,
           "num_attention_heads": H, "num_key_value_heads": K, "hidden_act": "silu",
           "rms_norm_eps": 1e-5, "max_position_embeddings": 128, "tie_word_embeddings": False,
           "rope_parameters": {"rope_type": "default", "rope_theta": 5000.0},
           "bos_token_id": 1, "eos_token_id": [2, 3]}
    cfg.update(kw)
    return cfg


def hf_tensors(seed=0, bias=False, tied=False):
    """Random tensors in HF naming/layout ([out, in])."""
    rng = np.random.default_rng(seed)
    r = lambda *s: rng.standard_normal(s).astype(np.float32)  # noqa: E731
    t = {"model.embed_tokens.weight": r(V, D), "model.norm.weight": r(D)}
    if not tied:
        t["lm_head.weight"] = r(V, D)
    for i in range(L):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = r(D)
        t[p + "post_attention_layernorm.weight"] = r(D)
        t[p + "self_attn.q_proj.weight"] = r(H * HD, D)
        t[p + "self_attn.k_proj.weight"] = r(K * HD, D)
        t[p + "self_attn.v_proj.weight"] = r(K * HD, D)
        t[p + "self_attn.o_proj.weight"] = r(D, H * HD)
        if bias:
            for n, rows in (("q", H * HD), ("k", K * HD), ("v", K * HD)):
                t[p + f"self_attn.{n}_proj.bias"] = r(rows)
        t[p + "mlp.gate_proj.weight"] = r(FF, D)
        t[p + "mlp.up_proj.weight"] = r(FF, D)
        t[p + "mlp.down_proj.weight"] = r(D, FF)
    return t


def write_hf(path, config, tensors, shards=1):
    from safetensors.numpy import save_file

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    if shards == 1:
        save_file(tensors, str(path / "model.safetensors"))
        return path
    names = sorted(tensors)
    weight_map = {}
    for s in range(shards):
        fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[s::shards]}
        save_file(part, str(path / fname))
        weight_map.update({n: fname for n in part})
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path
