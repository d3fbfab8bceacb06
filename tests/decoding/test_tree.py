"""Token-tree speculative sampling (dsbd_jax.decoding.tree): structure, MCSD rules, exactness, draft side.

End-to-end exactness uses the chi-square test of test_speculative.py (same toy models, BATCH =
20000 copies of one prompt, p > 1e-3 to pass; see its docstring for why). The sibling rule itself is
also tested alone (``verify_siblings`` on fixed p and q, 200000 Monte-Carlo trials, chi-square
against p): correct in both modes, and failing (p < 1e-6) when Algorithm 2 does not remove the
rejected draft from q. Run with ``PYTHONPATH=tests``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

import dsbd_jax
from dsbd_jax.decoding import speculative as spec, tree
import exact_reference as ref
from dsbd_jax.decoding import common
from dsbd_jax.decoding.configs import TreeConfig
from test_speculative import (BATCH, P_BROKEN, P_EXACT, PROMPT, check_bad_inputs, check_exact_case,
                              check_identical, config, eos_config, params_with, run_exact,
                              target_lp)


# ---------------------------------------------------------------------------------------------
def test_tree_structure_and_mask():
    parents, depths, offsets = tree.tree_structure((2, 3))
    assert offsets == (0, 1, 3, 9)
    assert parents.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert depths.tolist() == [0, 1, 1, 2, 2, 2, 2, 2, 2]
    anc = np.asarray(tree.ancestor_mask(jnp.asarray(parents), 2))
    want = np.zeros((9, 9), bool)
    for i in range(9):
        j = i
        while True:
            want[i, j] = True
            if j == 0:
                break
            j = parents[j]
    np.testing.assert_array_equal(anc, want)
    assert tree.tree_widths(config(TreeConfig, gamma=3)) == (2, 2, 2)


TRIALS = 200_000


def sibling_output_dist(p, q, k, replacement, seed=0):
    """Monte-Carlo distribution of the token emitted by one node's verification: the children
    are drawn by ``tree.draw_children``; the accepted child is emitted, or a draw from the final
    residual when all ``k`` children are rejected."""
    V = p.shape[0]
    n_u = tree.children_uniforms(1, k, V, replacement)

    @jax.jit
    def run(u_kids, u_acc, u_final):
        cand = tree.draw_children(jnp.broadcast_to(jnp.log(q), (TRIALS, 1, V)), u_kids, k,
                                  replacement)                                  # [TRIALS, k]
        acc, p_final = jax.vmap(tree.verify_siblings, in_axes=(None, None, 0, 0, None))(
            p, q, cand, u_acc, replacement)
        fallback = spec.draw_token(p_final, u_final)
        return jnp.where(acc >= 0, jnp.take_along_axis(cand, jnp.maximum(acc, 0)[:, None], 1)[:, 0],
                         fallback)

    ku, ka, kf = jax.random.split(jax.random.key(seed), 3)
    u = lambda key, shape: jax.random.uniform(key, shape, minval=1e-30)  # noqa: E731
    toks = np.asarray(run(u(ku, (TRIALS, n_u)), u(ka, (TRIALS, k)), u(kf, (TRIALS,))))
    return np.bincount(toks, minlength=V)


def chi2_against(counts, p):
    p = np.asarray(p, np.float64)
    keep = p > 0
    assert counts[~keep].sum() == 0, "a token with p = 0 was emitted"
    return scipy.stats.chisquare(counts[keep], p[keep] / p[keep].sum() * counts.sum()).pvalue


P_RULE = jnp.array([0.05, 0.1, 0.45, 0.3, 0.1])
Q_RULE = jnp.array([0.4, 0.3, 0.1, 0.1, 0.1])


@pytest.mark.parametrize("replacement", [True, False])
@pytest.mark.parametrize("q,k", [(Q_RULE, 3), (jnp.array([0.5, 0.0, 0.2, 0.0, 0.3]), 4)])
def test_verify_siblings_emits_p(replacement, q, k):
    """One node: emitted token ~ p in both modes (second case: q has a smaller support than p,
    and without replacement more children than q's support: the surplus ones are skipped)."""
    pval = chi2_against(sibling_output_dist(P_RULE, q, k, replacement), P_RULE)
    assert pval > P_EXACT, pval


@pytest.fixture
def no_removal(monkeypatch):
    monkeypatch.setattr(tree, "remove", lambda q, x: q)


def test_power_algorithm2_without_removal(no_removal):
    """Algorithm 2 without 'remove x from q' (what the DSBD reference code does) is not exact."""
    pval = chi2_against(sibling_output_dist(P_RULE, Q_RULE, 3, False), P_RULE)
    print(f"broken rule (Algorithm 2, x not removed from q): p={pval:.3g} ({TRIALS} trials)")
    assert pval < P_BROKEN, pval


# ---------------------------------------------------------------------------------------------
CASES = {
    # name: (config, draft); the first is shared with the tests below (one compilation)
    "w22_iid_eos": (lambda: eos_config(TreeConfig), "far"),
    "w31_norepl_topk_temp": (lambda: config(TreeConfig, gamma=2, max_new_tokens=3,
                                            tree_widths=(3, 1), replacement=False,
                                            temperature=1.3, top_k=4), "far"),
}


@pytest.mark.parametrize("name", list(CASES))
def test_tree_exact(name):
    """Widths (2, 2) with i.i.d. children (Algorithm 1) and EOS; widths (3, 1) without
    replacement (Algorithm 2) with temperature and top-k. n = 3 with gamma = 2: the second
    iteration, when there is one, has a budget of fewer than gamma levels."""
    make, draft = CASES[name]
    cfg = make()
    result, out = run_exact(tree.tree_speculative_sample, cfg, draft)
    check_exact_case(f"tree {name} ({draft} draft, widths {tree.tree_widths(cfg)}, "
                     f"replacement={cfg.replacement})", cfg, result, out)


def test_tree_identical_draft_accepts_everything():
    """Draft == target: every tree level is accepted. Exactness does not depend on the draft, so
    this is the test of the draft side: gamma = 3 makes level-2 nodes attend to their level-1
    ancestors in the draft's scratch slots, n = 7 takes two iterations (the draft cache commit of
    the accepted path and the recomputed last token are used in the second)."""
    check_identical(tree.tree_speculative_sample,
                    config(TreeConfig, gamma=3, max_new_tokens=7, tree_widths=(2, 1, 2),
                           replacement=False),
                    iterations=2)


def test_tree_no_recompile_for_other_prompt_lengths():
    """Same padded shape, other true lengths (here some one-token prompts): no new compilation,
    and the one-token rows are still exact (chi-square against their own distribution)."""
    cfg = eos_config(TreeConfig)
    ids = np.tile(np.asarray(PROMPT, np.int32)[None], (BATCH, 1))
    lens = np.where(np.arange(BATCH) % 2 == 0, 1, 2).astype(np.int32)
    tree.tree_speculative_sample(params_with("far"), ids, jax.random.key(1), cfg)
    before = dsbd_jax.compile_count("tree_speculative_sample")
    out = tree.tree_speculative_sample(params_with("far"), ids, jax.random.key(1), cfg,
                                       prompt_lengths=lens)
    assert dsbd_jax.compile_count("tree_speculative_sample") == before
    seqs = np.asarray(out.sequences[0::2, 0])
    exact = ref.exact_sample_dist(target_lp(), PROMPT[:1], cfg.max_new_tokens,
                                  eos_ids=cfg.eos_ids, pad_id=cfg.pad_id)
    pval = ref.chi_square_pvalue([tuple(s) for s in seqs.tolist()], exact)
    assert pval > P_EXACT, pval


def test_tree_bad_inputs_raise():
    check_bad_inputs(tree.tree_speculative_sample)
