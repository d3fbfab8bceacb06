"""Dynamic width (dsbd_jax/width.py): the P(m, k) recursion, its base cases, and the chosen width
against a brute-force Monte-Carlo simulation of the real multi-candidate acceptance process.

Statistical test: Pearson chi-square of 200,000 simulated acceptance counts against ``P(m, .)``
from JAX; the threshold p > 1e-3 fails a correct implementation 0.1% of the time, while a wrong
recursion (e.g. subtracting q twice per step, the official code's slip) moves probabilities by
> 0.01, i.e. > 10 standard errors at this sample size.
"""

import numpy as np
import pytest
import scipy.stats

import jax
import jax.numpy as jnp

from dsbd_jax.decoding.dsbd import width as dw

_width_from_counts = jax.jit(dw.width_from_counts)     # threshold / widths traced: one compile
_count_probs = jax.jit(dw.count_probs)
_alphas = jax.jit(dw.acceptance_rates, static_argnums=2)


def _np_alphas(p, q, n):
    out, pj = [], p.copy()
    for _ in range(n):
        out.append(np.minimum(pj, q).sum())
        r = np.maximum(pj - q, 0.0)
        pj = r / r.sum() if r.sum() > 0 else r
    return np.array(out)


def _simulate_counts(p, q, m, runs, rng):
    """Accepted candidates among m i.i.d. draws from q, multi-candidate rule, no early stop."""
    N = len(p)
    res = [p]
    for _ in range(m):                       # p_1 .. p_{m+1}: the residual after j rejections
        r = np.maximum(res[-1] - q, 0.0)
        res.append(r / r.sum() if r.sum() > 0 else r)
    res = np.stack(res)
    state = np.zeros(runs, int)              # rejections since the last acceptance
    count = np.zeros(runs, int)
    for _ in range(m):
        x = rng.choice(N, size=runs, p=q)
        acc = rng.random(runs) * q[x] < res[state, x]
        count += acc
        state = np.where(acc, 0, state + 1)
    return count


def _pair(seed, N=10):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(N, 0.7))
    q = rng.dirichlet(np.full(N, 0.7))
    return p, q


def test_count_probs_base_cases():
    alphas = jnp.array([0.3, 0.6, 0.2, 0.9])
    P = np.asarray(dw.count_probs(alphas), np.float64)
    a = np.asarray(alphas, np.float64)
    assert P.shape == (5, 5)
    assert P[0, 0] == pytest.approx(1.0) and np.all(P[0, 1:] == 0)
    for m in range(5):
        assert P[m, 0] == pytest.approx(np.prod(1 - a[:m]), abs=1e-6)      # P(m, 0)
        assert np.all(P[m, m + 1:] == 0)                                    # k > m
        assert P[m].sum() == pytest.approx(1.0, abs=1e-6)
    assert P[1, 1] == pytest.approx(a[0], abs=1e-6)
    assert P[2, 1] == pytest.approx(a[0] * (1 - a[0]) + (1 - a[0]) * a[1], abs=1e-6)
    assert P[2, 2] == pytest.approx(a[0] * a[0], abs=1e-6)   # restart from p_beam after accept
    # certain / impossible acceptance
    assert np.allclose(np.diag(np.asarray(dw.count_probs(jnp.ones(3)))), 1.0)
    assert np.allclose(np.asarray(dw.count_probs(jnp.zeros(3)))[:, 0], 1.0)


