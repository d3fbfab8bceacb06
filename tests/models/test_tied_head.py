"""Tied vocabulary heads: one row runs ``E h^T`` (XLA:CPU's fast order for a single row), more
rows ``attend``'s ``h E^T``; both are the same product to float rounding, and a truncated tied
head with every row still reproduces the full logits bit for bit."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dsbd_jax.models import llama
from dsbd_jax.models.config import ModelConfig
from dsbd_jax.models.vocab import tied_logits, truncate_head, untie_head

V, D = 300, 32


def _dots(fn, *args):
    """The operand shapes of every dot_general in ``fn``'s jaxpr."""
    jaxpr = jax.make_jaxpr(fn)(*args)
    return [tuple(tuple(v.aval.shape) for v in e.invars) for e in jaxpr.eqns
            if e.primitive.name == "dot_general"]


@pytest.mark.parametrize("shape", [(D,), (1, D), (1, 1, D)])
def test_one_row_uses_the_embedding_as_left_operand(shape):
    rng = np.random.default_rng(0)
    E = jnp.asarray(rng.standard_normal((V, D), np.float32))
    h = jnp.asarray(rng.standard_normal(shape, np.float32))
    out = tied_logits(h, E)
    assert out.shape == shape[:-1] + (V,)
    assert _dots(tied_logits, h, E) == [((V, D), (1, D))]
    np.testing.assert_allclose(np.asarray(out), np.asarray(jnp.dot(h, E.T)), rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("shape", [(2, D), (1, 4, D), (3, 1, D)])
def test_more_rows_are_attend_bit_for_bit(shape):
    rng = np.random.default_rng(1)
    E = jnp.asarray(rng.standard_normal((V, D), np.float32))
    h = jnp.asarray(rng.standard_normal(shape, np.float32))
    assert _dots(tied_logits, h, E)[0][0] == shape
    np.testing.assert_array_equal(np.asarray(jax.jit(tied_logits)(h, E)),
                                  np.asarray(jax.jit(lambda h, E: jnp.dot(h, E.T))(h, E)))


def _tied_model():
    cfg = ModelConfig(vocab_size=V, hidden_size=D, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, max_position_embeddings=64,
                      tie_word_embeddings=True)
    return cfg, llama.init_params(cfg, jax.random.PRNGKey(0), "per_layer")


def _logits(cfg, params, B, T):
    tokens = jnp.arange(B * T, dtype=jnp.int32).reshape(B, T) % cfg.vocab_size
    positions = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (B, T, T))
    return np.asarray(jax.jit(lambda p: llama.forward(cfg, p, tokens, positions, mask)[0])(params))


@pytest.mark.parametrize("B,T", [(1, 1), (1, 3), (2, 1)])
def test_tied_model_forward_and_full_truncation(B, T):
    cfg, params = _tied_model()
    full = _logits(cfg, params, B, T)
    # against attend's order on the same hidden states: same product to float rounding
    untied_cfg = dataclasses.replace(cfg, tie_word_embeddings=False)
    untied = dict(params, lm_head={"kernel": params["embed"]["embedding"].T})
    np.testing.assert_allclose(full, _logits(untied_cfg, untied, B, T), rtol=1e-4, atol=1e-5)
    # a truncated tied head with every row: the same logits, bit for bit
    cut = truncate_head(params, cfg, np.arange(V))
    np.testing.assert_array_equal(_logits(cfg, cut, B, T), full)


def test_untie_head_same_logits_and_truncation():
    cfg, params = _tied_model()
    up, ucfg = untie_head(params, cfg)
    assert not ucfg.tie_word_embeddings and cfg.tie_word_embeddings
    assert up["lm_head"]["kernel"].shape == (D, V) and "lm_head" not in params
    for B, T in ((1, 1), (2, 1), (1, 3)):
        np.testing.assert_allclose(_logits(ucfg, up, B, T), _logits(cfg, params, B, T),
                                   rtol=1e-4, atol=1e-5)
    # untie, then truncate: a truncated head with every row is the untied logits bit for bit
    cut = truncate_head(up, ucfg, np.arange(V))
    assert "kernel" in cut["vocab_head"] and "lm_head" not in cut
    np.testing.assert_array_equal(_logits(ucfg, cut, 2, 1), _logits(ucfg, up, 2, 1))
    # an untied model is returned as it is; a truncated one is refused
    assert untie_head(up, ucfg)[0] is up
    with pytest.raises(ValueError, match="untie the full model"):
        untie_head(truncate_head(params, cfg, [1, 2]), cfg)
    with pytest.raises(TypeError):
        untie_head([params], cfg)


def test_load_model_untie_head(tmp_path):
    from hf_files import hf_config, hf_tensors, write_hf

    from dsbd_jax.loading.load import load_model
    write_hf(tmp_path / "m", hf_config(tie_word_embeddings=True), hf_tensors(seed=1, tied=True))
    tied = load_model(tmp_path / "m", progress=False)
    untied = load_model(tmp_path / "m", progress=False, untie_head=True, head_rows=None)
    assert untied.info["untied_head"] and not tied.info["untied_head"]
    assert not untied.config.tie_word_embeddings
    np.testing.assert_array_equal(np.asarray(untied.params["lm_head"]["kernel"]),
                                  np.asarray(tied.params["embed"]["embedding"]).T)
    B, T = 2, 1
    np.testing.assert_allclose(_logits(untied.config, untied.params, B, T),
                               _logits(tied.config, tied.params, B, T), rtol=1e-4, atol=1e-5)
