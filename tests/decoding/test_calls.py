"""A decoder call is one checked call of one jitted program: ``decoder.prepare(...)`` returns
that call (``calls.CoreCall``) without running it, and states which program it is and which
compiler options it compiles under; running it is the public call (one compile per bucket)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dsbd_jax
from dsbd_jax import (DSBDConfig, beam_sample, beam_search, dsbd_generate, sample,
                      speculative_sample, tree_speculative_sample)
from dsbd_jax.decoding import common, configs, methods
from dsbd_jax.decoding._jit import calls
from dsbd_jax.host import cpu_options as co
from dsbd_jax.host import plan as host


def _setup(bench_pair, name):
    _, _, target, draft = bench_pair
    kw = dict(target=target.config, max_new_tokens=4, top_k=10, top_p=0.8, eos_token_id=())
    if name == "dsbd_generate":
        cfg = DSBDConfig(draft=draft.config, gamma=2, draft_width=2, threshold=0.9, **kw)
    elif name in ("speculative_sample", "tree_speculative_sample"):
        cfg = configs.ACCEPTS[name][0](draft=draft.config, gamma=2, **kw)
    else:
        cfg = configs.ACCEPTS[name][0](num_beams=2, **kw)
    params = ({"target": target.params, "draft": draft.params} if getattr(cfg, "draft", None)
              else target.params)
    return cfg, params


DECODERS = {"sample": sample, "beam_sample": beam_sample, "beam_search": beam_search,
            "speculative_sample": speculative_sample,
            "tree_speculative_sample": tree_speculative_sample, "dsbd_generate": dsbd_generate}


@pytest.fixture
def forced_options(monkeypatch):
    """The host's choice of compiler options forced to a candidate that has options."""
    monkeypatch.setenv(co.ENV, "single_thread_eigen")
    co.choice.cache_clear()
    yield {"xla_cpu_multi_thread_eigen": False}
    co.choice.cache_clear()


def _call(bench_pair, name):
    """``(decoder, config, params, ids, lengths, key, positional args)`` of a two-prompt call."""
    cfg, params = _setup(bench_pair, name)
    ids, lengths = common.pad_prompts([[5, 6, 7], [8, 9]], pad_id=0, length=8)
    key = jax.random.PRNGKey(1)
    args = (params, ids) if name == "beam_search" else (params, ids, key)
    return DECODERS[name], cfg, params, ids, lengths, key, args


@pytest.mark.parametrize("name", [  # CI: a drafted and a plain decoder; the others extended
    pytest.param(n, marks=() if n in ("dsbd_generate", "sample") else pytest.mark.extended)
    for n in sorted(DECODERS)])
def test_a_call_states_its_program_and_options_and_runs_once_compiled(bench_pair, name,
                                                                      forced_options):
    """For one call: the program (its decoder's core), the compiler options (those the host's
    choice names for these arguments: forced here to a candidate with options), one compile for
    the prepared call and the public call of the same bucket, and the same output."""
    fn, cfg, params, ids, lengths, key, args = _call(bench_pair, name)
    call = fn.prepare(*args, cfg, prompt_lengths=lengths)
    assert isinstance(call, calls.CoreCall) and call.decoder == name
    assert call.options == forced_options
    # ... named by the host's plan for the model the call runs (its loaded form and dtype)
    plan = host.plan(cfg.target, "float32", "plain")
    assert co.options_of((call.args, call.kwargs)) == plan.options == "single_thread_eigen"
    call.via.clear_cache()   # compiled by an earlier test of this process: drop it
    before = dsbd_jax.compile_count(name)
    # ahead of time from the public function itself, as from a jax.jit: that compile is the
    # one the call then runs
    assert "while" in fn.lower(*args, cfg, prompt_lengths=lengths).as_text()
    call.compile()
    assert dsbd_jax.compile_count(name) == before + 1
    out = call()
    assert dsbd_jax.compile_count(name) == before + 1
    again = fn(*args, cfg, prompt_lengths=lengths)   # same bucket: no second compile
    assert dsbd_jax.compile_count(name) == before + 1
    np.testing.assert_array_equal(np.asarray(out.sequences), np.asarray(again.sequences))


def test_the_checks_run_when_the_call_is_prepared(bench_pair):
    cfg, params = _setup(bench_pair, "dsbd_generate")
    ids = jnp.asarray([[5, 6, 7]], jnp.int32)
    with pytest.raises(ValueError):
        dsbd_generate.prepare(params, ids, jax.random.PRNGKey(0), cfg,
                              prompt_lengths=np.array([9]))


def test_a_decoder_without_a_prepared_call_is_refused(bench_pair):
    cfg, params = _setup(bench_pair, "sample")
    dec = methods.Decoder("sample", lambda *a, **k: None, cfg)
    with pytest.raises(TypeError, match=r"_jit\.decoder"):
        dec.core_call(params, jnp.asarray([[5, 6]], jnp.int32), jax.random.PRNGKey(0))


