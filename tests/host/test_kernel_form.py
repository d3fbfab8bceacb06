"""Compiler options that follow the kernels' form, and the per-host choice of form:
``cpu_options.choice(form)`` is measured per form, ``tuned_jit`` compiles a call whose
arguments hold transposed kernels under the transposed form's options, ``forms.choose_form``
picks plain or transposed kernels per host and shape (forced, cached, measured), and
``load_model(kernel_blocks="measured")`` applies it. Run with ``PYTHONPATH=tests``."""

from __future__ import annotations

import dataclasses
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import exact_reference as ref
from dsbd_jax.host import cpu_options as co
from dsbd_jax.models import kinds
from dsbd_jax.host import forms
from dsbd_jax.models import llama
from dsbd_jax.models.weights import (RowBlocks, Rows, form_of, has_row_head, kernel_dtype,
                                     program_kind)


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """Own cache dir, nothing forced, every per-process choice forgotten."""
    monkeypatch.setenv("DSBD_JAX_CACHE", str(tmp_path))
    for env in (co.ENV, forms.FORM_ENV):
        monkeypatch.delenv(env, raising=False)
    choice, choose = co.choice, forms._choose_form  # (a test may replace co.choice)
    choice.cache_clear()
    choose.cache_clear()
    yield tmp_path
    choice.cache_clear()
    choose.cache_clear()


def test_form_of_finds_a_transposed_kernel_anywhere():
    config, params = ref.kernel_model()
    assert form_of(params) == "plain"
    t = kinds.transpose_params(params, {"down_proj": 8})
    assert form_of(t) == "transposed"
    # among a call's arguments: nested in dicts, tuples, lists
    assert form_of(((jnp.ones(2),), {"pair": [{"x": 1}, {"target": t}]})) == "transposed"
    assert form_of(((jnp.ones(2), params), {})) == "plain"


def test_program_kind_reads_form_dtype_and_head_in_one_walk():
    def spec(dtype, *shape):
        return jax.ShapeDtypeStruct(shape or (4, 4), dtype)

    f32, bf16 = jnp.float32, jnp.bfloat16
    layer = {"mlp": {"down_proj": {"kernel": spec(f32)}}}
    untied = {"embed": {"embedding": spec(f32)}, "layers_0": layer,
              "lm_head": {"kernel": spec(f32)}}
    tied = {"embed": {"embedding": spec(f32)}, "layers_0": layer}
    cases = {
        "untied float32": (untied, ("plain", "float32", False)),
        "tied": (tied, ("plain", "float32", True)),
        "truncated tied": ({**tied, "vocab_head": {"embedding": spec(f32)}},
                           ("plain", "float32", True)),
        "truncated untied": ({**untied, "vocab_head": {"kernel": spec(f32)}},
                             ("plain", "float32", False)),
        "head stored as rows": ({**untied, "lm_head": {"kernel": Rows(spec(bf16, 4, 4))},
                                 "layers_0": {"mlp": {"down_proj": {
                                     "kernel": RowBlocks(spec(bf16, 2, 2, 4))}}}},
                                ("transposed", "bfloat16", True)),
        "bfloat16 layer": ({**untied, "layers_0": {"mlp": {"down_proj": {"kernel": spec(bf16)}}}},
                           ("plain", "bfloat16", False)),
        # a call's arguments: a plain float32 draft beside a tied bfloat16 target, in a tuple
        "a call's arguments": (
            ((jnp.ones(2), untied),
             {"target": [{**tied, "layers_0": {"mlp": {"up": {"kernel": RowBlocks(spec(bf16, 1, 4, 4))}}}}]}),
            ("transposed", "bfloat16", True)),
    }
    for name, (tree, want) in cases.items():
        assert program_kind(tree) == want, name
        assert (form_of(tree), kernel_dtype(tree), has_row_head(tree)) == want, name


def test_each_form_is_measured_and_cached_apart(fresh, monkeypatch):
    monkeypatch.setattr(co, "PROBE_IN", 64)
    monkeypatch.setattr(co, "PROBE_OUT", 128)
    monkeypatch.setattr(co, "PROBE_REPEATS", 2)
    names = {f: co.choice(f) for f in co.FORMS}
    cached = json.loads((fresh / "host_plan.json").read_text())[co.host_key()]
    keys = {f: co.options_key(f) for f in co.FORMS}
    assert keys["plain"] != keys["transposed"] and "transposed kernels" in keys["transposed"]
    for f in co.FORMS:
        assert cached[keys[f]]["choice"] == names[f]
        assert set(cached[keys[f]]["min_ms"]) == set(co.candidates())
    with pytest.raises(ValueError, match="kernel form must be one of"):
        co.choice("sideways")
    # a forced name holds for both forms
    co.choice.cache_clear()
    monkeypatch.setenv(co.ENV, "single_thread_eigen")
    assert {co.choice(f) for f in co.FORMS} == {"single_thread_eigen"}


