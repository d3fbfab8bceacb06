"""Vocabulary-truncated drafts (dsbd_jax.models.vocab) in every drafted decoder: exactness,
``N = V`` identity, and a broken rule that the exactness test catches.

A truncated draft's ``q`` is zero outside its ``N`` head rows; verification is unchanged, so the
output distribution must still be the target's. The subsets below leave out the target's most
likely tokens (at the first new position), which then can only come out through the residual
``max(p - q, 0)``: the tests check that they do, at their target frequency (chi-square against
the enumerated distribution, same sizes and thresholds as test_speculative.py / test_dsbd.py).

Broken on purpose (last test): a verifier that draws the residual over the subset only (as if
the vocabulary were the subset) fails with p < 1e-6. Run with ``PYTHONPATH=tests``.
"""

from __future__ import annotations

import collections

import jax
import numpy as np
import pytest

import exact_reference as ref
import dsbd_jax
from dsbd_jax.decoding import common, speculative as spec, tree
from dsbd_jax.decoding.configs import TreeConfig
from dsbd_jax.decoding.dsbd import DSBDConfig, dsbd_generate
from dsbd_jax.models import llama as dmodel
from dsbd_jax.models.vocab import head_rows, truncate_head
from test_speculative import (BATCH, P_BROKEN, P_EXACT, PROMPT, config, eos_config, target_lp,
                              toy)


def left_out(k: int = 2):
    """The target's ``k`` most likely first new tokens after PROMPT (left out of the subsets)."""
    p = np.exp(target_lp()(PROMPT))
    return tuple(int(i) for i in np.argsort(-p)[:k])


def subset_without(excluded, vocab):
    return np.array([t for t in range(vocab) if t not in excluded], np.int32)


def truncated_pair(draft: str, rows):
    dcfg, dparams = toy(draft)
    return {"target": toy("target")[1], "draft": truncate_head(dparams, dcfg, rows)}


def draws(fn, cfg, params, n, key, chunk=None):
    """The outputs of ``n`` rows of PROMPT: one call with ``key``, or (``chunk``) calls of
    ``chunk`` rows with one key per row split from ``key`` (one compiled program). A prompt-rows
    head has a column per prompt token of the call (``N + B * P``), so one call of 20,000 rows
    would build 20,000 x 40,000 logits per draft pass (about 20 GB at the peak)."""
    ids = np.tile(np.asarray(PROMPT, np.int32)[None], (chunk or n, 1))
    if chunk is None:
        return [fn(params, ids, key, cfg)]
    keys = jax.random.split(key, n)
    return [fn(params, ids, keys[i:i + chunk], cfg) for i in range(0, n, chunk)]


def check_exact(fn, cfg, params, excluded, key=0, chunk=None):
    """Chi-square of BATCH samples (:func:`draws`) against the target's sampling distribution;
    the excluded tokens must come out as the first new token at about their target
    probability. Returns the test's result and the list of outputs."""
    outs = draws(fn, cfg, params, BATCH, jax.random.key(key), chunk)
    seqs = np.concatenate([np.asarray(o.sequences[:, 0]) for o in outs])
    exact = ref.exact_sample_dist(target_lp(), PROMPT, cfg.max_new_tokens, cfg.temperature,
                                  cfg.top_k, cfg.top_p, cfg.eos_ids, cfg.pad_id)
    res = ref.chi_square_test([tuple(s) for s in seqs.tolist()], exact)
    first = collections.Counter(seqs[:, 0].tolist())
    want = collections.defaultdict(float)
    for s, pr in exact.items():
        want[s[0]] += pr
    for t in excluded:
        assert want[t] > 0.05 and first[t] > 0.5 * want[t] * BATCH, (t, first[t], want[t])
    return res, outs


