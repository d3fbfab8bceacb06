"""Reading llama.cpp GGUF files: model config from the metadata, tensors in Hugging Face layout.

Architectures ``llama`` (Llama 2/3, SmolLM), ``qwen2`` and ``gemma3`` (text; the local/global
layer pattern and the local RoPE base are what llama.cpp hard-codes, and the norm weights are
stored plus one, which :meth:`GGUFSource.get` takes off); any tensor type that
``gguf.quants.dequantize`` handles is read as float32. llama.cpp's converter stores the rows of
the q and k projections of ``llama`` models permuted (interleaved RoPE pairs);
:func:`unpermute_rows` undoes that, so the weights match the HF (rotate-half) layout (``qwen2``
files are written without it). :func:`load_gguf` builds a :class:`LoadedModel`;
:func:`gguf_config` and :func:`tokenizer_from_gguf` read the config and tokenizer alone.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path
from typing import Optional, Union

import jax.numpy as jnp
import numpy as np

from dsbd_jax.loading.checkpoint import LoadedModel, assemble_params, check_no_unexpected
from dsbd_jax.models.config import ModelConfig

logger = logging.getLogger("dsbd_jax")

SUPPORTED_GGUF_ARCHITECTURES = ("llama", "qwen2", "gemma3")

# HF tensor name (with {i} for the layer) -> GGUF tensor name.
_HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "model.layers.{i}.input_layernorm.weight": "blk.{i}.attn_norm.weight",
    "model.layers.{i}.post_attention_layernorm.weight": "blk.{i}.ffn_norm.weight",
    "model.layers.{i}.self_attn.q_proj.weight": "blk.{i}.attn_q.weight",
    "model.layers.{i}.self_attn.k_proj.weight": "blk.{i}.attn_k.weight",
    "model.layers.{i}.self_attn.v_proj.weight": "blk.{i}.attn_v.weight",
    "model.layers.{i}.self_attn.o_proj.weight": "blk.{i}.attn_output.weight",
    "model.layers.{i}.self_attn.q_proj.bias": "blk.{i}.attn_q.bias",
    "model.layers.{i}.self_attn.k_proj.bias": "blk.{i}.attn_k.bias",
    "model.layers.{i}.self_attn.v_proj.bias": "blk.{i}.attn_v.bias",
    "model.layers.{i}.mlp.gate_proj.weight": "blk.{i}.ffn_gate.weight",
    "model.layers.{i}.mlp.up_proj.weight": "blk.{i}.ffn_up.weight",
    "model.layers.{i}.mlp.down_proj.weight": "blk.{i}.ffn_down.weight",
}


# Gemma 3: sandwich norms and q/k norms under their own names (llama.cpp's gemma3 graph)
_GEMMA3_TO_GGUF = {
    **{k: v for k, v in _HF_TO_GGUF.items() if "post_attention_layernorm" not in k},
    "model.layers.{i}.post_attention_layernorm.weight": "blk.{i}.post_attention_norm.weight",
    "model.layers.{i}.pre_feedforward_layernorm.weight": "blk.{i}.ffn_norm.weight",
    "model.layers.{i}.post_feedforward_layernorm.weight": "blk.{i}.post_ffw_norm.weight",
    "model.layers.{i}.self_attn.q_norm.weight": "blk.{i}.attn_q_norm.weight",
    "model.layers.{i}.self_attn.k_norm.weight": "blk.{i}.attn_k_norm.weight",
}
# what llama.cpp's gemma3 graph hard-codes (not in the file's metadata)
GEMMA3_SLIDING_PATTERN = 6      # every 6th layer is global
GEMMA3_LOCAL_ROPE_THETA = 10000.0


def is_gguf_file(path) -> bool:
    """True if ``path`` is a file starting with the GGUF magic."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except (OSError, TypeError):
        return False


