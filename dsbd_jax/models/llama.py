"""Flax implementation of the Llama family (Llama 2/3, Qwen2/3, SmolLM, Mistral, Gemma 2/3).

The families are switches of :class:`ModelConfig` on this one model. :func:`forward` takes token
ids ``[B, T]``, explicit positions ``[B, T]``, an explicit boolean mask over [cached keys ; new
keys] ``[B, T, S + T]`` and a fixed-shape KV cache ``[L, B, S, K, D]`` that it only reads; it
returns the logits ``[B, T, V]`` (float32) and the new tokens' keys and values, so the caller
decides what to commit. With this one entry point the decoders run prefill, one-token decode and
a whole draft forest in one call. Two weight layouts (:data:`LAYOUTS`): ``"stacked"`` (a leading
layer axis, run with ``nn.scan``) and ``"per_layer"`` (unrolled; the default on CPU and GPU);
:func:`default_layout` picks by backend and :func:`convert_layout` converts exactly (the same
logits, ``tests/models/test_model_parity.py``). Shapes and layouts in full:
``docs/results/design_notes.md``.
"""

from __future__ import annotations

import functools
import math
from typing import Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.models import weights
from dsbd_jax.models.cache import KVCache, empty_cache
from dsbd_jax.models.config import ModelConfig
from dsbd_jax.models.layout import (  # noqa: F401  (part of the model's API)
    LAYOUTS, check_layout, convert_layout, default_layout, num_layers_of, params_layout,
    unstack_layers_)
from dsbd_jax.models.vocab import split_head, tied_logits, truncated_logits

_NEG = -0.7 * float(np.finfo(np.float32).max)  # finite "minus infinity": no NaN on empty rows


