"""``benchmarks/draft_levers.py --small --acceptance-only``: every draft (base, truncated,
distilled, both, and the truncated ones with prompt rows) gets an acceptance in (0, 1], nothing is timed, and the JSON records the
frequency table it used."""

import pytest
import json

from bench_setup import load_bench


@pytest.mark.extended   # a benchmark script's --small run (DSBD_TEST_EXTENDED=1)
def test_small_acceptance_only(tmp_path, monkeypatch):
    monkeypatch.setenv("DSBD_JAX_CPU_OPTIONS", "default")  # no host measurement in CI
    from dsbd_jax.host import cpu_options
    cpu_options.choice.cache_clear()
    out = tmp_path / "levers.json"
    load_bench("draft_levers").main(["--small", "--acceptance-only", "--prompt-rows",
                                      "--out", str(out)])
    data = json.loads(out.read_text())
    drafts = data["drafts"]
    assert {"base", "distilled"} <= set(drafts) and any(k.startswith("trunc_") for k in drafts)
    assert any(k.startswith("both_") for k in drafts)
    prompt = [k for k in drafts if k.endswith("_prompt")]
    assert prompt and all(k[:-len("_prompt")] in drafts for k in prompt)
    for rec in drafts.values():
        assert 0.0 < rec["acceptance"] <= 1.0 + 1e-6
    assert drafts["base"]["acceptance_minus_base"] == 0.0
    assert data["table"] and "references" not in data  # nothing timed
    cpu_options.choice.cache_clear()


@pytest.mark.extended   # a benchmark script's --small run (DSBD_TEST_EXTENDED=1)
def test_small_passes_only(tmp_path, monkeypatch):
    """``--passes-only``: every draft gets a draft-pass time at batch 1 and ``--batch``, the base
    is 1.0x itself, prompt-rows drafts are timed too, and nothing else is measured."""
    monkeypatch.setenv("DSBD_JAX_CPU_OPTIONS", "default")
    from dsbd_jax.host import cpu_options
    cpu_options.choice.cache_clear()
    out = tmp_path / "passes.json"
    load_bench("draft_levers").main(["--small", "--passes-only", "--prompt-rows", "--batch", "2",
                                      "--out", str(out)])
    data = json.loads(out.read_text())
    drafts = data["drafts"]
    assert any(k.endswith("_prompt") for k in drafts) and "distilled" in drafts
    for rec in drafts.values():
        assert set(rec) == {"draft_pass_ms_b1", "draft_pass_ms_b2", "draft_pass_vs_base_b1",
                            "draft_pass_vs_base_b2"}
        assert rec["draft_pass_ms_b1"] > 0 and rec["draft_pass_ms_b2"] > 0
    assert drafts["base"]["draft_pass_vs_base_b1"] == 1.0
    assert "references" not in data and data["machine"]["cpu_model"]
    cpu_options.choice.cache_clear()
