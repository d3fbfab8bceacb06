"""Parity of the Flax model with ``transformers`` (penzai / levanter style).

Tiny random ``transformers`` checkpoints (vocab 128, 2 layers) are built with torch, saved with
``save_pretrained`` into ``tmp_path`` and loaded by ``dsbd_jax.loading.load.load_model``. Weights are
re-drawn at unit scale (not HF's 0.02 init) and biases are non-zero, so attention patterns,
RoPE and biases change the logits by O(1): a wrong rotation, a dropped bias, a wrong GQA head
mapping or a wrong mask moves them by far more than the 1e-4 float32 tolerance.

Checked per configuration (MHA, GQA, MQA, tied/untied, llama3 and linear RoPE scaling, explicit
head_dim != hidden/heads, Qwen2 with biases, sharded safetensors):
  * float32 full-pass logits vs torch (max abs diff <= 1e-4);
  * bfloat16 load vs torch float32 (loose tolerance);
  * prefill + token-by-token decode with the KV cache vs torch on each row alone;
  * one forest pass (branches sharing a cached prefix, arbitrary parent order, depth positions,
    ancestor mask) vs torch on each node's root-to-node path alone.
Tiny GGUF files (llama with llama.cpp's q/k permutation, qwen2) written with ``gguf.GGUFWriter``
are checked against the original torch model and against transformers' own GGUF loading.
"""

from __future__ import annotations

import numpy as np
import pytest

import chex
import jax
import jax.numpy as jnp

from dsbd_jax.decoding import common
from dsbd_jax.loading.load import load_model
from dsbd_jax.models.llama import forward, logits as jax_logits

V = 128
TOL = 1e-4

