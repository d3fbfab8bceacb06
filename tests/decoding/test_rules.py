"""The rules of ``dsbd_jax.decoding.rules``, each once: the pieces on small vectors, and two
statistical tests that a wrong rule fails.

* One speculative step (draw ``x ~ q``; keep it iff ``accept_test``; else draw from
  ``safe_residual(p, q)``) emits exactly ``p``: a chi-square test over 6 tokens with 40,000
  draws; the paper's typo (accept with ``q / p``) moves the output by tens of sigmas, so it
  fails the same test (p-value < 1e-6).
* ``draw_gumbel``'s first two draws are successive draws without replacement: ordered pairs
  ``(a, b)`` have probability ``p_a p_b / (1 - p_a)``; noise of the wrong scale (0.5) is found.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from dsbd_jax.decoding import rules
from dsbd_jax.decoding.warping import draw_from, warp_logits

N = 40_000
P = np.array([0.30, 0.25, 0.20, 0.12, 0.08, 0.05], np.float32)
Q = np.array([0.10, 0.40, 0.05, 0.25, 0.15, 0.05], np.float32)


def test_rule_pieces():
    p = jnp.array([0.5, 0.3, 0.2, 0.0])
    q = jnp.array([0.25, 0.25, 0.25, 0.25])
    assert bool(rules.accept_test(jnp.float32(0.999), p[0], q[0]))   # p >= q: always
    assert not bool(rules.accept_test(jnp.float32(0.0), p[3], q[3]))  # p = 0: never
    np.testing.assert_allclose(rules.safe_residual(p, q), [0.25 / 0.3, 0.05 / 0.3, 0, 0],
                               rtol=1e-6)
    np.testing.assert_allclose(rules.residual(p, q), rules.safe_residual(p, q), rtol=1e-6)
    np.testing.assert_allclose(rules.safe_residual(q, q), q)          # nothing left: keep p
    np.testing.assert_allclose(rules.residual(q, q), jnp.zeros(4))    # the plain one: zeros
    left = rules.safe_residual_and_left(jnp.stack([p, q]), jnp.stack([q, q]))[1]
    assert left[:, 0].tolist() == [True, False]
    np.testing.assert_allclose(rules.remove(q, 1), [1 / 3, 0, 1 / 3, 1 / 3], rtol=1e-6)
    np.testing.assert_allclose(rules.normalize(jnp.zeros(3)), jnp.zeros(3))   # no NaN


def _speculative_step(accept):
    key = jax.random.key(0)
    u = jax.random.uniform(key, (N, 3))
    p, q = jnp.asarray(P), jnp.asarray(Q)
    x = draw_from(jnp.broadcast_to(q, (N, 6)), u[:, :1])[:, 0]
    keep = accept(u[:, 1], p[x], q[x])
    y = draw_from(jnp.broadcast_to(rules.safe_residual(p, q), (N, 6)), u[:, 2:])[:, 0]
    return np.asarray(jnp.where(keep, x, y))


@pytest.mark.parametrize("broken", [False, True])
def test_a_speculative_step_emits_p(broken):
    accept = (lambda u, p_x, q_x: u * p_x < q_x) if broken else rules.accept_test
    counts = np.bincount(_speculative_step(accept), minlength=6)
    pvalue = stats.chisquare(counts, N * P.astype(np.float64) / P.sum()).pvalue
    if broken:
        assert pvalue < 1e-6
    else:
        assert pvalue > 1e-3


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_gumbel_draws_are_successive_draws_without_replacement(scale):
    logp = jnp.log(jnp.asarray(P[:5] / P[:5].sum()))
    g = jax.random.gumbel(jax.random.key(1), (N, 5)) * scale
    pairs = np.asarray(jax.vmap(lambda gi: rules.draw_gumbel(logp, gi, 2))(g))
    p = np.exp(np.asarray(logp, np.float64))
    cells = list(itertools.permutations(range(5), 2))
    expected = np.array([p[a] * p[b] / (1 - p[a]) for a, b in cells]) * N
    index = {c: i for i, c in enumerate(cells)}
    counts = np.bincount([index[tuple(r)] for r in pairs], minlength=len(cells))
    pvalue = stats.chisquare(counts, expected * counts.sum() / expected.sum()).pvalue
    if scale == 1.0:
        assert pvalue > 1e-3
    else:
        assert pvalue < 1e-6


def test_sample_without_replacement_distinct_and_in_support():
    lw = warp_logits(jnp.asarray(np.random.default_rng(1).standard_normal((500, 10)), jnp.float32),
                     1.0, 6, 1.0)
    idx = np.asarray(rules.sample_without_replacement(jax.random.PRNGKey(0), lw, 4))
    assert all(len(set(r)) == 4 for r in idx)
    assert np.isfinite(np.take_along_axis(np.asarray(lw), idx, -1)).all()