# ---------------------------------------------------------------------------------------------
def test_truncate_head_rows_and_errors():
    dcfg, dparams = toy("close")
    t = truncate_head(dparams, dcfg, [4, 1, 3])
    np.testing.assert_array_equal(np.asarray(head_rows(t)), [1, 3, 4])
    assert "lm_head" not in t and t["vocab_head"]["kernel"].shape == (dcfg.hidden_size, 3)
    assert head_rows(dparams) is None
    for bad, msg in (([], "non-empty"), ([1, 1], "distinct"), ([0, 6], r"\[0, 6\)"),
                     ([[1, 2]], "1-D")):
        with pytest.raises(ValueError, match=msg):
            truncate_head(dparams, dcfg, bad)
    with pytest.raises(ValueError, match="already"):
        truncate_head(t, dcfg, [1])
    ids = np.asarray([PROMPT])
    full = np.asarray(dmodel.logits(dcfg, dparams, ids))
    cut = np.asarray(dmodel.logits(dcfg, t, ids))
    assert np.all(np.isneginf(cut[..., [0, 2, 5]]))
    np.testing.assert_allclose(cut[..., [1, 3, 4]], full[..., [1, 3, 4]], rtol=1e-6, atol=1e-6)


def _dsbd_cfg(**kw):
    tc = toy("target")[0]
    base = dict(target=tc, draft=tc, max_new_tokens=3, gamma=2, draft_width=3, min_width=2,
                threshold=1.0, top_k=8, temperature=1.3, eos_token_id=(4,), pad_token_id=0)
    return DSBDConfig(**{**base, **kw})


IDENTITY = {
    "speculative": (spec.speculative_sample, eos_config),
    "tree": (tree.tree_speculative_sample,
             lambda: config(TreeConfig, gamma=2, max_new_tokens=3, tree_widths=(3, 1),
                            replacement=False, temperature=1.3, top_k=4)),
    "dsbd": (dsbd_generate, _dsbd_cfg),
    "dsbd_single_beam": (dsbd_generate,
                         lambda: _dsbd_cfg(single_beam=True, min_width=1, max_width=1)),
}


@pytest.mark.parametrize("name", [  # CI: the chain and DSBD; the tree and single-beam DSBD
    # (the same truncated head through other verifiers) extended
    pytest.param(n, marks=() if n in ("speculative", "dsbd") else pytest.mark.extended)
    for n in IDENTITY])
def test_full_subset_is_bit_identical(name):
    """``N = V``: the same outputs, log-likelihoods and statistics as the untruncated draft."""
    fn, make = IDENTITY[name]
    cfg = make()
    ids = np.tile(np.asarray(PROMPT, np.int32)[None], (512, 1))
    dcfg, dparams = toy("far")
    full = fn({"target": toy("target")[1], "draft": dparams}, ids, jax.random.key(5), cfg)
    cut = fn(truncated_pair("far", np.arange(dcfg.vocab_size)), ids, jax.random.key(5), cfg)
    np.testing.assert_array_equal(np.asarray(cut.sequences), np.asarray(full.sequences))
    np.testing.assert_array_equal(np.asarray(cut.log_likelihoods),
                                  np.asarray(full.log_likelihoods))
    for k in full.stats:
        np.testing.assert_array_equal(np.asarray(cut.stats[k]), np.asarray(full.stats[k]))


@pytest.mark.parametrize("name", ["speculative", "tree"])
def test_truncated_draft_is_exact(name):
    """The target's two most likely first tokens are outside the draft's subset: they come out
    through the residual, and the sequence distribution is the target's."""
    fn, make = IDENTITY[name]
    cfg = make()
    excluded = left_out(2)
    params = truncated_pair("close", subset_without(excluded, 6))
    res, (out,) = check_exact(fn, cfg, params, excluded)
    acc = float(out.stats["acceptance_rate"])
    print(f"{name}, truncated draft without {excluded}: p={res.pvalue:.3g} "
          f"(chi2={res.statistic:.1f}, dof={res.dof}), acceptance={acc:.3f}")
    assert 0.05 < acc < 0.97
    assert res.pvalue > P_EXACT, res


DSBD_CASES = {
    "replacement": dict(),
    "no_replacement": dict(replacement=False, top_k=None, top_p=0.9),
    "single_beam": dict(single_beam=True, min_width=1, max_width=1),
}