# name -> (architecture, config overrides, save_pretrained max_shard_size or None)
CONFIGS = {
    "llama_mha_untied": ("llama", dict(num_attention_heads=4, num_key_value_heads=4), None),
    "llama_gqa_tied": ("llama", dict(num_attention_heads=4, num_key_value_heads=2,
                                     tie_word_embeddings=True), None),
    "llama_mqa_headdim8": ("llama", dict(num_attention_heads=4, num_key_value_heads=1,
                                         head_dim=8), None),
    "llama3_rope_gqa": ("llama", dict(num_attention_heads=4, num_key_value_heads=2,
                                      rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                                    "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                                    "original_max_position_embeddings": 32}),
                        None),
    "linear_rope_sharded": ("llama", dict(num_attention_heads=4, num_key_value_heads=2,
                                          rope_scaling={"rope_type": "linear", "factor": 4.0}),
                            "40KB"),
    "qwen2_bias_gqa": ("qwen2", dict(num_attention_heads=4, num_key_value_heads=2), None),
    "qwen2_bias_mqa_tied": ("qwen2", dict(num_attention_heads=4, num_key_value_heads=1,
                                          tie_word_embeddings=True), None),
}


def hf_config(arch, **overrides):
    from transformers import LlamaConfig, Qwen2Config

    kw = dict(vocab_size=V, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              max_position_embeddings=256, rms_norm_eps=1e-5, rope_theta=10000.0,
              tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    kw.update(overrides)
    if arch == "qwen2":
        kw["use_sliding_window"] = False
        return Qwen2Config(**kw)
    return LlamaConfig(**kw)


def randomize_(torch, model, seed=0):
    """Unit-scale weights, norms around 1, clearly non-zero biases."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if "norm" in name:
                p.copy_(1.0 + 0.2 * r)
            elif name.endswith("bias"):
                p.copy_(0.5 * r)
            elif "embed_tokens" in name:
                p.copy_(0.7 * r)
            else:
                p.copy_(r / np.sqrt(p.shape[1]))
    return model


def make_torch_model(torch, arch, overrides, seed=0):
    from transformers import AutoModelForCausalLM

    cfg = hf_config(arch, **overrides)
    cfg._attn_implementation = "eager"
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    randomize_(torch, model, seed)
    model.tie_weights()
    return model.eval()


def torch_logits(torch, model, ids):
    with torch.no_grad():
        return model(torch.as_tensor(np.asarray(ids), dtype=torch.long)).logits.float().numpy()


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def case(request, torch, tmp_path_factory):
    """(name, torch model, LoadedModel float32, checkpoint dir) for one configuration."""
    name = request.param
    arch, overrides, shard = CONFIGS[name]
    model = make_torch_model(torch, arch, overrides, seed=len(name))
    path = tmp_path_factory.mktemp(name)
    kw = {"max_shard_size": shard} if shard else {}
    model.save_pretrained(str(path), **kw)
    if shard:
        assert (path / "model.safetensors.index.json").exists()
        assert len(list(path.glob("model-*.safetensors"))) > 2
    loaded = load_model(path, jnp.float32, progress=False)
    return name, model, loaded, path


def _max_diff(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64))))


def test_config_mapping(case):
    name, model, loaded, _ = case
    c, hf = loaded.config, model.config
    assert (c.vocab_size, c.hidden_size, c.num_layers) == (V, 64, 2)
    assert c.num_heads == hf.num_attention_heads and c.num_kv_heads == hf.num_key_value_heads
    assert c.head_dim == getattr(hf, "head_dim", 64 // hf.num_attention_heads)
    assert c.tie_word_embeddings == bool(hf.tie_word_embeddings)
    assert ("lm_head" in loaded.params) == (not c.tie_word_embeddings)
    assert c.attention_bias == name.startswith("qwen2")
    assert c.eos_token_id == (2,)


def test_float32_logits_match_torch(case, torch):
    name, model, loaded, _ = case
    ids = np.random.default_rng(1).integers(0, V, size=(2, 12))
    want = torch_logits(torch, model, ids)
    got = np.asarray(jax_logits(loaded.config, loaded.params, ids))
    chex.assert_shape([got, want], (2, 12, V))
    assert np.std(want) > 0.5  # non-trivial logits, so the tolerance means something
    diff = _max_diff(got, want)
    assert diff <= TOL, f"{name}: max abs diff {diff:.3g}"


def test_bfloat16_load_close(case, torch):
    name, model, _, path = case
    loaded = load_model(path, jnp.bfloat16, progress=False)
    assert loaded.config.dtype == "bfloat16"
    chex.assert_type(jax.tree.leaves(loaded.params), jnp.bfloat16)
    ids = np.random.default_rng(2).integers(0, V, size=(2, 12))
    want = torch_logits(torch, model, ids)
    got = np.asarray(jax_logits(loaded.config, loaded.params, ids))
    scale = float(np.max(np.abs(want)))
    diff = _max_diff(got, want)
    # measured: 0.9-1.4% of the logit scale; a wrong weight would be O(100%)
    assert diff <= 0.04 * scale, f"{name}: bf16 max abs diff {diff:.3g} (logit scale {scale:.3g})"
    agree = np.mean(got.argmax(-1) == want.argmax(-1))  # measured >= 0.92 (random near-ties)
    assert agree >= 0.75, f"{name}: bf16 argmax agreement {agree:.2f}"


@pytest.mark.parametrize("form", [None, "transposed"])
def test_bfloat16_matches_transformers_bfloat16(case, torch, form):
    """Ours in bfloat16 (16-bit weights, float32 accumulation and activations; plain kernels,
    or every projection and an untied head as ``[out, in]`` rows) against transformers with the
    model in bfloat16 (16-bit activations too). Measured: 0.6-1.2% of the logit scale apart
    (transformers' bfloat16 is 0.7-1.3% from its float32, ours 0.5-0.9%), argmax agreement
    0.96-1.0 (random near-ties); tolerance 2.5% and 0.9. A wrong weight is O(100%)."""
    import copy
    name, model, _, path = case
    loaded = load_model(path, jnp.bfloat16, progress=False, kernel_blocks=form)
    assert loaded.info["dtype"] == "bfloat16"
    assert loaded.info["head_transposed"] == (form is not None
                                              and not loaded.config.tie_word_embeddings)
    ids = np.random.default_rng(2).integers(0, V, size=(2, 12))
    want = torch_logits(torch, copy.deepcopy(model).to(torch.bfloat16), ids)
    got = np.asarray(jax_logits(loaded.config, loaded.params, ids))
    assert got.dtype == np.float32
    scale = float(np.max(np.abs(want)))
    diff = _max_diff(got, want)
    assert diff <= 0.025 * scale, f"{name}: max abs diff {diff:.3g} (logit scale {scale:.3g})"
    agree = np.mean(got.argmax(-1) == want.argmax(-1))
    assert agree >= 0.9, f"{name}: argmax agreement {agree:.2f}"


def test_kv_cache_decode_matches_full_pass(case, torch):
    """Right-padded prefill of two prompts of different lengths, then 6 single-token steps."""
    name, model, loaded, _ = case
    cfg, params = loaded.config, loaded.params
    rng = np.random.default_rng(3)
    lens = np.array([4, 9], np.int32)
    steps = 6
    seqs = [rng.integers(0, V, size=n + steps) for n in lens]
    want = [torch_logits(torch, model, s[None])[0] for s in seqs]  # each row alone
    P = int(lens.max())
    prompt = np.zeros((2, P), np.int32)
    for r, n in enumerate(lens):
        prompt[r, :n] = seqs[r][:n]
    cache, last = jax.jit(common.prefill, static_argnums=(0, 4))(
        cfg, params, jnp.asarray(prompt), jnp.asarray(lens), P + steps + 3)
    step = jax.jit(common.decode_step, static_argnums=0)
    got = [[np.asarray(last[r])] for r in range(2)]
    lengths = jnp.asarray(lens)
    for i in range(steps):
        tok = jnp.asarray([seqs[r][lens[r] + i] for r in range(2)], jnp.int32)
        out, cache = step(cfg, params, cache, tok, lengths)
        lengths = lengths + 1
        for r in range(2):
            got[r].append(np.asarray(out[r]))
    for r, n in enumerate(lens):
        ref = want[r][n - 1: n + steps]
        diff = _max_diff(np.stack(got[r]), ref)
        assert diff <= TOL, f"{name}: row {r} decode max abs diff {diff:.3g}"


def forest_inputs(parents, prefix_len, slots):
    """Depth positions ``[N]`` and mask ``[N, slots + N]`` for a forest hanging off a prefix.

    ``parents[j]`` is node j's parent node or -1 (child of the prefix's last token); any order.
    Node j attends to the prefix slots and to its ancestors and itself; unused slots are masked.
    """
    N = len(parents)
    anc = np.eye(N, dtype=bool)
    depth = np.zeros(N, np.int32)
    for j in range(N):
        p = parents[j]
        while p != -1:
            anc[j, p] = True
            depth[j] += 1
            p = parents[p]
    mask = np.zeros((N, slots + N), bool)
    mask[:, :prefix_len] = True
    mask[:, slots:] = anc
    return prefix_len + depth, mask


def path_tokens(parents, tokens, j):
    path = []
    while j != -1:
        path.append(tokens[j])
        j = parents[j]
    return path[::-1]


def test_forest_pass_matches_each_path_alone(case, torch):
    name, model, loaded, _ = case
    cfg, params = loaded.config, loaded.params
    rng = np.random.default_rng(4)
    prefix = rng.integers(0, V, size=7)
    # two roots (0 and 5), branches of different depths, children listed before parents
    parents = [-1, 3, 0, 0, 1, -1, 5, 2, 6, 4]
    tokens = rng.integers(0, V, size=len(parents))
    slots = 12  # 7 prefix slots + 5 unused (masked) ones
    cache, _ = common.prefill(cfg, params, jnp.asarray(prefix[None], jnp.int32),
                              jnp.asarray([7], jnp.int32), slots)
    pos, mask = forest_inputs(parents, 7, slots)
    out, new = forward(cfg, params, jnp.asarray(tokens[None], jnp.int32),
                       jnp.asarray(pos[None]), jnp.asarray(mask[None]), cache)
    chex.assert_shape([new.k, new.v], (cfg.num_layers, 1, len(parents), cfg.num_kv_heads, cfg.head_dim))
    out = np.asarray(out[0])
    for j in range(len(parents)):
        seq = np.concatenate([prefix, path_tokens(parents, tokens, j)])
        want = torch_logits(torch, model, seq[None])[0, -1]
        diff = _max_diff(out[j], want)
        assert diff <= TOL, f"{name}: forest node {j} max abs diff {diff:.3g}"


# ---------------------------------------------------------------------------------------------
# GGUF written like llama.cpp's convert_hf_to_gguf.py

GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def llamacpp_permute(w, n_head, n_head_kv):
    """``LlamaModel.permute`` from llama.cpp's convert_hf_to_gguf.py."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def write_gguf(path, model, arch, quantize=True):
    """Write ``model`` (a torch Llama/Qwen2) as a GGUF file the way llama.cpp converts it.

    With ``quantize``, 2-D weights alternate between Q8_0, F16 and F32 (norms stay F32)."""
    import gguf

    cfg = model.config
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("tiny-test")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_rope_dimension_count(head_dim)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_bos_token_id(cfg.bos_token_id)
    w.add_eos_token_id(cfg.eos_token_id)
    types = [gguf.GGMLQuantizationType.Q8_0, gguf.GGMLQuantizationType.F16,
             gguf.GGMLQuantizationType.F32]
    sd = model.state_dict()
    if cfg.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    for i, (name, t) in enumerate(sd.items()):
        a = t.detach().float().numpy().copy()
        if name.startswith("model.layers."):
            _, _, layer, rest = name.split(".", 3)
            gname = f"blk.{layer}.{GGUF_NAMES[rest]}"
        else:
            gname = GGUF_NAMES[name]
        if arch == "llama" and (".attn_q." in gname or ".attn_k." in gname):
            a = llamacpp_permute(a, heads, heads if ".attn_q." in gname else kv)
        qtype = types[i % 3] if (quantize and a.ndim == 2) else gguf.GGMLQuantizationType.F32
        if qtype == gguf.GGMLQuantizationType.Q8_0:
            w.add_tensor(gname, gguf.quants.quantize(a, qtype), raw_dtype=qtype)
        elif qtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor(gname, a.astype(np.float16))
        else:
            w.add_tensor(gname, a)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


GGUF_CASES = {
    "llama_gqa": ("llama", dict(num_attention_heads=4, num_key_value_heads=2)),
    "llama_mqa_tied": ("llama", dict(num_attention_heads=4, num_key_value_heads=1,
                                     tie_word_embeddings=True)),
    "qwen2_bias": ("qwen2", dict(num_attention_heads=4, num_key_value_heads=2)),
}


@pytest.mark.parametrize("name", sorted(GGUF_CASES))
def test_gguf_float_matches_original_torch(name, torch, tmp_path):
    """An F32 GGUF (q/k permuted for llama) loads to the original model's logits."""
    arch, overrides = GGUF_CASES[name]
    model = make_torch_model(torch, arch, overrides, seed=7)
    write_gguf(tmp_path / "tiny.gguf", model, arch, quantize=False)
    loaded = load_model(tmp_path / "tiny.gguf", progress=False)
    assert loaded.config.architecture == arch
    assert loaded.config.tie_word_embeddings == bool(model.config.tie_word_embeddings)
    assert loaded.config.attention_bias == (arch == "qwen2")
    assert loaded.config.eos_token_id == (2,) and loaded.config.bos_token_id == 1
    assert loaded.tokenizer is None  # no tokenizer.ggml.* metadata in this file
    ids = np.random.default_rng(5).integers(0, V, size=(2, 10))
    diff = _max_diff(jax_logits(loaded.config, loaded.params, ids), torch_logits(torch, model, ids))
    assert diff <= TOL, f"{name}: max abs diff {diff:.3g}"


@pytest.mark.parametrize("name", sorted(GGUF_CASES))
def test_gguf_quantized_matches_transformers_gguf(name, torch, tmp_path):
    """A Q8_0/F16/F32 GGUF gives the logits transformers computes from the same file."""
    from transformers import AutoModelForCausalLM

    arch, overrides = GGUF_CASES[name]
    model = make_torch_model(torch, arch, overrides, seed=8)
    write_gguf(tmp_path / "tiny.gguf", model, arch, quantize=True)
    ref = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file="tiny.gguf",
                                               dtype=torch.float32).eval()
    ids = np.random.default_rng(6).integers(0, V, size=(2, 10))
    want = torch_logits(torch, ref, ids)
    loaded = load_model(tmp_path / "tiny.gguf", progress=False)
    got = np.asarray(jax_logits(loaded.config, loaded.params, ids))
    diff = _max_diff(got, want)
    assert diff <= TOL, f"{name}: max abs diff vs transformers GGUF {diff:.3g}"
    # the quantisation is real: the dequantised model differs from the float original
    assert _max_diff(got, torch_logits(torch, model, ids)) > 10 * TOL


# ---------------------------------------------------------------------------------------------
# weight layouts: stacked (nn.scan) and per-layer (unrolled), chosen by backend
def test_layouts_give_the_same_logits_and_convert_exactly(case, torch):
    """Both layouts of one checkpoint: the same logits as transformers and as each other (a
    prefill and a cached one-token step), conversions in both directions exact."""
    from dsbd_jax.models import llama as M
    name, tmodel, loaded, path = case
    stacked = load_model(path, jnp.float32, progress=False, layout="stacked")
    per_layer = load_model(path, jnp.float32, progress=False, layout="per_layer")
    assert M.params_layout(stacked.params) == "stacked"
    assert M.params_layout(per_layer.params) == "per_layer"
    assert sorted(k for k in per_layer.params if k.startswith("layers_")) == [
        f"layers_{i}" for i in range(loaded.config.num_layers)]
    chex.assert_trees_all_equal(M.convert_layout(stacked.params, "per_layer"), per_layer.params)
    chex.assert_trees_all_equal(M.convert_layout(per_layer.params, "stacked"), stacked.params)
    ids = np.random.default_rng(1).integers(0, V, (2, 9))
    ref = torch_logits(torch, tmodel, ids)
    a = jax_logits(loaded.config, stacked.params, ids)
    b = jax_logits(loaded.config, per_layer.params, ids)
    assert _max_diff(a, ref) < TOL and _max_diff(b, ref) < TOL and _max_diff(a, b) < 1e-5
    lens = jnp.array([9, 9])
    steps = []
    for p in (stacked.params, per_layer.params):
        cache, _ = common.prefill(loaded.config, p, jnp.asarray(ids), lens, 12)
        lg, _ = common.decode_step(loaded.config, p, cache, jnp.array([3, 4]), lens)
        steps.append(np.asarray(lg))
    assert _max_diff(*steps) < 1e-5


def test_layout_defaults_and_errors():
    from dsbd_jax.models import llama as M
    from dsbd_jax.models.config import ModelConfig
    assert M.default_layout("cpu") == M.default_layout("gpu") == "per_layer"  # measured faster
    assert M.default_layout("tpu") == "stacked"
    assert M.check_layout(None) == M.default_layout()
    cfg = ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=24, num_layers=3,
                      num_heads=2, num_kv_heads=1, head_dim=8)
    p = M.init_params(cfg, jax.random.PRNGKey(0))
    assert M.params_layout(p) == M.default_layout()
    for bad in ("scan", "", 3):
        with pytest.raises(ValueError, match="layout must be one of"):
            M.init_params(cfg, jax.random.PRNGKey(0), bad)
    with pytest.raises(ValueError, match="neither 'layers'"):
        M.params_layout({"embed": {}})
    # init_params values do not depend on the layout
    chex.assert_trees_all_equal(
        M.convert_layout(M.init_params(cfg, jax.random.PRNGKey(0), "per_layer"), "stacked"),
        M.init_params(cfg, jax.random.PRNGKey(0), "stacked"))


def test_decoders_agree_across_layouts():
    """DSBD and beam sampling on a tiny pair give the same tokens with either layout."""
    from dsbd_jax import BeamSampleConfig, DSBDConfig, beam_sample, dsbd_generate
    from dsbd_jax.models import llama as M
    from dsbd_jax.models.config import ModelConfig
    t = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=3,
                    num_heads=4, num_kv_heads=2, head_dim=8)
    d = t.replace(num_layers=1)
    outs = []
    for layout in ("stacked", "per_layer"):
        pt = M.init_params(t, jax.random.PRNGKey(0), layout)
        pd = M.init_params(d, jax.random.PRNGKey(1), layout)
        ids = jnp.array([[1, 2, 3, 4, 5]])
        o1 = dsbd_generate({"target": pt, "draft": pd}, ids, jax.random.PRNGKey(2),
                           DSBDConfig(target=t, draft=d, max_new_tokens=8, gamma=2,
                                      draft_width=3, threshold=0.7, top_k=10))
        o2 = beam_sample(pt, ids, jax.random.PRNGKey(3),
                         BeamSampleConfig(target=t, num_beams=3, max_new_tokens=8, top_k=10))
        outs.append((np.asarray(o1.sequences), np.asarray(o2.sequences)))
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])
