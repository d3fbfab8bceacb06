"""beam.beam_sample: exactness against the enumerated beam-sampling distribution (chi-square),
with and without replacement, warping on the joint, EOS, dead beams; the test's power (rules
broken on purpose must fail it); beam.beam_search against transformers' beam search; batching,
compile reuse, input checks.

Statistical tests: ``ROWS`` rows of one prompt, row b with key fold_in(key, b); the outcome of a
row is the multiset of its live beams (exact_reference.beam_key); Pearson chi-square against
exact_reference.exact_beam_sample_dist, cells with expected count < 5 pooled, pass if
p > 1e-3 (see test_sampling's docstring for the threshold). The broken-rule tests run the same
decoder with one rule changed and require p < 1e-6.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from exact_reference import (beam_key, chi_square_test, exact_beam_sample_dist,
                             exact_sample_dist)
from test_sampling import load_peer

import dsbd_jax
from dsbd_jax.decoding import beam, common
from dsbd_jax.decoding.configs import BeamSampleConfig, BeamSearchConfig
from dsbd_jax.decoding.warping import warp_logits

ROWS = 20000
P_MIN = 1e-3


# ---------------------------------------------------------------------------------------------
# the reference itself and the small pieces
def test_reference_width_one_is_sampling(toy):
    _, _, lp = toy
    for args in [(1.0, None, 1.0), (1.3, 3, 0.9)]:
        s = exact_sample_dist(lp, (2, 5), 3, *args, eos_ids=(0,), pad_id=5)
        for rep in (True, False):
            b = exact_beam_sample_dist(lp, (2, 5), [1, 1, 1], *args, replacement=rep,
                                       eos_ids=(0,), pad_id=5)
            assert set(b) == {(k,) for k in s}
            for k, p in s.items():
                assert abs(b[(k,)] - p) < 1e-6
    # one step, width 2, unwarped: i.i.d. pairs / ordered draws without replacement, by hand
    p = np.exp(lp((2, 5)))
    w = exact_beam_sample_dist(lp, (2, 5), [2], replacement=True)
    assert abs(w[((1,), (4,))] - 2 * p[1] * p[4]) < 1e-6 and abs(w[((4,), (4,))] - p[4] ** 2) < 1e-6
    wo = exact_beam_sample_dist(lp, (2, 5), [2], replacement=False)
    want = p[1] * p[4] / (1 - p[1]) + p[4] * p[1] / (1 - p[4])
    assert abs(wo[((1,), (4,))] - want) < 1e-6 and ((4,), (4,)) not in wo
    for d in (w, wo):
        assert abs(sum(d.values()) - 1) < 1e-9
    # varying widths (what a dynamic-width decoder produces): still a distribution over beam sets
    for rep in (True, False):
        d = exact_beam_sample_dist(lp, (2, 5), [3, 1, 2], 1.2, 5, 0.95, rep, (0,), 5)
        assert abs(sum(d.values()) - 1) < 1e-9
        # 2 beams; or 3 / 1 if every beam had ended after step 1 / 2 (the row stopped there)
        sizes = {len(k) for k in d}
        assert 2 in sizes and sizes <= {1, 2, 3}
        assert sum(p for k, p in d.items() if len(k) == 2) > 0.5


def test_pieces():
    scores = jnp.array([[0.0, -1.0], [-2.0, -jnp.inf]])
    logp = jnp.log(jnp.array([[[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]]] * 2))
    j = jax.jit(beam.joint_logprobs)(scores, logp)
    assert j.shape == (2, 6)
    want = np.log([0.5, 0.5, 1e-300, .2, .3, .5]) + [0, 0, 0, -1, -1, -1]
    want[2] = -np.inf
    np.testing.assert_allclose(np.asarray(j[0]), want, rtol=1e-6)
    assert np.isneginf(np.asarray(j[1, 3:])).all()
    b, t = beam.split_flat(np.array([0, 4, 5]), 3)
    np.testing.assert_array_equal(b, [0, 1, 1])
    np.testing.assert_array_equal(t, [0, 1, 2])
    lw = jax.jit(warp_logits, static_argnums=(1, 2, 3))(
        jnp.asarray(np.random.default_rng(0).standard_normal((300, 12)), jnp.float32), 1.0, 5, 1.0)
    draw = jax.jit(beam.draw_beams, static_argnums=(2, 3))
    idx = np.asarray(draw(jax.random.PRNGKey(0), lw, 4, False))
    assert idx.shape == (300, 4) and all(len(set(r)) == 4 for r in idx)
    idx = np.asarray(draw(jax.random.PRNGKey(0), lw, 4, True))
    assert idx.shape == (300, 4) and np.isfinite(np.take_along_axis(np.asarray(lw), idx, -1)).all()
    assert any(len(set(r)) < 4 for r in idx)  # duplicates do occur with replacement


def test_dead_beams(toy):
    """Without replacement, top-k 2 < W = 3 on the joint: both kept entries are taken, the third
    beam is dead (log-likelihood -inf, pad tokens)."""
    config, params, lp = toy
    dc = BeamSampleConfig(target=config, max_new_tokens=1, num_beams=3, top_k=2,
                          replacement=False, pad_token_id=5)
    out = beam.beam_sample(params, np.array([[2, 5], [0, 3]]), jax.random.PRNGKey(0), dc)
    for b, prompt in enumerate([(2, 5), (0, 3)]):
        ll = np.asarray(out.log_likelihoods[b])
        seqs = np.asarray(out.sequences[b])
        top2 = set(np.argsort(lp(prompt))[-2:].tolist())
        assert set(seqs[np.isfinite(ll), 0].tolist()) == top2
        assert np.isneginf(ll).sum() == 1 and seqs[np.isneginf(ll), 0] == 5
        assert int(out.best[b]) == int(np.argmax(ll))


# ---------------------------------------------------------------------------------------------
# exactness
CASES = {
    # name: (prompt, widths, temperature, top_k, top_p, replacement, eos, pad)
    "rep_W2_n3": ((2, 5), [2, 2, 2], 0.7, None, 1.0, True, (), 0),
    "rep_W3_n2_topk_topp": ((2, 5), [3, 3], 1.2, 5, 0.9, True, (), 0),
    # EOS = 4: every beam has finished after 2 steps in 93% (61%) of the rows: those rows stop;
    # without replacement, top-k 4 on the joint also counts finished beams' pad entries
    "rep_W2_n3_eos": ((2, 5), [2, 2, 2], 1.0, None, 1.0, True, (4,), 5),
    "norep_W2_n3_topk_eos": ((2, 5), [2, 2, 2], 1.0, 4, 1.0, False, (4,), 5),
    # top-p leaves 2 entries at step 1: one beam is dead there and must get no weight at step 2
    "norep_W3_n2_topk_topp_dead": ((0, 3), [3, 3], 1.0, 8, 0.9, False, (), 0),
}


def decode_config(config, case):
    prompt, widths, t, k, p, rep, eos, pad = case
    return BeamSampleConfig(target=config, max_new_tokens=len(widths), num_beams=widths[0],
                            temperature=t, top_k=k, top_p=p, replacement=rep,
                            eos_token_id=eos or None, pad_token_id=pad)


def run_case(toy, case, seed=0, rows=ROWS):
    config, params, lp = toy
    prompt, widths, t, k, p, rep, eos, pad = case
    out = beam.beam_sample(params, np.tile(np.asarray(prompt, np.int32), (rows, 1)),
                           jax.random.PRNGKey(seed), decode_config(config, case))
    seqs, ll = np.asarray(out.sequences), np.asarray(out.log_likelihoods)
    samples = [beam_key(s, l) for s, l in zip(seqs, ll)]
    exact = exact_beam_sample_dist(lp, prompt, widths, t, k, p, rep, eos, pad)
    return out, samples, exact


@pytest.mark.parametrize("name", list(CASES))
def test_beam_sample_is_exact(toy, name):
    case = CASES[name]
    prompt, widths, t, k, p, rep, eos, pad = case
    out, samples, exact = run_case(toy, case)
    res = chi_square_test(samples, exact)
    assert res.pvalue > P_MIN, res
    assert res.dof >= 8, res
    lp = toy[2]
    seqs, ll = np.asarray(out.sequences), np.asarray(out.log_likelihoods)
    n = len(widths)
    for r in range(50):  # scores are the UNWARPED target log-likelihoods
        for s, l in zip(seqs[r], ll[r]):
            s = tuple(s.tolist())
            m = next((i + 1 for i, x in enumerate(s) if x in eos), n)
            want = sum(lp(prompt + s[:i])[s[i]] for i in range(m))
            np.testing.assert_allclose(l, want, atol=1e-4)
            assert all(x == pad for x in s[m:])
    if eos:
        assert any(eos[0] in s[:-1] for s in samples[0])  or any(
            eos[0] in b[:-1] for row in samples[:100] for b in row)
    if not rep:
        assert all(len(set(s)) == len(s) for s in samples)


def _per_row_warping_step(key_rows, scores, logp, config, W):
    """BROKEN: warps each beam's next-token distribution separately instead of the joint."""
    V = logp.shape[-1]
    warped_rows = warp_logits(logp, config.temperature, config.top_k, config.top_p)
    joint = jax.nn.log_softmax(beam.joint_logprobs(scores, warped_rows), axis=-1)
    idx = jax.vmap(lambda k, lw: beam.draw_beams(k, lw, W, config.replacement))(key_rows, joint)
    b, tok = beam.split_flat(idx, V)
    true = jnp.take_along_axis(beam.joint_logprobs(scores, logp), idx, axis=-1)
    return b, tok.astype(jnp.int32), true, jnp.zeros(idx.shape, bool)


