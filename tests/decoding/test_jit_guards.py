"""The decoders inside a user's own ``jax.jit``.

Value checks (prompt ids, prompt lengths) run in the program: with ``checkify.checkify`` they
raise the direct call's message; without it the invalid prompt is marked (``invalid``) and its
beams are empty. Valid prompts give the same output as before the checks existed (bit for bit,
against ``data/guard_reference.npz`` written by the code of ``main`` before the jit guards, see
``reference_outputs``). Parameters that do not fit a model's config fail at trace time in one
line; ``compile_count`` counts compilations whoever triggered them.

Run as a script (``python tests/decoding/test_jit_guards.py OUT.npz``) to write the reference
outputs with whatever ``dsbd_jax`` is importable.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from jax.experimental import checkify

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from exact_reference import toy_model  # noqa: E402

import dsbd_jax
from dsbd_jax.decoding import common, methods  # noqa: E402
from dsbd_jax.decoding._jit import inputs

REFERENCE = Path(__file__).parent / "data" / "guard_reference.npz"
V, P = 8, 8
IDS = np.array([[1, 2, 3, 0, 0, 0, 0, 0], [4, 5, 6, 7, 1, 2, 3, 4]], np.int32)
LENS = np.array([3, 8], np.int32)   # row 1 full length
SETTINGS = {"dsbd": dict(gamma=2, draft_width=2, max_width=2), "beam": dict(num_beams=2),
            "beam_search": dict(num_beams=2), "sample": {}, "spec": dict(gamma=2),
            "tree": dict(gamma=2)}
# the table: (what, a change to row 1 of (ids, lengths))
BAD = {
    "id >= vocab": (lambda ids, lens: ids.__setitem__((1, 0), V)),
    "negative id": (lambda ids, lens: ids.__setitem__((1, 2), -3)),
    "length 0": (lambda ids, lens: lens.__setitem__(1, 0)),
    "length > P": (lambda ids, lens: lens.__setitem__(1, P + 1)),
}


def pair():
    tc, tp = toy_model(vocab=V, seed=0, layers=2, eos_token_id=None)
    dc, dp = toy_model(vocab=V, seed=1, layers=1, eos_token_id=None)
    return tc, tp, dc, dp


def decoder(method, tc, tp, dc, dp):
    d = methods.build(method, tc, dc if method in methods.NEEDS_DRAFT else None,
                      max_new_tokens=4, **SETTINGS[method])
    return d, methods.model_params(d, tp, dp)


def reference_outputs():
    """Every decoder on the valid batch, direct call, ``key(0)``: ``{method/field: array}``."""
    tc, tp, dc, dp = pair()
    out = {}
    for m in methods.METHODS:
        d, params = decoder(m, tc, tp, dc, dp)
        o = d(params, IDS, jax.random.key(0), LENS)
        for f in ("sequences", "lengths", "log_likelihoods"):
            out[f"{m}/{f}"] = np.asarray(getattr(o, f))
    return out


@pytest.fixture(scope="module")
def models():
    return pair()


def test_valid_prompts_give_the_same_output_as_before(models):
    """The same outputs as ``main`` before the in-program checks (same key), which were recorded
    on another host under XLA's default compiler options: tokens and lengths bit for bit, the
    log-likelihoods to float rounding. XLA:CPU compiles for the CPU it runs on, and on another
    CPU model (an AMD EPYC host against the Intel Xeon that recorded them) or under other
    options (``cpu_options.SAME_BITS``) a sum can round one ulp apart (seen: DSBD's
    log-likelihood -7.0947714 against -7.0947704)."""
    ref = np.load(REFERENCE)
    tc, tp, dc, dp = models
    for m in methods.METHODS:
        d, params = decoder(m, tc, tp, dc, dp)
        o = d(params, IDS, jax.random.key(0), LENS)
        assert not np.any(o.invalid), m
        for f in ("sequences", "lengths", "log_likelihoods"):
            got = np.asarray(getattr(o, f))
            if f == "log_likelihoods":
                np.testing.assert_allclose(got, ref[f"{m}/{f}"], rtol=1e-5, atol=1e-5,
                                           err_msg=f"{m} {f}")
            else:
                np.testing.assert_array_equal(got, ref[f"{m}/{f}"], err_msg=f"{m} {f}")


@pytest.mark.parametrize("method", [  # CI: a drafted and a plain decoder; the rest extended
    pytest.param(m, marks=() if m in ("dsbd", "sample") else pytest.mark.extended)
    for m in methods.METHODS])
def test_bad_prompts_inside_a_user_jit(models, method):
    """Each row of the issue's table, through the user's own jit: a direct call raises; under
    ``checkify`` the same message; without it the row is marked and its beams are empty, and
    the valid row is untouched. One compiled program for all four (no recompilation)."""
    tc, tp, dc, dp = models
    d, params = decoder(method, tc, tp, dc, dp)
    key = jax.random.key(0)
    plain = jax.jit(lambda p, i, k, l: d(p, i, k, l))
    checked = jax.jit(checkify.checkify(lambda p, i, k, l: d(p, i, k, l)))
    good = plain(params, IDS, key, LENS)
    assert not np.any(good.invalid)
    checked(params, IDS, key, LENS)[0].throw()     # valid: no error
    before = dsbd_jax.compile_count(d.fn.__name__)
    for what, spoil in BAD.items():
        ids, lens = IDS.copy(), LENS.copy()
        spoil(ids, lens)
        with pytest.raises(ValueError) as direct:
            d(params, ids, key, lens)
        err, _ = checked(params, ids, key, lens)
        with pytest.raises(checkify.JaxRuntimeError) as jitted:
            err.throw()
        assert str(direct.value) in str(jitted.value), (what, str(jitted.value))
        assert "\n" not in str(direct.value)
        o = plain(params, ids, key, lens)
        assert np.asarray(o.invalid).tolist() == [False, True], what
        assert np.all(np.asarray(o.lengths[1]) == 0), what
        assert np.all(np.isneginf(np.asarray(o.log_likelihoods[1]))), what
        assert np.all(np.asarray(o.sequences[1]) == d.config.pad_id), what
        assert int(o.stats["generated_tokens"][1]) == 0, what
        for f in ("sequences", "lengths", "log_likelihoods"):
            np.testing.assert_array_equal(np.asarray(getattr(o, f))[0],
                                          np.asarray(getattr(good, f))[0], err_msg=what)
    assert dsbd_jax.compile_count(d.fn.__name__) == before


def test_guard_marks_what_the_host_check_refuses():
    """``guard_prompts`` flags exactly the rows ``check_prompt_batch`` refuses (padding past a
    row's length may hold anything) and leaves valid rows' prompts as they were, their padding
    set to 0 (padding is never read)."""
    rng = np.random.default_rng(0)
    for _ in range(50):
        ids = rng.integers(-2, V + 2, size=(1, 4)).astype(np.int32)
        lens = rng.integers(-1, 6, size=(1,)).astype(np.int32)
        try:
            inputs.check_prompt_batch(ids, lens, V)
            refused = False
        except ValueError:
            refused = True
        invalid, new_ids, new_lens = inputs.guard_prompts(jax.numpy.asarray(ids),
                                                          jax.numpy.asarray(lens), V)
        assert bool(invalid[0]) == refused, (ids, lens)
        if not refused:
            np.testing.assert_array_equal(new_ids, np.where(np.arange(4) < lens[:, None], ids, 0))
            np.testing.assert_array_equal(new_lens, lens)


@pytest.mark.parametrize("method", ["dsbd", "sample"])
def test_params_of_another_model_fail_in_one_line(models, method):
    """Draft parameters passed as the target's (the draft has 1 layer, the target 2): one line
    naming the model and the first leaf that differs, under the user's jit too."""
    tc, tp, dc, dp = models
    d, _ = decoder(method, tc, tp, dc, dp)
    params = {"target": dp, "draft": dp} if d.needs_draft else dp
    f = jax.jit(lambda p, i, k, l: d(p, i, k, l))
    for call in (d, f):
        with pytest.raises(ValueError) as e:
            call(params, IDS, jax.random.key(0), LENS)
        msg = str(e.value)
        assert "\n" not in msg and msg.startswith("target parameters do not match config.target: "
                                                  "leaf ['layers"), msg
    if d.needs_draft:
        with pytest.raises(ValueError, match=r"^draft parameters do not match config.draft"):
            f({"target": tp, "draft": tp}, IDS, jax.random.key(0), LENS)


def test_compile_count_counts_the_user_jit_and_the_plain_call(models, caplog):
    """The issue's case: the user's jit compiles, then a plain call on the same shapes compiles
    again: both count, and each logs one short INFO line (method and shapes)."""
    tc, tp, dc, dp = models
    d, params = decoder("sample", tc.replace(rope_theta=12345.0), tp, dc, dp)  # a fresh program
    before = dsbd_jax.compile_count("sample")
    with caplog.at_level(logging.INFO, logger="dsbd_jax"):
        jax.jit(lambda p, i, k, l: d(p, i, k, l))(params, IDS, jax.random.key(0), LENS)
        assert dsbd_jax.compile_count("sample") == before + 1
        d(params, IDS, jax.random.key(0), LENS)
        assert dsbd_jax.compile_count("sample") == before + 2
        d(params, IDS, jax.random.key(1), LENS)   # same shapes: no compile
    assert dsbd_jax.compile_count("sample") == before + 2
    assert isinstance(dsbd_jax.compile_count(), dict)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("compiled sample")]
    assert len(lines) == 2 and all("batch 2, prompt 8" in s and len(s) < 100 for s in lines), lines


def test_compile_count_through_sharded_decoder(models):
    """``ShardedDecoder`` compiles its own jit around the decoder: that compilation counts as
    the decoder's (once; the second call reuses it), and the output carries ``invalid``."""
    from dsbd_jax.parallel import ShardedDecoder
    from dsbd_jax.parallel.mesh import make_mesh
    tc, tp, dc, dp = models
    d, params = decoder("sample", tc.replace(rope_theta=23456.0), tp, dc, dp)
    sd = ShardedDecoder.of(d, make_mesh(1, 1))
    placed = sd.place(params)
    before = dsbd_jax.compile_count("sample")
    out = sd(placed, IDS, jax.random.key(0), LENS)
    sd(placed, IDS, jax.random.key(1), LENS)
    assert dsbd_jax.compile_count("sample") == before + 1 and sd.compiles == 1
    assert np.asarray(out.invalid).tolist() == [False, False]


if __name__ == "__main__":
    np.savez(sys.argv[1], **reference_outputs())
