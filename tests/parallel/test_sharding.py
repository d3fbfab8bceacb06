"""Sharded decoding (dsbd_jax.parallel) on 8 virtual CPU devices.

The decoders run in ONE subprocess (``tests/parallel/sharding_worker.py``) started with
``XLA_FLAGS=--xla_force_host_platform_device_count=8``, so this process and the rest of the suite
keep one device. The worker compares every sharded decoder with its single-device run on tiny
HF-format models (batch 3, which the data axes 2 and 8 do not divide; 2 KV heads, which the model
axes 4 and 8 do not divide), reads each compiled program and writes a JSON report; the tests
below assert on it. The rule-only tests run here, on one device.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
# stats that sum over the prompts of the batch: with uneven_batch="pad" they include the copies
SUMMED_OVER_PROMPTS = {"layer_verified", "layer_passed", "layer_candidates", "layer_accepted",
                       "layer_width_sum", "layer_acceptance_rate", "candidate_acceptance_rate",
                       "mean_layer_width", "mean_accepted_width", "acceptance_rate",
                       "mean_accepted"}


@pytest.fixture(scope="module")
def report(tmp_path_factory, torch):
    tmp = tmp_path_factory.mktemp("sharding")
    out = tmp / "report.json"
    # the caller's flags kept; XLA's backend optimisation level 0: the same optimised programs
    # (what the worker reads) in less compile time, which is most of the worker's
    flags = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
             " --xla_backend_optimization_level=0")
    env = dict(os.environ, XLA_FLAGS=flags.strip(),
               JAX_PLATFORMS="cpu", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, str(HERE / "sharding_worker.py"), str(tmp / "tiny"),
                           str(out)], env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    return json.loads(out.read_text())


def _cases(report, **match):
    return [c for c in report["cases"] if all(c[k] == v for k, v in match.items())]


def test_every_decoder_matches_one_device(report):
    methods = {c["method"] for c in report["cases"]}
    assert methods == {"sample", "beam", "beam_search", "spec", "tree", "dsbd"}
    assert {tuple(c["mesh"]) for c in _cases(report, method="dsbd")} == {(8, 1), (2, 4), (1, 2)}
    # both weight layouts run sharded (per-layer is the CPU's and GPU's default, stacked TPU's)
    assert {c["layout"] for c in _cases(report, method="dsbd", mesh=[2, 4])} == {"stacked",
                                                                                 "per_layer"}
    for c in report["cases"]:
        padded = c["uneven"] == "pad" and 3 % c["mesh"][0] != 0
        allowed = SUMMED_OVER_PROMPTS if padded else set()
        names = {m.split("'")[1] if "stats" in m else m for m in c["mismatches"]}
        assert names <= allowed, (c["method"], c["mesh"], c["mismatches"])


def test_replicated_uneven_batch_is_identical(report):
    (c,) = _cases(report, method="sample", uneven="replicate")
    assert c["mismatches"] == []


def test_one_compile_per_bucket(report):
    for c in report["cases"]:
        assert c["compiles"] == 1, (c["method"], c["mesh"])


def test_no_weight_or_cache_gathered_in_the_decode_loop(report):
    for c in report["cases"]:
        assert c["decode_loops"] >= 1, c["method"]
        assert c["forbidden"] == [], (c["method"], c["mesh"], c["forbidden"])
        ops = {o["op"] for o in c["collectives"]}
        if c["mesh"][1] == 1:   # pure data parallel: nothing is all-reduced but flags and scalars
            for o in c["collectives"]:
                if o["op"] == "all-reduce":
                    assert o["bytes"] <= 64, o
        assert ops <= {"all-reduce", "all-gather", "collective-permute", "all-to-all",
                       "reduce-scatter"}


def test_kv_cache_layout_in_the_loop(report):
    """The decode loop carries every KV cache with its batch split over data and its heads over
    model, as the rules say (per-device shapes read from the compiled while loop)."""
    for c in report["cases"]:
        assert c["cache_state_shapes"], c["method"]
        for L, b, S, k, D in c["cache_state_shapes"]:
            assert (b, k) == (c["expected_cache_batch"], c["expected_cache_heads"]), c


def test_indivisible_heads_are_repeated_or_replicated(report):
    for c in _cases(report, method="beam", mesh=[2, 4]):     # both weight layouts
        assert c["kv_repeat"] == {"target": 2}
        assert any("repeated 2x" in n for n in c["notes"])
    (c,) = _cases(report, method="sample", mesh=[1, 8])
    assert c["kv_repeat"] == {"target": 1}
    assert any("num_heads = 4 does not divide the model axis (8)" in n for n in c["notes"])
    assert any("vocab_size = 260" in n for n in c["notes"])
    assert "num_kv_heads = 2 does not divide the model axis (8)" in report["strict_error"]


def test_per_layer_weight_layout(report):
    for r in report["per_layer"]:
        assert r["matches_stacked"] and r["values_kept"], r
        specs = r["specs"]
        assert specs["layers_1/mlp/down_proj/kernel"] == "P('model', None)"
        assert specs["layers_0/attn/q_proj/kernel"] == "P(None, 'model')"


def test_an_int8_draft_stays_int8_on_the_mesh(report):
    """DSBD with an int8 draft on a (2, 4) mesh gives its one-device output; the draft's kernels
    stay int8 there, split like the plain kernels ([in, out] (None, model) -> codes [out, in]
    (model, None), scales (model,)), the repeated KV heads repeated in codes and scales."""
    r = report["int8_draft"]
    # batch 3 padded to 4 over data=2: the stats summed over the prompts count the copy
    names = {m.split("'")[1] if "stats" in m else m for m in r["mismatches"]}
    assert names <= SUMMED_OVER_PROMPTS, r
    assert r["kind"] == "Int8" and r["int8_leaves"] >= 8, r
    assert r["up_codes_spec"] == "P('model', None)", r
    assert r["up_scales_spec"] == "P('model',)", r
    kv = r["draft_kv_heads"] * r["head_dim"]            # after any repetition
    assert r["k_codes_shape"][0] == kv and r["k_scales_shape"] == [kv], r


def test_cli_mesh(report):
    assert report["cli"]["code"] == 0, report["cli"]["out"]
    out = report["cli"]["out"]
    assert "mesh data=2,model=4 over 8 cpu devices" in out and "repeated 2x" in out
    assert out.count("--- prompt") == 3 and out.count("\n    best beam ") == 3


# ---------------------------------------------------------------------------------------------
# rules on one device (no subprocess)

def test_cli_mesh_needs_the_devices(capsys):
    from dsbd_jax.cli import main
    code = main(["generate", "--prompt", "x", "--mesh", "data=2,model=4"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("dsbd: error: --mesh:") and "needs 8 devices" in err
    code = main(["generate", "--prompt", "x", "--mesh", "tensor=2"])
    assert code == 2 and "data=2,model=4" in capsys.readouterr().err

def test_parse_mesh():
    from dsbd_jax.parallel import parse_mesh
    assert parse_mesh("data=2,model=4") == {"data": 2, "model": 4}
    assert parse_mesh("model=2") == {"data": None, "model": 2}
    for bad in ("data=0", "tensor=2", "data=2,data=2", "2x4"):
        with pytest.raises(ValueError, match="mesh"):
            parse_mesh(bad)


def test_logical_axes_both_layouts():
    from dsbd_jax.parallel import logical_axes
    assert logical_axes(("layers", "attn", "q_proj", "kernel"), 3) == ("layers", "embed", "q_heads")
    assert logical_axes(("layers_3", "attn", "q_proj", "kernel"), 2) == ("embed", "q_heads")
    assert logical_axes(("layers_0", "mlp", "down_proj", "kernel"), 2) == ("mlp", "embed")
    assert logical_axes(("embed", "embedding"), 2) == ("vocab", "embed")
    with pytest.raises(ValueError, match="no sharding rule for parameter layers/mlp/extra"):
        logical_axes(("layers", "mlp", "extra", "kernel"), 3)
    with pytest.raises(ValueError, match="rank 2"):
        logical_axes(("layers", "attn", "q_proj", "kernel"), 2)


def test_expand_kv_heads_is_the_same_model():
    """Repeating KV heads (what the model axis needs when it does not divide them) computes the
    same logits."""
    import jax
    import jax.numpy as jnp
    from dsbd_jax import ModelConfig, init_params, logits
    from dsbd_jax.parallel import expand_kv_heads
    cfg = ModelConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_layers=2,
                      num_heads=4, num_kv_heads=2, head_dim=8, attention_bias=True)
    ids = jnp.arange(10)[None] % 32
    for layout in ("stacked", "per_layer"):
        params = init_params(cfg, jax.random.key(0), layout)
        big = expand_kv_heads(params, cfg, 2)
        k = big["layers"]["attn"] if layout == "stacked" else big["layers_1"]["attn"]
        assert k["k_proj"]["kernel"].shape == ((2, 32, 32) if layout == "stacked" else (32, 32))
        np.testing.assert_allclose(logits(cfg.replace(num_kv_heads=4), big, ids),
                                   logits(cfg, params, ids), rtol=1e-5, atol=1e-5)


def test_one_device_mesh_runs(toy):
    """A (1, 1) mesh (what the notebook uses on one device) gives the single-device result."""
    import jax
    from dsbd_jax import SampleConfig, sample
    from dsbd_jax.parallel import ShardedDecoder, make_mesh
    config, params, _ = toy
    cfg = SampleConfig(target=config, max_new_tokens=4, eos_token_id=())
    ids = np.array([[1, 2, 3], [3, 2, 1]], np.int32)
    dec = ShardedDecoder(sample, cfg, make_mesh(1, 1))
    out = dec(dec.place(params), ids, jax.random.key(3))
    ref = sample(params, ids, jax.random.key(3), cfg)
    np.testing.assert_array_equal(np.asarray(out.sequences), np.asarray(ref.sequences))
    with pytest.raises(ValueError, match="needs 2 devices"):
        make_mesh(2, 1)


@pytest.mark.extended   # a benchmark script's --small run (DSBD_TEST_EXTENDED=1)
def test_bench_harness_on_a_mesh(tmp_path, torch):
    """``dsbd bench --mesh``: the harness runs every method through a ShardedDecoder (a (1, 1)
    mesh here, on one device) and records the mesh in its header."""
    from dsbd_jax.eval.plan import load_config
    from dsbd_jax.eval.records import read_records
    from dsbd_jax.eval.run import run_bench
    from dsbd_jax.parallel import make_mesh
    from dsbd_jax.testing import make_tiny_pair
    from bench_setup import write_bench_config, write_gsm
    t, d = make_tiny_pair(tmp_path / "tiny", noise=0.1)
    cfg_path = write_bench_config(tmp_path / "cfg.yaml", t, d, write_gsm(tmp_path / "gsm.jsonl"),
                                  [{"method": "sample"}], warping={"top_k": 10, "top_p": 0.8})
    summary = run_bench(load_config(cfg_path), tmp_path / "out", progress=False,
                        log=lambda s: None, mesh=make_mesh(1, 1))
    header, *records = read_records(tmp_path / "out" / "records.jsonl")
    assert header["mesh"] == {"data": 1, "model": 1}
    assert len(records) == 1 and records[0]["new_tokens"] == 4
    assert summary["rows"][0]["label"] == "sample"