def _unweighted_step(key_rows, scores, logp, config, W):
    """BROKEN: draws beams from p(v | x^i) without the weights exp(s_i) of the input beams."""
    V = logp.shape[-1]
    alive = jnp.where(jnp.isfinite(scores), 0.0, -jnp.inf)
    joint = beam.joint_logprobs(alive, logp)
    warped = warp_logits(joint, config.temperature, config.top_k, config.top_p)
    idx = jax.vmap(lambda k, lw: beam.draw_beams(k, lw, W, config.replacement))(key_rows, warped)
    b, tok = beam.split_flat(idx, V)
    true = jnp.take_along_axis(beam.joint_logprobs(scores, logp), idx, axis=-1)
    return b, tok.astype(jnp.int32), true, jnp.zeros(idx.shape, bool)


@pytest.mark.parametrize("broken,attr,name", [
    (_per_row_warping_step, "beam_sample_step", "rep_W2_n3"),  # temperature per row
    (_unweighted_step, "beam_sample_step", "rep_W2_n3"),
])
def test_broken_rules_are_detected(toy, monkeypatch, broken, attr, name):
    """The exactness test has power: each rule broken on purpose gives a tiny p-value."""
    beam.beam_sample.core.clear_cache()
    monkeypatch.setattr(beam, attr, broken)
    try:
        _, samples, exact = run_case(toy, CASES[name], rows=ROWS)
    finally:
        monkeypatch.undo()
        beam.beam_sample.core.clear_cache()  # drop the broken trace
    res = chi_square_test(samples, exact)
    print(f"broken rule {broken.__name__} on {name}: p = {res.pvalue:.3g}, "
          f"chi2 = {res.statistic:.1f}, dof = {res.dof}, outside support = {res.outside}")
    assert res.pvalue < 1e-6, res


