"""Every drafted decoder is exact with an int8 draft, and every decoder with an int8 target.

An int8 draft (:class:`dsbd_jax.models.weights.Int8` projections and head, its activations
quantised per row inside every product) proposes tokens from distributions other than the float
draft's; the verification must still give the float target's distributions: speculative and
tree sampling that of multinomial sampling, DSBD (at fixed width, and single-beam) that of beam
sampling. An int8 target is another model: each decoder must reproduce that model's own
distributions (``exact_reference.make_lp_fn`` evaluates it with the same ``forward``).

Each case draws ``ROWS`` rows of the same prompt in one jitted call and compares the outcomes
with the enumerated distribution by Pearson's chi-square (expected counts < 5 pooled), pass at
p > 1e-3 (a correct decoder fails a case 0.1% of the time).

Power, shown by breaking the rule on purpose: the verifier is handed ``q^2`` renormalised
instead of the int8 draft's q (the tokens still drawn from q): speculative sampling and DSBD
then fail with p < 1e-6 (``test_int8_draft_with_a_wrong_q_fails``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import exact_reference as ref
import test_bfloat16 as tb
from dsbd_jax.decoding import speculative as spec
from dsbd_jax.decoding.dsbd import generate as dsbd, steps
from dsbd_jax.decoding.beam import beam_sample
from dsbd_jax.decoding.configs import (BeamSampleConfig, SampleConfig, SpeculativeConfig,
                                       TreeConfig)
from dsbd_jax.decoding.dsbd import dsbd_generate
from dsbd_jax.decoding.sampling import sample
from dsbd_jax.decoding.tree import tree_speculative_sample
from dsbd_jax.models import weights
from dsbd_jax.models import kinds
from dsbd_jax.models.vocab import truncate_head

V, PROMPT, N, ROWS, P_MIN, WARP = tb.V, tb.PROMPT, tb.N, tb.ROWS, tb.P_MIN, tb.WARP
P_BROKEN = 1e-6


@pytest.fixture(scope="module")
def pair():
    """``(target config, float32 target params, int8 draft config, int8 draft params)``."""
    tc, tp = ref.toy_model(V, seed=0, eos_token_id=None)
    dc, dp = ref.toy_model(V, seed=7, eos_token_id=None)
    dp, dc = kinds.int8_params(dp, dc)
    assert isinstance(dp["layers_0"]["mlp"]["up_proj"]["kernel"], weights.Int8)
    assert isinstance(dp["lm_head"]["kernel"], weights.Int8)
    return tc, tp, dc, dp


@pytest.fixture(scope="module")
def lp(pair):
    tc, tp, _, _ = pair
    return ref.make_lp_fn(tc, tp)


# the bfloat16 tests' prompt, sizes, warping and checks (the same toy models' vocabulary)
_ids, _sample_check, _beam_check, _dsbd = tb._ids, tb._sample_check, tb._beam_check, tb._dsbd


@pytest.mark.parametrize("fn", ["speculative", "tree"])
def test_speculative_and_tree_with_an_int8_draft_are_exact(pair, lp, fn):
    tc, tp, dc, dp = pair
    params = {"target": tp, "draft": dp}
    if fn == "speculative":
        out = spec.speculative_sample(params, _ids(), jax.random.key(3),
                                      SpeculativeConfig(target=tc, draft=dc, gamma=2,
                                                        max_new_tokens=N, **WARP))
    else:
        out = tree_speculative_sample(params, _ids(), jax.random.key(4),
                                      TreeConfig(target=tc, draft=dc, gamma=2, tree_widths=(2, 2),
                                                 max_new_tokens=N, **WARP))
    acc = float(out.stats["acceptance_rate"])
    assert 0.05 < acc < 0.97, acc  # partial acceptance: the rule is exercised
    res = _sample_check(out, lp)
    assert res.pvalue > P_MIN, res


def test_dsbd_with_an_int8_draft_is_exact_beam_sampling(pair, lp):
    tc, tp, dc, dp = pair
    out = dsbd_generate({"target": tp, "draft": dp}, _ids(), jax.random.key(4), _dsbd(tc, dc))
    rate = float(np.asarray(out.stats["layer_acceptance_rate"])[0])
    assert 0.05 < rate < 0.95, rate
    res = _beam_check(out, lp, 2)
    assert res.pvalue > P_MIN, res


def test_dsbd_with_fused_projections_is_exact_beam_sampling(pair):
    """Fused projections (``dsbd_jax.models.fused``) in both models, the draft in int8: DSBD
    is the fused target's beam sampling, and its draft accepts as the separate one does (the
    same model: bit-identical int8 products)."""
    from dsbd_jax.models.fused import fuse_projections
    tc, tp, dc, dp = pair
    params = {"target": fuse_projections(tp), "draft": fuse_projections(dp)}
    out = dsbd_generate(params, _ids(), jax.random.key(4), _dsbd(tc, dc))
    sep = dsbd_generate({"target": tp, "draft": dp}, _ids(), jax.random.key(4), _dsbd(tc, dc))
    rate = float(np.asarray(out.stats["layer_acceptance_rate"])[0])
    assert abs(rate - float(np.asarray(sep.stats["layer_acceptance_rate"])[0])) < 0.02, rate
    res = _beam_check(out, ref.make_lp_fn(tc, params["target"]), 2)
    assert res.pvalue > P_MIN, res


@pytest.mark.extended   # single-beam DSBD with other drafts: test_bfloat16, test_head_exact
def test_single_beam_dsbd_with_an_int8_draft_is_exact_sampling(pair, lp):
    tc, tp, dc, dp = pair
    cfg = _dsbd(tc, dc, single_beam=True, min_width=1, max_width=1)
    out = dsbd_generate({"target": tp, "draft": dp}, _ids(), jax.random.key(5), cfg)
    res = _sample_check(out, lp)
    assert res.pvalue > P_MIN, res


@pytest.mark.extended   # truncated drafts: test_vocab_truncation; int8 drafts: the tests above
def test_a_truncated_int8_draft_is_exact(pair, lp):
    """A truncated int8 head with prompt rows, without the target's most likely first token: it
    comes out through the residual, the distribution is the target's."""
    tc, tp, _, _ = pair
    dc, dp = ref.toy_model(V, seed=7, eos_token_id=None)
    top = int(np.argmax(lp(PROMPT)))
    rows = [t for t in range(V) if t != top and t not in PROMPT]
    draft, dc = kinds.int8_params(truncate_head(dp, dc, rows, prompt_rows=True), dc)
    assert isinstance(draft["vocab_head"]["kernel"], weights.Int8)
    out = spec.speculative_sample({"target": tp, "draft": draft}, _ids(), jax.random.key(7),
                                  SpeculativeConfig(target=tc, draft=dc, gamma=2,
                                                    max_new_tokens=N, **WARP))
    res = _sample_check(out, lp)
    assert res.pvalue > P_MIN, res


