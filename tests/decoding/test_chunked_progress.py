"""``Progress(every=k)``: the host drives a decoder's loop in compiled chunks of ``k`` trips and
reports between them. The outputs are the one-program call's, bit for bit; the programs have no
host callback (so JAX's cache and the program store keep them); a second call of the same bucket,
or a new channel with the same ``every``, compiles nothing; under the caller's own ``jax.jit``
the call runs as one program."""

import math

import jax
import numpy as np
import pytest

import dsbd_jax
from dsbd_jax.decoding import common

from dsbd_jax.decoding._jit import calls, programs

from test_calls import DECODERS, _call


def _chunked(cfg, every):
    return cfg.replace(progress=dsbd_jax.Progress(every=every))


def _same(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.parametrize("name", [  # CI: DSBD (drafted) and a one-token-per-step decoder: the
    # chunking is calls.py's, the same for every decoder's loop; the others extended
    pytest.param(n, marks=() if n in ("dsbd_generate", "beam_search")
                 else pytest.mark.extended) for n in sorted(DECODERS)])
def test_chunks_give_the_one_program_outputs_and_report_between_them(bench_pair, name):
    fn, cfg, params, ids, lengths, key, args = _call(bench_pair, name)
    whole = fn(*args, cfg, prompt_lengths=lengths)
    every = 2
    chunked_cfg = _chunked(cfg, every)
    reports = []
    with chunked_cfg.progress.listen(reports.append):
        out = fn(*args, chunked_cfg, prompt_lengths=lengths)
    _same(whole, out)
    trips = int(out.stats["iterations"])
    assert len(reports) == math.ceil(trips / every)          # one report per chunk
    seen = [int(r["iterations"]) for r in reports]
    assert seen == [min(every * (i + 1), trips) for i in range(len(seen))]
    if name in ("dsbd_generate", "speculative_sample", "tree_speculative_sample"):
        np.testing.assert_array_equal(reports[-1]["generated"], out.stats["generated_tokens"])
    assert int(reports[-1]["target_calls"]) == int(out.stats["target_calls"])


def test_chunk_programs_have_no_callback_and_compile_once(bench_pair):
    fn, cfg, params, ids, lengths, key, args = _call(bench_pair, "dsbd_generate")
    chunked_cfg = _chunked(cfg, 1)
    call = fn.prepare(*args, chunked_cfg, prompt_lengths=lengths)
    call.via.clear_cache()
    before = dsbd_jax.compile_count("dsbd_generate")
    first = call()
    assert dsbd_jax.compile_count("dsbd_generate") == before + 3    # start, step, finish
    again = fn(*args, _chunked(cfg, 1), prompt_lengths=lengths)   # a new channel, same every
    assert dsbd_jax.compile_count("dsbd_generate") == before + 3
    _same(first, again)
    plain = cfg.replace(progress=False)
    start, _ = call.via._chunks["start"]
    lowered = start.lower(None, call.args, plain, ("start", 1))
    assert programs._has_host_callbacks(lowered) is False
    # the loop state crosses the programs in the loop's own layouts: no copy of a cache in or
    # out of the step program
    step, _ = call.via._chunks["step"]
    state = start(None, call.args, plain, ("start", 1))[0]
    compiled = step.lower(state, call.args, plain, ("step", 1)).compile().as_text()
    entry = compiled[compiled.index("ENTRY"):]
    assert "wrapped_copy" not in entry[:entry.index("\n}\n")]
    # the callback form, for contrast: a program that calls back
    hooked = fn.prepare(*args, cfg.replace(progress=dsbd_jax.Progress()), prompt_lengths=lengths)
    assert programs._has_host_callbacks(hooked.lower()) is True


def test_under_the_callers_jit_the_call_is_one_program(bench_pair):
    fn, cfg, params, ids, lengths, key, args = _call(bench_pair, "speculative_sample")
    chunked_cfg = _chunked(cfg, 1)
    reports = []
    def inside(config):   # the caller's program, compiled under XLA's default options
        return jax.jit(lambda p, i, k, n: fn(p, i, k, config, prompt_lengths=n))(
            params, ids, key, lengths)
    with chunked_cfg.progress.listen(reports.append):
        chunked = inside(chunked_cfg)
    assert reports == []                                         # no host loop inside a trace
    _same(inside(cfg), chunked)


@pytest.mark.parametrize("every", [0, -1, 1.5, True])
def test_every_must_be_a_positive_int(every):
    with pytest.raises(ValueError, match="every"):
        dsbd_jax.Progress(every=every)


@pytest.mark.parametrize("name", [  # CI: DSBD (prompts finish apart), a one-token-per-step one
    pytest.param(n, marks=() if n in ("dsbd_generate", "beam_sample")
                 else pytest.mark.extended) for n in sorted(DECODERS)])
def test_prompts_are_told_when_done_with_their_final_outputs(bench_pair, name):
    fn, cfg, params, ids, lengths, key, args = _call(bench_pair, name)
    apart = {"dsbd_generate": 12, "speculative_sample": 8}   # lengths where prompts finish apart
    if name in apart:
        cfg = cfg.replace(max_new_tokens=apart[name])
    chunked_cfg = _chunked(cfg, 1)
    told = []

    def tell(rows, out):
        told.append((rows, jax.tree.map(np.asarray, out)))
    with chunked_cfg.progress.listen_done(tell):
        out = fn(*args, chunked_cfg, prompt_lengths=lengths)
    rows = [r for rs, _ in told for r in rs]
    assert sorted(rows) == list(range(ids.shape[0]))            # every prompt, once
    for rs, early in told:                                      # its rows as the call returns them
        for field in ("sequences", "lengths", "log_likelihoods", "best"):
            np.testing.assert_array_equal(getattr(early, field)[rs],
                                          np.asarray(getattr(out, field))[rs])
    if name in apart:             # one prompt told before the other, in an earlier chunk
        assert len(told) == 2 and len(told[0][0]) == 1
    # one program (a callback channel, or none reporting): every prompt told with the outputs
    hooked, told = cfg.replace(progress=dsbd_jax.Progress()), []
    with hooked.progress.listen_done(tell):
        whole = fn(*args, hooked, prompt_lengths=lengths)
    assert [rs for rs, _ in told] == [list(range(ids.shape[0]))]
    _same(whole, out)


def test_a_first_call_reports_its_compilation_stages(bench_pair):
    """``listen_stages``: a call on a new shape says it started, then each stage of its
    compilation as it ends (the XLA compile after "lowered" is the long silent part); the same
    call again compiles nothing and only starts; under the caller's own jit nothing is told."""
    fn, cfg, params, ids, lengths, key, args = _call(bench_pair, "sample")
    channel = dsbd_jax.Progress(every=3)
    cfg = cfg.replace(progress=channel, max_new_tokens=cfg.max_new_tokens + 1)   # a new program
    stages = []
    with channel.listen_stages(lambda stage, s: stages.append((stage, s))):
        fn(*args, cfg, prompt_lengths=lengths)
        first = [s for s, _ in stages]
        stages.clear()
        fn(*args, cfg, prompt_lengths=lengths)
        again = [s for s, _ in stages]
        stages.clear()
        jax.jit(lambda *a: fn(*a, cfg, prompt_lengths=lengths).sequences)(*args)
    assert first[0] == "start" and first.count("start") == 1
    for stage in ("traced", "lowered", "compiled"):
        assert stage in first, first
    assert first.index("lowered") < first.index("compiled")
    assert again == ["start"]
    assert stages == []