# ---------------------------------------------------------------------------------------------
# beam search against transformers
def _hf_beam(model, prompt, W, N, length_penalty, early_stopping, eos):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=N, num_beams=W,
                             do_sample=False, num_return_sequences=W, eos_token_id=eos,
                             pad_token_id=0, length_penalty=length_penalty,
                             early_stopping=early_stopping, output_scores=True,
                             return_dict_in_generate=True)
    return out.sequences[:, len(prompt):].numpy(), out.sequences_scores.numpy()


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    return load_peer(tmp_path_factory.mktemp("peer"))


@pytest.mark.parametrize("length_penalty,early_stopping,eos", [
    (1.0, False, None), (0.0, False, None), (2.0, False, None),
    (1.0, False, "frequent"), (0.5, True, "frequent"), (1.0, "never", "frequent")])
def test_beam_search_equals_transformers(peer, length_penalty, early_stopping, eos):
    """W = 3, 6 new tokens, 2 prompts of different lengths (one batch here, one by one in HF):
    the W returned hypotheses, their order and HF's sequences_scores are equal."""
    model, config, params = peer
    W, N = 3, 6
    prompts = [[5, 17, 3, 40, 22], [33, 2, 2, 7, 11, 30, 8]]
    ids, lens = common.pad_prompts(prompts, length=8)
    if eos == "frequent":  # an EOS id the beams emit often, so hypotheses end at various lengths
        toks = np.concatenate([_hf_beam(model, p, W, N, 1.0, False, None)[0][:, :N - 1].ravel()
                               for p in prompts])
        eos = int(np.bincount(toks).argmax())
    dc = BeamSearchConfig(target=config, max_new_tokens=N, num_beams=W, eos_token_id=eos,
                          pad_token_id=0, length_penalty=length_penalty,
                          early_stopping=early_stopping)
    out = beam.beam_search(params, ids, dc, lens)
    ended = 0
    for b, p in enumerate(prompts):
        hf_seqs, hf_scores = _hf_beam(model, p, W, N, length_penalty, early_stopping, eos)
        ours = np.asarray(out.sequences[b])
        np.testing.assert_allclose(np.asarray(out.stats["scores"][b]), hf_scores, rtol=1e-4,
                                   atol=1e-5)
        for w in range(W):
            L = int(out.lengths[b, w])
            np.testing.assert_array_equal(ours[w, :L], hf_seqs[w, :L])
            assert (ours[w, L:] == 0).all()
            ended += L < N
            np.testing.assert_allclose(float(out.log_likelihoods[b, w]),
                                       hf_scores[w] * L ** length_penalty, rtol=1e-4, atol=1e-4)
    if eos is not None:
        assert ended > 0  # the EOS logic was exercised
    np.testing.assert_array_equal(np.asarray(out.best), 0)