@pytest.fixture(scope="module")
def int8_target():
    """An int8 target, its own log-prob function, and an int8 draft for it."""
    tc, tp = ref.toy_model(V, seed=0, eos_token_id=None)
    tq, tqc = kinds.int8_params(tp, tc)
    dc, dp = ref.toy_model(V, seed=7, eos_token_id=None)
    dq, dqc = kinds.int8_params(dp, dc)
    lp_q = ref.make_lp_fn(tqc, tq)
    # another model than the float one: its distributions differ (by little)
    assert 0 < np.abs(np.exp(lp_q(PROMPT)) - np.exp(ref.make_lp_fn(tc, tp)(PROMPT))).max() < 0.1
    return tqc, tq, dqc, dq, lp_q


def test_an_int8_target_samples_its_own_distribution(int8_target):
    tc, tp, _, _, lp_q = int8_target
    out = sample({"target": tp}, _ids(), jax.random.key(11),
                 SampleConfig(target=tc, max_new_tokens=N, **WARP))
    res = _sample_check(out, lp_q)
    assert res.pvalue > P_MIN, res
    seq = tuple(np.asarray(out.sequences[0, 0]).tolist())
    want = sum(lp_q(PROMPT + seq[:i])[seq[i]] for i in range(N))
    np.testing.assert_allclose(float(out.log_likelihoods[0, 0]), want, atol=1e-4)


def test_beam_sampling_and_dsbd_on_an_int8_target_are_exact(int8_target):
    tc, tp, dc, dp, lp_q = int8_target
    out = beam_sample({"target": tp}, _ids(), jax.random.key(12),
                      BeamSampleConfig(target=tc, num_beams=2, max_new_tokens=N, **WARP))
    res = _beam_check(out, lp_q, 2)
    assert res.pvalue > P_MIN, res
    out = dsbd_generate({"target": tp, "draft": dp}, _ids(), jax.random.key(13), _dsbd(tc, dc))
    res = _beam_check(out, lp_q, 2)
    assert res.pvalue > P_MIN, res