@pytest.mark.parametrize("case", [  # CI: replacement and single beam; no_replacement extended
    # (DSBD without replacement under a truncated draft: test_prompt_rows_dsbd_is_exact_...)
    pytest.param(c, marks=() if c != "no_replacement" else pytest.mark.extended)
    for c in DSBD_CASES])
def test_truncated_draft_dsbd_is_exact_beam_sampling(case):
    """DSBD at fixed width 2 (beam sampling W=2) with and without replacement, and single-beam
    DSBD at width 1 (sampling), with the target's most likely first tokens outside the draft's
    subset."""
    excluded = left_out(2)
    _check_dsbd_beam(case, truncated_pair("far", subset_without(excluded, 6)), excluded)


@pytest.mark.parametrize("case", ["replacement", "no_replacement"])
def test_prompt_rows_dsbd_is_exact_beam_sampling(case):
    """The same with rows {3, 4} plus the prompt's tokens {1, 2} (prompt rows)."""
    excluded = left_out(2)
    dcfg, dparams = toy("far")
    rows = subset_without(set(excluded) | set(PROMPT), 6)
    _check_dsbd_beam(case, {"target": toy("target")[1],
                            "draft": truncate_head(dparams, dcfg, rows, prompt_rows=True)},
                     excluded, chunk=1000)


def _check_dsbd_beam(case, params, excluded, chunk=None):
    cfg = _dsbd_cfg(**DSBD_CASES[case])
    single_beam = cfg.single_beam
    W = cfg.min_width
    outs = draws(dsbd_generate, cfg, params, 10_000, jax.random.PRNGKey(11), chunk)
    rate = float(np.mean([np.asarray(o.stats["layer_acceptance_rate"])[0] for o in outs]))
    assert 0.05 < rate < 0.95, rate
    seqs = np.concatenate([np.asarray(o.sequences) for o in outs])
    ll = np.concatenate([np.asarray(o.log_likelihoods) for o in outs])
    samples = collections.Counter(ref.beam_key(s, l) for s, l in zip(seqs, ll))
    exact = ref.exact_beam_sample_dist(target_lp(), PROMPT, [W] * cfg.max_new_tokens,
                                       replacement=cfg.replacement, eos_ids=(4,), pad_id=0,
                                       top_k=cfg.top_k, top_p=cfg.top_p, temperature=1.3)
    res = ref.chi_square_test(samples, exact)
    print(f"dsbd {case} (single_beam={single_beam}), truncated draft without {excluded}: "
          f"p={res.pvalue:.3g} (chi2={res.statistic:.1f}, dof={res.dof}), "
          f"layer acceptance={rate:.3f}")
    firsts = collections.Counter(int(seqs[i, b, 0]) for i in range(len(seqs)) for b in range(W)
                                 if np.isfinite(ll[i, b]))
    for t in excluded:
        assert firsts[t] > 100, (t, firsts)
    assert res.pvalue > 1e-3, res


# ---------------------------------------------------------------------------------------------
# Last in this file: it traces a deliberately broken rule, then clears the compiled cache.
@pytest.fixture
def clear_chain_cache_after():
    yield
    spec.speculative_sample.core.clear_cache()  # the broken program must not be reused


def test_power_residual_over_the_subset_only(monkeypatch, clear_chain_cache_after):
    """A verifier that renormalises over the draft's subset (residual drawn only among the N
    rows, as if they were the vocabulary) must fail: the left-out tokens then never come out
    after a rejection. The config is used by no other test, so the rule is traced anew."""
    excluded = left_out(2)
    rows = subset_without(excluded, 6)
    inside = np.zeros(6, bool)
    inside[rows] = True
    right = spec.safe_residual

    def over_subset(p, q):
        return right(np.where(inside, 1.0, 0.0) * p, q)
    monkeypatch.setattr(spec, "safe_residual", over_subset)
    before = dsbd_jax.compile_count("speculative_sample")
    cfg = config(gamma=2, max_new_tokens=2)
    ids = np.tile(np.asarray(PROMPT, np.int32)[None], (BATCH, 1))
    out = spec.speculative_sample(truncated_pair("close", rows), ids, jax.random.key(0), cfg)
    assert dsbd_jax.compile_count("speculative_sample") == before + 1
    exact = ref.exact_sample_dist(target_lp(), PROMPT, 2)
    res = ref.chi_square_test([tuple(s) for s in np.asarray(out.sequences[:, 0]).tolist()], exact)
    print(f"broken rule (residual over the subset only): p={res.pvalue:.3g} "
          f"(chi2={res.statistic:.1f}, dof={res.dof})")
    assert res.pvalue < P_BROKEN, res