def test_measure_times_the_transposed_product(monkeypatch):
    times = co.measure(rows=(1, 3), din=32, dout=64, layers=2, repeats=1, form="transposed")
    assert set(times) == set(co.candidates())
    assert all(set(t) == {1, 3} and all(0 < v < 10 for v in t.values()) for t in times.values())


def test_tuned_jit_compiles_each_form_under_its_own_options(fresh, monkeypatch):
    """A call with transposed kernels runs the program compiled with the transposed form's
    options, a call with plain kernels the plain form's; both give the same numbers (to float
    rounding), and a second call of either form compiles nothing."""
    if "eigen_dot" not in co.candidates():
        pytest.skip("this XLA rejects eigen_dot's options")
    choices = {"plain": "eigen_dot", "transposed": "default"}
    monkeypatch.setattr(co, "choice", lambda form="plain": choices[form])
    config, params = ref.kernel_model()
    tparams = kinds.transpose_params(params, kinds.transposed_widths(config))
    traces = []

    def logits(p, tokens):
        traces.append(form_of(p))
        return llama._logits_fn(config, p, tokens)
    tj = co.tuned_jit(logits)
    tokens = jnp.asarray([[1, 2, 3], [4, 5, 6]], jnp.int32)
    a = np.asarray(tj(params, tokens))
    b = np.asarray(tj(tparams, tokens))
    np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)
    assert set(tj._jits) == {"eigen_dot", "default"} and traces == ["plain", "transposed"]
    tj(params, tokens), tj(tparams, tokens)
    assert traces == ["plain", "transposed"]  # no retrace, no recompilation
    # the programs differ where the options do: YNNPACK fusions only without eigen_dot
    hlo = {f: tj.lower(p, tokens).compile().as_text() for f, p in
           (("plain", params), ("transposed", tparams))}
    assert "__ynn_fusion" not in hlo["plain"]
    # both forms choosing the same options share one jit object
    choices["transposed"] = "eigen_dot"
    tj2 = co.tuned_jit(logits)
    tj2(params, tokens), tj2(tparams, tokens)
    assert list(tj2._jits) == ["eigen_dot"]


def test_pick_form_rule():
    base = {1: 1.0, 4: 2.0, 16: 4.0}
    assert forms.pick_form({"plain": base, "transposed": {1: 0.8, 4: 1.5, 16: 2.6}}) == \
        "transposed"
    # faster in total, but slower at one M: plain stays
    assert forms.pick_form({"plain": base, "transposed": {1: 1.2, 4: 1.0, 16: 2.0}}) == "plain"
    # not GAIN faster in total
    assert forms.pick_form({"plain": base, "transposed": {1: 0.95, 4: 1.9, 16: 3.8}}) == "plain"
    # from the transposed prior the same rule runs the other way: two forms within the margins
    # keep whichever is the prior, so a measurement that wobbles between runs cannot flip it
    close = {"plain": base, "transposed": {1: 0.95, 4: 1.9, 16: 3.8}}
    assert forms.pick_form(close, prior="transposed") == "transposed"
    assert forms.pick_form({"plain": {1: 0.8, 4: 1.5, 16: 2.6}, "transposed": base},
                             prior="transposed") == "plain"
    assert forms.pick_form({"plain": {1: 1.2, 4: 1.0, 16: 2.0}, "transposed": base},
                             prior="transposed") == "transposed"


def test_prior_form_is_transposed_for_16_bit_kernels():
    assert forms.prior_form("bfloat16") == forms.prior_form(jnp.float16) == "transposed"
    assert forms.prior_form("float32") == "plain"
    # the prior is part of the cached entry: a choice made under another rule is not reused
    assert forms.form_key(16, 32, "bfloat16").endswith("| prior transposed")
    assert forms.form_key(16, 32, "float32").endswith("| prior plain")


def test_choose_form_forced_small_cached_measured(fresh, monkeypatch):
    config, _ = ref.kernel_model()
    assert forms.choose_form(config) == "plain"  # tiny shapes: never measured, never transposed
    monkeypatch.setenv(forms.FORM_ENV, "transposed")
    assert forms.choose_form(config) == "transposed"
    monkeypatch.setenv(forms.FORM_ENV, "diagonal")
    with pytest.raises(ValueError, match="DSBD_JAX_KERNEL_FORM must be"):
        forms.choose_form(config)
    monkeypatch.delenv(forms.FORM_ENV)
    # a shape above MIN_ELEMENTS is measured once, then read from the cache
    monkeypatch.setattr(forms, "MIN_ELEMENTS", 1)
    forms._choose_form.cache_clear()  # (the tiny shape's "plain" above is remembered)
    # (forms imported the name: patched there too, or the options are measured, ~15 s a form)
    monkeypatch.setattr(co, "choice", lambda form="plain": "default")
    monkeypatch.setattr(forms, "choice", co.choice)
    calls = []

    def fake_measure(din, dout, dtype):
        calls.append((din, dout, dtype))
        return {"plain": {1: 2.0, 4: 3.0, 16: 5.0}, "transposed": {1: 1.0, 4: 2.0, 16: 3.0}}
    monkeypatch.setattr(forms, "measure_forms", fake_measure)
    assert forms.choose_form(config) == "transposed"
    assert calls == [(16, 32, "float32")]
    cached = co.host_entries()
    assert cached[forms.form_key(16, 32, "float32")]["choice"] == "transposed"
    forms._choose_form.cache_clear()
    assert forms.choose_form(config) == "transposed" and len(calls) == 1


