"""A decoder call is one checked call of one jitted program: ``decoder.prepare(...)`` returns
that call (``calls.CoreCall``) without running it, and states which program it is and which
compiler options it compiles under; running it is the public call (one compile per bucket)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dsbd_jax import (DSBDConfig, DecodeConfig, beam_sample, beam_search, dsbd_generate, sample,
                      speculative_sample, tree_speculative_sample)
from dsbd_jax.decoding import calls, common, methods
from dsbd_jax.models import cpu_options as co
from dsbd_jax.models import host


def _setup(bench_pair, name):
    _, _, target, draft = bench_pair
    kw = dict(target=target.config, max_new_tokens=4, top_k=10, top_p=0.8, eos_token_id=())
    if name == "dsbd_generate":
        cfg = DSBDConfig(draft=draft.config, gamma=2, draft_width=2, threshold=0.9, **kw)
    elif name in ("speculative_sample", "tree_speculative_sample"):
        cfg = DecodeConfig(draft=draft.config, gamma=2, **kw)
    else:
        cfg = DecodeConfig(num_beams=2, **kw)
    params = ({"target": target.params, "draft": draft.params} if cfg.draft is not None
              else target.params)
    return cfg, params


DECODERS = {"sample": sample, "beam_sample": beam_sample, "beam_search": beam_search,
            "speculative_sample": speculative_sample,
            "tree_speculative_sample": tree_speculative_sample, "dsbd_generate": dsbd_generate}


@pytest.mark.parametrize("name", sorted(DECODERS))
def test_a_call_states_its_program_and_options_and_runs_once_compiled(bench_pair, name,
                                                                      monkeypatch):
    """For one call: the program (its decoder's core), the compiler options (those the host's
    choice names for these arguments: forced here to a candidate with options), one compile for
    the prepared call and the public call of the same bucket, and the same output."""
    monkeypatch.setenv(co.ENV, "single_thread_eigen")
    co.choice.cache_clear()
    try:
        fn = DECODERS[name]
        cfg, params = _setup(bench_pair, name)
        ids, lengths = common.pad_prompts([[5, 6, 7], [8, 9]], pad_id=0, length=8)
        args = (params, ids) if name == "beam_search" else (params, ids, jax.random.PRNGKey(1))
        call = fn.prepare(*args, cfg, prompt_lengths=lengths)
        assert isinstance(call, calls.CoreCall) and call.decoder == name
        assert call.options == {"xla_cpu_multi_thread_eigen": False}
        # ... named by the host's plan for the model the call runs (its loaded form and dtype)
        plan = host.plan(cfg.target, "float32", "plain")
        assert co.options_of((call.args, call.kwargs)) == plan.options == "single_thread_eigen"
        call.via.clear_cache()   # compiled by an earlier test of this process: drop it
        before = common.compile_count(name)
        out = call()
        assert common.compile_count(name) == before + 1
        again = fn(*args, cfg, prompt_lengths=lengths)   # same bucket: no second compile
        assert common.compile_count(name) == before + 1
        np.testing.assert_array_equal(np.asarray(out.sequences), np.asarray(again.sequences))
    finally:
        co.choice.cache_clear()


def test_the_checks_run_when_the_call_is_prepared(bench_pair):
    cfg, params = _setup(bench_pair, "dsbd_generate")
    ids = jnp.asarray([[5, 6, 7]], jnp.int32)
    with pytest.raises(ValueError):
        dsbd_generate.prepare(params, ids, jax.random.PRNGKey(0), cfg,
                              prompt_lengths=np.array([9]))


def test_a_decoder_without_a_prepared_call_is_refused(bench_pair):
    cfg, params = _setup(bench_pair, "sample")
    dec = methods.Decoder("sample", lambda *a, **k: None, cfg)
    with pytest.raises(TypeError, match="prepared_by"):
        dec.core_call(params, jnp.asarray([[5, 6]], jnp.int32), jax.random.PRNGKey(0))
