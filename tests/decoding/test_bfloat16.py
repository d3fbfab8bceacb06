"""Every decoder is exact for a bfloat16 model: the reference is the bfloat16 model itself.

A bfloat16 model (:mod:`dsbd_jax.host.plan`) stores its weights and KV cache in 16 bits and
runs its products in mixed precision (float32 accumulation); its logits are float32, and
warping, scores and verification run in float32 as for a float32 model. The model the user
loaded is the bfloat16 one, so the distribution each decoder must reproduce is the one of that
model's own float32 logits: ``exact_reference.make_lp_fn`` evaluates it with the same
``forward``. Each case draws ``ROWS`` rows of the same prompt in one jitted call and compares
the outcomes with the enumerated distribution by Pearson's chi-square (expected counts < 5
pooled), pass at p > 1e-3 (a correct decoder fails a case 0.1% of the time).

The pairs: a bfloat16 target with a bfloat16 draft in the CPU's fast form (every projection and
the head stored as ``[out, in]`` rows, :func:`dsbd_jax.models.kinds.transpose_head`), a
bfloat16 draft with a float32 target, and a truncated bfloat16 draft head (its ``[N, d]`` rows).

Power, measured once by breaking the rule on purpose (the speculative case with the residual
``max(p - q, 0)`` replaced by ``p``, monkeypatched in ``dsbd_jax.decoding.speculative``): p =
0 (chi2 in the thousands), against p > 1e-3 for the real rule; ``test_broken_rule_fails``
keeps that check in the suite.
"""

from __future__ import annotations

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import exact_reference as ref
from dsbd_jax.decoding import speculative as spec
from dsbd_jax.decoding.beam import beam_sample
from dsbd_jax.decoding.configs import (BeamSampleConfig, SampleConfig, SpeculativeConfig,
                                       TreeConfig)
from dsbd_jax.decoding.dsbd import DSBDConfig, dsbd_generate
from dsbd_jax.decoding.sampling import sample
from dsbd_jax.decoding.tree import tree_speculative_sample
from dsbd_jax.models import kinds
from dsbd_jax.models.vocab import truncate_head

V = 6
PROMPT = (1, 2, 3)
N = 3
ROWS = 12_000
P_MIN = 1e-3
WARP = dict(temperature=1.2, top_k=5)


def _rows_form(params):
    """Projections and head as ``[out, in]`` rows (what a 16-bit load on the CPU stores)."""
    return kinds.transpose_head(kinds.transpose_params(params, _widths(params)))


def _widths(params):
    """One block per projection (the toy model's projections are too small to split)."""
    layer = params["layers_0"]
    out = {}
    for group in ("attn", "mlp"):
        for name, leaf in layer[group].items():
            out[name] = int(leaf["kernel"].shape[-1])
    return out


@pytest.fixture(scope="module")
def pair():
    """``(target config, target params, draft config, draft params)``: both bfloat16, rows form."""
    tc, tp = ref.toy_model(V, seed=0, dtype="bfloat16", eos_token_id=None)
    dc, dp = ref.toy_model(V, seed=7, dtype="bfloat16", eos_token_id=None)
    tp, dp = _rows_form(tp), _rows_form(dp)
    assert tp["lm_head"]["kernel"].value.shape == (V, tc.hidden_size)
    assert jax.tree.leaves(tp)[0].dtype == jnp.bfloat16
    return tc, tp, dc, dp


@pytest.fixture(scope="module")
def lp(pair):
    tc, tp, _, _ = pair
    return ref.make_lp_fn(tc, tp)


def _ids(rows=ROWS):
    return np.tile(np.asarray([PROMPT], np.int32), (rows, 1))


def _sample_check(out, lp, warp=WARP):
    seqs = [tuple(r) for r in np.asarray(out.sequences[:, 0]).tolist()]
    exact = ref.exact_sample_dist(lp, PROMPT, N, warp.get("temperature", 1.0),
                                  warp.get("top_k"), warp.get("top_p", 1.0))
    res = ref.chi_square_test(seqs, exact)
    assert res.dof >= 10, res
    return res


def _beam_check(out, lp, width, replacement=True, warp=WARP):
    seqs, ll = np.asarray(out.sequences), np.asarray(out.log_likelihoods)
    samples = collections.Counter(ref.beam_key(s, l) for s, l in zip(seqs, ll))
    exact = ref.exact_beam_sample_dist(lp, PROMPT, [width] * N, warp.get("temperature", 1.0),
                                       warp.get("top_k"), warp.get("top_p", 1.0), replacement,
                                       (), 0)
    return ref.chi_square_test(samples, exact)


def _decode(cls, tc, **kw):
    """A ``cls`` config (a baseline decoder's own) with N new tokens and WARP."""
    return cls(target=tc, max_new_tokens=N, **{**WARP, **kw})


def _dsbd(tc, dc, **kw):
    base = dict(target=tc, draft=dc, max_new_tokens=N, gamma=2, draft_width=3, min_width=2,
                threshold=1.0, **WARP)
    return DSBDConfig(**{**base, **kw})