# ---------------------------------------------------------------------------------------------
# prompt rows: each call adds its prompts' tokens to the truncated head
def test_prompt_rows_extend_the_head():
    from dsbd_jax.models.vocab import has_prompt_rows, with_prompt_rows
    dcfg, dparams = toy("close")
    plain = truncate_head(dparams, dcfg, [1, 3])
    assert not has_prompt_rows(plain) and with_prompt_rows(plain, np.asarray([[2]])) is plain
    t = truncate_head(dparams, dcfg, [1, 3], prompt_rows=True)
    assert has_prompt_rows(t) and t["vocab_head"]["full_kernel"].shape == (dcfg.hidden_size, 6)
    ext = with_prompt_rows(t, np.asarray([[2, 2], [0, 3]]))
    np.testing.assert_array_equal(np.asarray(head_rows(ext)), [1, 3, 2, 2, 0, 3])
    assert set(ext["vocab_head"]) == {"rows", "kernel"}
    ids = np.asarray([PROMPT])
    full = np.asarray(dmodel.logits(dcfg, dparams, ids))
    cut = np.asarray(dmodel.logits(dcfg, ext, ids))
    assert np.all(np.isneginf(cut[..., [4, 5]]))
    np.testing.assert_allclose(cut[..., :4], full[..., :4], rtol=1e-6, atol=1e-6)
    # a tied head gathers from the embedding it keeps anyway
    import dataclasses
    tied_cfg = dataclasses.replace(dcfg, tie_word_embeddings=True)
    tied = {k: v for k, v in dparams.items() if k != "lm_head"}
    tt = with_prompt_rows(truncate_head(tied, tied_cfg, [1], prompt_rows=True), np.asarray([[4]]))
    np.testing.assert_array_equal(np.asarray(tt["vocab_head"]["embedding"][1]),
                                  np.asarray(tied["embed"]["embedding"][4]))


@pytest.mark.parametrize("name", [  # CI: the chain and the tree; single-beam DSBD extended
    # (DSBD with prompt rows: test_prompt_rows_dsbd_is_exact_beam_sampling)
    "speculative", "tree", pytest.param("dsbd_single_beam", marks=pytest.mark.extended)])
def test_prompt_rows_draft_is_exact_and_accepts_more(name):
    """Rows {3, 4} plus the prompt's tokens {1, 2}: the target's likely first tokens (0, 5) come
    out through the residual, the distribution is the target's, and acceptance is at least the
    plain truncated draft's (which cannot propose 1 or 2)."""
    fn, make = IDENTITY[name]
    cfg = make()
    excluded = left_out(2)
    rows = subset_without(set(excluded) | set(PROMPT), 6)
    dcfg, dparams = toy("close")
    target = toy("target")[1]
    with_rows = {"target": target, "draft": truncate_head(dparams, dcfg, rows, prompt_rows=True)}
    res, outs = check_exact(fn, cfg, with_rows, excluded, chunk=1000)
    assert res.pvalue > P_EXACT, res
    plain = {"target": target, "draft": truncate_head(dparams, dcfg, rows)}
    _, (out_plain,) = check_exact(fn, cfg, plain, excluded)
    key = "acceptance_rate" if "acceptance_rate" in out_plain.stats else "layer_acceptance_rate"
    rate = lambda o: float(np.ravel(np.asarray(o.stats[key]))[0])  # noqa: E731 (layer 0)
    acc, acc_plain = float(np.mean([rate(o) for o in outs])), rate(out_plain)
    print(f"{name}: p={res.pvalue:.3g}, {key} {acc_plain:.3f} -> {acc:.3f}")
    assert acc > acc_plain
