"""benchmarks/accelerator.py in its ``--small`` mode on the CPU (so the GPU script never rots),
and the accelerator hygiene it relies on: no host callback in a decode loop unless asked for."""

import pytest
import json

import jax
import jax.numpy as jnp

from dsbd_jax.decoding import methods
from dsbd_jax.models.config import ModelConfig
from bench_setup import load_bench


def load_script():
    return load_bench("accelerator")


@pytest.mark.extended   # a benchmark script's --small run (DSBD_TEST_EXTENDED=1)
def test_small_run_writes_every_section(tmp_path, monkeypatch):
    monkeypatch.setenv("DSBD_JAX_CPU_OPTIONS", "default")  # no host measurement in CI
    from dsbd_jax.host import cpu_options
    cpu_options.choice.cache_clear()
    bench = load_script()
    out = tmp_path / "acc.json"
    names = ["sample", "beam_sample_W4", "dsbd_g2_WS4_t0.7_Wmin2"]
    bench.main(["--small", "--methods", *names, "--head-rows", "256", "--out", str(out)])
    cpu_options.choice.cache_clear()
    data = json.loads(out.read_text())
    assert data["machine"]["cpu_model"] and "xla_flags" in data["machine"]
    assert data["machine"]["cpu_options"] == "default"
    runs = data["runs"]
    assert [(r["dtype"], r["layout"]) for r in runs] == [("bfloat16", "per_layer"),
                                                         ("float32", "stacked")]
    assert not data["skipped"]
    first = runs[0]
    assert set(first["param_bytes"]) == {"target", "draft", "head"} and first["head_rows"] == 256
    # target, draft and the head, one slot size
    # + the target's forests of the node budget's curve
    assert len(first["forward"]) == 3 * len(bench.FORWARD_SHAPES) + len(bench.BUDGET_FORESTS)
    assert set(first["forest_curve"]) == {"12", "16", "24", "32", "48", "64"}
    assert first["node_budget"] == bench.forest_budget.pick_budget(
        {1: 1.0, **{int(k): v for k, v in first["forest_curve"].items()}})
    assert set(first["head_vs_target"]) == {"draft", "head"}
    assert all(v > 0 for v in first["head_vs_target"].values())
    assert all(v["ms"] > 0 and v["compile_s"] > 0 for v in first["forward"].values())
    costs = first["decoders"]["1"]
    assert set(costs) == set(names) | {"dsbd_g2_WS4_t0.7_Wmin2_head"}  # + DSBD with the head
    for c in costs.values():
        assert c["iterations"] >= 1 and c["kv_cache_bytes"] > 0 and c["run_s"] > 0
        assert c["forward_ms_per_iteration"] > 0
        # a loop cost is (run - prefill) / iterations: positive, or None (never 0 or negative)
        # where the difference is under the timer's resolution on a busy host
        assert c["ms_per_iteration"] is None or c["ms_per_iteration"] > 0
        assert (c["ms_per_iteration"] is None) == (c["run_s"] <= c["prefill_s"])
    measured = [m for m, c in costs.items() if c["ms_per_iteration"]]
    assert measured  # 32 new tokens outweigh the noise; all three below it would be a bug
    # dsbd runs fewer iterations than one-token decoders for the same budget of new tokens
    assert costs["dsbd_g2_WS4_t0.7_Wmin2"]["iterations"] <= costs["sample"]["iterations"]
    proj = first["projection"]
    assert proj["note"] == "PROJECTION, not measured"
    row = proj["batch 1"]
    assert set(row) == set(measured) & set(proj["tokens_per_iteration"])
    if "beam_sample_W4" in row:
        assert row["beam_sample_W4"]["projected_ratio_to_beam_W4"] == 1.0
    for m in row:
        expect = 1e3 * proj["tokens_per_iteration"][m] / costs[m]["ms_per_iteration"]
        assert abs(row[m]["projected_tokens_per_s"] - expect) < 1e-6 * expect
    assert "decoders" not in runs[1]  # decoders once per pair, in the first layout


@pytest.mark.extended   # a benchmark script's --small run (DSBD_TEST_EXTENDED=1)
def test_small_run_of_the_variants(tmp_path, monkeypatch):
    """``--projections separate fused --draft-weights int8``: the first layout once per
    projections choice, each with its decoders, the draft's kernels int8 in both."""
    monkeypatch.setenv("DSBD_JAX_CPU_OPTIONS", "default")
    from dsbd_jax.host import cpu_options
    cpu_options.choice.cache_clear()
    out = tmp_path / "acc.json"
    load_script().main(["--small", "--dtypes", "bfloat16", "--layouts", "per_layer",
                        "--methods", "dsbd_g2_WS4_t0.7_Wmin2", "--head-rows", "0",
                        "--projections", "separate", "fused", "--draft-weights", "int8",
                        "--out", str(out)])
    cpu_options.choice.cache_clear()
    runs = json.loads(out.read_text())["runs"]
    assert [(r["projections"], r["draft_weights"]) for r in runs] == [("separate", "int8"),
                                                                      ("fused", "int8")]
    for r in runs:
        assert r["decoders"]["1"]["dsbd_g2_WS4_t0.7_Wmin2"]["iterations"] >= 1


def test_no_host_callback_in_the_loop_unless_progress():
    """The benchmark's decoders (``progress=False``) trace no host callback; with ``progress``
    one is there, so this check can fail."""
    cfg = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                      num_heads=2, num_kv_heads=1, head_dim=16, max_position_embeddings=64)
    from dsbd_jax.models import llama
    params = llama.init_params(cfg, jax.random.PRNGKey(0))
    ids = jnp.ones((1, 4), jnp.int32)
    texts = {}
    for progress in (False, True):
        dec = methods.build("beam", cfg, num_beams=2, max_new_tokens=3, progress=progress)
        texts[progress] = dec.core_call(params, ids, jax.random.PRNGKey(0)).lower().as_text()
    assert "callback" not in texts[False]
    assert "callback" in texts[True]
    assert "f64" not in texts[False]  # no float64 in the program


def test_head_projection_reads_the_trained_heads_tokens_per_iteration(tmp_path):
    """The head's decoders are projected with what ``draft_terms.py --head`` measured for the
    trained head on the CPU (its batch-1 runs), under the accelerator's method names."""
    bench = load_script()
    terms = tmp_path / "terms.json"
    terms.write_text(json.dumps({"batches": {"b1": {"drafts": {"head": {
        "speculative_g4": {"tokens_per_iteration": 3.0},
        "dsbd_beamW4_point": {"tokens_per_iteration": 2.5}}}}}}))
    assert bench.head_tokens_per_iteration(terms) == {"speculative_g4_head": 3.0,
                                                      "dsbd_g2_WS4_t0.7_Wmin2_head": 2.5}
    assert bench.head_tokens_per_iteration(tmp_path / "missing.json") == {}
    speed = tmp_path / "speed.json"
    speed.write_text(json.dumps({"rows": [
        {"impl": "dsbd_jax", "method": "beam_sample_W4", "tokens_per_target_call": 1.0}]}))
    costs = {"1": {"beam_sample_W4": {"ms_per_iteration": 10.0},
                   "dsbd_g2_WS4_t0.7_Wmin2_head": {"ms_per_iteration": 12.5}}}
    proj = bench.projection(costs, str(speed), str(terms))
    row = proj["batch 1"]["dsbd_g2_WS4_t0.7_Wmin2_head"]
    assert row["projected_tokens_per_s"] == 200.0          # 2.5 tokens / 12.5 ms
    assert row["projected_ratio_to_beam_W4"] == 2.0        # beam: 1 token / 10 ms