@pytest.mark.parametrize("seed,m", [(0, 4), (1, 3), (2, 5)])
def test_counts_match_monte_carlo(seed, m):
    p, q = _pair(seed)
    alphas = _alphas(jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32), m)
    assert np.allclose(np.asarray(alphas), _np_alphas(p, q, m), atol=1e-5)
    table = _count_probs(alphas)
    P = np.asarray(table, np.float64)[m]
    runs = 200_000
    counts = np.bincount(_simulate_counts(p, q, m, runs, np.random.default_rng(seed + 10)),
                         minlength=m + 1)
    keep = P * runs >= 5
    expected = P[keep] * runs
    observed = counts[keep]
    assert counts[~keep].sum() <= max(5, 3 * (P[~keep].sum() * runs) + 5)
    stat = np.sum((observed - expected) ** 2 / expected)
    pval = scipy.stats.chi2.sf(stat, keep.sum() - 1)
    assert pval > 1e-3, (P, counts / runs, pval)

    # the width the rule picks equals the one read off the simulated counts (thresholds not
    # within sampling error of a tail probability)
    tail_mc = np.cumsum((counts / runs)[::-1])[::-1]
    se = np.sqrt(tail_mc * (1 - tail_mc) / runs)
    for t in np.linspace(0.05, 0.95, 19):
        if np.any(np.abs(tail_mc - t) < 5 * se + 1e-6):
            continue
        w_mc = max(K for K in range(m + 1) if K == 0 or tail_mc[K] >= t)
        for wmin, wmax in ((1, 8), (2, 8), (1, 2)):
            got = int(_width_from_counts(table, jnp.int32(m), jnp.float32(t), jnp.int32(wmin),
                                         jnp.int32(wmax)))
            assert got == min(wmax, max(wmin, w_mc)), (t, wmin, wmax)
    # and the end-to-end entry point agrees
    got = int(dw.layer_width(jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32),
                             jnp.int32(m), 0.5, 1, 8, m))
    assert got == int(_width_from_counts(table, jnp.int32(m), jnp.float32(0.5), 1, 8))


def test_width_uses_present_candidates_only():
    p, q = _pair(3)
    P32, Q32 = jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32)
    table = _count_probs(_alphas(P32, Q32, 4))
    for m in range(0, 5):
        w = int(_width_from_counts(table, jnp.int32(m), jnp.float32(0.0), 1, 8))
        assert w == max(1, m)                            # t = 0: every present candidate
    assert int(_width_from_counts(table, jnp.int32(4), jnp.float32(0.0), 1, 3)) == 3  # cap


def test_threshold_one_is_fixed_width():
    p, _ = _pair(4)
    P32 = jnp.asarray(p, jnp.float32)
    # even when acceptance is certain (p == q) t = 1 gives W_min
    for wmin in (1, 2, 3):
        assert int(dw.layer_width(P32, P32, jnp.int32(4), 1.0, wmin, 4, 4)) == wmin


def test_expected_layers_formula():
    for a, g in ((0.3, 1), (0.7, 4), (0.95, 2)):
        assert float(dw.expected_layers(a, g)) == pytest.approx(sum(a ** k for k in range(g + 1)),
                                                                rel=1e-5)
    assert float(dw.expected_layers(1.0, 3)) == 4.0


@pytest.mark.parametrize("case", ["random", "p_equals_q"])
def test_rates_from_the_verification_chain_are_the_width_rates(case):
    """The width reads its alphas off the rule's residual chain; they must be
    ``acceptance_rates``' (up to the roundings of the residuals' sums), also once the plain
    residual empties, where the rule's safe residual keeps ``p'`` and the width's chain stays
    zero: every later alpha exactly 0."""
    from dsbd_jax.decoding.dsbd import verify
    p, q = _pair(11)
    if case == "p_equals_q":
        q = p
    p, q = jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32)

    @jax.jit
    def both(p, q):
        chain, emptied = verify.residual_chain(p, q, 5)
        return dw.rates_from_chain(chain[:5], q, emptied), dw.acceptance_rates(p, q, 5), emptied

    got, want, emptied = both(p, q)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-6, atol=1e-9)
    np.testing.assert_array_equal(np.asarray(got) == 0, np.asarray(want) == 0)
    if case != "random":
        assert bool(np.any(np.asarray(emptied)))
        assert float(np.asarray(got)[-1]) == 0.0
