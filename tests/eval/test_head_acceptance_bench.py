"""``benchmarks/head_acceptance.py``: a draft's teacher-forced acceptance on the target's own
continuations, split into prompt and continuation positions, with the decoder's own count."""

import json

import pytest

from bench_setup import load_bench


@pytest.mark.extended   # a benchmark script's --small run (DSBD_TEST_EXTENDED=1)
def test_small_run(tmp_path, monkeypatch):
    monkeypatch.setenv("DSBD_JAX_CPU_OPTIONS", "default")  # no host measurement in CI
    from dsbd_jax.host import cpu_options
    cpu_options.choice.cache_clear()
    bench = load_bench("head_acceptance")
    out = tmp_path / "acc.json"
    bench.main(["--small", "--draft", "tiny", "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["machine"]["cpu_model"] and data["written_with"] == "head"
    assert len(data["prompts"]) == 2
    for rec in data["prompts"]:
        assert rec["new_tokens"] == 8
        for name in ("head", "draft"):
            assert 0.0 <= rec[name]["prompt"] <= 1.0 + 1e-6
            assert 0.0 <= rec[name]["continuation"] <= 1.0 + 1e-6
        assert 0.0 <= rec["decoded"]["head"] <= 1.0
    s = data["summary"]
    assert set(s) == {"head", "draft", "decoded_head"}
    assert abs(s["head"]["continuation"]
               - sum(r["head"]["continuation"] for r in data["prompts"]) / 2) < 1e-6