def rope_inv_freq(config: ModelConfig) -> np.ndarray:
    """Inverse RoPE frequencies ``[head_dim // 2]`` (float64 numpy), scaling applied (HF rules)."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    scaling = config.rope_scaling_dict()
    rope_type = scaling.get("rope_type", "default")
    if rope_type == "linear":
        inv_freq = inv_freq / float(scaling["factor"])
    elif rope_type == "llama3":
        factor = float(scaling["factor"])
        low = float(scaling["low_freq_factor"])
        high = float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        low_wavelen = old_len / low
        high_wavelen = old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
        inv_freq = np.where(is_medium, smoothed, scaled)
    return inv_freq


def rope_cos_sin(config: ModelConfig, positions: jax.Array):
    """cos/sin tables ``[B, T, head_dim]`` (float32) for explicit integer positions ``[B, T]``."""
    inv_freq = jnp.asarray(rope_inv_freq(config), dtype=jnp.float32)
    angles = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, D/2]
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """HF convention (rotate_half). x: [B, T, H, D]; cos/sin: [B, T, D]."""
    half = x.shape[-1] // 2
    x32 = x.astype(jnp.float32)
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    out = x32 * cos[:, :, None, :] + rotated * sin[:, :, None, :]
    return out.astype(x.dtype)


class RMSNorm(nn.Module):
    """RMSNorm over the last axis in float32 (``dtype`` is the weight's storage dtype); ``style``
    ``"llama"``: ``w * x``, ``"gemma"``: ``(1 + w) * x`` (each as its ``transformers`` model
    computes it in float32)."""
    eps: float
    dtype: jnp.dtype
    style: str = "llama"

    @nn.compact
    def __call__(self, x):
        gemma = self.style == "gemma"
        init = nn.initializers.zeros if gemma else nn.initializers.ones
        weight = self.param("weight", init, (x.shape[-1],), self.dtype)
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        if gemma:
            return x32 * (1.0 + weight.astype(jnp.float32))
        return weight.astype(jnp.float32) * x32


def _norm(cfg: ModelConfig, name: str) -> RMSNorm:
    return RMSNorm(cfg.rms_norm_eps, cfg.jnp_dtype, cfg.norm_style, name=name)


def softcap(x: jax.Array, cap) -> jax.Array:
    """``cap * tanh(x / cap)`` (Gemma 2's soft-capping); ``x`` unchanged for ``cap=None``."""
    return x if cap is None else cap * jnp.tanh(x / cap)


class Dense(nn.Module):
    """``nn.Dense`` (same parameter names and ``[in, out]`` kernel, same product) whose kernel
    may be any kind of :mod:`dsbd_jax.models.weights` (a plain array, or a typed leaf that says
    its form: transposed row blocks, blocked columns, a head's rows): the leaf runs its own
    product (:func:`dsbd_jax.models.weights.product`).

    ``dtype`` is the kernel's storage dtype. A 16-bit kernel (bfloat16, float16) runs in mixed
    precision: ``x`` cast to 16 bits, float32 accumulation, a float32 result
    (:func:`dsbd_jax.models.products.is_mixed`); a float32 kernel runs in float32."""
    features: int
    use_bias: bool
    dtype: jnp.dtype

    @nn.compact
    def __call__(self, x):
        if self.has_variable("params", "kernel"):  # apply: take the tree's kernel as it is
            kernel = self.get_variable("params", "kernel")
        else:
            kernel = self.param("kernel", nn.initializers.normal(0.02),
                                (x.shape[-1], self.features), self.dtype)
        y = dense_product(x, {"kernel": kernel}, self.dtype)
        if self.use_bias:
            y = y + self.param("bias", nn.initializers.zeros, (self.features,),
                               self.dtype).astype(y.dtype)
        return y


def dense_product(x, params, dtype) -> jax.Array:
    """``x [..., in]`` times the kernel a :class:`Dense` stores in ``params`` (its parameter
    dict; the kernel of any kind), without the bias: the product :class:`Dense` runs, in the
    same form, dtype (``dtype``, the kernel's storage dtype) and precision.
    ``benchmarks/pass_floor.py`` chains these products alone to time a forward pass's floor."""
    return weights.product(_operand(x, dtype), weights.astype(params["kernel"], dtype))


def _operand(x, dtype):
    """A product's input: cast to a float32 kernel's dtype as before; left in float32 for a
    16-bit kernel (the mixed product casts it to 16 bits itself)."""
    return x if jnp.dtype(dtype).itemsize == 2 else x.astype(dtype)


# activations (the residual stream, attention, norms, RoPE, logits) are float32 whatever the
# parameters' dtype: a 16-bit model stores its weights and KV cache in 16 bits and runs its
# products in mixed precision (Dense)
ACT = jnp.float32


def _dense(features, use_bias, dtype, name):
    return Dense(features, use_bias, dtype, name=name)


class Attention(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(self, x, cache_k, cache_v, cos, sin, mask):
        cfg = self.config
        dt = cfg.jnp_dtype
        B, T, _ = x.shape
        store = dt  # the cache's dtype: new keys/values are returned in it
        H, K, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        if self.has_variable("params", "qkv_proj"):  # fused (dsbd_jax.models.fused)
            qkv = _dense((H + 2 * K) * D, cfg.attention_bias, dt, "qkv_proj")(x)
            q, k, v = jnp.split(qkv, [H * D, (H + K) * D], axis=-1)
        else:
            q = _dense(H * D, cfg.attention_bias, dt, "q_proj")(x)
            k = _dense(K * D, cfg.attention_bias, dt, "k_proj")(x)
            v = _dense(K * D, cfg.attention_bias, dt, "v_proj")(x)
        q, k, v = q.reshape(B, T, H, D), k.reshape(B, T, K, D), v.reshape(B, T, K, D)
        if cfg.qk_norm:  # per head, before RoPE (Qwen3, Gemma 3)
            q = _norm(cfg, "q_norm")(q)
            k = _norm(cfg, "k_norm")(k)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        k, v = k.astype(store), v.astype(store)
        out = attend_cache(cfg, q, k, v, cache_k, cache_v, mask)
        out = _dense(cfg.hidden_size, False, dt, "o_proj")(out)
        return out, k, v


def attend_cache(cfg: ModelConfig, q, k, v, cache_k, cache_v, mask):
    """A layer's attention after its projections: queries ``q [B, T, H, D]`` (after RoPE) over
    the cached keys and values ``cache_k, cache_v [B, S, K, D]`` followed by the new ones
    ``k, v [B, T, K, D]`` (the cache's dtype; two parts for :func:`attend`, never joined: a copy
    of the cache), under ``mask [B, T, S + T]``; ``[B, T, H * D]`` float32. Query head ``h``
    reads kv head ``h // (H // K)`` (HF's ``repeat_kv``)."""
    B, T, H, D = q.shape
    q = q.astype(ACT).reshape(B, T, k.shape[2], H // k.shape[2], D)
    scale = (cfg.query_pre_attn_scalar if cfg.query_pre_attn_scalar is not None else D) ** -0.5
    return attend(q, (cache_k.astype(k.dtype), k), (cache_v.astype(v.dtype), v), mask, scale,
                  cfg.attn_logit_softcap).reshape(B, T, H * D)


def attend(q, keys, values, mask, scale: float, cap=None):
    """Softmax attention: ``q [B, T, K, G, D]`` (G query heads per kv head) over
    ``keys, values [B, S, K, D]`` (each may be a tuple of parts along ``S``: the cache's and the
    new tokens', :func:`attend_cache`) under ``mask [B, T, S]`` (True = may attend; a row with
    no key allowed averages all values, no division by zero), scores scaled by ``scale`` and
    soft-capped at ``cap``; ``[B, T, K, G, D]`` float32.

    Each part's two products take their operands in the part's dtype (queries and weights cast
    to 16 bits for a 16-bit cache) and accumulate in float32; scores, softmax and normalisation
    are float32. The keys are the products' first operand, and the weights are normalised after
    the values product (on ``[.., D]``, not ``[.., S]``). A pass's time outside its products is
    this function on XLA:CPU; the former forms (``jax.nn.softmax`` first; a 16-bit cache
    converted to float32 and joined with the new tokens) were slower for DSBD
    (``docs/performance.md``, *The products floor*). ``jax.nn.softmax`` up to roundings."""
    keys = keys if isinstance(keys, tuple) else (keys,)
    values = values if isinstance(values, tuple) else (values,)
    scores = jnp.concatenate(
        [jnp.einsum("bskd,btkgd->bkgts", part, q.astype(part.dtype),
                    preferred_element_type=jnp.float32) for part in keys], axis=-1) * scale
    scores = softcap(scores, cap)
    scores = jnp.where(mask[:, None, None, :, :], scores, _NEG)
    weights_ = jnp.exp(scores - jax.lax.stop_gradient(scores.max(-1, keepdims=True)))
    total = jnp.moveaxis(weights_.sum(-1), 3, 1)[..., None]  # [B, T, K, G, 1]
    starts = np.cumsum([0] + [part.shape[1] for part in values])
    return sum(jnp.einsum("bskd,bkgts->btkgd", part, weights_[..., a:b].astype(part.dtype),
                          preferred_element_type=jnp.float32)
               for part, a, b in zip(values, starts[:-1], starts[1:])) / total


class MLP(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        dt = cfg.jnp_dtype
        F = cfg.intermediate_size
        if self.has_variable("params", "gate_up_proj"):  # fused (dsbd_jax.models.fused)
            gate, up = jnp.split(_dense(2 * F, False, dt, "gate_up_proj")(x), [F], axis=-1)
        else:
            gate = _dense(F, False, dt, "gate_proj")(x)
            up = _dense(F, False, dt, "up_proj")(x)
        act = nn.silu(gate) if cfg.hidden_act == "silu" else jax.nn.gelu(gate, approximate=True)
        return _dense(cfg.hidden_size, False, dt, "down_proj")(act * up)


class DecoderLayer(nn.Module):
    """One block. ``local`` (a bool, traced under ``nn.scan``) picks the sliding-window mask
    and the local RoPE tables; ``rope = (cos, sin, cos_local, sin_local)``,
    ``masks = (mask, mask_local)``."""
    config: ModelConfig

    @nn.compact
    def __call__(self, h, layer, rope, masks):
        cfg = self.config
        cache_k, cache_v, local = layer
        cos, sin, cos_l, sin_l = rope
        mask, mask_l = masks
        if cfg.has_local_layers:
            mask = jnp.where(local, mask_l, mask)
            if cfg.rope_local_theta is not None:
                cos, sin = jnp.where(local, cos_l, cos), jnp.where(local, sin_l, sin)
        attn_out, k, v = Attention(cfg, name="attn")(
            _norm(cfg, "input_norm")(h), cache_k, cache_v, cos, sin, mask)
        if cfg.sandwich_norms:
            attn_out = _norm(cfg, "attn_out_norm")(attn_out)
        h = h + attn_out
        mlp_out = MLP(cfg, name="mlp")(_norm(cfg, "post_norm")(h))
        if cfg.sandwich_norms:
            mlp_out = _norm(cfg, "mlp_out_norm")(mlp_out)
        return h + mlp_out, (k, v)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _layer_call(cfg: ModelConfig, local: bool, params, h, cache_k, cache_v, rope, masks):
    """One per-layer block applied to its own parameters (a pure function of its arguments,
    so every layer of the same shapes reuses one trace)."""
    return DecoderLayer(cfg).apply({"params": params}, h, (cache_k, cache_v, local), rope, masks)


def window_mask(config: ModelConfig, mask, positions, key_positions):
    """``mask`` restricted to keys within the sliding window of each query:
    ``q_pos - k_pos < sliding_window`` (``key_positions [B, S + T]``, ``positions [B, T]``)."""
    near = positions[:, :, None] - key_positions[:, None, :] < config.sliding_window
    return mask & near


class LlamaForCausalLM(nn.Module):
    """Llama-family decoder (every variant of :class:`ModelConfig`) with a read-only
    fixed-shape KV cache (see module doc)."""

    config: ModelConfig
    layout: str = "stacked"

    @nn.compact
    def __call__(self, tokens, positions, mask, cache: KVCache, logits_at=None,
                 key_positions=None, head=None, feature_layers=None):
        cfg = self.config
        dt = cfg.jnp_dtype
        embed = nn.Embed(cfg.vocab_size, cfg.hidden_size, dtype=dt, param_dtype=dt, name="embed",
                         embedding_init=nn.initializers.normal(0.02))
        h = embed_rows(embed, tokens)
        if cfg.embed_scale:
            h = h * jnp.asarray(math.sqrt(cfg.hidden_size), dt).astype(ACT)
        rope = rope_cos_sin(cfg, positions)
        rope = rope + (rope_cos_sin(cfg.local_rope_config(), positions)
                       if cfg.has_local_layers and cfg.rope_local_theta is not None else rope)
        if cfg.has_local_layers:
            S = cache.k.shape[2]
            if key_positions is None:  # slot s holds position s
                key_positions = jnp.broadcast_to(jnp.arange(S, dtype=jnp.int32),
                                                 (tokens.shape[0], S))
            keys_pos = jnp.concatenate([key_positions, positions], axis=1)
            masks = (mask, window_mask(cfg, mask, positions, keys_pos))
        else:
            masks = (mask, mask)
        local = cfg.local_layers
        taps = []  # the residual stream after the layers a draft head fuses (feature_layers)
        if self.layout == "stacked":
            if feature_layers:
                raise ValueError("feature_layers need the per-layer weight layout "
                                 "(llama.convert_layout(params, 'per_layer'))")
            Stack = nn.scan(DecoderLayer, variable_axes={"params": 0}, split_rngs={"params": True},
                            in_axes=(0, nn.broadcast, nn.broadcast), length=cfg.num_layers)
            h, (new_k, new_v) = Stack(cfg, name="layers")(
                h, (cache.k, cache.v, jnp.asarray(local)), rope, masks)
        else:
            ks, vs = [], []
            # applying, each block is one call of a jitted function: the layers share one
            # trace (tracing the 28 blocks of a 1.5B model one by one cost seconds per
            # program); XLA inlines the calls, so the compiled program is the same
            params = None if self.is_initializing() else self.variables["params"]
            for i in range(cfg.num_layers):
                if params is None:
                    h, (k, v) = DecoderLayer(cfg, name=f"layers_{i}")(
                        h, (cache.k[i], cache.v[i], local[i]), rope, masks)
                else:
                    h, (k, v) = _layer_call(cfg, bool(local[i]), params[f"layers_{i}"], h,
                                            cache.k[i], cache.v[i], rope, masks)
                ks.append(k)
                vs.append(v)
                if feature_layers and i in feature_layers:
                    taps.append(h)
            new_k, new_v = jnp.stack(ks), jnp.stack(vs)
        h = _norm(cfg, "final_norm")(h)
        if feature_layers is not None:  # features for a draft head (dsbd_jax.models.head)
            feats = jnp.concatenate(taps, axis=-1) if feature_layers else h
            return _vocab_logits(cfg, embed, h, logits_at, head), KVCache(new_k, new_v), feats
        return _vocab_logits(cfg, embed, h, logits_at, head), KVCache(new_k, new_v)


def embed_rows(embed, tokens):
    """``tokens``' rows of the embedding ``embed`` (an ``nn.Embed``) in the activations' dtype.

    A 16-bit table's rows are gathered as their bits (``uint16``), then cast: XLA:CPU runs a
    16-bit float gather in float32, converting the whole ``[V, d]`` table first, and hoists that
    conversion into the decoders' loops, where it runs again on every iteration
    (``tests/models/test_embed_rows.py`` checks the compiled programs). Same rows, bit for bit;
    an index out of range still gives NaN (the all-ones bit pattern).

    The table passes an optimization barrier together with ``tokens`` first: in a loop the
    table is loop-invariant and ``tokens`` are not, and XLA's loop-invariant code motion
    would otherwise hoist the table's whole-table bit view out of the loop as a copy (0.47 GB
    for the 1.5B target's table, made once per call and once per chunk of a chunked run),
    where fused with the gather it reads only the gathered rows."""
    table = embed.embedding
    if jnp.dtype(table.dtype).itemsize != 2:
        return embed(tokens).astype(ACT)
    table, tokens = jax.lax.optimization_barrier((table, tokens))
    bits = jnp.take(jax.lax.bitcast_convert_type(table, jnp.uint16), tokens, axis=0)
    return jax.lax.bitcast_convert_type(bits, table.dtype).astype(ACT)


def _vocab_logits(cfg: ModelConfig, embed, h, logits_at, head):
    """float32 logits of the final-normed ``h`` (the rows ``logits_at``, or all) through the
    truncated ``head``, the tied embedding or ``lm_head`` (a submodule of the calling module)."""
    dt = cfg.jnp_dtype
    if logits_at is not None:  # [B, n] indices into T: only those rows go through the head
        h = jnp.take_along_axis(h, logits_at[..., None], axis=1)
    if head is not None:  # truncated head (dsbd_jax.models.vocab): N rows, the rest -inf
        return truncated_logits(h, head, cfg.vocab_size)
    if cfg.tie_word_embeddings:
        logits = tied_logits(h, embed.embedding.astype(dt))
    else:
        logits = _dense(cfg.vocab_size, False, dt, "lm_head")(h)
    return softcap(logits.astype(jnp.float32), cfg.final_logit_softcap)


def forward(config: ModelConfig, params, tokens, positions, mask, cache: Optional[KVCache] = None,
            logits_at=None, key_positions=None, feature_layers=None):
    """Pure forward pass. See the module docstring for shapes.

    Args:
      params: the model's parameter pytree (``load_model(...).params``).
      cache: cached keys/values ``[L, B, S, K, D]``; ``None`` means no cache (S = 0).
      logits_at: optional ``[B, n]`` int indices into the T new tokens; logits are then
        ``[B, n, V]`` (saves the vocabulary projection for a prefill that needs the last row only).
      key_positions: ``[B, S]`` RoPE positions of the cached slots, read only by models with a
        sliding window (``config.sliding_window``); ``None``: slot ``s`` holds position ``s``.
        Decoders whose caches hold rows or scratch at other positions pass them.
      feature_layers: ``None`` (the default), or the features a draft head reads
        (:mod:`dsbd_jax.models.head`): ``()`` for the final-normed hidden state that the
        vocabulary head reads, or a tuple of layer indices whose residual streams are
        concatenated (per-layer layout only). Returned for all ``T`` tokens.

    A ``params["vocab_head"]`` (:func:`dsbd_jax.models.vocab.truncate_head`) replaces the
    vocabulary projection by its ``N`` rows; the other ``V - N`` logits are ``-inf``.

    Returns:
      ``(logits float32, KVCache of the new tokens [L, B, T, K, D])``, and with
      ``feature_layers`` the features ``[B, T, F]`` (float32) as a third element.
    """
    tokens, cache = checked_inputs(config, tokens, mask, cache)
    B, T = tokens.shape
    if tuple(positions.shape) != (B, T):
        raise ValueError(f"positions must have shape [B, T] = {(B, T)}, got {tuple(positions.shape)}")
    if key_positions is not None and tuple(key_positions.shape) != (B, cache.k.shape[2]):
        raise ValueError(f"key_positions must have shape [B, S] = {(B, cache.k.shape[2])}, "
                         f"got {tuple(key_positions.shape)}")
    params, head = split_head(params)
    with jax.named_scope(forward_scope(config)):
        return LlamaForCausalLM(config, params_layout(params)).apply(
            {"params": params}, tokens, jnp.asarray(positions, jnp.int32), mask, cache, logits_at,
            None if key_positions is None else jnp.asarray(key_positions, jnp.int32), head,
            None if feature_layers is None else tuple(feature_layers))


def checked_inputs(config, tokens, mask, cache: Optional[KVCache]):
    """``(tokens int32, cache)`` for a forward pass (an empty cache for ``None``); ``ValueError``
    unless ``mask`` is ``[B, T, S + T]``. Shared by this model and the draft head's."""
    tokens = jnp.asarray(tokens, jnp.int32)
    B, T = tokens.shape
    if cache is None:
        cache = empty_cache(config, B, 0)
    expected = (B, T, cache.k.shape[2] + T)
    if tuple(mask.shape) != expected:
        raise ValueError(f"mask must have shape [B, T, S + T] = {expected}, got {tuple(mask.shape)}")
    return tokens, cache


def forward_scope(config: ModelConfig) -> str:
    """The ``jax.named_scope`` of a model's forward passes in compiled programs (the profiler of
    ``benchmarks/phase_profile.py`` tells the target's passes from the draft's by it)."""
    return f"forward_L{config.num_layers}_d{config.hidden_size}"


def init_params(config: ModelConfig, key: jax.Array, layout: Optional[str] = None):
    """Random parameters (normal(0.02) weights, unit norms) for tests and examples, in ``layout``
    (default: :func:`default_layout`). The values do not depend on the layout."""
    tokens = jnp.zeros((1, 1), jnp.int32)
    mask = jnp.ones((1, 1, 1), bool)
    variables = LlamaForCausalLM(config, "stacked").init(key, tokens, tokens, mask,
                                                         empty_cache(config, 1, 0))
    return convert_layout(variables["params"], check_layout(layout))


def causal_mask(lengths: jax.Array, T: int) -> jax.Array:
    """``[B, T, T]`` causal mask for right-padded rows of the given lengths (no cache).

    A padding query (t >= length) attends to itself only, so every row of the softmax is
    non-empty; its outputs are never used.
    """
    t = jnp.arange(T)
    causal = t[None, :, None] >= t[None, None, :]
    valid_key = t[None, None, :] < lengths[:, None, None]
    own = t[:, None] == t[None, :]
    return (causal & valid_key) | own[None]


def logits(config: ModelConfig, params, token_ids) -> jax.Array:
    """Plain causal forward: float32 logits ``[batch, seq, vocab]`` for ``token_ids [batch, seq]``."""
    return _logits(config, params, jnp.asarray(token_ids, jnp.int32))


def _logits_fn(config, params, token_ids):
    B, T = token_ids.shape
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (B, T, T))
    out, _ = forward(config, params, token_ids, positions, mask)
    return out


_logits = jax.jit(_logits_fn, static_argnums=0)
