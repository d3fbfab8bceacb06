"""``benchmarks/dtype_runs.py``: ``dsbd host`` run twice with empty caches on a tiny model, every
run's choice (dtype and kernel form) parsed from its output, the JSON with its host and no path of this machine."""

import pytest
import json

from bench_setup import load_bench


@pytest.mark.extended   # a benchmark script's --small run (DSBD_TEST_EXTENDED=1)
def test_small_runs(tmp_path):
    bench = load_bench("dtype_runs")
    out = tmp_path / "runs.json"
    res = bench.main(["--small", "--runs", "2", "--out", str(out)])
    (model,) = res["models"]
    assert len(res["runs"]) == 2
    for run in res["runs"]:
        assert run["choices"][model]["dtype"] == "float32"          # a tiny model
        assert run["choices"][model]["form"] == "plain"             # under MIN_ELEMENTS
        assert "small model" in run["choices"][model]["why"]
    assert res["same_on_every_run"] == {model: True}
    assert res["same_form_on_every_run"] == {model: True}
    stored = json.loads(out.read_text())
    assert stored["machine"]["cpu_flags"] is not None and "/tmp/" not in out.read_text()


def test_a_line_of_dsbd_host_is_parsed():
    bench = load_bench("dtype_runs")
    line = ("qwen2.5-coder-1.5b-instruct (1536x8960): dtype float32 (the CPU has no AMX-BF16; "
            "passes of 4 of 28 blocks over 1 / 12 new tokens: float32 30.1 / 61.0 ms, bfloat16 "
            "52.3 / 70.4 ms; the other dtype must be 20% faster (measured, written to x)); "
            "kernels transposed; compiler options default")
    m = bench.LINE.match(line)
    assert m["dtype"] == "float32" and m["why"].startswith("the CPU has no AMX-BF16")
    assert m["form"] == "transposed"
