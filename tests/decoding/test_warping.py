"""warping.warp_logits against Hugging Face's Temperature/TopK/TopP logits warpers (PyTorch),
applied in HF's order (temperature, top-k, top-p), on random logits, logits with ties, and on
the flattened beam joint; plus the edge cases HF does not cover (temperature 0 = greedy,
top-k >= vocab, top-p = 1) and invalid settings."""

import numpy as np
import pytest
import torch
from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                    TopPLogitsWarper)

import jax.numpy as jnp

from dsbd_jax.decoding.configs import (BeamSampleConfig, BeamSearchConfig, DSBDConfig,
                                       SampleConfig, SpeculativeConfig, TreeConfig)
from dsbd_jax.models.config import ModelConfig
from dsbd_jax.decoding.warping import warp_logits

torch.set_num_threads(1)  # tiny tensors: a thread pool only adds overhead on shared cores


def hf_warp(logits: np.ndarray, temperature, top_k, top_p) -> np.ndarray:
    scores = torch.tensor(logits, dtype=torch.float32)
    ids = torch.zeros((scores.shape[0], 1), dtype=torch.long)
    if temperature != 1.0:
        scores = TemperatureLogitsWarper(temperature)(ids, scores)
    if top_k:
        scores = TopKLogitsWarper(top_k)(ids, scores)
    if top_p < 1.0:
        scores = TopPLogitsWarper(top_p)(ids, scores)
    return torch.log_softmax(scores, dim=-1).numpy()


def assert_same_warp(ours, theirs):
    ours = np.asarray(ours)
    np.testing.assert_array_equal(np.isfinite(ours), np.isfinite(theirs))
    fin = np.isfinite(theirs)
    np.testing.assert_allclose(ours[fin], theirs[fin], rtol=1e-5, atol=1e-5)


SETTINGS = [(1.0, None, 1.0), (0.7, None, 1.0), (1.0, 5, 1.0), (1.0, None, 0.8), (1.3, 7, 0.9),
            (0.5, 3, 0.6), (2.0, 12, 0.95), (1.0, 1, 1.0), (1.0, None, 0.05), (0.9, 40, 0.99)]


@pytest.mark.parametrize("seed,temperature,top_k,top_p", [(i,) + s for i, s in enumerate(SETTINGS)])
def test_matches_hf_on_random_logits(seed, temperature, top_k, top_p):
    rng = np.random.default_rng(seed)
    logits = (rng.standard_normal((64, 37)) * rng.uniform(0.5, 4.0, (64, 1))).astype(np.float32)
    assert_same_warp(warp_logits(jnp.asarray(logits), temperature, top_k, top_p),
                     hf_warp(logits, temperature, top_k, top_p))


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, 3, 1.0), (1.0, 4, 1.0), (0.8, 6, 1.0),
                                                     (1.0, None, 0.5), (1.0, 5, 0.7)])
def test_matches_hf_with_ties(temperature, top_k, top_p):
    """Integer logits: many ties, including at the top-k boundary (all tied entries are kept)."""
    rng = np.random.default_rng(7)
    logits = rng.integers(-3, 3, (200, 12)).astype(np.float32)
    assert_same_warp(warp_logits(jnp.asarray(logits), temperature, top_k, top_p),
                     hf_warp(logits, temperature, top_k, top_p))
    if top_k:  # ties at the k-th value really occur and keep more than k entries
        kept = np.isfinite(np.asarray(warp_logits(jnp.asarray(logits), 1.0, top_k, 1.0))).sum(-1)
        assert kept.max() > top_k


def test_joint_warping_is_warping_of_the_flat_joint():
    """Beam joint [rows, W, V] flattened to [rows, W*V]: top-k counts (beam, token) pairs."""
    rng = np.random.default_rng(3)
    W, V = 3, 11
    scores = rng.normal(-3, 1, (20, W, 1))
    logp = np.log(rng.dirichlet(np.ones(V) * 0.5, (20, W)))
    joint = (scores + logp).reshape(20, W * V).astype(np.float32)
    ours = np.asarray(warp_logits(jnp.asarray(joint), 0.8, 10, 0.9))
    assert_same_warp(ours, hf_warp(joint, 0.8, 10, 0.9))
    assert (np.isfinite(ours).sum(-1) <= 10).all()


