"""DSBD on the entries a warp can keep (dsbd_jax/decoding/dsbd/tops.py, warping.warp_sorted,
warping.draw_short).

The short-row warp and draw against the vocabulary-length ones, the ``risk`` check of
``row_tops`` on made-up rows, and DSBD end to end on toy models by the enumeration test of
test_dsbd.py (10,000 rows of one prompt against exact beam sampling, pass at p > 1e-3): with a
top-k below the vocabulary (rows kept whole, a layer cut to its ``K`` largest), with rows cut
too (``SPARSE_EXTRA`` lowered so that ``K < V``; equal entries then send some iterations to the
``[P * V]`` form), and with a wrong ``q`` on purpose, which must fail.
"""

import collections

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import exact_reference as ref
from dsbd_jax.decoding.dsbd import generate as dsbd, tops, verify
from dsbd_jax.decoding.dsbd import DSBDConfig, dsbd_generate
from dsbd_jax.decoding.rules import normalize
from dsbd_jax.decoding.warping import (draw_from, draw_short, warp_logits,
                                       warp_sorted)

PROMPT = (1, 2, 3)
ROWS = 10_000
P_MIN = 1e-3
P_BROKEN = 1e-6


def _rows(seed, n, rows=64, ties=True):
    """Rows of log-weights with many equal entries (values on a coarse grid) and some -inf."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-12, 1, size=(rows, n)).astype(np.float32) / 4 if ties else \
        rng.normal(size=(rows, n)).astype(np.float32)
    x[rng.random((rows, n)) < 0.1] = -np.inf
    return jnp.asarray(x)


@pytest.mark.parametrize("top_k,top_p", [(3, 1.0), (5, 0.7), (8, 0.9), (None, 0.6), (4, 0.3)])
@pytest.mark.parametrize("ties", [True, False])
def test_warp_sorted_keeps_what_warp_logits_keeps(top_k, top_p, ties):
    x = _rows(0, 24, ties=ties)
    want = jnp.exp(warp_logits(x, 1.0, top_k, top_p))
    lp, order = warp_sorted(x, top_k, top_p)
    got = jnp.zeros_like(want).at[jnp.arange(x.shape[0])[:, None], order].set(jnp.exp(lp))
    np.testing.assert_array_equal(np.asarray(got) > 0, np.asarray(want) > 0)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7)
    # ascending (value, index) order
    o = np.asarray(order)
    xs = np.take_along_axis(np.asarray(x), o, axis=1)
    assert np.all((xs[:, 1:] > xs[:, :-1]) | ((xs[:, 1:] == xs[:, :-1]) & (o[:, 1:] > o[:, :-1])))


def test_warp_sorted_keep_is_the_largest_entries():
    """With ``keep``, the same probabilities on the ``keep`` largest entries, where top-k keeps
    no more than them (rows without ties)."""
    x = _rows(1, 40, ties=False)
    want = jnp.exp(warp_logits(x, 1.0, 6, 0.8))
    lp, order = warp_sorted(x, 6, 0.8, keep=10)
    assert lp.shape == (x.shape[0], 10)
    got = jnp.zeros_like(want).at[jnp.arange(x.shape[0])[:, None], order].set(jnp.exp(lp))
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-6, atol=1e-7)


def test_draw_short_draws_what_draw_from_draws():
    """Probabilities in 64ths (their running sums are exact in float32): the same index for the
    same uniform, zero entries never drawn; an all-zero row gives an index in the row."""
    rng = np.random.default_rng(2)
    p = rng.integers(0, 4, size=(200, 20)).astype(np.float32) / 64
    p[0] = 0.0
    u = jnp.asarray(rng.random((200, 7)).astype(np.float32))
    a = np.asarray(draw_short(jnp.asarray(p), u))
    b = np.asarray(jax.vmap(draw_from)(jnp.asarray(p), u))
    np.testing.assert_array_equal(a[1:], b[1:])
    assert np.all(np.take_along_axis(p, a, 1)[1:] > 0) and np.all(a[0] == p.shape[1] - 1)
    # draw_from's all-zero row: the last index of its padded blocks (its docstring)
    assert np.all(b[0] == 255)


class _Cfg:
    """What row_tops reads of a DSBD config."""

    def __init__(self, top_k, temperature=1.0):
        self.top_k, self.temperature = top_k, temperature


def test_row_tops_risk():
    L, P, V, k = 2, 3, 40, 4
    K = tops.row_size(k, V)
    rng = np.random.default_rng(3)
    joint = rng.normal(size=(L, P, V)).astype(np.float32)
    r = tops.row_tops(jnp.asarray(joint), _Cfg(k))
    assert not bool(r.risk) and r.values.shape == (L, P, K)
    np.testing.assert_array_equal(np.sort(np.asarray(r.values), -1),
                                  np.sort(-np.sort(-joint, -1)[..., :K], -1))
    np.testing.assert_array_equal(np.asarray(r.flat) // V, np.arange(P)[None, :, None]
                                  + np.zeros((L, 1, K), int))
    # a row whose k-th to K-th largest are equal: an entry equal to them may lie past K
    tied = joint.copy()
    tied[1, 2, :K + 3] = 5.0
    assert bool(tops.row_tops(jnp.asarray(tied), _Cfg(k)).risk)
    # ties that stop before the K-th largest are safe
    short = joint.copy()
    short[1, 2, :k + 2] = 5.0
    assert not bool(tops.row_tops(jnp.asarray(short), _Cfg(k)).risk)
    # one value held by more than K - k + 1 entries of a layer (many rows alike): the layer's
    # K largest may not hold every entry top-k keeps; three rows alike are safe
    many = np.broadcast_to(joint[:1, :1], (L, K, V)).copy()
    assert bool(tops.row_tops(jnp.asarray(many), _Cfg(k)).risk)
    alike = joint.copy()
    alike[0, :] = joint[0, 0]
    assert not bool(tops.row_tops(jnp.asarray(alike), _Cfg(k)).risk)
    # equal entries below every row's k-th largest never reach a kept set: rows alike in their
    # tail only are safe
    tail = np.broadcast_to(joint[:1, :1], (L, K, V)).copy()
    tail[:, :, :k] += np.arange(K * k).reshape(K, k)[None] + 100.0    # distinct tops
    assert not bool(tops.row_tops(jnp.asarray(tail), _Cfg(k)).risk)
    # rows with fewer than k finite entries (finished beams): safe while they hold at most K
    few = np.full((L, K + 1, V), -np.inf, np.float32)
    few[:, :, 0] = 0.0
    assert bool(tops.row_tops(jnp.asarray(few), _Cfg(k)).risk)
    assert not bool(tops.row_tops(jnp.asarray(few[:, :K]), _Cfg(k)).risk)


@pytest.mark.parametrize("k", [3, 5])
def test_a_layer_on_its_tops_is_the_dense_layer(k):
    """``p_beam`` and the restricted ``q`` on the tops equal the [P * V] ones where they are
    positive, for random allowed parents."""
    P, V = 3, 30
    cfg = DSBDConfig(target=ref.toy_model(V, seed=0)[0], draft=ref.toy_model(V, seed=1)[0],
                     top_k=k, top_p=0.8, temperature=1.3, gamma=2, draft_width=3, min_width=2)
    rng = np.random.default_rng(4)
    for trial in range(6):
        joint = jnp.asarray(rng.normal(size=(1, P, V)).astype(np.float32) * 2)
        ok = jnp.asarray(rng.random(P) < 0.7).at[trial % P].set(True)
        q = normalize(jnp.asarray(rng.random(P * V).astype(np.float32)) ** 8)
        qi = jnp.argsort(-q)[:tops.row_size(k, V)].astype(jnp.int32)
        r = tops.row_tops(joint, cfg)
        cand = qi[:3]
        lt = tops.layer_on_tops(r.values[0], r.flat[0], ok, q[qi], qi, cand,
                                ok[cand // V], V, cfg)
        dense_p = verify.beam_distribution(joint[0], ok, 1.3, k, 0.8)
        dense_q = verify.restrict_draft(jnp.zeros_like(q).at[qi].set(q[qi]), ok)
        got_p = jnp.zeros_like(dense_p).at[lt.index].add(lt.p_beam)
        np.testing.assert_allclose(np.asarray(got_p), np.asarray(dense_p), rtol=1e-5, atol=1e-7)
        kept = np.asarray(dense_p) > 0
        np.testing.assert_allclose(np.asarray(jnp.zeros_like(q).at[lt.index].add(lt.q))[kept],
                                   np.asarray(dense_q)[kept], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(np.asarray(lt.q_x), np.asarray(dense_q[cand]), rtol=1e-5)


# ---------------------------------------------------------------------------------------------
# end to end
def _samples(out):
    seqs, ll = np.asarray(out.sequences), np.asarray(out.log_likelihoods)
    return collections.Counter(ref.beam_key(s, l) for s, l in zip(seqs, ll))


def _run(vocab, warp, key=11, threshold=1.0):
    tc, tp = ref.toy_model(vocab, seed=0)
    dc, dp = ref.toy_model(vocab, seed=7)
    config = DSBDConfig(target=tc, draft=dc, max_new_tokens=3, gamma=2, draft_width=3,
                        min_width=2, threshold=threshold, replacement=True, eos_token_id=(4,),
                        pad_token_id=0, **warp)
    assert tops.sparse_applies(config)
    dsbd.dsbd_generate.core.clear_cache()
    try:
        out = dsbd_generate({"target": tp, "draft": dp},
                            np.tile(np.asarray([PROMPT], np.int32), (ROWS, 1)),
                            jax.random.PRNGKey(key), config)
    finally:
        dsbd.dsbd_generate.core.clear_cache()
    exact = ref.exact_beam_sample_dist(ref.make_lp_fn(tc, tp), PROMPT, [2] * 3, eos_ids=(4,),
                                       pad_id=0, **warp)
    rate = float(np.asarray(out.stats["layer_acceptance_rate"])[0])
    assert 0.05 < rate < 0.95, rate   # both outcomes of a layer occur
    return ref.chi_square_test(_samples(out), exact)


CASES = {
    # rows kept whole (K = V), each layer cut to its K largest entries
    "layers_cut": dict(vocab=6, warp=dict(top_k=3, temperature=1.3), extra=None),
    "with_top_p": dict(vocab=6, warp=dict(top_k=4, top_p=0.8, temperature=1.3), extra=None),
    # rows cut too: K = top_k + 1 < V (equal entries send iterations to the [P * V] form)
    "rows_cut": dict(vocab=7, warp=dict(top_k=3, temperature=1.3), extra=1),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_dsbd_on_tops_is_exact_beam_sampling(case, monkeypatch):
    c = CASES[case]
    if c["extra"] is not None:
        monkeypatch.setattr(tops, "SPARSE_EXTRA", c["extra"])
    res = _run(c["vocab"], c["warp"])
    print(f"{case}: p={res.pvalue:.3g} (chi2={res.statistic:.1f}, dof={res.dof})")
    assert res.pvalue > P_MIN, res


def test_dsbd_on_tops_with_a_wrong_q_fails(monkeypatch):
    """The rule handed ``q^2`` renormalised on the tops (not what the draft drew from): the
    same check fails."""
    orig = verify.layer_on_tops

    def broken(*a, **kw):
        lt = orig(*a, **kw)
        return lt._replace(q=normalize(lt.q * lt.q), q_x=lt.q_x * lt.q_x)

    monkeypatch.setattr(verify, "layer_on_tops", broken)
    res = _run(6, dict(top_k=3, temperature=1.3))
    print(f"wrong q on the tops: p={res.pvalue:.3g} (chi2={res.statistic:.1f}, dof={res.dof})")
    assert res.pvalue < P_BROKEN, res
