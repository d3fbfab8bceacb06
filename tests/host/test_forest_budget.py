"""DSBD's node budget (``host.forest_budget``): the rule, the cache and its key, the CLI."""

import json

import pytest

import exact_reference as ref
from dsbd_jax.host import forms
from dsbd_jax.host import cpu_options
from dsbd_jax.host import forest_budget as fb
from dsbd_jax.models import kinds


def test_the_budget_grows_while_the_forest_is_free():
    flat = {1: 1.0, 12: 0.9, 16: 0.95, 24: 1.0, 32: 1.1, 48: 1.25, 64: 1.3}
    assert fb.pick_budget(flat) == 64
    # the first size past FREE stops the growth, even when a later one is cheaper (noise)
    assert fb.pick_budget({**flat, 32: 1.31, 48: 1.0}) == 24
    assert fb.pick_budget({**flat, 12: 1.4}) is None
    # the figures of the AMD EPYC host's bfloat16 probe: no forest is free there
    epyc = {1: 1.0, 12: 1.38, 16: 1.52, 24: 1.87, 32: 2.32, 48: 2.81, 64: 4.21}
    assert fb.pick_budget(epyc) is None
    assert fb.pick_budget(epyc, free=2.0) == 24


def test_a_small_model_is_not_measured(monkeypatch, tmp_path):
    monkeypatch.setenv("DSBD_JAX_CACHE", str(tmp_path))
    monkeypatch.setattr(fb, "measure", lambda *a, **k: pytest.fail("measured a tiny model"))
    config, _ = ref.toy_model(vocab=12)
    nodes, why = fb.node_budget(config)
    assert nodes is None and "small model" in why
    assert not cpu_options.cache_file().exists()


def test_measured_once_cached_and_keyed_by_the_flags(monkeypatch, tmp_path):
    """A model past MIN_ELEMENTS is measured (a real probe, cut to one block, two sizes),
    written with its figures, read back on the next call; the same entry never answers for a
    host whose CPU flags differ, nor for the other dtype."""
    monkeypatch.setenv("DSBD_JAX_CACHE", str(tmp_path))
    monkeypatch.setattr(forms, "MIN_ELEMENTS", 1)
    monkeypatch.setattr(fb, "NODES", (12, 16))
    fb._budget.cache_clear()
    calls = []
    real = fb.measure

    def counted(cfg, nodes=None, repeats=fb.REPEATS, weights="float"):
        calls.append(cfg.dtype if weights == "float" else f"{cfg.dtype} {weights}")
        return real(cfg, nodes=nodes, repeats=1, weights=weights)
    monkeypatch.setattr(fb, "measure", counted)
    config, _ = ref.toy_model(vocab=64)
    mid = config.replace(hidden_size=64, intermediate_size=128, num_layers=1)
    nodes, why = fb.node_budget(mid)
    assert calls == ["float32"] and "measured" in why and "12 / 16 nodes" in why
    entry = json.loads(cpu_options.cache_file().read_text())[cpu_options.host_key()][
        fb.budget_key(mid)]
    times = {int(k): v for k, v in entry["min_ms"]["passes"].items()}
    assert set(times) == {1, 12, 16} and entry["choice"] == nodes
    assert nodes == fb.pick_budget(times, nodes=(12, 16))
    fb._budget.cache_clear()
    again, why = fb.node_budget(mid)
    assert again == nodes and "cached" in why and len(calls) == 1
    key = fb.budget_key(mid)
    assert key != fb.budget_key(mid.replace(dtype="bfloat16"))
    # an int8 target is priced on its own: measured with int8 kernels, under its own entry
    fb._budget.cache_clear()
    q_nodes, why = fb.node_budget(mid, "int8")
    assert calls == ["float32", "float32 int8"] and "with int8 weights" in why
    assert fb.budget_key(mid, "int8") != key and fb.budget_key(mid, "int8") in \
        cpu_options.host_entries()
    with pytest.raises(ValueError, match="weights"):
        fb.node_budget(mid, "int4")
    monkeypatch.setattr(cpu_options, "cpu_flags", lambda: ("avx512f", "amx_tile", "amx_bf16"))
    assert key not in cpu_options.host_entries()       # another host's key: not its entry
    fb._budget.cache_clear()


def test_cli_node_budget_option(tmp_path):
    import argparse

    from dsbd_jax.cli import _settings, build_parser
    parse = lambda *a: build_parser().parse_args(["generate", "--prompt", "hi", *a])  # noqa: E731
    assert _settings("dsbd", parse(), node_budget=24)["node_budget"] is None   # off: the default
    auto = parse("--node-budget", "auto")
    assert _settings("dsbd", auto)["node_budget"] is None          # auto, not yet resolved
    assert _settings("dsbd", auto, node_budget=24)["node_budget"] == 24
    assert _settings("dsbd", parse("--node-budget", "off"), node_budget=24)["node_budget"] is None
    assert _settings("dsbd", parse("--node-budget", "40"), node_budget=24)["node_budget"] == 40
    for bad in ("0", "-3", "many"):
        with pytest.raises(argparse.ArgumentTypeError):
            from dsbd_jax.cli.options import node_budget_arg
            node_budget_arg(bad)


def test_an_int8_probe_runs_int8_kernels(monkeypatch):
    from dsbd_jax.host import pass_probe
    seen = []
    real = pass_probe.pass_call

    def recorded(cfg, params, T, slots):
        seen.append(kinds.is_int8(params))
        return real(cfg, params, T, slots)
    monkeypatch.setattr(pass_probe, "pass_call", recorded)
    config, _ = ref.toy_model(vocab=64)
    mid = config.replace(hidden_size=64, intermediate_size=128, num_layers=1)
    for weights, int8 in (("float", False), ("int8", True)):
        seen.clear()
        times = pass_probe.time_passes(mid, ("float32",), {"float32": "plain"}, rows=(1, 12),
                                       layers=1, repeats=1, weights=weights)
        assert seen == [int8, int8] and set(times["float32"]) == {1, 12}

