"""A feature-level draft head as the draft of every drafted decoder: the outputs keep their exact
distributions (dsbd_jax/models/head.py, dsbd_jax/decoding/drafting.py).

The head (``head_toys.toy_head``: one block with O(1) random weights over a toy target's
features) proposes tokens from distributions unlike the target's, so every case accepts drafts
only partly and exercises the rules. The references and tests are the draft-model tests' own:
speculative and tree sampling against multinomial sampling of the warped target
(``test_speculative.run_exact``: 20,000 rows, Pearson chi-square, p > 1e-3, and per-row
log-likelihoods, lengths and padding), DSBD at fixed width and single-beam DSBD against beam
sampling (``exact_reference.exact_beam_sample_dist``: 10,000 rows, p > 1e-3).

Power: the verifier must see the very distribution each drafted token was drawn from. When the
q that reaches it is wrong on purpose (sharpened, ``q^2`` renormalised, while the tokens are
still drawn from q), speculative sampling and DSBD with the head fail with p < 1e-6
(``test_head_with_a_wrong_q_fails``).
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import exact_reference as ref
import test_speculative as ts
from head_toys import toy_head
from dsbd_jax.decoding import speculative as spec, tree
from dsbd_jax.decoding.dsbd import generate as dsbd, steps
from dsbd_jax.decoding.dsbd import DSBDConfig, dsbd_generate

ROWS = 10_000
P_MIN = 1e-3
DSBD_PROMPT = (1, 2, 3)


def _head_params(feature_layers=()):
    tc, tp = ts.toy("target")
    hc, hp = toy_head(tc, seed=5, feature_layers=feature_layers)
    return hc, {"target": tp, "draft": hp}


@pytest.mark.parametrize("decoder", ["speculative", "tree"])
def test_chain_and_tree_with_a_head_are_exact(decoder):
    """gamma 2, n = 3, EOS (speculative: the last-layer feature; tree: widths (2, 2) i.i.d. over
    fused features of layer 0)."""
    hc, params = _head_params(() if decoder == "speculative" else (0,))
    fn = spec.speculative_sample if decoder == "speculative" else tree.tree_speculative_sample
    cfg = ts.eos_config(ts.OWN_CONFIG[fn.__name__]).replace(draft=hc)
    result, out = ts.run_exact(fn, cfg, params)
    ts.check_exact_case(f"{decoder} with a draft head", cfg, result, out)


def _dsbd_case(single_beam: bool, replacement: bool, node_budget=None):
    tc, tp = ref.toy_model(5, seed=0)
    hc, hp = toy_head(tc, seed=3)
    width = 1 if single_beam else 2
    warp = dict(top_k=8, temperature=1.3) if replacement else dict(top_p=0.9, temperature=1.3)
    config = DSBDConfig(target=tc, draft=hc, max_new_tokens=3, gamma=2, draft_width=3,
                        min_width=width, threshold=1.0, replacement=replacement,
                        eos_token_id=(4,), pad_token_id=0, single_beam=single_beam,
                        node_budget=node_budget, **warp)
    exact = ref.exact_beam_sample_dist(ref.make_lp_fn(tc, tp), DSBD_PROMPT, [width] * 3,
                                       replacement=replacement, eos_ids=(4,), pad_id=0, **warp)
    return config, {"target": tp, "draft": hp}, exact


def _dsbd_run(config, params, key=11):
    out = dsbd_generate(params, np.tile(np.asarray([DSBD_PROMPT], np.int32), (ROWS, 1)),
                        jax.random.PRNGKey(key), config)
    seqs, ll = np.asarray(out.sequences), np.asarray(out.log_likelihoods)
    return out, collections.Counter(ref.beam_key(s, l) for s, l in zip(seqs, ll))


@pytest.mark.parametrize("mode", ["replacement", "single_beam",   # CI; the others extended
                                  pytest.param("no_replacement", marks=pytest.mark.extended),
                                  pytest.param("node_budget", marks=pytest.mark.extended)])
def test_dsbd_with_a_head_is_exact_beam_sampling(mode):
    """Threshold 1 (fixed width): DSBD with the head is beam sampling of width W_min (2; 1 in
    single-beam mode), with and without replacement, with EOS; ``node_budget``: layers of 7
    nodes, the first 3 of each the next layer's parents."""
    config, params, exact = _dsbd_case(mode == "single_beam", mode != "no_replacement",
                                       node_budget=17 if mode == "node_budget" else None)
    assert config.layer_width == (7 if mode == "node_budget" else 3)
    out, samples = _dsbd_run(config, params)
    rate = float(np.asarray(out.stats["layer_acceptance_rate"])[0])
    assert 0.05 < rate < 0.95, rate
    res = ref.chi_square_test(samples, exact)
    print(f"dsbd {mode} with a draft head: p={res.pvalue:.3g} (chi2={res.statistic:.1f}, "
          f"dof={res.dof}), layer-1 acceptance {rate:.3f}")
    assert res.pvalue > P_MIN, res


