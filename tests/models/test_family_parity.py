"""Parity of the family variants (Qwen3, Mistral, Gemma 2, Gemma 3) with ``transformers``.

As ``test_model_parity.py``: tiny random ``transformers`` models (vocab 128, unit-scale weights)
saved with ``save_pretrained`` and loaded by ``load_model``; float32 logits within 1e-4. Every
prompt is longer than the sliding window (4 or 5), so a window applied wrongly (or not at all),
a wrong local/global layer pattern or RoPE base, a missing soft-cap or norm moves the logits by
O(1). Checked per configuration, in BOTH weight layouts: a full pass, a right-padded prefill and
cached one-token steps, and a forest pass whose cached prefix sits at shifted slots (its
positions passed as ``key_positions``, as DSBD's row caches do).
"""

from __future__ import annotations

import numpy as np
import pytest

import jax
import jax.numpy as jnp

from dsbd_jax.decoding import common
from dsbd_jax.models.llama import forward, logits as jax_logits
from dsbd_jax.loading.load import load_model

V = 128
TOL = 1e-4
GEMMA = dict(head_dim=16, query_pre_attn_scalar=24, sliding_window=4)

# name -> (transformers config class, overrides)
CONFIGS = {
    "qwen3_gqa_untied": ("Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=2)),
    "qwen3_mqa_tied": ("Qwen3Config", dict(num_attention_heads=4, num_key_value_heads=1,
                                           tie_word_embeddings=True, head_dim=8)),
    "mistral_window_gqa": ("MistralConfig", dict(num_attention_heads=4, num_key_value_heads=2,
                                                 sliding_window=5)),
    "mistral_window_mha_tied": ("MistralConfig", dict(num_attention_heads=4,
                                                      num_key_value_heads=4, sliding_window=4,
                                                      tie_word_embeddings=True)),
    "mistral_nowindow_mqa": ("MistralConfig", dict(num_attention_heads=4, num_key_value_heads=1,
                                                   sliding_window=None)),
    "gemma2_gqa_softcap": ("Gemma2Config", dict(GEMMA, num_attention_heads=4,
                                                num_key_value_heads=2, attn_logit_softcapping=3.0,
                                                final_logit_softcapping=4.0)),
    "gemma2_mqa": ("Gemma2Config", dict(GEMMA, num_attention_heads=4, num_key_value_heads=1,
                                        num_hidden_layers=3)),
    "gemma3_gqa": ("Gemma3TextConfig", dict(GEMMA, num_attention_heads=4, num_key_value_heads=2,
                                            num_hidden_layers=3,
                                            layer_types=["sliding_attention", "full_attention",
                                                         "sliding_attention"],
                                            rope_parameters={
                                                "full_attention": {"rope_type": "linear",
                                                                   "factor": 4.0,
                                                                   "rope_theta": 100000.0},
                                                "sliding_attention": {"rope_type": "default",
                                                                      "rope_theta": 50.0}})),
    "gemma3_mha_softcap": ("Gemma3TextConfig", dict(GEMMA, num_attention_heads=2,
                                                    num_key_value_heads=2,
                                                    final_logit_softcapping=4.0,
                                                    attn_logit_softcapping=3.0)),
}


def make_torch_model(torch, cls_name, overrides, seed):
    import transformers

    kw = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              max_position_embeddings=256, rms_norm_eps=1e-5, tie_word_embeddings=False,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)
    if cls_name.startswith("Gemma"):
        kw["tie_word_embeddings"] = True
    kw.update(overrides)
    cfg = getattr(transformers, cls_name)(**kw)
    cfg._attn_implementation = "eager"
    model = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if "norm" in name:
                p.copy_(0.2 * r + (0.0 if cls_name.startswith("Gemma") else 1.0))
            elif "embed_tokens" in name:
                p.copy_(0.7 * r)
            else:
                p.copy_(r / np.sqrt(p.shape[1]))
    model.tie_weights()
    return model.eval()


def torch_logits(torch, model, ids):
    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(ids), dtype=torch.long)).logits.float().numpy()


