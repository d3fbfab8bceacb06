"""``benchmarks/draft_levers.py --small --acceptance-only``: every draft (base, truncated,
distilled, both, and the truncated ones with prompt rows) gets an acceptance in (0, 1], nothing is timed, and the JSON records the
frequency table it used."""

import json

from bench_setup import load_bench


def test_small_acceptance_only(tmp_path, monkeypatch):
    monkeypatch.setenv("DSBD_JAX_CPU_OPTIONS", "default")  # no host measurement in CI
    from dsbd_jax.models import cpu_options
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
