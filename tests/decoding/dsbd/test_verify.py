"""One layer of DSBD verification (dsbd_jax/verify.py) against exact beam-sampling distributions.

Setting: a target beam joint ``p_beam`` and a draft ``q`` over N = 8 flat entries (random,
different), ``m`` candidates drawn from ``q`` (i.i.d., or successively without replacement), width
``W_L``. Whatever happens (``W_L`` accepted, or the correction layer), the layer's ``W_L`` beams
must be ``W_L`` i.i.d. draws from ``p_beam`` (replacement) or ``W_L`` successive draws without
replacement (``replacement=False``), as multisets / sets. Each case runs 30,000 layers in one
jitted vmap and applies Pearson's chi-square (exact_reference.chi_square_test, expected counts
< 5 pooled); pass: p > 1e-3 (a correct rule fails 0.1% of the time per case). A wrong rule moves
the output distribution by O(0.01-0.1) in total variation, i.e. far beyond sampling error: the
q/p' variant is checked to fail with p < 1e-6.
"""

import functools

import numpy as np
import pytest

import jax
import jax.numpy as jnp

import exact_reference as ref
from dsbd_jax.decoding import rules
from dsbd_jax.decoding.dsbd import verify
from dsbd_jax.decoding.warping import draw_from

N_FLAT = 8
RUNS = 30_000
C_MAX, W_OUT = 5, 3   # static sizes; m and the width are traced (one compile per mode)


def _pair(seed):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(N_FLAT, 0.8))
    q = rng.dirichlet(np.full(N_FLAT, 0.8))
    return p.astype(np.float32), q.astype(np.float32)


@functools.partial(jax.jit, static_argnames=("replacement",))
def _layer(key, p, q, m, width, replacement):
    """One layer: draft m candidates from q, verify, correct; returns the output flat [W_OUT]
    (-1 = no beam)."""
    W_out, C = W_OUT, C_MAX
    k1, k2 = jax.random.split(key)
    u = jax.random.uniform(k1, (2 * C + 1 + W_out,))
    g = jax.random.gumbel(k2, (2, N_FLAT))
    if replacement:
        cand = draw_from(q, u[:C])
    else:
        cand = rules.draw_gumbel(jnp.log(q), g[0], C)
    res = verify.verify_candidates(u[C:2 * C], p, q, cand, jnp.arange(C) < m, width,
                                   replacement)
    c_flat, c_valid = verify.correct_layer(u[2 * C:], g[1], p, res, cand, width, W_out,
                                           replacement)
    a_flat, _ = verify.compact(cand, res.accepted, W_out)
    passed = res.num_accepted >= width
    flat = jnp.where(passed, a_flat, c_flat)
    valid = jnp.where(passed, jnp.arange(W_out) < res.num_accepted, c_valid)
    return jnp.where(valid, flat, -1), passed


def _run(p, q, m, width, replacement, seed=0):
    keys = jax.random.split(jax.random.PRNGKey(seed), RUNS)
    flat, passed = jax.vmap(_layer, in_axes=(0, None, None, None, None, None))(
        keys, jnp.asarray(p), jnp.asarray(q), m, width, replacement)
    flat = np.asarray(flat)
    samples = [tuple(sorted(int(x) for x in row if x >= 0)) for row in flat]
    return samples, np.asarray(passed)


def _exact(p, width, replacement):
    p = np.asarray(p, np.float64)
    p = p / p.sum()
    if replacement:
        return ref._multiset_probs_with_replacement({i: float(p[i]) for i in range(len(p))}, width)
    entries = [(i, float(p[i])) for i in range(len(p)) if p[i] > 0]
    return ref._set_probs_without_replacement(entries, width)


@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("m,width,seed", [(3, 2, 0), (5, 3, 1), (1, 2, 2), (4, 1, 4)])
def test_layer_output_is_beam_sampling(m, width, seed, replacement):
    p, q = _pair(seed)
    samples, passed = _run(p, q, m, width, replacement, seed)
    res = ref.chi_square_test(samples, _exact(p, width, replacement))
    assert res.pvalue > 1e-3, res
    if m >= width:   # both branches (all accepted / correction) must occur for the test to bite
        assert 0 < passed.mean() < 1


@pytest.mark.parametrize("replacement", [True, False])
def test_dead_beams_when_support_is_small(replacement):
    """p_beam with 2 entries of positive mass and width 3: without replacement both are taken and
    the third beam is dead; with replacement 3 i.i.d. draws."""
    p = np.zeros(N_FLAT, np.float32)
    p[[1, 5]] = [0.3, 0.7]
    _, q = _pair(7)
    samples, _ = _run(p, q, 4, 3, replacement, 8)
    if replacement:
        assert ref.chi_square_test(samples, _exact(p, 3, True)).pvalue > 1e-3
    else:
        assert set(samples) == {(1, 5)}


