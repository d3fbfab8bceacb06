"""Padding is never read.

A prompt batch is ``prompt_ids [B, P]`` with ``prompt_lengths [B]``; whatever the tokens past a
row's length hold (ids >= vocab_size, negative, 2**30, 0), every decoder's output is the same,
bit for bit, as for the same prompts padded with 0 (their *clean twin*), called directly, under a
user's ``jax.jit`` + ``checkify``, and sharded. A prompt whose real tokens or length are bad is
refused (direct call: ``ValueError``; in a jit: ``invalid`` with empty beams; under checkify: the
direct call's message), never decoded into a plausible wrong answer, and nothing is ever NaN.

Property-based (hypothesis): the examples draw token values, lengths and padding values at one
fixed shape (``B, P``), so each decoder and calling mode compiles once.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest
from exact_reference import toy_model
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from jax.experimental import checkify

from dsbd_jax.decoding import methods

from dsbd_jax.decoding._jit import inputs

V, B, P, N = 8, 3, 6, 3
# name: (method, settings); greedy sampling and single-beam DSBD are decoders of their own here
DECODERS = {
    "sample": ("sample", {}),
    "greedy": ("sample", dict(temperature=0.0)),
    "beam": ("beam", dict(num_beams=2)),
    "beam_search": ("beam_search", dict(num_beams=2)),
    "spec": ("spec", dict(gamma=2)),
    "tree": ("tree", dict(gamma=2)),
    "dsbd": ("dsbd", dict(gamma=2, draft_width=2, max_width=2)),
    "dsbd_single_beam": ("dsbd", dict(gamma=2, draft_width=2, max_width=2, single_beam=True)),
}
# every decoder directly and under a user's jit with checkify; a plain jit and the sharded
# decoder for one each (each (decoder, mode) is one more compilation: the file's time)
CASES = ([(d, "direct") for d in DECODERS] + [(d, "checkify") for d in DECODERS]
         + [("beam_search", "jit"), ("greedy", "sharded")])
FILLS = (V, V + 1, 2 ** 30, 2 ** 31 - 1, -1, -(2 ** 31), 0)
SETTINGS = settings(max_examples=10, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow])


@pytest.fixture(scope="module")
def models():
    tc, tp = toy_model(vocab=V, seed=0, layers=1, eos_token_id=(5,))
    dc, dp = toy_model(vocab=V, seed=1, layers=1, eos_token_id=(5,))
    return tc, tp, dc, dp


_RUNNERS: dict = {}


def runner(name: str, mode: str, models):
    """``(run(ids, lengths) -> (error message or None, GenerateOutput), pad id)`` for one decoder
    in one calling mode (built once per module, so each compiles once)."""
    if (name, mode) in _RUNNERS:
        return _RUNNERS[(name, mode)]
    tc, tp, dc, dp = models
    method, setting = DECODERS[name]
    dec = methods.build(method, tc, dc if method in methods.NEEDS_DRAFT else None,
                        max_new_tokens=N, **setting)
    params = methods.model_params(dec, tp, dp)
    key = jax.random.key(7)
    if mode == "direct":
        def run(ids, lens):
            try:
                return None, dec(params, ids, key, lens)
            except ValueError as e:
                return str(e), None
    elif mode == "jit":
        f = jax.jit(lambda p, i, l: dec(p, i, key, l))
        run = lambda ids, lens: (None, f(params, ids, lens))  # noqa: E731
    elif mode == "checkify":
        f = jax.jit(checkify.checkify(lambda p, i, l: dec(p, i, key, l)))

        def run(ids, lens):
            err, out = f(params, ids, lens)
            return err.get(), out
    else:
        from dsbd_jax.parallel import ShardedDecoder, make_mesh
        sd = ShardedDecoder.of(dec, make_mesh(1, 1))
        placed = sd.place(params)

        def run(ids, lens):
            try:
                return None, sd(placed, ids, key, lens)
            except ValueError as e:
                return str(e), None
    _RUNNERS[(name, mode)] = run, dec.config.pad_id
    return _RUNNERS[(name, mode)]


@st.composite
def batches(draw, bad_rows: bool):
    """``(real tokens [B, P], lengths [B], fills [B])``: the tokens at positions < length are a
    row's prompt; a row's padding gets its fill. With ``bad_rows``, a row may hold an id outside
    the vocabulary among its real tokens, or a length outside ``[1, P]``."""
    ids = np.array(draw(st.lists(st.integers(0, V - 1), min_size=B * P, max_size=B * P)),
                   np.int32).reshape(B, P)
    lens = np.array(draw(st.lists(st.integers(1, P), min_size=B, max_size=B)), np.int32)
    fill = st.one_of(st.sampled_from(FILLS), st.integers(-(2 ** 31), 2 ** 31 - 1))
    fills = np.array(draw(st.lists(fill, min_size=B, max_size=B)), np.int64)
    if bad_rows:
        for b in range(B):
            kind = draw(st.sampled_from(["ok", "ok", "bad id", "bad length"]))
            if kind == "bad id":
                ids[b, draw(st.integers(0, lens[b] - 1))] = draw(st.sampled_from([V, -1, 2 ** 30]))
            elif kind == "bad length":
                lens[b] = draw(st.sampled_from([0, -2, P + 1]))
    return ids, lens, fills


def padded(ids, lens, fills) -> np.ndarray:
    """``ids`` with each row's positions >= its length set to its fill (int32)."""
    past = np.arange(P)[None, :] >= lens[:, None]
    return np.where(past, fills[:, None], ids).astype(np.int32)


