"""Speculative sampling (dsbd_jax.decoding.speculative): exactness, power, greedy, compilation, errors.

Exactness test (``run_exact``, also used by test_tree.py): toy target and draft models
(``exact_reference.toy_model``, V = 6, one layer) small enough to enumerate. One prompt is
repeated in a batch of BATCH = 20000 rows (each row has its own key), n = 2-3 new tokens are
sampled, and the output sequences are compared with the exact multinomial-sampling distribution
of the warped target (``exact_sample_dist``) by a Pearson chi-square test (bins with expected
count < 5 pooled; 36-216 outcomes, 10-160 bins).
A correct sampler passes with p > P_EXACT = 1e-3. The seeds are fixed, so each test is
deterministic; the threshold keeps the chance that a correct sampler fails on an unlucky seed at
0.1% per case (should the PRNG streams change).
Why 20000 rows: enough that most outcomes get >= 5 expected counts (so the test resolves the
individual sequences, not one pooled bin) and that breaking a rule fails by a wide margin:
accepting with q/p instead of p/q gives chi2 ~ 1e5 on 35 dof (p = 0; test_power_chain_q_over_p);
Algorithm 2 without removing the rejected draft from q gives chi2 ~ 2000 on 158 dof end to end
(widths (3, 1), "far" draft; measured once, not a test) and p = 0 in the rule-level test of
test_tree.py. Breaking must give
p < P_BROKEN = 1e-6. Every exactness run also checks, for every row, the returned unwarped target
log-likelihood, the length and the padding after EOS against the enumerated model.

Drafts: "close" is the target's weights with a flatter head (lm_head scale 1 instead of 2, about
the target at twice the temperature: acceptance ~0.75, tree ~0.9); "far" is an unrelated model
(acceptance ~0.3-0.4, tree ~0.3-0.5); "target" is the target itself. Run with
``PYTHONPATH=tests``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import exact_reference as ref
import dsbd_jax
from dsbd_jax.decoding import common
from dsbd_jax.models import llama as dmodel
from dsbd_jax.decoding import speculative as spec
from dsbd_jax.decoding.configs import SpeculativeConfig, TreeConfig

V = 6
PROMPT = (1, 2)
BATCH = 20000
P_EXACT = 1e-3
P_BROKEN = 1e-6


@functools.lru_cache(maxsize=None)
def toy(name: str):
    """``(config, params)`` of the toy models: "target", "close", "far"."""
    if name == "target":
        return ref.toy_model(V, seed=1, scale=2.0)
    if name == "close":
        return ref.toy_model(V, seed=1, scale=1.0)
    if name == "far":
        return ref.toy_model(V, seed=2, scale=2.0)
    raise KeyError(name)


@functools.lru_cache(maxsize=None)
def target_lp():
    return ref.make_lp_fn(*toy("target"))


def params_with(draft: str):
    return {"target": toy("target")[1], "draft": toy(draft)[1]}


# the config each drafted decoder takes (check_greedy and check_bad_inputs build it by decoder)
OWN_CONFIG = {"speculative_sample": SpeculativeConfig, "tree_speculative_sample": TreeConfig}


def config(cls=SpeculativeConfig, **kw):
    """A ``cls`` config (``SpeculativeConfig``; ``TreeConfig`` for the tree) of the toy target,
    drafted by the toy target."""
    return cls(toy("target")[0], draft=toy("target")[0], **kw)


def eos_token(n_prefix=PROMPT, target_prob=0.3) -> int:
    """A token whose probability as the first new token is closest to ``target_prob`` (an EOS
    that ends a good share of rows early but not all of them)."""
    p = np.exp(target_lp()(n_prefix))
    return int(np.argmin(np.abs(p - target_prob)))


def expected_loglik(seq, eos_ids, n):
    """Unwarped target log p(new tokens up to and including the first EOS) and that length."""
    total, length = 0.0, n
    for j, tok in enumerate(seq):
        total += float(target_lp()(PROMPT + tuple(int(t) for t in seq[:j]))[tok])
        if tok in eos_ids:
            length = j + 1
            break
    return total, length


def run_exact(fn, cfg, draft, key=0, batch=BATCH):
    """Sample ``batch`` copies of PROMPT; check log-likelihoods, lengths, padding and stats;
    return ``(ChiSquare against the exact distribution, output)``. ``draft``: a toy's name, or
    the ``{"target", "draft"}`` parameters themselves (a draft head's)."""
    ids = np.tile(np.asarray(PROMPT, np.int32)[None], (batch, 1))
    params = draft if isinstance(draft, dict) else params_with(draft)
    out = fn(params, ids, jax.random.key(key), cfg)
    seqs = np.asarray(out.sequences[:, 0])
    eos_ids = set(cfg.eos_ids)
    exact = ref.exact_sample_dist(target_lp(), PROMPT, cfg.max_new_tokens, cfg.temperature,
                                  cfg.top_k, cfg.top_p, tuple(eos_ids), cfg.pad_id)
    result = ref.chi_square_test([tuple(s) for s in seqs.tolist()], exact)
    # per-row log-likelihoods, lengths and pad after EOS (one enumeration per distinct sequence)
    uniq, inv = np.unique(seqs, axis=0, return_inverse=True)
    want = np.array([expected_loglik(tuple(s), eos_ids, cfg.max_new_tokens) for s in uniq])
    np.testing.assert_allclose(np.asarray(out.log_likelihoods[:, 0]), want[inv.ravel(), 0],
                               rtol=1e-4, atol=1e-4)
    lengths = want[inv.ravel(), 1].astype(int)
    np.testing.assert_array_equal(np.asarray(out.lengths[:, 0]), lengths)
    np.testing.assert_array_equal(np.asarray(out.stats["generated_tokens"]), lengths)
    after = np.arange(cfg.max_new_tokens)[None, :] >= lengths[:, None]
    assert np.all(seqs[after] == cfg.pad_id)
    st = {k: np.asarray(v) for k, v in out.stats.items()}
    assert st["target_calls"] == st["iterations"] == st["row_iterations"].max()
    assert st["draft_calls"] == cfg.gamma * st["iterations"]
    assert np.all(st["accepted_tokens"] <= st["verified_tokens"])
    return result, out


def greedy_reference(prompt, n, eos_ids=(), pad_id=0):
    """Greedy decoding of the target by a plain loop over ``model.logits`` (no cache; the sequence
    is right-padded to one fixed width, harmless under the causal mask, so one compilation).
    Returns ``(new tokens, unwarped log-likelihood up to and including the first EOS)``."""
    tc, tp = toy("target")
    seq, out, ll = list(prompt), [], 0.0
    for _ in range(n):
        if any(t in eos_ids for t in out):
            out.append(pad_id)
            continue
        ids = np.zeros((1, GREEDY_WIDTH), np.int32)
        ids[0, :len(seq)] = seq
        logp = jax.nn.log_softmax(dmodel.logits(tc, tp, ids)[0, len(seq) - 1])
        tok = int(np.argmax(np.asarray(logp)))
        ll += float(logp[tok])
        seq.append(tok)
        out.append(tok)
    return out, ll


GREEDY_PROMPTS = ([1, 2, 3, 5], [1, 1], [0])
GREEDY_PROMPTS_2 = ([4], [2, 3], [3, 1, 4])
GREEDY_N = 7
GREEDY_WIDTH = 4 + GREEDY_N


def pick_eos(prompts, n):
    """An EOS token that ends the greedy rows after as many different lengths as possible."""
    refs = [greedy_reference(p, n)[0] for p in prompts]

    def lengths(v):
        return [r.index(v) + 1 if v in r else n for r in refs]

    return max(range(V), key=lambda v: (len(set(lengths(v))), -min(lengths(v)), -v))


def check_greedy(fn, cfg_kw, name):
    """Temperature 0: output == greedy decoding of the target (tokens, lengths, log-likelihoods),
    for prompts of different lengths in one padded batch, with an EOS that ends rows after
    different numbers of tokens. A second batch with other true lengths in the same padded
    shape must not recompile."""
    eos = pick_eos(GREEDY_PROMPTS, GREEDY_N)
    cfg = config(OWN_CONFIG[fn.__name__], temperature=0.0, max_new_tokens=GREEDY_N,
                 eos_token_id=(eos,), pad_token_id=0, **cfg_kw)
    params = params_with("far")

    def run_and_check(prompts):
        ids, lens = common.pad_prompts(prompts, length=4)
        out = fn(params, ids, jax.random.key(0), cfg, prompt_lengths=lens)
        for b, pr in enumerate(prompts):
            want, ll = greedy_reference(pr, GREEDY_N, (eos,), 0)
            assert np.asarray(out.sequences[b, 0]).tolist() == want, (b, pr)
            length = want.index(eos) + 1 if eos in want else GREEDY_N
            assert int(out.lengths[b, 0]) == length
            np.testing.assert_allclose(float(out.log_likelihoods[b, 0]), ll, rtol=1e-4, atol=1e-4)
        return out

    out = run_and_check(list(GREEDY_PROMPTS))
    print(f"greedy {name}: eos={eos}, lengths={np.asarray(out.lengths[:, 0]).tolist()}")
    before = dsbd_jax.compile_count(name)
    run_and_check(list(GREEDY_PROMPTS_2))
    assert dsbd_jax.compile_count(name) == before, "a batch of other true lengths recompiled"


def check_bad_inputs(fn):
    tc, tp = toy("target")
    params = params_with("far")
    ids = np.array([[1, 2], [3, 4]], np.int32)
    key = jax.random.key(0)
    cls = OWN_CONFIG[fn.__name__]
    good = eos_config(cls)
    # the same inputs with nothing wrong work (shape of the other tests: no new compilation)
    fn(params, np.tile(ids, (BATCH // 2, 1)), key, good, prompt_lengths=np.full(BATCH, 2))
    with pytest.raises(ValueError):
        config(cls, gamma=0)
    with pytest.raises(ValueError):  # no draft model
        fn(params, ids, key, good.replace(draft=None))
    c7, p7 = ref.toy_model(7, seed=3)
    with pytest.raises(ValueError):  # draft and target vocabularies differ
        cls(tc, draft=c7)
    with pytest.raises(ValueError):  # parameters do not match the config's vocabulary
        fn({"target": tp, "draft": p7}, ids, key, good)
    with pytest.raises(ValueError):  # params without the draft
        fn({"target": tp}, ids, key, good)
    with pytest.raises(ValueError):  # prompt + new tokens + look-ahead beyond the positions
        short = tc.replace(max_position_embeddings=6)
        fn(params, ids, key, good.replace(target=short, draft=short))
    with pytest.raises(ValueError):  # prompt_lengths out of range
        fn(params, ids, key, good, prompt_lengths=np.array([0, 2]))
    with pytest.raises(ValueError):
        fn(params, ids, key, good, prompt_lengths=np.array([1, 3]))
    with pytest.raises(ValueError):  # token ids outside the vocabulary
        fn(params, np.array([[1, V]], np.int32), key, good)
    with pytest.raises(ValueError):  # a batch of keys of the wrong size
        fn(params, ids, jax.random.split(jax.random.key(0), 3), good)
    with pytest.raises(ValueError):  # prompt_ids not 2-D
        fn(params, np.array([1, 2], np.int32), key, good)


# ---------------------------------------------------------------------------------------------
def test_verify_chain_rule():
    """The rule on hand-made numbers: acceptance, residual after a rejection, bonus, budget."""
    p = jnp.array([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5], [0.1, 0.1, 0.8]])
    q = jnp.array([[0.25, 0.75, 0.0], [0.6, 0.2, 0.2]])
    drafts = jnp.array([1, 0])
    # draft 0 (token 1): p/q = 2/3 -> accepted iff u < 2/3; draft 1 (token 0): p/q = 1/3.
    n, nxt = spec.verify_chain(p, q, drafts, jnp.array([0.6, 0.2]), 2)
    assert int(n) == 2 and np.allclose(nxt, p[2])                       # bonus from p[2]
    n, nxt = spec.verify_chain(p, q, drafts, jnp.array([0.6, 0.5]), 2)
    assert int(n) == 1 and np.allclose(nxt, [0.0, 0.1 / 0.4, 0.3 / 0.4])  # residual(p[1], q[1])
    n, nxt = spec.verify_chain(p, q, drafts, jnp.array([0.7, 0.0]), 2)
    assert int(n) == 0 and np.allclose(nxt, [1.0, 0.0, 0.0])            # residual(p[0], q[0])
    n, nxt = spec.verify_chain(p, q, drafts, jnp.array([0.6, 0.2]), 1)
    assert int(n) == 1 and np.allclose(nxt, p[1])                       # budget: bonus from p[1]
    n, nxt = spec.verify_chain(p, q, drafts, jnp.array([0.6, 0.2]), 0)
    assert int(n) == 0 and np.allclose(nxt, p[0])


def eos_config(cls=SpeculativeConfig, **kw):
    """gamma = 2, n = 3, with an EOS that ends a good share of the rows early (a ``cls`` config,
    as :func:`config`). Shared by several tests below (one compilation)."""
    return config(cls, gamma=2, max_new_tokens=3, eos_token_id=(eos_token(),), pad_token_id=0,
                  **kw)


@pytest.mark.parametrize("name,draft", [("gamma1_topk_topp", "far"), ("gamma2_eos", "close")])
def test_speculative_exact(name, draft):
    """gamma 1 with temperature/top-k/top-p and n = 3 (not a multiple of gamma + 1: the last
    iteration has a smaller budget); gamma 2 without warping, with EOS."""
    if name == "gamma1_topk_topp":
        cfg = config(gamma=1, max_new_tokens=3, temperature=1.3, top_k=4, top_p=0.9)
    else:
        cfg = eos_config()
    result, out = run_exact(spec.speculative_sample, cfg, draft)
    check_exact_case(f"{name} ({draft} draft)", cfg, result, out)


def check_exact_case(label, cfg, result, out):
    """Report and assert one exactness case: partial acceptance (so the rule is exercised), EOS
    ending a fair share of rows when enabled, and the chi-square p-value above P_EXACT."""
    acc = float(out.stats["acceptance_rate"])
    print(f"{label}: p={result.pvalue:.3g} (chi2={result.statistic:.1f}, dof={result.dof}, "
          f"{BATCH} samples), acceptance={acc:.3f}, "
          f"accepted per target call={float(out.stats['mean_accepted']):.3f}")
    assert 0.05 < acc < 0.97, "the draft should be accepted partially"
    if cfg.eos_ids:
        ended = np.asarray(out.lengths[:, 0]) < cfg.max_new_tokens
        assert 0.05 < ended.mean() < 0.95
    assert result.pvalue > P_EXACT, result


def check_identical(fn, cfg, iterations, batch=256):
    """Draft == target: every draft token is accepted (acceptance exactly 1: p and q are the same
    numbers, so u * q(x) < p(x) always holds), in the given number of iterations."""
    ids = np.tile(np.asarray(PROMPT, np.int32)[None], (batch, 1))
    out = fn(params_with("target"), ids, jax.random.key(3), cfg)
    st = {k: np.asarray(v) for k, v in out.stats.items()}
    assert float(st["acceptance_rate"]) == 1.0
    np.testing.assert_array_equal(st["accepted_tokens"], st["verified_tokens"])
    assert int(st["iterations"]) == iterations
    np.testing.assert_array_equal(st["generated_tokens"], cfg.max_new_tokens)


def test_identical_draft_accepts_everything():
    """n = 7 with gamma = 2: three iterations of 2 accepted drafts + bonus (the last with a budget
    of 1), so the draft's recomputation of the last accepted token (never fed to the draft) is
    exercised: if it were wrong, q would differ from p and some drafts would be rejected."""
    check_identical(spec.speculative_sample, config(gamma=2, max_new_tokens=7), iterations=3)


def test_keys_single_and_batch():
    """Row b with one key == row b with the batch of keys fold_in(key, b) == with the raw key;
    another key gives other samples."""
    cfg = eos_config()
    ids = np.tile(np.asarray(PROMPT, np.int32)[None], (BATCH, 1))
    key = jax.random.key(7)
    a = spec.speculative_sample(params_with("far"), ids, key, cfg)
    keys = jax.vmap(jax.random.fold_in, in_axes=(None, 0))(key, jnp.arange(BATCH))
    b = spec.speculative_sample(params_with("far"), ids, keys, cfg)
    c = spec.speculative_sample(params_with("far"), ids, jax.random.PRNGKey(7), cfg)  # raw key
    d = spec.speculative_sample(params_with("far"), ids, jax.random.key(8), cfg)
    np.testing.assert_array_equal(np.asarray(a.sequences), np.asarray(b.sequences))
    np.testing.assert_array_equal(np.asarray(a.sequences), np.asarray(c.sequences))
    assert np.mean(np.any(np.asarray(a.sequences) != np.asarray(d.sequences), axis=-1)) > 0.3


def test_greedy_equals_target_greedy():
    check_greedy(spec.speculative_sample, dict(gamma=3), "speculative_sample")


def test_bad_inputs_raise():
    check_bad_inputs(spec.speculative_sample)


# ---------------------------------------------------------------------------------------------
# Last in this file: it traces a deliberately broken rule, then clears the compiled cache.
@pytest.fixture
def clear_chain_cache_after():
    yield
    spec.speculative_sample.core.clear_cache()  # the broken program must not be reused


def test_power_chain_q_over_p(monkeypatch, clear_chain_cache_after):
    """Accepting with min(1, q/p) (docs/algorithm.md: the paper's typo) must fail the exactness test.
    The config is used by no other test, so the broken rule is traced anew (checked)."""
    monkeypatch.setattr(spec, "accept_test", lambda u, p_x, q_x: u * p_x < q_x)
    before = dsbd_jax.compile_count("speculative_sample")
    result, _ = run_exact(spec.speculative_sample, config(gamma=2, max_new_tokens=2), "far")
    assert dsbd_jax.compile_count("speculative_sample") == before + 1
    print(f"broken rule (accept w.p. q/p): p={result.pvalue:.3g} (chi2={result.statistic:.1f}, "
          f"dof={result.dof}, {BATCH} samples)")
    assert result.pvalue < P_BROKEN, result