def test_choose_form_starts_from_the_dtypes_prior(fresh, monkeypatch):
    """Measured forms within the margins: a float32 model keeps plain kernels, a bfloat16 one
    transposed kernels, each cached under its own entry."""
    config, _ = ref.kernel_model()
    monkeypatch.setattr(forms, "MIN_ELEMENTS", 1)
    forms._choose_form.cache_clear()
    # (forms imported the name: patched there too, or the options are measured, ~15 s a form)
    monkeypatch.setattr(co, "choice", lambda form="plain": "default")
    monkeypatch.setattr(forms, "choice", co.choice)
    monkeypatch.setattr(forms, "measure_forms", lambda din, dout, dtype: {
        "plain": {1: 1.0, 4: 2.0, 16: 4.0}, "transposed": {1: 0.95, 4: 1.9, 16: 3.8}})
    try:
        assert forms.choose_form(config, "float32") == "plain"
        assert forms.choose_form(config, "bfloat16") == "transposed"
        cached = co.host_entries()
        assert cached[forms.form_key(16, 32, "bfloat16")]["choice"] == "transposed"
        assert cached[forms.form_key(16, 32, "float32")]["choice"] == "plain"
    finally:
        forms._choose_form.cache_clear()


def test_measure_forms_runs_both_products():
    times = forms.measure_forms(32, 64, rows=(1, 3), layers=2, repeats=1)
    assert set(times) == {"plain", "transposed"}
    assert all(set(t) == {1, 3} and all(0 < v < 10 for v in t.values()) for t in times.values())


def test_load_model_measured(bench_pair, fresh, monkeypatch):
    from dsbd_jax.loading.load import load_model
    monkeypatch.setenv(co.ENV, "default")   # the options' own measurement is not this test's
    t = str(bench_pair[0])
    plain = load_model(t, progress=False, kernel_blocks="measured")  # tiny: plain
    assert plain.info["kernel_transposed"] == {} and form_of(plain.params) == "plain"
    monkeypatch.setenv(forms.FORM_ENV, "transposed")
    tr = load_model(t, progress=False, kernel_blocks="measured")
    assert tr.info["kernel_transposed"] == kinds.transposed_widths(tr.config)
    assert form_of(tr.params) == "transposed"
    np.testing.assert_array_equal(
        np.asarray(kinds.unblock_params(tr.params)["layers_0"]["mlp"]["up_proj"]["kernel"]),
        np.asarray(plain.params["layers_0"]["mlp"]["up_proj"]["kernel"]))


def test_load_model_applies_one_plan_passed_as_a_value(bench_pair, fresh):
    """``load_model`` works out one :class:`HostPlan` (the dtype and the form) and records it;
    a plan passed in is applied as it is, with nothing measured; a call that contradicts it
    fails before loading."""
    from dsbd_jax.host import plan as host
    from dsbd_jax.loading.load import load_model, read_config
    from dsbd_jax.models.weights import Rows
    t = str(bench_pair[0])
    default = load_model(t, progress=False)
    assert default.info["plan"] == dataclasses.asdict(host.plan(read_config(t)))
    assert default.info["plan"]["form"] == "plain"     # a tiny model: not measured
    given = host.HostPlan("bfloat16", "transposed", "default", True, "given by the test")
    m = load_model(t, progress=False, plan=given)
    assert m.info["plan"] == dataclasses.asdict(given)
    assert (m.info["dtype"], m.info["dtype_why"]) == ("bfloat16", "given by the test")
    assert m.info["kernel_transposed"] == kinds.transposed_widths(m.config)
    assert program_kind(m.params)[:2] == ("transposed", "bfloat16")
    assert isinstance(m.params["lm_head"]["kernel"], Rows) == m.info["head_transposed"] is True
    with pytest.raises(ValueError, match="contradicts the plan's bfloat16"):
        load_model(t, "float32", progress=False, plan=given)
    with pytest.raises(ValueError, match="the plan decides the kernel form"):
        load_model(t, progress=False, plan=given, kernel_blocks=None)
    with pytest.raises(TypeError, match="HostPlan"):
        load_model(t, progress=False, plan={"dtype": "float32"})
    # a form asked for by kernel_blocks: no plan
    assert load_model(t, progress=False, kernel_blocks=None).info["plan"] is None