def test_sampling_is_exact(pair, lp):
    tc, tp, _, _ = pair
    out = sample({"target": tp}, _ids(), jax.random.key(1), _decode(SampleConfig, tc))
    res = _sample_check(out, lp)
    assert res.pvalue > P_MIN, res
    # log-likelihoods: the bfloat16 model's own (float32) log-probs of the tokens
    seq = tuple(np.asarray(out.sequences[0, 0]).tolist())
    want = sum(lp(PROMPT + seq[:i])[seq[i]] for i in range(N))
    np.testing.assert_allclose(float(out.log_likelihoods[0, 0]), want, atol=1e-4)


def test_beam_sample_is_exact(pair, lp):
    tc, tp, _, _ = pair
    out = beam_sample({"target": tp}, _ids(), jax.random.key(2),
                      _decode(BeamSampleConfig, tc, num_beams=2))
    res = _beam_check(out, lp, 2)
    assert res.pvalue > P_MIN, res


@pytest.mark.parametrize("fn", ["speculative", "tree"])
def test_speculative_and_tree_are_exact(pair, lp, fn):
    tc, tp, dc, dp = pair
    if fn == "speculative":
        out = spec.speculative_sample({"target": tp, "draft": dp}, _ids(), jax.random.key(3),
                                      _decode(SpeculativeConfig, tc, draft=dc, gamma=2))
    else:
        out = tree_speculative_sample({"target": tp, "draft": dp}, _ids(), jax.random.key(4),
                                      _decode(TreeConfig, tc, draft=dc, gamma=2,
                                              tree_widths=(2, 2)))
    acc = float(out.stats["acceptance_rate"])
    assert 0.05 < acc < 0.97, acc  # partial acceptance: the rule is exercised
    res = _sample_check(out, lp)
    assert res.pvalue > P_MIN, res


def test_dsbd_is_exact_beam_sampling(pair, lp):
    tc, tp, dc, dp = pair
    out = dsbd_generate({"target": tp, "draft": dp}, _ids(), jax.random.key(4), _dsbd(tc, dc))
    rate = float(np.asarray(out.stats["layer_acceptance_rate"])[0])
    assert 0.05 < rate < 0.95, rate
    res = _beam_check(out, lp, 2)
    assert res.pvalue > P_MIN, res


def test_single_beam_dsbd_is_exact_sampling(pair, lp):
    tc, tp, dc, dp = pair
    cfg = _dsbd(tc, dc, single_beam=True, min_width=1, max_width=1)
    out = dsbd_generate({"target": tp, "draft": dp}, _ids(), jax.random.key(5), cfg)
    res = _sample_check(out, lp)
    assert res.pvalue > P_MIN, res


def test_bfloat16_draft_for_a_float32_target():
    """A 16-bit draft (half the memory) for a float32 target: the output is the float32
    target's distribution."""
    tc, tp = ref.toy_model(V, seed=0, eos_token_id=None)
    dc, dp = ref.toy_model(V, seed=7, dtype="bfloat16", eos_token_id=None)
    out = spec.speculative_sample({"target": tp, "draft": _rows_form(dp)}, _ids(),
                                  jax.random.key(6),
                                  _decode(SpeculativeConfig, tc, draft=dc, gamma=2))
    res = _sample_check(out, ref.make_lp_fn(tc, tp))
    assert res.pvalue > P_MIN, res


def test_truncated_bfloat16_draft_is_exact(pair, lp):
    """A truncated 16-bit draft head stored as ``[N, d]`` rows, without the target's most likely
    first token: it comes out through the residual, the distribution is the target's."""
    tc, tp, dc, _ = pair
    _, dp = ref.toy_model(V, seed=7, dtype="bfloat16", eos_token_id=None)
    top = int(np.argmax(lp(PROMPT)))
    rows = [t for t in range(V) if t != top]
    draft = kinds.transpose_head(truncate_head(dp, dc, rows, prompt_rows=True))
    assert draft["vocab_head"]["kernel"].value.shape == (len(rows), dc.hidden_size)
    out = spec.speculative_sample({"target": tp, "draft": draft}, _ids(), jax.random.key(7),
                                  _decode(SpeculativeConfig, tc, draft=dc, gamma=2))
    res = _sample_check(out, lp)
    assert res.pvalue > P_MIN, res


def test_broken_rule_fails(pair, lp, monkeypatch):
    """The same speculative case with the residual replaced by ``p`` (a wrong rule) fails: the
    test above has the power to see a wrong rule on a bfloat16 pair."""
    tc, tp, dc, dp = pair
    # after a rejection, p itself instead of norm(max(p - q, 0))
    monkeypatch.setattr(spec, "safe_residual", lambda p, q: p)
    # another batch size: a new trace (the compiled program of the real rule is not reused)
    out = spec.speculative_sample({"target": tp, "draft": dp}, _ids(ROWS - 8), jax.random.key(3),
                                  _decode(SpeculativeConfig, tc, draft=dc, gamma=2))
    res = _sample_check(out, lp)
    assert res.pvalue < 1e-6, res
