"""Per-host XLA:CPU compiler options (``models.cpu_options``): the choice (forced, cached,
measured), its one-line error, and that no candidate changes a single output bit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dsbd_jax.decoding import methods
from dsbd_jax.models import cpu_options as co
from dsbd_jax.models import llama
from dsbd_jax.models.config import ModelConfig


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A clean choice: own cache dir, no forced option, the process's choice forgotten."""
    monkeypatch.setenv("DSBD_JAX_CACHE", str(tmp_path))
    monkeypatch.delenv(co.ENV, raising=False)
    co.choice.cache_clear()
    yield tmp_path
    co.choice.cache_clear()


def test_forced_choice_and_bad_value(fresh, monkeypatch):
    monkeypatch.setenv(co.ENV, "single_thread_eigen")
    assert co.choice() == "single_thread_eigen"
    assert co.compiler_options() == {"xla_cpu_multi_thread_eigen": False}
    co.choice.cache_clear()
    monkeypatch.setenv(co.ENV, "fastest")
    with pytest.raises(ValueError, match="DSBD_JAX_CPU_OPTIONS must be 'auto' or one of"):
        co.choice()


def test_auto_measures_once_per_host_then_reads_the_cache(fresh, monkeypatch):
    monkeypatch.setattr(co, "PROBE_IN", 64)
    monkeypatch.setattr(co, "PROBE_OUT", 128)
    monkeypatch.setattr(co, "PROBE_REPEATS", 2)
    name = co.choice()
    assert name in co.CANDIDATES
    import json
    cached = json.loads((fresh / "cpu_options.json").read_text())
    assert cached[co.host_key()]["choice"] == name
    assert set(cached[co.host_key()]["min_ms"]) == set(co.CANDIDATES)
    co.choice.cache_clear()

    def no_measuring(*a, **k):
        raise AssertionError("measured again although the host's choice is cached")
    monkeypatch.setattr(co, "measure", no_measuring)
    assert co.choice() == name
    assert co.cpu_model() in co.host_key()


def test_pick_rule():
    """A candidate replaces the default only if faster in total AND never slower at any M
    (a host where single-threading wins at M=4 but loses at M=16 keeps the default)."""
    d = {1: 1.0, 4: 2.0, 16: 4.0}
    assert co.pick({"default": d, "single_thread_eigen": {1: 0.9, 4: 1.5, 16: 3.5}}) == \
        "single_thread_eigen"
    assert co.pick({"default": d, "single_thread_eigen": {1: 0.5, 4: 1.0, 16: 5.0}}) == "default"
    assert co.pick({"default": d, "single_thread_eigen": {1: 1.0, 4: 2.0, 16: 3.95}}) == "default"


def _with_options(tj, opts):
    """The same function and jit arguments as the ``tuned_jit`` ``tj``, with ``opts``."""
    return jax.jit(tj._fun, compiler_options=dict(opts), **tj._jit_kwargs)


def test_tuned_jit_builds_one_jit_on_first_use(fresh, monkeypatch):
    monkeypatch.setenv(co.ENV, "default")
    calls = []
    tj = co.tuned_jit(lambda x: calls.append(1) or x * 2)
    assert "jitted" not in tj.__dict__  # nothing built (nor measured) at definition
    for _ in range(3):
        np.testing.assert_array_equal(tj(jnp.arange(3.0)), [0.0, 2.0, 4.0])
    assert len(calls) == 1  # traced once: no recompilation
    assert tj.lower(jnp.arange(3.0)) is not None


def test_forward_bit_identical_under_every_candidate():
    """Few-row products at a width where XLA:CPU uses Eigen's thread pool: same bits."""
    cfg = ModelConfig(vocab_size=512, hidden_size=256, intermediate_size=1024, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=64, max_position_embeddings=256)
    for layout in ("stacked", "per_layer"):
        params = llama.init_params(cfg, jax.random.PRNGKey(0), layout)
        tokens = jax.random.randint(jax.random.PRNGKey(1), (16, 1), 0, cfg.vocab_size)
        for M in (1, 4, 12, 16):
            outs = [np.asarray(_with_options(llama._logits, o)(cfg, params, tokens[:M]))
                    for o in co.CANDIDATES.values()]
            for other in outs[1:]:
                np.testing.assert_array_equal(outs[0], other)


@pytest.mark.parametrize("method,settings", [
    ("beam", dict(num_beams=4)),
    ("dsbd", dict(gamma=2, draft_width=4, threshold=0.7, min_width=2, max_width=4)),
])
def test_decoders_bit_identical_under_every_candidate(bench_pair, method, settings):
    _, _, target, draft = bench_pair
    dec = methods.build(method, target.config, draft.config, max_new_tokens=8, top_k=10,
                        top_p=0.8, **settings)
    params = methods.model_params(dec, target.params, draft.params)
    ids = jnp.asarray([[1, 5, 9, 3], [2, 7, 4, 0]], jnp.int32)
    call = dec.core_call(params, ids, jax.random.PRNGKey(3), jnp.asarray([4, 3], jnp.int32))
    tj = call.core
    assert isinstance(tj, co.tuned_jit)  # every decoder core is a tuned_jit
    outs = [jax.tree.map(np.asarray, _with_options(tj, o)(*call.args, **call.kwargs))
            for o in co.CANDIDATES.values()]
    for other in outs[1:]:
        jax.tree.map(np.testing.assert_array_equal, outs[0], other)
