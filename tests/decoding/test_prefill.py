"""The prompt pass in chunks up to the batch's longest prompt gives the one-pass prompt pass's
cache and logits (and a head's features), for every mix of lengths, in one program per bucket;
decoders fed by it emit what they emitted before."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from exact_reference import toy_model

from dsbd_jax.decoding import common

P, S = 128, 136
LENGTHS = [1, 15, 16, 17, 64, 65, 100, 128]


def _prompts(V, seed=0):
    rng = np.random.default_rng(seed)
    return jnp.asarray(rng.integers(0, V, size=(len(LENGTHS), P)), jnp.int32)


@pytest.mark.parametrize("kind", ["plain", "sliding_window", "features"])
def test_chunks_give_the_one_pass_cache_and_logits(kind):
    extra = dict(sliding_window=12) if kind == "sliding_window" else {}
    config, params = toy_model(vocab=11, layers=2, **extra)
    ids, lens = _prompts(11), jnp.asarray(LENGTHS, jnp.int32)
    fl = () if kind == "features" else None
    whole = common.prefill(config, params, ids, lens, S, feature_layers=fl, chunk=0)
    for chunk in (16, 64):
        got = common.prefill(config, params, ids, lens, S, feature_layers=fl, chunk=chunk)
        np.testing.assert_allclose(got[1], whole[1], rtol=1e-5, atol=1e-5)
        for new, old in ((got[0].k, whole[0].k), (got[0].v, whole[0].v)):
            for r, n in enumerate(LENGTHS):    # the prompt's slots; later ones are never read
                np.testing.assert_allclose(new[:, r, :n], old[:, r, :n], rtol=1e-5, atol=1e-5)
        if fl is not None:
            for r, n in enumerate(LENGTHS):
                np.testing.assert_allclose(got[2][r, :n], whole[2][r, :n], rtol=1e-5,
                                           atol=1e-5)


def test_one_program_per_bucket_and_only_the_chunks_needed():
    """The trip count is traced: short and long batches in one bucket share a program; a batch
    of short prompts runs only its first chunk (it reads no token past it)."""
    config, params = toy_model(vocab=11)
    f = jax.jit(lambda i, n: common.prefill(config, params, i, n, S, chunk=32)[1])
    ids = _prompts(11)
    short = jnp.full((len(LENGTHS),), 20, jnp.int32)
    a = f(ids, short)
    poisoned = ids.at[:, 32:].set(10 ** 6)    # past the first chunk: never embedded
    np.testing.assert_array_equal(f(poisoned, short), a)
    f(ids, jnp.asarray(LENGTHS, jnp.int32))
    assert f._cache_size() == 1


def test_decoders_emit_what_the_one_pass_prefill_gave(monkeypatch):
    """Greedy sampling and beam search on 128-token prompts: the same tokens with the prompt
    pass in chunks as in one pass."""
    from dsbd_jax.decoding.beam import beam_search
    from dsbd_jax.decoding.configs import BeamSearchConfig, SampleConfig
    from dsbd_jax.decoding.sampling import sample
    config, params = toy_model(vocab=11, layers=2)
    ids, lens = _prompts(11, seed=1), jnp.asarray(LENGTHS, jnp.int32)
    runs = {}
    for chunk in (0, 32):
        monkeypatch.setattr(common, "PREFILL_CHUNK", chunk)
        # inside a new jit of its own per chunk size: traced afresh, never a stored program
        g = jax.jit(lambda i, n: sample(params, i, jax.random.PRNGKey(0), SampleConfig(
            config, max_new_tokens=4, temperature=0.0, eos_token_id=()), prompt_lengths=n
        ).sequences)(ids, lens)
        b = jax.jit(lambda i, n: beam_search(params, i, BeamSearchConfig(
            config, max_new_tokens=4, num_beams=2, eos_token_id=()), prompt_lengths=n
        ).sequences)(ids, lens)
        runs[chunk] = (np.asarray(g), np.asarray(b))
    for a, b in zip(runs[0], runs[32]):
        np.testing.assert_array_equal(a, b)