@pytest.mark.parametrize("name", ["dsbd_generate", "beam_search"])
def test_a_sharded_call_runs_the_decoders_own_program(bench_pair, name, forced_options):
    """``ShardedDecoder`` runs the decoder's own jitted core (the same jit object and compiler
    options as a one-device call) on placed arguments, not a jit of its own: its one compile
    per bucket is the decoder's, and its output is the one-device output."""
    from dsbd_jax.parallel import ShardedDecoder, make_mesh
    fn, cfg, params, ids, lengths, key, args = _call(bench_pair, name)
    one = fn(*args, cfg, prompt_lengths=lengths)
    sdec = ShardedDecoder(fn, cfg, make_mesh(1, 1))
    placed = sdec.place(params)
    keys = np.asarray(jax.random.key_data(jax.random.split(key, 2)))
    call = sdec.core_call(placed, ids, lengths, keys)
    assert call.via is fn.prepare(*args, cfg, prompt_lengths=lengths).via
    assert call.options == forced_options
    assert all(isinstance(x.sharding, jax.sharding.NamedSharding)
               for x in jax.tree.leaves(call.args) if hasattr(x, "sharding"))
    before, total = dsbd_jax.compile_count(name), sum(dsbd_jax.compile_count().values())
    k = None if name == "beam_search" else key
    out = sdec(placed, ids, k, prompt_lengths=lengths)
    assert sdec.compiles == 1 and dsbd_jax.compile_count(name) == before + 1
    assert sum(dsbd_jax.compile_count().values()) == total + 1     # no other decoder's
    # the program that ran is the core's own (its module is named after the core's jit)
    module = sdec.compiled(placed, ids, k, prompt_lengths=lengths).as_text().split()[1]
    assert module.rstrip(",") == f"jit_{call.via.__name__}", module
    np.testing.assert_array_equal(np.asarray(out.sequences), np.asarray(one.sequences))


def _own(name, cfg, **changes):
    """``cfg`` as the decoder's own config (:data:`configs.ACCEPTS`), with ``changes``."""
    import dataclasses
    cls = configs.ACCEPTS[name][0]
    kept = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cls) if hasattr(cfg, f.name)}
    return cls(**{**kept, **changes})


# CI: sampling (the plan's options reach a decoder through calls.py, the same for every
# decoder; DSBD's five compiles here, about 85 s, are extended)
@pytest.mark.parametrize("name", ["sample", pytest.param("dsbd_generate",
                                                          marks=pytest.mark.extended)])
def test_a_config_names_its_options_and_nothing_is_asked_of_the_host(bench_pair, name,
                                                                     forced_options):
    """A plan handed to the decoder as a value: ``config.options`` (a ``HostPlan``'s) is the
    options the call states, lowers and compiles under, instead of the host's choice (forced
    here to other options), and the host's choice is never asked (it would measure on a fresh
    host); the tokens are the host-choice call's. Under the caller's own ``jax.jit`` the
    enclosing program's options apply and the call still runs."""
    fn, cfg, params, ids, lengths, key, args = _call(bench_pair, name)
    want = fn(*args, cfg, prompt_lengths=lengths)
    named = _own(name, cfg, options="default")
    plan = host.HostPlan(dtype="float32", form="plain", options="default",
                         head_transposed=False, why="a plan made elsewhere")
    assert _own(name, cfg, options=plan.options) == named

    def asked(*a, **k):
        raise AssertionError("the host's options choice was asked")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(co, "choice", asked)
        _run_named(fn, args, params, ids, lengths, key, named, name, want, forced_options)


def _run_named(fn, args, params, ids, lengths, key, named, name, want, forced):
    call = fn.prepare(*args, named, prompt_lengths=lengths)
    assert call.options == {} != forced
    call.via.clear_cache()
    before = dsbd_jax.compile_count(name)
    assert "while" in call.lower().as_text()
    out = fn(*args, named, prompt_lengths=lengths)
    assert dsbd_jax.compile_count(name) == before + 1
    fn(*args, named, prompt_lengths=lengths)                  # same bucket: no recompile
    assert dsbd_jax.compile_count(name) == before + 1
    np.testing.assert_array_equal(np.asarray(out.sequences), np.asarray(want.sequences))
    inner = jax.jit(lambda i, l: fn(params, i, key, named, prompt_lengths=l).sequences)
    np.testing.assert_array_equal(np.asarray(inner(ids, lengths)), np.asarray(want.sequences))
    # the sharded decoder runs the same core under the same named options
    from dsbd_jax.parallel import ShardedDecoder, make_mesh
    sdec = ShardedDecoder(fn, named, make_mesh(1, 1))
    placed = sdec.place(params)
    keys = np.asarray(jax.random.key_data(jax.random.split(key, 2)))
    assert sdec.core_call(placed, ids, lengths, keys).options == {}
    got = sdec(placed, ids, key, prompt_lengths=lengths)
    np.testing.assert_array_equal(np.asarray(got.sequences), np.asarray(want.sequences))


def test_a_config_refuses_unknown_options(bench_pair):
    cfg, _ = _setup(bench_pair, "dsbd_generate")
    with pytest.raises(ValueError, match="options must be None or the name of XLA:CPU"):
        cfg.replace(options="fast")
    with pytest.raises(ValueError, match="options must be None"):
        _own("sample", _setup(bench_pair, "sample")[0], options={"xla_cpu_multi_thread_eigen": 0})