def test_neg_inf_entries_stay_zero():
    logits = np.array([[0.0, -np.inf, 1.0, -np.inf, 2.0]], np.float32)
    for args in [(1.0, None, 1.0), (0.5, 4, 1.0), (1.0, None, 0.999), (1.0, 10, 1.0)]:
        out = np.asarray(warp_logits(jnp.asarray(logits), *args))
        assert np.isneginf(out[0, [1, 3]]).all()
        assert_same_warp(out, hf_warp(logits, *args))


def test_greedy_top_k_all_top_p_one():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((50, 9)).astype(np.float32)
    logits[0] = [1, 3, 3, 0, 0, 0, 0, 0, 0]  # tie for the max: lowest index wins
    g = np.asarray(warp_logits(jnp.asarray(logits), 0.0, 5, 0.5))
    assert (np.isfinite(g).sum(-1) == 1).all()
    np.testing.assert_array_equal(np.argmax(g, -1), np.argmax(logits, -1))
    assert g[0, 1] == 0.0
    full = np.asarray(warp_logits(jnp.asarray(logits), 1.0, None, 1.0))
    ref = logits - np.log(np.exp(logits.astype(np.float64)).sum(-1, keepdims=True))
    np.testing.assert_allclose(full, ref, atol=1e-5)
    for k in (0, 9, 100):  # off, == vocab, > vocab: keep everything
        np.testing.assert_allclose(np.asarray(warp_logits(jnp.asarray(logits), 1.0, k, 1.0)), full)
    # top_p = 1 keeps entries whose probability underflows (HF's cum <= 0 test would drop them)
    extreme = np.array([[0.0, -120.0, -200.0]], np.float32)
    assert np.isfinite(np.asarray(warp_logits(jnp.asarray(extreme), 1.0, None, 1.0))).all()


@pytest.mark.parametrize("kwargs", [dict(temperature=-0.5), dict(temperature=float("nan")),
                                    dict(temperature=float("inf")), dict(top_k=-1),
                                    dict(top_k=2.5), dict(top_p=0.0), dict(top_p=1.5),
                                    dict(top_p=-0.1), dict(top_p=float("nan"))])
def test_invalid_settings_raise(kwargs):
    args = dict(temperature=1.0, top_k=None, top_p=1.0)
    args.update(kwargs)
    with pytest.raises(ValueError):
        warp_logits(jnp.zeros((2, 5)), **args)
    cfg = ModelConfig(vocab_size=5, hidden_size=8, intermediate_size=8, num_layers=1,
                      num_heads=1, num_kv_heads=1, head_dim=8)
    for cls in (SampleConfig, BeamSampleConfig, BeamSearchConfig):   # every decoder's config
        with pytest.raises(ValueError):
            cls(cfg, **args)
    for cls in (SpeculativeConfig, TreeConfig, DSBDConfig):
        with pytest.raises(ValueError):
            cls(cfg, draft=cfg, **args)


# ---------------------------------------------------------------------------------------------
# the sort-free paths: rows longer than the top-p candidate set, ties on the joint, fallback
def _duplicate_beam_joint(rng, rows, W, V, integer):
    """A beam joint [rows, W*V]; beams 1..W-1 are copies of beam 0 (i.i.d. beam sampling draws
    the same beam twice: every joint entry is then tied W-fold). ``integer``: integer values,
    so that different tokens tie as well."""
    if integer:
        logp = rng.integers(-6, 1, (rows, 1, V)).astype(np.float32)
    else:
        logp = (rng.standard_normal((rows, 1, V)) * 3).astype(np.float32)
    return np.repeat(logp, W, axis=1).reshape(rows, W * V)


# top-p values whose 1 - top_p is no ratio of small integers: a cumulative sum of equal tied
# probabilities never lands on it exactly, where float32 rounding alone would decide
@pytest.mark.parametrize("integer,top_k,top_p", [(False, 10, 0.8), (False, 10, 1.0),
                                                 (False, 25, 0.95), (True, 10, 0.8137),
                                                 (True, 3, 0.5371), (True, 25, 0.9123)])
