"""The unrolled steps of head training attend as the draft tokens they stand for do while
decoding (``training.head.unrolled_steps``, ``unrolled_mask``): step ``k + 1`` at a counted
position ``j`` equals a depth-``k + 1`` draft token read through a cache of step 1's keys up to
the chain's root and the chain's own deeper keys, one token at a time."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dsbd_jax.models import head as mh
from dsbd_jax.models import llama
from dsbd_jax.models.cache import KVCache
from dsbd_jax.models.config import ModelConfig
from dsbd_jax.training import head as th

CFG = ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2,
                  num_kv_heads=1, head_dim=8, max_position_embeddings=64)
B, T, N = 2, 10, 5


def _setup(loss_from=(4, 1)):
    tp = llama.init_params(CFG, jax.random.PRNGKey(0), "per_layer")
    hc = mh.HeadConfig(CFG)
    hp = mh.init_params(hc, jax.random.PRNGKey(1), scale=4.0)
    lengths = np.array([T, T - 3], np.int32)
    at = np.stack([np.minimum(f + np.arange(N), T - 1) for f in loss_from]).astype(np.int32)
    batch = {"tokens": jax.random.randint(jax.random.PRNGKey(2), (B, T), 0, 32),
             "feats": jax.random.normal(jax.random.PRNGKey(3), (B, T, 16)),
             "lengths": jnp.asarray(lengths), "pos": jnp.asarray(at),
             "mask": jnp.asarray(at < lengths[:, None] - 1),
             "ids": jax.random.randint(jax.random.PRNGKey(4), (B, N, 4), 0, 32),
             "probs": jax.nn.softmax(jax.random.normal(jax.random.PRNGKey(5), (B, N, 4)))}
    return tp, hc, hp, batch


def _as_decoded(tp, hc, hp, batch, k, j, b):
    """The depth-``k + 1`` draft token at ``j`` of row ``b``, read as a decoder reads it: a cache
    of step 1's keys at ``0 .. r = j - k`` (the target's features), then the chain's tokens
    ``r + 1 .. j`` one at a time, each reading the cache so far and the feature the token before
    it gave (the root's: step 1's output at ``r``)."""
    toks, L = batch["tokens"][b:b + 1], int(batch["lengths"][b])
    pos = jnp.arange(T, dtype=jnp.int32)[None]
    _, kv1, out1 = mh.forward(hc, hp, tp, toks, mh.features_of_prompt(batch["feats"])[b:b + 1],
                              pos, llama.causal_mask(jnp.array([L]), T))
    if k == 0:   # a first draft token: the causal pass
        full, _, _ = mh.forward(hc, hp, tp, toks, mh.features_of_prompt(batch["feats"])[b:b + 1],
                                pos, llama.causal_mask(jnp.array([L]), T))
        return full[0, j]
    r = j - k
    ck, cv, feat = [kv1.k[:, :, :r + 1]], [kv1.v[:, :, :r + 1]], out1[:, r:r + 1]
    logits = None
    for i in range(r + 1, j + 1):
        cache = KVCache(jnp.concatenate(ck, 2), jnp.concatenate(cv, 2))
        logits, kv, feat = mh.forward(hc, hp, tp, toks[:, i:i + 1], feat, pos[:, i:i + 1],
                                      jnp.ones((1, 1, cache.k.shape[2] + 1), bool), cache)
        ck.append(kv.k)
        cv.append(kv.v)
    return logits[0, 0]


@pytest.mark.parametrize("unroll", [2, 3])
def test_each_unrolled_step_reads_the_context_a_decoded_draft_token_reads(unroll):
    tp, hc, hp, batch = _setup()
    steps = jax.jit(lambda b: th.unrolled_steps(hc, hp, tp, b, unroll))(batch)
    own = th.unrolled_steps(hc, hp, tp, batch, unroll, context="own")
    for k in range(unroll):
        for b in range(B):
            for n in range(N):
                j = int(batch["pos"][b, n])
                if not bool(batch["mask"][b, n]) or j < k:
                    continue
                want = _as_decoded(tp, hc, hp, batch, k, j, b)
                np.testing.assert_allclose(steps[k][0][b, n], want, rtol=1e-4, atol=1e-4,
                                           err_msg=f"step {k + 1} row {b} position {j}")
                if k and j > k:  # past the text's first token, the former unroll's context
                    # (the head's outputs everywhere) is another one
                    assert not np.allclose(own[k][0][b, n], want, rtol=1e-3, atol=1e-3)
        assert np.isfinite(np.asarray(steps[k][0])).all()
    np.testing.assert_allclose(steps[0][0], own[0][0], rtol=1e-5, atol=1e-5)
    # the losses differ only past step 1
    cfg = th.HeadTrainConfig(unroll=unroll)
    _, mt = th.head_losses(hc, hp, tp, batch, cfg)
    _, mo = th.head_losses(hc, hp, tp, batch, cfg, context="own")
    assert mt["kl_1"] == pytest.approx(float(mo["kl_1"]), rel=1e-5)
    assert abs(float(mt["kl_2"]) - float(mo["kl_2"])) > 1e-3


def test_the_mask_of_each_step():
    q = jnp.arange(2, 7)[None]               # five query positions 2 .. 6 of a 7-token text
    m = np.asarray(th.unrolled_mask(q, jnp.array([7]), 7, 2))[0]       # step 3
    assert m.shape == (5, 7 + 5 + 5)
    # query 6 (index 4), root 4: step 1's keys 0..4, step 2's key at 5 (index 3), itself
    assert list(np.nonzero(m[4])[0]) == [0, 1, 2, 3, 4, 7 + 3, 12 + 4]
    m1 = np.asarray(th.unrolled_mask(q, jnp.array([5]), 7, 0))[0]      # step 1, length 5
    assert list(np.nonzero(m1[1])[0]) == [0, 1, 2, 7 + 1]               # query 3: keys < 3
    assert list(np.nonzero(m1[4])[0]) == [7 + 4]                        # padding: itself only
    with pytest.raises(ValueError, match="unroll_context"):
        th.HeadTrainConfig(unroll_context="mixed")