def _max_diff(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def case(request, torch, tmp_path_factory):
    name = request.param
    cls_name, overrides = CONFIGS[name]
    model = make_torch_model(torch, cls_name, overrides, seed=len(name))
    path = tmp_path_factory.mktemp(name)
    model.save_pretrained(str(path))
    loaded = {lay: load_model(path, jnp.float32, progress=False, layout=lay)
              for lay in ("stacked", "per_layer")}
    return name, model, loaded, path


def test_config_switches(case):
    name, model, loaded, _ = case
    c = loaded["stacked"].config
    hf = model.config
    assert c.num_heads == hf.num_attention_heads and c.num_kv_heads == hf.num_key_value_heads
    assert c.tie_word_embeddings == bool(hf.tie_word_embeddings)
    assert c.qk_norm == (name.startswith("qwen3") or name.startswith("gemma3"))
    gemma = name.startswith("gemma")
    assert (c.norm_style == "gemma") == gemma and c.sandwich_norms == gemma
    assert c.embed_scale == gemma and (c.hidden_act == "gelu_tanh") == gemma
    window = getattr(hf, "sliding_window", None)
    assert c.sliding_window == window
    if gemma:
        assert c.layer_types == tuple(hf.layer_types)
        assert c.query_pre_attn_scalar == 24
    if name.startswith("gemma2"):
        assert c.attn_logit_softcap == hf.attn_logit_softcapping
    if name.startswith("gemma3"):  # transformers' Gemma 3 does not apply it
        assert c.attn_logit_softcap is None
        assert c.rope_local_theta == hf.rope_parameters["sliding_attention"]["rope_theta"]


def test_full_pass_both_layouts(case, torch):
    name, model, loaded, _ = case
    ids = np.random.default_rng(1).integers(0, V, size=(2, 13))  # longer than every window
    want = torch_logits(torch, model, ids)
    assert np.std(want) > 0.3
    for lay, m in loaded.items():
        diff = _max_diff(jax_logits(m.config, m.params, ids), want)
        assert diff <= TOL, f"{name} ({lay}): max abs diff {diff:.3g}"


def test_prefill_and_cached_steps_both_layouts(case, torch):
    name, model, loaded, _ = case
    rng = np.random.default_rng(3)
    lens = np.array([6, 11], np.int32)
    steps = 5
    seqs = [rng.integers(0, V, size=n + steps) for n in lens]
    want = [torch_logits(torch, model, s[None])[0] for s in seqs]
    P = int(lens.max())
    prompt = np.zeros((2, P), np.int32)
    for r, n in enumerate(lens):
        prompt[r, :n] = seqs[r][:n]
    for lay, m in loaded.items():
        cfg, params = m.config, m.params
        cache, last = common.prefill(cfg, params, jnp.asarray(prompt), jnp.asarray(lens),
                                     P + steps + 2)
        got = [[np.asarray(last[r])] for r in range(2)]
        lengths = jnp.asarray(lens)
        for i in range(steps):
            tok = jnp.asarray([seqs[r][lens[r] + i] for r in range(2)], jnp.int32)
            out, cache = common.decode_step(cfg, params, cache, tok, lengths)
            lengths = lengths + 1
            for r in range(2):
                got[r].append(np.asarray(out[r]))
        for r, n in enumerate(lens):
            diff = _max_diff(np.stack(got[r]), want[r][n - 1: n + steps])
            assert diff <= TOL, f"{name} ({lay}): row {r} cached steps max abs diff {diff:.3g}"


def test_forest_pass_with_shifted_slots(case, torch):
    """Forest attention under the window: the 7-token prefix lies at slots 3..9 of a 12-slot
    cache (positions 0..6 passed as key_positions); nodes up to depth 3 (positions up to 10)."""
    name, model, loaded, _ = case
    rng = np.random.default_rng(4)
    prefix = rng.integers(0, V, size=7)
    parents = [-1, 3, 0, 0, 1, -1, 5, 2, 6, 4]
    tokens = rng.integers(0, V, size=len(parents))
    N, slots, shift = len(parents), 12, 3
    anc = np.eye(N, dtype=bool)
    depth = np.zeros(N, np.int32)
    for j in range(N):
        p = parents[j]
        while p != -1:
            anc[j, p] = True
            depth[j] += 1
            p = parents[p]
    mask = np.zeros((N, slots + N), bool)
    mask[:, shift:shift + 7] = True
    mask[:, slots:] = anc
    key_pos = np.full(slots, 99, np.int32)  # unused slots: far away (and masked anyway)
    key_pos[shift:shift + 7] = np.arange(7)
    for lay, m in loaded.items():
        cfg, params = m.config, m.params
        pre, _ = common.prefill(cfg, params, jnp.asarray(prefix[None], jnp.int32),
                                jnp.asarray([7], jnp.int32), slots)
        cache = jax.tree.map(lambda x: jnp.roll(x, shift, axis=2), pre)  # slots 3..9
        out, _ = forward(cfg, params, jnp.asarray(tokens[None], jnp.int32),
                         jnp.asarray((7 + depth)[None]), jnp.asarray(mask[None]), cache,
                         key_positions=jnp.asarray(key_pos[None]))
        out = np.asarray(out[0])
        for j in range(N):
            path, k = [], j
            while k != -1:
                path.append(tokens[k])
                k = parents[k]
            seq = np.concatenate([prefix, path[::-1]])
            diff = _max_diff(out[j], torch_logits(torch, model, seq[None])[0, -1])
            assert diff <= TOL, f"{name} ({lay}): forest node {j} max abs diff {diff:.3g}"


def test_unsupported_options_fail_in_one_line():
    from dsbd_jax.loading.hf import config_from_hf

    base = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2)
    cases = {
        "use_sliding_window": dict(architectures=["Qwen3ForCausalLM"], use_sliding_window=True),
        "attention_bias": dict(architectures=["Qwen3ForCausalLM"], attention_bias=True),
        "use_bidirectional_attention": dict(architectures=["Gemma3ForCausalLM"],
                                            use_bidirectional_attention=True),
        "hidden_act": dict(architectures=["MistralForCausalLM"], hidden_act="relu"),
        "Gemma3ForConditionalGeneration": dict(architectures=["Gemma3ForConditionalGeneration"]),
    }
    for word, extra in cases.items():
        with pytest.raises(ValueError, match=word) as err:
            config_from_hf({**base, **extra})
        assert "\n" not in str(err.value)


