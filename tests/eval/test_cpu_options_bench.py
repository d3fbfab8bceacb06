"""``benchmarks/cpu_options.py --small``: every decoder core compiled under each compiler-options
candidate, timed, and the candidates' integer outputs (tokens, lengths) equal to ``default``'s."""

import json

import pytest

from bench_setup import load_bench
from dsbd_jax.host import cpu_options


@pytest.mark.extended   # a benchmark script's --small run (DSBD_TEST_EXTENDED=1)
def test_small_run_times_every_candidate(tmp_path, monkeypatch):
    monkeypatch.setenv("DSBD_JAX_CPU_OPTIONS", "default")  # no host measurement in CI
    cpu_options.choice.cache_clear()
    bench = load_bench("cpu_options")
    out = tmp_path / "co.json"
    methods = ["sample", "speculative_g4", "dsbd_beamW4_point"]
    bench.main(["--small", "--prompts", "2", "--max-new-tokens", "4", "--methods", *methods,
                "--out", str(out)])
    data = json.loads(out.read_text())
    names = list(cpu_options.candidates())
    assert data["machine"]["cpu_model"] and data["host_choice"] == "default"
    assert list(data["options"]) == names
    for m in methods:
        run = data["runs"][m]
        for n in names:
            assert run[n]["tokens"] == 8 and run[n]["tokens_per_s"] > 0
            if n != "default":
                assert run[f"{n}_same_integer_outputs"] is True
                assert run[f"{n}_vs_default"] > 0
    cpu_options.choice.cache_clear()


def test_rejected_candidate_is_a_usage_error(tmp_path, monkeypatch, capsys):
    import pytest
    monkeypatch.setattr(cpu_options, "CANDIDATES", {**cpu_options.CANDIDATES,
                                                    "bogus": {"xla_cpu_no_such_option_dsbd": 1}})
    cpu_options.supported.cache_clear()
    bench = load_bench("cpu_options")
    try:
        with pytest.raises(SystemExit):
            bench.main(["--small", "--options", "bogus", "--out", str(tmp_path / "x.json")])
        assert "rejects the options of ['bogus']" in capsys.readouterr().err
    finally:
        cpu_options.supported.cache_clear()
