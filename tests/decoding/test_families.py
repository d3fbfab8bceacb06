"""The decoders on the family variants (Qwen3, Mistral, Gemma 2, Gemma 3 switches of the one
model), on toy models (``exact_reference.toy_model`` with the family's config switches).

Exactness on a Gemma-style pair (soft-capped attention and logits, (1 + w) sandwich norms,
GELU-tanh, a sliding window of 2 on alternate layers with its own RoPE base, q/k norms): the
window changes the distributions verification compares, and DSBD's caches hold beams in rows
and the draft forest in a scratch tail, so the slots' positions differ from the slot index
(``forest.row_positions`` / ``buffer_positions`` pass them to the model). DSBD at fixed width
must be beam sampling of the target and the token tree must be sampling, by chi-square against
enumeration (the reference runs plain causal passes, slot = position). Broken on purpose
(key_positions dropped from DSBD's target pass, so beam r's row reads positions r * S + s):
the DSBD case fails (p = 7e-39); the draft's scratch positions dropped (forest / tree): the
draft's distributions change, which exactness cannot see (the draft only proposes), so
``test_scratch_positions_change_the_draft`` checks them directly.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest

import jax

import exact_reference as ref
from dsbd_jax.decoding import beam, tree
from dsbd_jax.decoding.configs import BeamSampleConfig, TreeConfig
from dsbd_jax.decoding.dsbd import DSBDConfig, dsbd_generate

PROMPT = (1, 2, 3)
ROWS = 10_000
P_MIN = 1e-3

GEMMA_STYLE = dict(norm_style="gemma", sandwich_norms=True, hidden_act="gelu_tanh",
                   embed_scale=True, query_pre_attn_scalar=12.0, attn_logit_softcap=2.0,
                   final_logit_softcap=3.0, sliding_window=2, qk_norm=True,
                   layer_types=("sliding_attention", "full_attention"), rope_local_theta=50.0)
FAMILIES = {
    "qwen3": dict(qk_norm=True),
    "mistral": dict(sliding_window=2),
    "gemma2": dict(GEMMA_STYLE, qk_norm=False, rope_local_theta=None),
    "gemma3": dict(GEMMA_STYLE, attn_logit_softcap=None, final_logit_softcap=None),
}


def pair(switches, vocab=5):
    tc, tp = ref.toy_model(vocab, seed=0, layers=2, **switches)
    dc, dp = ref.toy_model(vocab, seed=7, layers=2, **switches)
    return tc, tp, dc, dp


def test_window_changes_the_distribution():
    """Guard: without the window the toy target's next-token law differs (else the exactness
    test below could not tell)."""
    tc, tp, _, _ = pair(GEMMA_STYLE)
    prefix = PROMPT + (0, 1)
    with_w = np.exp(ref.make_lp_fn(tc, tp)(prefix))
    without = np.exp(ref.make_lp_fn(tc.replace(sliding_window=None), tp)(prefix))
    assert 0.5 * np.abs(with_w - without).sum() > 0.02


def test_gemma_style_dsbd_is_exact_beam_sampling():
    tc, tp, dc, dp = pair(GEMMA_STYLE)
    N, W = 3, 2
    config = DSBDConfig(target=tc, draft=dc, max_new_tokens=N, gamma=2, draft_width=3,
                        min_width=W, threshold=1.0, temperature=1.2, pad_token_id=0)
    out = dsbd_generate({"target": tp, "draft": dp},
                        np.tile(np.asarray([PROMPT], np.int32), (ROWS, 1)),
                        jax.random.PRNGKey(5), config)
    rate = float(np.asarray(out.stats["layer_acceptance_rate"])[0])
    assert 0.05 < rate < 0.95, rate
    samples = collections.Counter(ref.beam_key(s, ll) for s, ll in
                                  zip(np.asarray(out.sequences), np.asarray(out.log_likelihoods)))
    exact = ref.exact_beam_sample_dist(ref.make_lp_fn(tc, tp), PROMPT, [W] * N,
                                       temperature=1.2, pad_id=0)
    res = ref.chi_square_test(samples, exact)
    print(f"gemma-style DSBD: {res}")
    assert res.pvalue > P_MIN, res


def test_gemma_style_token_tree_is_exact_sampling():
    """gamma = 4: the draft's depth-3 queries must NOT see their depth-1 ancestors in the
    scratch slots (outside the window of 2), which only their passed positions tell."""
    tc, tp, dc, dp = pair(GEMMA_STYLE)
    cfg = TreeConfig(target=tc, draft=dc, max_new_tokens=4, gamma=4, tree_widths=(2, 1, 1, 1),
                     pad_token_id=0)
    out = tree.tree_speculative_sample({"target": tp, "draft": dp},
                                       np.tile(np.asarray([PROMPT], np.int32), (ROWS, 1)),
                                       jax.random.key(2), cfg)
    exact = ref.exact_sample_dist(ref.make_lp_fn(tc, tp), PROMPT, 4)
    res = ref.chi_square_test([tuple(s) for s in np.asarray(out.sequences[:, 0]).tolist()], exact)
    print(f"gemma-style token tree: {res}")
    assert res.pvalue > P_MIN, res


@pytest.mark.parametrize("family", [  # CI: gemma3 (the others extended; every family's
    # forward is checked against transformers in tests/models/test_family_parity.py)
    pytest.param(f, marks=() if f == "gemma3" else pytest.mark.extended)
    for f in sorted(FAMILIES)])
def test_dsbd_and_beam_sampling_run_on_each_family(family):
    """DSBD (dynamic width) and beam sampling on a tiny pair of each family: valid tokens, and
    the reported log-likelihoods are the target's (recomputed by enumeration's passes)."""
    tc, tp, dc, dp = pair(FAMILIES[family], vocab=11)
    prompts = np.array([[1, 2, 3, 4], [5, 6, 7, 8]], np.int32)
    lp = ref.make_lp_fn(tc, tp)
    cfg = DSBDConfig(target=tc, draft=dc, max_new_tokens=5, gamma=2, draft_width=3,
                     min_width=1, max_width=3, threshold=0.5)
    out = dsbd_generate({"target": tp, "draft": dp}, prompts, jax.random.PRNGKey(0), cfg)
    bs = beam.beam_sample(tp, prompts, jax.random.PRNGKey(1),
                          BeamSampleConfig(target=tc, max_new_tokens=5, num_beams=3))
    for o in (out, bs):
        seqs, lls = np.asarray(o.sequences), np.asarray(o.log_likelihoods)
        assert seqs.min() >= 0 and seqs.max() < tc.vocab_size
        for r in range(2):
            s = seqs[r, 0]
            want = sum(lp(tuple(prompts[r]) + tuple(int(t) for t in s[:j]))[s[j]]
                       for j in range(len(s)))
            np.testing.assert_allclose(lls[r, 0], want, rtol=1e-4, atol=1e-4)


def test_scratch_positions_change_the_draft():
    """Draft == target (Gemma-style, window 2): every proposal is accepted only when the draft's
    passes over its scratch slots (DSBD's forest tail, the token tree's) compute the target's
    numbers, which needs the scratch positions (gamma = 4: depth-3 queries must not see their
    depth-1 ancestors). Dropping ``key_positions`` in ``forest._draft_forward`` or in the tree's
    draft call makes both acceptance checks below fail (tried on purpose)."""
    tc, tp, _, _ = pair(GEMMA_STYLE, vocab=11)
    params = {"target": tp, "draft": tp}
    prompts = np.random.default_rng(0).integers(0, 11, (64, 4)).astype(np.int32)
    cfg = TreeConfig(target=tc, draft=tc, max_new_tokens=10, gamma=4, tree_widths=(2, 1, 1, 1))
    out = tree.tree_speculative_sample(params, prompts, jax.random.key(0), cfg)
    assert float(out.stats["acceptance_rate"]) == 1.0
    dcfg = DSBDConfig(target=tc, draft=tc, max_new_tokens=10, gamma=4, draft_width=2,
                      min_width=2, threshold=1.0)
    st = dsbd_generate(params, prompts, jax.random.PRNGKey(0), dcfg).stats
    st = {k: np.asarray(v) for k, v in st.items()}
    assert st["layer_verified"].sum() > 0
    np.testing.assert_array_equal(st["layer_passed"], st["layer_verified"])