# ---------------------------------------------------------------------------------------------
def test_batch_rows_equal_single_runs_and_no_recompile(toy):
    config, params, _ = toy
    prompts = [[1, 2, 3, 4, 5, 1], [2], [3, 3, 1], [5, 4, 3, 2]]
    ids, lens = common.pad_prompts(prompts, length=8)
    ids2, lens2 = common.pad_prompts([[4], [1, 1, 1, 1, 1, 1, 1, 1], [2, 5], [3]], length=8)
    keys = jax.random.split(jax.random.PRNGKey(0), len(prompts))
    kw = dict(max_new_tokens=5, num_beams=2, top_k=10, top_p=0.95, eos_token_id=(4,),
              pad_token_id=5)
    dc = BeamSampleConfig(target=config, **kw)
    sc = BeamSearchConfig(target=config, **kw)
    d = dc.replace(replacement=False)
    batch = beam.beam_sample(params, ids, keys, d, lens)
    # some rows stop early (all beams ended) while others run on: their results must not move
    assert (np.asarray(batch.lengths).max(-1) < 5).any()
    for b in range(len(prompts)):
        alone = beam.beam_sample(params, ids[b:b + 1], keys[b:b + 1], d, lens[b:b + 1])
        np.testing.assert_array_equal(alone.sequences[0], batch.sequences[b])
        np.testing.assert_allclose(alone.log_likelihoods[0], batch.log_likelihoods[b], atol=1e-5)
    before = dsbd_jax.compile_count("beam_sample")
    beam.beam_sample(params, ids2, jax.random.PRNGKey(3), d, lens2).sequences.block_until_ready()
    assert dsbd_jax.compile_count("beam_sample") == before
    # with replacement: row b of a batch equals row 0 of a batch whose other rows differ
    d = dc.replace(replacement=True)
    batch = beam.beam_sample(params, ids, keys, d, lens)
    assert (np.asarray(batch.lengths).max(-1) < 5).any()
    for b in range(len(prompts)):
        order = [b] + [i for i in range(len(prompts)) if i != b][::-1]
        other = beam.beam_sample(params, ids[order], keys[np.array(order)], d, lens[order])
        np.testing.assert_array_equal(other.sequences[0], batch.sequences[b])
    bs = beam.beam_search(params, ids, sc, lens)
    for b in range(len(prompts)):
        order = [b] + [i for i in range(len(prompts)) if i != b][::-1]
        other = beam.beam_search(params, ids[order], sc, lens[order])
        np.testing.assert_array_equal(other.sequences[0], bs.sequences[b])
        np.testing.assert_allclose(other.stats["scores"][0], bs.stats["scores"][b], atol=1e-5)
    before = dsbd_jax.compile_count("beam_search")
    beam.beam_search(params, ids2, sc, lens2).sequences.block_until_ready()
    assert dsbd_jax.compile_count("beam_search") == before


def test_bad_inputs_raise(toy):
    config, params, _ = toy
    ids = np.array([[1, 2, 3]], np.int32)
    dc = BeamSampleConfig(target=config, max_new_tokens=3, num_beams=2)
    sc = BeamSearchConfig(target=config, max_new_tokens=3, num_beams=2)
    with pytest.raises(ValueError):
        beam.beam_sample(params, ids, jax.random.split(jax.random.PRNGKey(0), 2), dc)
    with pytest.raises(ValueError):
        beam.beam_sample(params, ids[0], jax.random.PRNGKey(0), dc)
    with pytest.raises(ValueError):
        beam.beam_sample(params, ids, jax.random.PRNGKey(0), dc, prompt_lengths=np.array([4]))
    with pytest.raises(ValueError):
        beam.beam_search(params, np.array([[1, 9]]), sc)
    with pytest.raises(ValueError):
        beam.beam_search(params, ids, sc.replace(early_stopping="sometimes"))
    with pytest.raises(ValueError):
        beam.beam_search(params, ids, sc.replace(length_penalty=float("nan")))
    for cls in (BeamSampleConfig, BeamSearchConfig):
        with pytest.raises(ValueError):
            cls(target=config, num_beams=0)
