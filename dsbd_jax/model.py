"""Flax implementation of the Llama family (Llama 2/3, Qwen2, SmolLM).

The forward pass takes, besides token ids, **explicit positions** and an **explicit boolean
attention mask over [cached keys ; new keys]**, and a fixed-shape KV cache that it only reads.
It returns the keys/values of the new tokens instead of writing them, so the caller decides what
to commit (a prefill writes all of them, a speculative verifier copies only the accepted path).
With this one entry point the decoders run prefill, one-token decode and a whole draft
tree/forest of tokens in one call.

Shapes (B = batch rows, T = new tokens, S = cached slots, L = layers, K = kv heads, D = head dim):
  tokens    [B, T] int32
  positions [B, T] int32           RoPE position of each new token
  mask      [B, T, S + T] bool     True = query t may attend to that key
  cache     KVCache(k, v)          each [L, B, S, K, D] (keys stored after RoPE)
  returns   logits [B, T, V] float32 and KVCache of the new tokens, each [L, B, T, K, D]

The transformer blocks are stacked on a leading layer axis and run with ``nn.scan`` so compile
time does not grow with depth.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from .cache import KVCache, empty_cache
from .config import ModelConfig

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
    eps: float
    dtype: jnp.dtype

    @nn.compact
    def __call__(self, x):
        weight = self.param("weight", nn.initializers.ones, (x.shape[-1],), self.dtype)
        x32 = x.astype(jnp.float32)
        x32 = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return weight * x32.astype(self.dtype)


def _dense(features, use_bias, dtype, name):
    return nn.Dense(features, use_bias=use_bias, dtype=dtype, param_dtype=dtype, name=name,
                    kernel_init=nn.initializers.normal(0.02))


class Attention(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(self, x, cache_k, cache_v, cos, sin, mask):
        cfg = self.config
        dt = cfg.jnp_dtype
        B, T, _ = x.shape
        H, K, D = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q = _dense(H * D, cfg.attention_bias, dt, "q_proj")(x).reshape(B, T, H, D)
        k = _dense(K * D, cfg.attention_bias, dt, "k_proj")(x).reshape(B, T, K, D)
        v = _dense(K * D, cfg.attention_bias, dt, "v_proj")(x).reshape(B, T, K, D)
        q = apply_rope(q, cos, sin)
        k = apply_rope(k, cos, sin)
        keys = jnp.concatenate([cache_k.astype(dt), k], axis=1)  # [B, S+T, K, D]
        values = jnp.concatenate([cache_v.astype(dt), v], axis=1)
        q = q.reshape(B, T, K, H // K, D)  # query head h uses kv head h // groups (HF repeat_kv)
        scores = jnp.einsum("btkgd,bskd->bkgts", q, keys,
                            preferred_element_type=jnp.float32) / math.sqrt(D)
        scores = jnp.where(mask[:, None, None, :, :], scores, _NEG)
        probs = jax.nn.softmax(scores, axis=-1).astype(dt)
        out = jnp.einsum("bkgts,bskd->btkgd", probs, values).reshape(B, T, H * D)
        out = _dense(cfg.hidden_size, False, dt, "o_proj")(out)
        return out, k, v


class MLP(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(self, x):
        cfg = self.config
        dt = cfg.jnp_dtype
        gate = _dense(cfg.intermediate_size, False, dt, "gate_proj")(x)
        up = _dense(cfg.intermediate_size, False, dt, "up_proj")(x)
        return _dense(cfg.hidden_size, False, dt, "down_proj")(nn.silu(gate) * up)


class DecoderLayer(nn.Module):
    config: ModelConfig

    @nn.compact
    def __call__(self, h, layer_cache, cos, sin, mask):
        cfg = self.config
        cache_k, cache_v = layer_cache
        attn_out, k, v = Attention(cfg, name="attn")(
            RMSNorm(cfg.rms_norm_eps, cfg.jnp_dtype, name="input_norm")(h),
            cache_k, cache_v, cos, sin, mask)
        h = h + attn_out
        h = h + MLP(cfg, name="mlp")(RMSNorm(cfg.rms_norm_eps, cfg.jnp_dtype, name="post_norm")(h))
        return h, (k, v)


class LlamaForCausalLM(nn.Module):
    """Llama / Qwen2 / SmolLM decoder with a read-only fixed-shape KV cache (see module doc)."""

    config: ModelConfig

    @nn.compact
    def __call__(self, tokens, positions, mask, cache: KVCache, logits_at=None):
        cfg = self.config
        dt = cfg.jnp_dtype
        embed = nn.Embed(cfg.vocab_size, cfg.hidden_size, dtype=dt, param_dtype=dt, name="embed",
                         embedding_init=nn.initializers.normal(0.02))
        h = embed(tokens)
        cos, sin = rope_cos_sin(cfg, positions)
        Stack = nn.scan(DecoderLayer, variable_axes={"params": 0}, split_rngs={"params": True},
                        in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast),
                        length=cfg.num_layers)
        h, (new_k, new_v) = Stack(cfg, name="layers")(h, (cache.k, cache.v), cos, sin, mask)
        h = RMSNorm(cfg.rms_norm_eps, dt, name="final_norm")(h)
        if logits_at is not None:  # [B, n] indices into T: only those rows go through the head
            h = jnp.take_along_axis(h, logits_at[..., None], axis=1)
        if cfg.tie_word_embeddings:
            logits = embed.attend(h)
        else:
            logits = _dense(cfg.vocab_size, False, dt, "lm_head")(h)
        return logits.astype(jnp.float32), KVCache(new_k, new_v)


def forward(config: ModelConfig, params, tokens, positions, mask, cache: Optional[KVCache] = None,
            logits_at=None) -> Tuple[jax.Array, KVCache]:
    """Pure forward pass. See the module docstring for shapes.

    Args:
      params: the model's parameter pytree (``load_model(...).params``).
      cache: cached keys/values ``[L, B, S, K, D]``; ``None`` means no cache (S = 0).
      logits_at: optional ``[B, n]`` int indices into the T new tokens; logits are then
        ``[B, n, V]`` (saves the vocabulary projection for a prefill that needs the last row only).
    Returns:
      ``(logits float32, KVCache of the new tokens [L, B, T, K, D])``.
    """
    tokens = jnp.asarray(tokens, jnp.int32)
    B, T = tokens.shape
    if cache is None:
        cache = empty_cache(config, B, 0)
    expected = (B, T, cache.k.shape[2] + T)
    if tuple(mask.shape) != expected:
        raise ValueError(f"mask must have shape [B, T, S + T] = {expected}, got {tuple(mask.shape)}")
    if tuple(positions.shape) != (B, T):
        raise ValueError(f"positions must have shape [B, T] = {(B, T)}, got {tuple(positions.shape)}")
    return LlamaForCausalLM(config).apply({"params": params}, tokens, jnp.asarray(positions, jnp.int32),
                                          mask, cache, logits_at)


def init_params(config: ModelConfig, key: jax.Array):
    """Random parameters (normal(0.02) weights, unit norms) for tests and examples."""
    tokens = jnp.zeros((1, 1), jnp.int32)
    mask = jnp.ones((1, 1, 1), bool)
    variables = LlamaForCausalLM(config).init(key, tokens, tokens, mask, empty_cache(config, 1, 0))
    return variables["params"]


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