def expected_invalid(ids, lens) -> np.ndarray:
    """[B] rows whose length is outside [1, P] or whose real tokens leave the vocabulary."""
    real = np.arange(P)[None, :] < lens[:, None]
    bad_id = np.any(real & ((ids < 0) | (ids >= V)), axis=1)
    return (lens < 1) | (lens > P) | bad_id


def assert_no_nan(out) -> None:
    for path, x in jax.tree_util.tree_flatten_with_path(out)[0]:
        x = np.asarray(x)
        if np.issubdtype(x.dtype, np.floating):
            assert not np.isnan(x).any(), f"NaN in {jax.tree_util.keystr(path)}"


def assert_same(out, ref) -> None:
    """Every leaf of ``out`` equals ``ref``'s, bit for bit."""
    got = jax.tree_util.tree_flatten_with_path(out)[0]
    want = jax.tree_util.tree_leaves(ref)
    assert len(got) == len(want)
    for (path, x), y in zip(got, want):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y),
                                      err_msg=f"{jax.tree_util.keystr(path)} differs from the "
                                              f"clean twin's")


def assert_empty(out, rows, pad) -> None:
    """The ``rows`` of ``out`` are marked invalid and their beams are empty."""
    assert np.asarray(out.invalid)[rows].all()
    assert (np.asarray(out.sequences)[rows] == pad).all()
    assert (np.asarray(out.lengths)[rows] == 0).all()
    assert np.isneginf(np.asarray(out.log_likelihoods)[rows]).all()
    assert (np.asarray(out.stats["generated_tokens"])[rows] == 0).all()


# CI: every decoder directly, under checkify the drafted ones whose guard is their own (dsbd,
# spec), the jit and sharded cases; the other checkify cases are marked extended
CHECKIFY_IN_CI = ("dsbd", "spec")


@pytest.mark.parametrize("name,mode", [
    pytest.param(d, m, id=f"{d}-{m}", marks=pytest.mark.extended
                 if m == "checkify" and d not in CHECKIFY_IN_CI else ())
    for d, m in CASES])
def test_padding_is_never_read(models, name, mode):
    run, pad = runner(name, mode, models)

    @SETTINGS
    @given(batches(bad_rows=True))
    def check(batch):
        ids, lens, fills = batch
        bad = expected_invalid(ids, lens)
        err, out = run(padded(ids, lens, fills), lens)
        clean_err, clean = run(padded(ids, lens, np.zeros(B, np.int64)), lens)
        if mode in ("direct", "sharded"):  # host checks: a bad prompt raises, nothing runs
            assert (err is not None) == bad.any(), err
            assert err == clean_err
            if bad.any():
                assert "prompt_lengths must be" in err or "prompt token ids must be" in err
                return
        elif mode == "checkify":
            assert (err is not None) == bad.any(), err
            if bad.any():
                assert "prompt_lengths must be" in err or "prompt token ids must be" in err
        assert_no_nan(out)
        assert_same(out, clean)
        np.testing.assert_array_equal(np.asarray(out.invalid), bad)
        if bad.any():
            assert_empty(out, bad, pad)
        # and the valid rows' best beams are real answers, not empty ones
        best = np.asarray(out.best)[:, None]
        assert (np.take_along_axis(np.asarray(out.lengths), best, 1)[~bad] >= 1).all()
        assert np.isfinite(np.take_along_axis(np.asarray(out.log_likelihoods), best, 1)[~bad]).all()

    check()


def test_mask_padding_keeps_the_prompt_and_zeroes_the_rest():
    ids = np.array([[3, 1, 9, -4], [2, 2, 2, 2 ** 30]], np.int32)
    got = np.asarray(inputs.mask_padding(ids, np.array([2, 3], np.int32)))
    np.testing.assert_array_equal(got, [[3, 1, 0, 0], [2, 2, 2, 0]])


# CI: greedy (the batch-size path is the shared prompt handling, ``inputs.mask_padding``); DSBD's
# own padding is test_padding_is_never_read's (directly and under checkify), so its three batch
# sizes (about 70 s of compiling) are extended
@pytest.mark.parametrize("name", ["greedy", pytest.param("dsbd", marks=pytest.mark.extended)])
def test_padding_is_never_read_at_any_batch_size(models, name):
    """The batch size drawn too (1, 2 or 5 rows; one compilation each): valid prompts with any
    padding decode exactly as their clean twins, nothing is NaN."""
    run, _ = runner(name, "direct", models)

    @st.composite
    def sized(draw):
        b = draw(st.sampled_from([1, 2, 5]))
        ids = np.array(draw(st.lists(st.integers(0, V - 1), min_size=b * P, max_size=b * P)),
                       np.int32).reshape(b, P)
        lens = np.array(draw(st.lists(st.integers(1, P), min_size=b, max_size=b)), np.int32)
        fill = st.one_of(st.sampled_from(FILLS), st.integers(-(2 ** 31), 2 ** 31 - 1))
        return ids, lens, np.array(draw(st.lists(fill, min_size=b, max_size=b)), np.int64)

    @settings(max_examples=8, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow])
    @given(sized())
    def check(batch):
        ids, lens, fills = batch
        err, out = run(padded(ids, lens, fills), lens)
        clean_err, clean = run(padded(ids, lens, np.zeros(len(lens), np.int64)), lens)
        assert err is None and clean_err is None, err
        assert_no_nan(out)
        assert_same(out, clean)
        assert not np.asarray(out.invalid).any()

    check()