def permute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k permutation (HF rotate-half layout -> interleaved), rows = heads * dim."""
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of :func:`permute_rows`: GGUF llama q/k rows (weight or bias) -> HF layout."""
    return (w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def _field(reader, key, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    value = field.contents()
    return value


class GGUFSource:
    """A GGUF file opened for reading (memory-mapped; tensors are dequantised on request)."""

    def __init__(self, path):
        import gguf  # imported lazily: only GGUF users pay for it

        self.path = os.fspath(path)
        self.reader = gguf.GGUFReader(self.path)
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.architecture = _field(self.reader, "general.architecture")
        if self.architecture not in SUPPORTED_GGUF_ARCHITECTURES:
            raise ValueError(
                f"unsupported GGUF architecture {self.architecture!r} in {self.path}; supported: "
                f"{', '.join(SUPPORTED_GGUF_ARCHITECTURES)}")
        self._config: Optional[ModelConfig] = None
        self.names = _GEMMA3_TO_GGUF if self.architecture == "gemma3" else _HF_TO_GGUF

    def close(self):
        self.tensors = {}
        self.reader = None

    # -- metadata ------------------------------------------------------------------------------
    def meta(self, key, default=None):
        return _field(self.reader, f"{self.architecture}.{key}", default)

    def has_tokenizer(self) -> bool:
        return "tokenizer.ggml.tokens" in self.reader.fields

    def config(self, dtype: str = "float32") -> ModelConfig:
        """The :class:`ModelConfig` described by the file's metadata and tensor shapes."""
        return config_from_metadata(
            self.path, lambda key, default=None: _field(self.reader, key, default),
            {n: tuple(int(d) for d in t.shape) for n, t in self.tensors.items()}, dtype)

    # -- tensors -------------------------------------------------------------------------------
    def get(self, hf_name: str, layer: Optional[int] = None) -> np.ndarray:
        """Tensor ``hf_name`` (HF naming/layout, ``{i}`` = layer) as float32 numpy."""
        from gguf.quants import dequantize

        if hf_name not in self.names:
            raise KeyError(f"no GGUF name for {hf_name}")
        name = self.names[hf_name].format(i=layer)
        if name not in self.tensors:
            raise ValueError(f"GGUF file {self.path} lacks tensor {name!r} (for {hf_name})")
        t = self.tensors[name]
        shape = tuple(int(d) for d in reversed(t.shape))  # numpy order: [rows, ..., ne0]
        data = t.data.reshape(-1, t.data.shape[-1]) if t.data.ndim > 1 else t.data[None]
        w = np.empty((data.shape[0], shape[-1]), np.float32)
        step = max(1, (4 << 20) // max(1, shape[-1]))  # ~16 MB of float32 per chunk
        for r in range(0, data.shape[0], step):  # row chunks bound dequantize's temporaries
            w[r:r + step] = dequantize(data[r:r + step], t.tensor_type)
        w = w.reshape(shape)
        if self.architecture == "gemma3" and name.endswith("norm.weight"):
            w = w - 1.0  # llama.cpp stores Gemma's (1 + w) norms as 1 + w
        if self.architecture == "llama":
            cfg = self._config or self.config()
            self._config = cfg
            if ".attn_q." in name:
                w = unpermute_rows(w, cfg.num_heads)
            elif ".attn_k." in name:
                w = unpermute_rows(w, cfg.num_kv_heads)
        return w

    def hf_names(self):
        """The file's tensor names in HF naming (unknown names are kept as they are)."""
        inverse = {}
        for hf, gg in self.names.items():
            prefix, _, suffix = gg.partition("{i}")
            inverse[(prefix, suffix)] = hf
        out = []
        for name in self.tensors:
            if name.startswith("blk."):
                _, layer, rest = name.split(".", 2)
                hf = inverse.get(("blk.", "." + rest))
                out.append(hf.format(i=layer) if hf else name)
            else:
                out.append(inverse.get((name, ""), name))
        return out


def config_from_metadata(path, field, tensors, dtype: str = "float32") -> ModelConfig:
    """The :class:`ModelConfig` of a GGUF file from its metadata: ``field(key, default)`` gives
    a key's value, ``tensors`` maps tensor names to their ggml-order shapes
    (``[ne0, ne1, ...]``)."""
    arch = field("general.architecture")
    if arch not in SUPPORTED_GGUF_ARCHITECTURES:
        raise ValueError(f"unsupported GGUF architecture {arch!r} in {path}; supported: "
                         f"{', '.join(SUPPORTED_GGUF_ARCHITECTURES)}")
    meta = lambda key, default=None: field(f"{arch}.{key}", default)  # noqa: E731
    required = ("embedding_length", "feed_forward_length", "block_count", "attention.head_count")
    missing = [k for k in required if meta(k) is None]
    if missing:
        raise ValueError(f"GGUF file {path} lacks metadata {[f'{arch}.{k}' for k in missing]}")
    hidden = int(meta("embedding_length"))
    heads = int(meta("attention.head_count"))
    kv_heads = int(meta("attention.head_count_kv", heads))
    head_dim = int(meta("attention.key_length", hidden // heads))
    value_dim = int(meta("attention.value_length", head_dim))
    if value_dim != head_dim:
        raise ValueError(f"GGUF key_length {head_dim} != value_length {value_dim} is not supported")
    rope_dim = meta("rope.dimension_count")
    if rope_dim is not None and int(rope_dim) != head_dim:
        raise ValueError(
            f"partial rotary embedding (rope.dimension_count={rope_dim}, head_dim={head_dim}) "
            "is not supported")
    if "token_embd.weight" not in tensors:
        raise ValueError(f"GGUF file {path} has no token_embd.weight tensor")
    vocab = int(tensors["token_embd.weight"][1])  # ggml order: [hidden, vocab]
    rope_scaling = None
    scaling_type = meta("rope.scaling.type")
    if "rope_freqs.weight" in tensors:
        raise ValueError("GGUF rope_freqs (llama3-style rope scaling factors) is not supported; "
                         "load the Hugging Face checkpoint instead")
    if scaling_type not in (None, "none"):
        if scaling_type != "linear":
            raise ValueError(f"unsupported GGUF rope.scaling.type {scaling_type!r}; supported: "
                             "none, linear")
        rope_scaling = ModelConfig.freeze_rope_scaling(
            {"rope_type": "linear", "factor": float(meta("rope.scaling.factor"))})
    bias = "blk.0.attn_q.bias" in tensors
    if arch == "qwen2" and not bias:
        raise ValueError(f"qwen2 GGUF file {path} has no attention biases")
    eos = []
    for key in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                "tokenizer.ggml.eom_token_id"):
        v = field(key)
        if v is not None and int(v) not in eos and int(v) < vocab:
            eos.append(int(v))
    family = {}
    if arch == "gemma3":
        n = int(meta("block_count"))
        window = meta("attention.sliding_window")
        family = dict(
            qk_norm=True, norm_style="gemma", sandwich_norms=True, hidden_act="gelu_tanh",
            embed_scale=True, query_pre_attn_scalar=float(head_dim),
            sliding_window=None if window is None else int(window),
            layer_types=tuple("sliding_attention" if (i + 1) % GEMMA3_SLIDING_PATTERN
                              else "full_attention" for i in range(n)),
            rope_local_theta=GEMMA3_LOCAL_ROPE_THETA)
        if n == 62:  # llama.cpp: the 27B (62 layers) scales by hidden / heads, not head_dim
            family["query_pre_attn_scalar"] = float(hidden // heads)
    bos = field("tokenizer.ggml.bos_token_id")
    pad = field("tokenizer.ggml.padding_token_id")
    return ModelConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=int(meta("feed_forward_length")),
        num_layers=int(meta("block_count")),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        rms_norm_eps=float(meta("attention.layer_norm_rms_epsilon", 1e-6)),
        rope_theta=float(meta("rope.freq_base", 10000.0)),
        rope_scaling=rope_scaling,
        tie_word_embeddings="output.weight" not in tensors,
        attention_bias=bias,
        max_position_embeddings=int(meta("context_length", 4096)),
        dtype=dtype,
        architecture=arch,
        bos_token_id=None if bos is None else int(bos),
        eos_token_id=tuple(eos) or None,
        pad_token_id=None if pad is None else int(pad),
        **family,
    )


# ---------------------------------------------------------------------------------------------
# loading a GGUF file

def load_gguf(path, dtype=jnp.float32, tokenizer: Union[bool, str] = "auto",
              progress: bool = False, save_dir: Optional[Path] = None,
              place=None) -> LoadedModel:
    """Load a GGUF file (see the module docstring).

    ``tokenizer``: ``"auto"`` builds the ``transformers`` tokenizer from the file's
    ``tokenizer.ggml.*`` metadata when present (slow for large vocabularies), ``False`` skips it.
    ``save_dir``: also write the float32 parameters there (used by the preset cache).
    ``place``: where each tensor goes (``checkpoint.assemble_params``).
    """
    path = Path(path)
    src = GGUFSource(path)
    try:
        config = src.config(jnp.dtype(dtype).name)
        has_tok = src.has_tokenizer()
        check_no_unexpected(src.hf_names(), config, f"GGUF file {path}")
        logger.info("dequantising %s (%s, %d layers)", path.name, src.architecture,
                    config.num_layers)
        params = assemble_params(config, src.get, dtype, save_dir=save_dir, progress=progress,
                                 desc=f"dequantising {path.name}", place=place)
    finally:
        src.close()
    tok = None
    if tokenizer is True or (tokenizer == "auto" and has_tok):
        tok = tokenizer_from_gguf(path)
    return LoadedModel(config, params, tok, str(path))


# GGUF value types (``gguf.GGUFValueType``) -> struct format of a scalar; 8 = string, 9 = array
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q",
           12: "d"}
_STRING, _ARRAY = 8, 9


@dataclasses.dataclass(frozen=True)
class SkippedArray:
    """An array value :func:`read_header` stepped over: its element type and length."""

    item_type: int
    length: int


def read_header(path):
    """A GGUF file's key/value metadata and tensor shapes, read straight from its header:
    ``(fields, tensors)`` with ``fields[key]`` a scalar or string, or a :class:`SkippedArray`
    for an array value (its items are stepped over, not decoded: the tokenizer's vocabulary,
    scores and merges, hundreds of thousands of items in a 150k-token model, which
    ``gguf.GGUFReader`` turns into as many numpy arrays), and ``tensors[name]`` the tensor's
    ggml-order shape. ``None`` for a big-endian file (``GGUFReader`` reads those)."""
    import mmap
    import struct
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        version, = struct.unpack_from("<I", m, 4)
        if version & 0xFFFF == 0:    # written big-endian
            return None
        if version < 2:
            raise ValueError(f"{path}: GGUF version {version} is not supported (2 or later)")
        n_tensors, n_kv = struct.unpack_from("<QQ", m, 8)
        pos = 24

        def u32():
            nonlocal pos
            v, = struct.unpack_from("<I", m, pos)
            pos += 4
            return v

        def u64():
            nonlocal pos
            v, = struct.unpack_from("<Q", m, pos)
            pos += 8
            return v

        def string():
            nonlocal pos
            n = u64()
            pos += n
            return bytes(m[pos - n:pos]).decode("utf-8", errors="replace")

        def scalar(t):
            nonlocal pos
            fmt = "<" + _SCALAR[t]
            v, = struct.unpack_from(fmt, m, pos)
            pos += struct.calcsize(fmt)
            return v

        def skip(t, count):
            nonlocal pos
            if t == _STRING:
                for _ in range(count):
                    n, = struct.unpack_from("<Q", m, pos)
                    pos += 8 + n
            elif t == _ARRAY:
                for _ in range(count):
                    inner = u32()
                    skip(inner, u64())
            elif t in _SCALAR:
                pos += count * struct.calcsize("<" + _SCALAR[t])
            else:
                raise ValueError(f"{path}: unknown GGUF value type {t}")

        fields = {}
        for _ in range(n_kv):
            key = string()
            t = u32()
            if t == _STRING:
                fields[key] = string()
            elif t == _ARRAY:
                item, length = u32(), u64()
                skip(item, length)
                fields[key] = SkippedArray(item, length)
            elif t in _SCALAR:
                fields[key] = scalar(t)
            else:
                raise ValueError(f"{path}: unknown GGUF value type {t} for {key!r}")
        tensors = {}
        for _ in range(n_tensors):
            name = string()
            dims = tuple(u64() for _ in range(u32()))
            pos += 12                 # ggml type (uint32), data offset (uint64)
            tensors[name] = dims
    return fields, tensors


def gguf_config(path, dtype_name: str = "float32") -> ModelConfig:
    """The :class:`ModelConfig` of a GGUF file, from its header (:func:`read_header`: no
    tensor is read and the tokenizer's arrays are stepped over, not decoded)."""
    header = read_header(path)
    if header is None:
        src = GGUFSource(Path(path))
        try:
            return src.config(dtype_name)
        finally:
            src.close()
    fields, tensors = header
    return config_from_metadata(os.fspath(path), lambda key, default=None: fields.get(key, default),
                                tensors, dtype_name)


def tokenizer_from_gguf(path):
    """``transformers`` tokenizer built from a GGUF file's metadata (needs the file's folder)."""
    from transformers import AutoTokenizer

    path = Path(path)
    logger.info("building tokenizer from %s", path.name)
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