def _sharpen(q):
    """``q^2`` renormalised over the last axis (zeros stay zero)."""
    q2 = q * q
    return q2 / jnp.maximum(jnp.sum(q2, axis=-1, keepdims=True), 1e-30)


@pytest.mark.parametrize("decoder", [pytest.param("speculative", marks=pytest.mark.extended),
                                     "dsbd"])
def test_int8_draft_with_a_wrong_q_fails(pair, lp, decoder, monkeypatch):
    """The verifier is handed ``q^2`` renormalised instead of the q the int8 draft drew from:
    the same exactness checks must fail (p < 1e-6)."""
    tc, tp, dc, dp = pair
    params = {"target": tp, "draft": dp}
    if decoder == "speculative":
        orig = spec.verify_chain
        monkeypatch.setattr(spec, "verify_chain", lambda p, q, *a: orig(p, _sharpen(q), *a))
        spec.speculative_sample.core.clear_cache()
        try:
            out = spec.speculative_sample(params, _ids(ROWS - 8), jax.random.key(3),
                                          SpeculativeConfig(target=tc, draft=dc, gamma=2,
                                                            max_new_tokens=N, **WARP))
        finally:
            spec.speculative_sample.core.clear_cache()
        res = _sample_check(out, lp)
    else:
        dense, tops = steps.verify_dense, steps.verify_tops

        def broken(orig):   # q [gamma, P * V] (on tops: [gamma, m]): one joint per layer
            return lambda rand, joint, input_ok, q, *a, **kw: orig(rand, joint, input_ok,
                                                                   _sharpen(q), *a, **kw)
        monkeypatch.setattr(steps, "verify_dense", broken(dense))
        monkeypatch.setattr(steps, "verify_tops", broken(tops))
        dsbd.dsbd_generate.core.clear_cache()
        try:
            out = dsbd_generate(params, _ids(ROWS - 8), jax.random.key(4), _dsbd(tc, dc))
        finally:
            dsbd.dsbd_generate.core.clear_cache()
        res = _beam_check(out, lp, 2)
    print(f"{decoder} with an int8 draft, wrong q on purpose: p={res.pvalue:.3g} "
          f"(chi2={res.statistic:.1f}, dof={res.dof})")
    assert res.pvalue < P_BROKEN, res


def test_same_context_maps_duplicates_to_their_first_node():
    """DSBD's forest pass reads one row per context (``dsbd.same_context``): duplicate input
    beams, a token drawn twice under one parent and the same path under duplicate roots map to
    their first node; a different token, depth, root or an invalid node do not. Without it a
    top-k cut through the joint's equal entries splits them (the int8-target test above fails
    at p < 1e-6)."""
    # 2 input beams (the same tokens), gamma 2, 2 nodes per layer: T = 2 + 4
    seq_in = jnp.asarray([[[5, 7, 0], [5, 7, 0]]])
    depth = jnp.asarray([0, 0, 1, 1, 2, 2])
    # layer 1: node 2 = beam 0 -> token 3, node 3 = beam 1 -> token 3 (same context as node 2)
    # layer 2: node 4 = node 2 -> token 1, node 5 = node 3 -> token 2 (not the same)
    anc = jnp.asarray([[[0, 0, 0], [1, 1, 1], [0, 2, 2], [1, 3, 3], [0, 2, 4], [1, 3, 5]]])
    tokens = jnp.asarray([[9, 9, 3, 3, 1, 2]])
    anc_tok = jax.vmap(lambda t, a: t[a])(tokens, anc)
    ok = jnp.ones((1, 6), bool)
    fin = jnp.zeros((1, 6), bool)
    canon = steps.same_context(seq_in, anc, anc_tok, depth, ok, fin)
    np.testing.assert_array_equal(np.asarray(canon), [[0, 0, 2, 2, 4, 5]])
    # other tokens in the beams: nothing is shared
    other = steps.same_context(seq_in.at[0, 1, 1].set(8), anc, anc_tok, depth, ok, fin)
    np.testing.assert_array_equal(np.asarray(other), [[0, 1, 2, 3, 4, 5]])
    # an invalid node reads its own row
    bad = steps.same_context(seq_in, anc, anc_tok, depth, ok.at[0, 3].set(False), fin)
    np.testing.assert_array_equal(np.asarray(bad), [[0, 0, 2, 3, 4, 5]])