def test_broken_acceptance_ratio_fails(monkeypatch):
    """Power check: accepting with q/p' (the paper's typo) is detected at this sample size."""
    monkeypatch.setattr(verify, "accept_test", lambda u, p_x, q_x: u * p_x < q_x)
    _layer.clear_cache()   # retrace with the broken rule
    try:
        p, q = _pair(0)
        samples, _ = _run(p, q, 3, 2, True, 0)
        assert ref.chi_square_test(samples, _exact(p, 2, True)).pvalue < 1e-6
    finally:
        _layer.clear_cache()


def test_rule_pieces():
    p = jnp.array([0.5, 0.3, 0.2, 0.0])
    q = jnp.array([0.25, 0.25, 0.25, 0.25])
    # accept w.p. min(1, p/q): x=0 always, x=3 never
    assert bool(rules.accept_test(jnp.float32(0.999), p[0], q[0]))
    assert not bool(rules.accept_test(jnp.float32(0.0), p[3], q[3]))
    np.testing.assert_allclose(rules.safe_residual(p, q), [0.25 / 0.3, 0.05 / 0.3, 0, 0],
                               rtol=1e-6)
    np.testing.assert_allclose(rules.safe_residual(q, q), q)           # nothing left: keep p'
    np.testing.assert_allclose(rules.remove(q, 1), [1 / 3, 0, 1 / 3, 1 / 3], rtol=1e-6)
    # q restricted to surviving parents (2 parents x 2 tokens), renormalised
    restricted = verify.restrict_draft(jnp.array([0.1, 0.3, 0.4, 0.2]), jnp.array([False, True]))
    np.testing.assert_allclose(restricted, [0, 0, 2 / 3, 1 / 3], rtol=1e-6)
    flat, n = verify.compact(jnp.array([7, 8, 9, 10]), jnp.array([False, True, False, True]), 3)
    assert int(n) == 2 and list(np.asarray(flat)[:2]) == [8, 10]
    # CDF draws never pick zero-probability entries, even at u -> 1
    idx = draw_from(jnp.array([0.2, 0.8, 0.0, 0.0]), jnp.array([0.0, 0.5, 0.9999999]))
    assert list(np.asarray(idx)) == [0, 1, 1]


def _candidate_by_candidate(u, p_beam, q, cand, cand_ok, width):
    """The with-replacement rule as it reads: one candidate after another, ``p'`` carried."""
    def step(carry, xs):
        p_res, n_acc = carry
        u_c, x, ok = xs
        live = ok & (n_acc < width)
        acc = live & rules.accept_test(u_c, verify.pick(p_res, x), verify.pick(q, x))
        p_next = jnp.where(acc, p_beam,
                           jnp.where(live & ~acc, rules.safe_residual(p_res, q), p_res))
        return (p_next, n_acc + acc.astype(jnp.int32)), acc

    (p_res, n_acc), accepted = jax.lax.scan(step, (p_beam, jnp.int32(0)), (u, cand, cand_ok))
    return accepted, n_acc, p_res


@pytest.mark.parametrize("degenerate", [False, True])
def test_rule_at_once_is_the_rule_candidate_by_candidate(degenerate):
    """With replacement every test is computed at once from the residual chain: the accepted
    candidates and their count must be the sequential rule's, and ``p'`` the same up to the
    roundings of the residuals' sums, which XLA may order differently in straight-line code
    than in a loop (also where ``p' - q`` empties and ``reject_update`` keeps ``p'``, and under
    the width's early stop)."""
    rng = np.random.default_rng(3)
    both = jax.jit(lambda *a: (verify.verify_candidates(*a, True), _candidate_by_candidate(*a)))
    for trial in range(40):
        p, q = _pair(100 + trial)
        if degenerate:
            q = p.copy()
        cand = rng.choice(N_FLAT, size=C_MAX, p=q / q.sum()).astype(np.int32)
        u = rng.random(C_MAX).astype(np.float32)
        ok = rng.random(C_MAX) < 0.85
        width = np.int32(rng.integers(1, C_MAX + 1))
        got, want = both(jnp.asarray(u), jnp.asarray(p), jnp.asarray(q), jnp.asarray(cand),
                         jnp.asarray(ok), width)
        np.testing.assert_array_equal(np.asarray(got.accepted), np.asarray(want[0]))
        assert int(got.num_accepted) == int(want[1])
        np.testing.assert_allclose(np.asarray(got.residual), np.asarray(want[2]), rtol=2e-6,
                                   atol=1e-9)