def test_bfloat16_load_close(case, torch):
    """bfloat16 weights and compute vs transformers in float32: close at the logit scale (the
    same bound as test_model_parity's; a wrong weight or norm would be O(100%))."""
    name, model, _, path = case
    m = load_model(path, jnp.bfloat16, progress=False)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(m.params))
    ids = np.random.default_rng(2).integers(0, V, size=(2, 13))
    want = torch_logits(torch, model, ids)
    got = np.asarray(jax_logits(m.config, m.params, ids))
    scale = float(np.max(np.abs(want)))
    diff = _max_diff(got, want)
    assert diff <= 0.04 * scale, f"{name}: bf16 max abs diff {diff:.3g} (logit scale {scale:.3g})"
    assert np.mean(got.argmax(-1) == want.argmax(-1)) >= 0.75


# ---------------------------------------------------------------------------------------------
# GGUF gemma3, written as llama.cpp's convert_hf_to_gguf.py does (norms stored as 1 + w)
GEMMA3_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def test_gemma3_gguf_matches_torch(torch, tmp_path):
    """A float32 gemma3 GGUF of a tiny Gemma 3 with llama.cpp's hard-coded choices (every 6th
    layer global, local RoPE base 10000, query scale head_dim) loads to the torch logits; the
    13-token prompt is longer than the window of 4."""
    import gguf

    model = make_torch_model(torch, "Gemma3TextConfig", dict(
        head_dim=16, query_pre_attn_scalar=16, sliding_window=4, num_attention_heads=4,
        num_key_value_heads=2, num_hidden_layers=6), seed=3)
    cfg = model.config
    assert cfg.layer_types[:6] == ["sliding_attention"] * 5 + ["full_attention"]
    w = gguf.GGUFWriter(str(tmp_path / "g3.gguf"), "gemma3")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(16)
    w.add_value_length(16)
    w.add_rope_freq_base(float(cfg.rope_parameters["full_attention"]["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_sliding_window(4)
    w.add_eos_token_id(2)
    for name, t in model.state_dict().items():
        if name == "lm_head.weight":
            continue
        a = t.detach().float().numpy().copy()
        if name.startswith("model.layers."):
            _, _, layer, rest = name.split(".", 3)
            gname = f"blk.{layer}.{GEMMA3_GGUF[rest]}"
        else:
            gname = GEMMA3_GGUF[name]
        w.add_tensor(gname, a + 1.0 if gname.endswith("norm.weight") else a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    loaded = load_model(tmp_path / "g3.gguf", progress=False)
    assert loaded.config.architecture == "gemma3" and loaded.config.sliding_window == 4
    ids = np.random.default_rng(6).integers(0, V, size=(2, 13))
    diff = _max_diff(jax_logits(loaded.config, loaded.params, ids), torch_logits(torch, model, ids))
    assert diff <= TOL, f"gemma3 GGUF: max abs diff {diff:.3g}"
