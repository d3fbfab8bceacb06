"""Three benchmarks in their ``--small`` modes, each of which checks that its forms compute the
same product: benchmarks/probes/tied_head.py (the orders and forms of a tied head, and whole tied and
untied draft passes) and benchmarks/probes/split_products.py (split kernels) land in their JSON with
their timings; benchmarks/jax_versions.py's items from an accelerator.py result."""

import pytest
import json

from bench_setup import load_bench


@pytest.mark.extended   # a benchmark script's --small run (DSBD_TEST_EXTENDED=1)
def test_small_run_times_every_variant(tmp_path):
    bench = load_bench("tied_head")
    out = tmp_path / "th.json"
    bench.main(["--small", "--rows", "1", "3", "--repeats", "1", "--forward", "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["machine"]["cpu_model"] and data["vocab"] == 4096
    for rows in ("1", "3"):
        names = {k.split(" | ")[0] for k in data["ms"][rows]}
        assert names == set(bench.VARIANTS), names
        assert all(v > 0 for v in data["ms"][rows].values())
    assert set(data["forward"]) == {"1 token", "4 rows", "16 rows"}
    assert all(set(v) == {"tied", "untied"} for v in data["forward"].values())


def test_jax_versions_items():
    bench = load_bench("jax_versions")
    result = {"runs": [{"forward": {"draft 1 token @512": {"ms": 2.0}},
                        "decoders": {"1": {"sample": {"ms_per_iteration": 3.0}}}}]}
    assert bench._items(result) == {"forward draft 1 token @512": 2.0,
                                    "sample batch 1 ms/iteration": 3.0}


@pytest.mark.extended   # a benchmark script's --small run (DSBD_TEST_EXTENDED=1)
def test_split_products_small(tmp_path):
    bench = load_bench("split_products")
    out = tmp_path / "sp.json"
    bench.main(["--small", "--rows", "1", "4", "--repeats", "1", "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["machine"]["cpu_model"] and (data["din"], data["dout"]) == (64, 256)
    for rows in ("1", "4"):
        forms = {k.split(" | ")[0] for k in data["ms"][rows]}
        assert {"plain", "split2", "split_in", "blocks2", "transposed"} <= forms, forms
        assert all(v > 0 for v in data["ms"][rows].values())


def test_fused_projections_small(tmp_path):
    """benchmarks/probes/fused_projections.py: in every kind the fused q|k|v and gate|up
    kernels give the separate products' outputs (checked inside) in fewer operations."""
    bench = load_bench("fused_projections")
    out = tmp_path / "fp.json"
    bench.main(["--small", "--rows", "1", "4", "--repeats", "1", "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["machine"]["cpu_model"] and data["shape"] == bench.SMALL
    assert {(r["kind"], r["rows"]) for r in data["rows"]} == {
        (k, m) for k in ("float32", "bfloat16", "int8") for m in (1, 4)}
    for r in data["rows"]:
        assert r["separate_ms"] > 0 and r["fused_ms"] > 0
        assert r["fused_ops"] < r["separate_ops"], r
    # a fused kernel cut in the wrong place is caught by the probe's own check
    real = bench.run_layers

    def wrong(x, kernels, shape, fused):
        return real(x, kernels, {**shape, "kv": shape["kv"] + 1} if fused else shape, fused)
    bench.run_layers = wrong
    try:
        with pytest.raises(AssertionError):
            bench.main(["--small", "--rows", "2", "--repeats", "1", "--kinds", "float32",
                        "--out", str(tmp_path / "bad.json")])
    finally:
        bench.run_layers = real