def test_ties_on_the_joint_of_duplicate_beams(integer, top_k, top_p):
    """4 identical beams: ties at the top-k boundary keep more than k entries (HF keeps every
    entry tied with the k-th), and top-p cuts inside a tie group in index order. HF sorts with
    torch's unstable sort, whose order inside a tie group is arbitrary on long rows, so the
    reference is HF's rule with a stable sort (:func:`stable_warp`)."""
    rng = np.random.default_rng(11)
    joint = _duplicate_beam_joint(rng, 40, 4, 300 if not integer else 40, integer)
    ours = np.asarray(warp_logits(jnp.asarray(joint), 1.0, top_k, top_p))
    assert_same_warp(ours, stable_warp(joint, top_k, top_p))
    top_k_alone = np.asarray(warp_logits(jnp.asarray(joint), 1.0, top_k, 1.0))
    assert (np.isfinite(top_k_alone).sum(-1) > top_k).any()  # ties at the k-th value occur


def stable_warp(logits: np.ndarray, top_k, top_p) -> np.ndarray:
    """HF's top-k / top-p rules (temperature 1) with a STABLE ascending sort, in numpy float64:
    ties at the top-p cut are ordered by index (the library's documented rule)."""
    x = logits.astype(np.float64).copy()
    if top_k:
        kth = np.sort(x, axis=-1)[:, -top_k][:, None]
        x[x < kth] = -np.inf
    if top_p < 1.0:
        order = np.argsort(x, axis=-1, kind="stable")
        sx = np.take_along_axis(x, order, -1)
        p = np.exp(sx - sx[:, -1:])
        cum = np.cumsum(p / p.sum(-1, keepdims=True), -1)
        rm = cum <= 1.0 - top_p
        rm[:, -1] = False
        remove = np.zeros_like(rm)
        np.put_along_axis(remove, order, rm, -1)
        x[remove] = -np.inf
    m = x.max(-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))


@pytest.mark.parametrize("scale,top_p", [(6.0, 0.8), (4.0, 0.95), (0.3, 0.8), (0.05, 0.5),
                                         (2.0, 0.99)])
def test_top_p_alone_on_long_rows(scale, top_p):
    """Rows of 2,000 entries (longer than TOP_P_CANDIDATES): peaked rows stay within the
    candidates, flat rows (small scale) take the exact full-sort fallback; both match HF."""
    from dsbd_jax.decoding.warping import TOP_P_CANDIDATES
    rng = np.random.default_rng(int(scale * 100))
    logits = (rng.standard_normal((16, 2000)) * scale).astype(np.float32)
    ours = np.asarray(warp_logits(jnp.asarray(logits), 1.0, None, top_p))
    assert_same_warp(ours, hf_warp(logits, 1.0, None, top_p))
    kept = np.isfinite(ours).sum(-1)
    if scale < 1.0:
        assert kept.max() > TOP_P_CANDIDATES  # the fallback was needed and taken


def test_top_p_alone_with_ties_beyond_the_candidates():
    """Integer logits on 1,000 entries: the tie group at the candidates' last value reaches far
    past the candidate set (reference: the stable-sort rule, see above)."""
    rng = np.random.default_rng(5)
    logits = rng.integers(-2, 2, (30, 1000)).astype(np.float32)
    for top_p in (0.3137, 0.9123):
        assert_same_warp(warp_logits(jnp.asarray(logits), 1.0, None, top_p),
                         stable_warp(logits, None, top_p))


def test_no_full_row_sort_in_the_compiled_warp():
    """The joint of 4 beams of a 151,936-token vocabulary, top-k 10 + top-p 0.8, jitted as part
    of a larger program (log-softmax before, a draw after): the compiled program has no sort
    (XLA:CPU turns a fused top_k into one unless it is kept apart)."""
    import jax

    def program(logits, key):
        logp = jax.nn.log_softmax(logits, axis=-1).reshape(-1)
        return jax.random.categorical(key, warp_logits(logp, 1.0, 10, 0.8))
    hlo = jax.jit(program).lower(jnp.zeros((4, 151936)), jax.random.PRNGKey(0)).compile().as_text()
    assert " sort(" not in hlo and "TopK" in hlo