def _sharpen(q):
    """``q^2`` renormalised over the last axis (zeros stay zero)."""
    q2 = q * q
    return q2 / jnp.maximum(jnp.sum(q2, axis=-1, keepdims=True), 1e-30)


@pytest.mark.parametrize("decoder", [pytest.param("speculative", marks=pytest.mark.extended),
                                     "dsbd"])
def test_head_with_a_wrong_q_fails(decoder, monkeypatch):
    """The verifier is handed ``q^2`` renormalised instead of the q the head drew from: the same
    exactness checks must fail (p < 1e-6)."""
    if decoder == "speculative":
        orig = spec.verify_chain
        monkeypatch.setattr(spec, "verify_chain",
                            lambda p, q, *a: orig(p, _sharpen(q), *a))
        hc, params = _head_params()
        cfg = ts.config(gamma=2, max_new_tokens=2).replace(draft=hc)
        spec.speculative_sample.core.clear_cache()
        try:
            result, _ = ts.run_exact(spec.speculative_sample, cfg, params)
        finally:
            spec.speculative_sample.core.clear_cache()
    else:
        dense, tops = steps.verify_dense, steps.verify_tops

        def broken(orig):   # q [gamma, P * V] (on tops: [gamma, m]): one joint per layer
            return lambda rand, joint, input_ok, q, *a, **kw: orig(rand, joint, input_ok,
                                                                   _sharpen(q), *a, **kw)

        monkeypatch.setattr(steps, "verify_dense", broken(dense))
        monkeypatch.setattr(steps, "verify_tops", broken(tops))
        config, params, exact = _dsbd_case(False, True)
        dsbd.dsbd_generate.core.clear_cache()
        try:
            _, samples = _dsbd_run(config, params)
        finally:
            dsbd.dsbd_generate.core.clear_cache()
        result = ref.chi_square_test(samples, exact)
    print(f"{decoder} with a head, wrong q on purpose: p={result.pvalue:.3g} "
          f"(chi2={result.statistic:.1f}, dof={result.dof})")
    assert result.pvalue < ts.P_BROKEN, result


@pytest.mark.parametrize("decoder", [pytest.param("speculative", marks=pytest.mark.extended),
                                     "dsbd"])
def test_an_int8_head_is_exact(decoder):
    """The head's block and ``fc`` in int8 (``head.int8``): speculative sampling (fused features
    of layer 0) and DSBD at fixed width keep their exact distributions."""
    from dsbd_jax.models import head as mhead, weights
    if decoder == "speculative":
        hc, params = _head_params((0,))
        params["draft"] = mhead.int8(params["draft"])
        assert isinstance(params["draft"]["fc"]["kernel"], weights.Int8)
        assert isinstance(params["draft"]["layers_0"]["mlp"]["up_proj"]["kernel"], weights.Int8)
        cfg = ts.eos_config().replace(draft=hc)
        result, out = ts.run_exact(spec.speculative_sample, cfg, params)
        ts.check_exact_case("speculative with an int8 head", cfg, result, out)
    else:
        config, params, exact = _dsbd_case(False, True)
        params["draft"] = mhead.int8(params["draft"])
        out, samples = _dsbd_run(config, params, key=12)
        res = ref.chi_square_test(samples, exact)
        print(f"dsbd with an int8 head: p={res.pvalue:.3g}")
        assert res.pvalue > P_MIN, res
