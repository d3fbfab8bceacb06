"""``benchmarks/draft_terms.py``: the split of a drafted decoder's iteration into its measured
terms and the ratios with one term changed (by hand on made-up figures), and a ``--small`` run
that lands every decoder, every pass and every target ratio in its JSON."""

import json

import pytest

from bench_setup import load_bench


def test_decode_split_and_what_if_by_hand():
    bench = load_bench("draft_terms")
    run = {"seconds": 2.0, "calls": 2, "iterations": 10, "tokens": 40}
    split = bench.decode_split(run, 100.0, {"draft": 60.0, "target": 90.0})
    # (2000 ms - 2 prompt passes of 100 ms) / 10 iterations = 180 ms, of which 30 ms are neither
    assert split["decode_ms_per_iteration"] == pytest.approx(180.0)
    assert split["tokens_per_iteration"] == 4.0
    assert split["decode_ms_per_token"] == pytest.approx(45.0)
    assert split["rest_ms"] == pytest.approx(30.0)
    ratios = bench.what_if(split, 100.0, one_row_target_ms=50.0, all_tokens=5)
    assert ratios["decode"] == pytest.approx(400 / 180)        # 4 tokens x 100 ms / 180 ms
    assert ratios["free_draft"] == pytest.approx(400 / 120)    # without the 60 ms of drafts
    assert ratios["one_row_target"] == pytest.approx(400 / 140)  # 90 ms pass -> 50 ms
    assert ratios["all_accepted"] == pytest.approx(500 / 180)
    assert set(bench.what_if(split, 100.0)) == {"decode", "free_draft"}


@pytest.mark.extended   # a benchmark script's --small run (DSBD_TEST_EXTENDED=1)
def test_small_run(tmp_path, monkeypatch):
    monkeypatch.setenv("DSBD_JAX_CPU_OPTIONS", "default")  # no host measurement in CI
    from dsbd_jax.host import cpu_options
    cpu_options.choice.cache_clear()
    bench = load_bench("draft_terms")
    out = tmp_path / "terms.json"
    # the draft: a head made from the tiny target (the full draft model's passes are the
    # references' code path; the head's are its own)
    bench.main(["--small", "--drafts", "head", "--batches", "1", "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["machine"]["cpu_model"] and set(data["batches"]) == {"b1"}
    b1 = data["batches"]["b1"]
    assert set(b1["references"]) == {"sample", "beam_sample_W4"}
    assert b1["target_one_row_pass_ms"] > 0 and b1["target_prefill_ms"] > 0
    assert set(b1["one_token_pass_ms"]) == {"target", "head"}
    assert b1["draft_pass_vs_target"]["head"] == pytest.approx(
        b1["one_token_pass_ms"]["head"] / b1["one_token_pass_ms"]["target"])
    assert data["head"]["own_params"] > 0 and data["head"]["feature_layers"] == []
    rec = b1["drafts"]["head"]
    methods = {"speculative_g2", "dsbd_single_beam", "dsbd_beamW4_point"}
    assert methods <= set(rec) and rec["best_speculative"] == "speculative_g2"
    for m in methods:
        r = rec[m]
        passes = r["passes_alone_ms"]
        assert {"prefill_target", "prefill_draft"} <= set(passes)
        assert all(v > 0 for v in passes.values())
        # speculative g2: a 2-token draft pass, one 1-token draft pass, a 3-token target pass
        if m == "speculative_g2":
            assert sorted(k for k in passes if k.startswith("pass")) == [
                "pass0_draft_1x2", "pass1_draft_1x1", "pass2_target_1x3"]
        total = r["draft_passes_ms"] + r["target_passes_ms"] + r["rest_ms"]
        assert total == pytest.approx(r["decode_ms_per_iteration"])
        assert r["iterations"] > 0 and r["tokens"] == 2 * 8  # 2 prompts, EOS off
    t = rec["targets"]
    spec = t["speculative_vs_sample"]["speculative_g2"]
    assert {"decode", "end_to_end", "free_draft", "one_row_target", "all_accepted",
            "reached_by"} == set(spec)
    assert {"decode", "end_to_end", "free_draft", "one_row_target", "all_accepted",
            "reached_by"} == set(t["dsbd_w4_vs_beam_w4"]["dsbd_beamW4_point"])
    assert {"decode", "end_to_end", "same_tokens", "same_target_pass", "same_draft", "same_rest",
            "reached_by"} == set(t["single_beam_vs_speculative"]["speculative_g2"])
    assert "| head | speculative_g2 |" in bench.report(data)
    cpu_options.choice.cache_clear()


def test_by_halves_by_hand():
    bench = load_bench("draft_terms")
    full = {"seconds": 3.0, "calls": 2, "iterations": 20, "tokens": 80}
    half = {"seconds": 2.0, "calls": 2, "iterations": 10, "tokens": 40}
    h = bench.by_halves(full, half)
    assert h["decode_ms_per_iteration"] == pytest.approx(100.0)   # 1000 ms over 10 iterations
    assert h["tokens_per_iteration_second_half"] == 4.0
    assert h["implied_prefill_ms_per_call"] == pytest.approx(500.0)  # (3000 - 2000) / 2 calls


def test_single_beam_what_if_and_reached_by():
    """Single-beam DSBD at 3 tokens / 300 ms against speculative sampling at 4 / 300 ms: 0.75x;
    with speculative sampling's tokens per iteration it would be 1.0x (reaches 0.95x), with its
    target pass (50 ms less) 0.9x (does not)."""
    bench = load_bench("draft_terms")
    spec = {"tokens_per_iteration": 4.0, "decode_ms_per_iteration": 300.0, "tokens_per_s": 4.0,
            "draft_passes_ms": 100.0, "target_passes_ms": 150.0, "rest_ms": 50.0,
            "decode_ms_per_token": 75.0}
    sb = {"tokens_per_iteration": 3.0, "decode_ms_per_iteration": 300.0, "tokens_per_s": 3.0,
          "draft_passes_ms": 50.0, "target_passes_ms": 200.0, "rest_ms": 50.0,
          "decode_ms_per_token": 100.0}
    r = bench.single_beam_what_if(sb, spec)
    assert r["decode"] == pytest.approx(0.75) and r["end_to_end"] == pytest.approx(0.75)
    assert r["same_tokens"] == pytest.approx(1.0)
    assert r["same_target_pass"] == pytest.approx(0.75 * 300 / 250)
    assert r["same_draft"] == pytest.approx(0.75 * 300 / 350)
    assert r["same_rest"] == pytest.approx(0.75)
    ref = {"tokens_per_s": 2.0, "decode_ms_per_token": 100.0, "target_passes_ms": 90.0}
    out = {"batches": {"b1": {"references": {"sample": ref, "beam_sample_W4": ref},
                              "target_one_row_pass_ms": 90.0, "drafts": {"base": {
                                  "speculative_g4": spec, "dsbd_single_beam": sb,
                                  "dsbd_beamW4_point": sb}}}}}
    t = bench.summarize(out)["batches"]["b1"]["drafts"]["base"]["targets"]
    assert t["single_beam_vs_speculative"]["speculative_g4"]["reached_by"] == ["same_tokens"]
    # speculative: 4 tokens x 100 ms / 300 ms = 1.33x; free draft 400 / 200 = 2.0x and all
    # accepted 500 / 300 = 1.67x reach 1.6x, a one-row target pass (90 ms) 400 / 240 = 1.67x too
    spec_t = t["speculative_vs_sample"]["speculative_g4"]
    assert spec_t["decode"] == pytest.approx(4 / 3)
    assert spec_t["reached_by"] == ["free_draft", "one_row_target", "all_accepted"]
    # at batch 2 the same figures count both rows: every draft accepted is 2 x 5 tokens
    out["batches"] = {"b2": out["batches"]["b1"]}
    t2 = bench.summarize(out)["batches"]["b2"]["drafts"]["base"]["targets"]
    assert t2["speculative_vs_sample"]["speculative_g4"]["all_accepted"] == pytest.approx(
        2 * 500 / 300)


def test_single_beam_sweep_options_and_summary():
    """``--single-beam-settings G,W,T[,M]``: parsed and named, bad ones refused; a run holding
    variants (and no beam-W4 point, as ``--methods`` allows) gets each variant's ratio against
    each speculative gamma, the default setting keeping its old key; summarizing twice (the
    ``--report`` path) gives the same targets."""
    import argparse
    bench = load_bench("draft_terms")
    assert bench.single_beam_setting("3,2,0.9") == (3, 2, 0.9, 1)
    assert bench.single_beam_setting("3,2,1,2") == (3, 2, 1.0, 2)
    for bad in ("3,2", "a,2,0.9", "0,2,0.9", "3,2,1.5", "3,2,1,3", "3,2,1,2,1"):
        with pytest.raises(argparse.ArgumentTypeError):
            bench.single_beam_setting(bad)
    sb0 = (bench.DSBD_SB["gamma"], bench.DSBD_SB["draft_width"], bench.DSBD_SB["threshold"])
    sb0 = sb0 + (bench.DSBD_SB["min_width"],)
    assert bench.single_beam_name(*sb0) == "dsbd_single_beam"
    assert bench.single_beam_name(4, 2, 0.9) == "dsbd_single_beam_g4w2t0.9"
    assert bench.single_beam_name(3, 2, 1.0, 2) == "dsbd_single_beam_g3w2t1m2"
    mk = lambda tpi, ms: {"tokens_per_iteration": tpi, "decode_ms_per_iteration": ms,  # noqa: E731
                          "tokens_per_s": tpi / ms, "draft_passes_ms": 100.0,
                          "target_passes_ms": ms - 150.0, "rest_ms": 50.0,
                          "decode_ms_per_token": ms / tpi}
    ref = {"tokens_per_s": 2.0, "decode_ms_per_token": 100.0, "target_passes_ms": 90.0}
    runs = {"speculative_g4": mk(4.0, 400.0), "speculative_g6": mk(5.0, 450.0),
            "dsbd_single_beam": mk(3.0, 400.0), "dsbd_single_beam_g4w2t0.9": mk(3.8, 380.0)}
    out = {"batches": {"b1": {"references": {"sample": ref, "beam_sample_W4": ref},
                              "target_one_row_pass_ms": 90.0, "drafts": {"d": dict(runs)}}}}
    drec = bench.summarize(out)["batches"]["b1"]["drafts"]["d"]
    t = drec["targets"]
    assert drec["best_speculative"] == "speculative_g6" and "dsbd_w4_vs_beam_w4" not in t
    sbt = t["single_beam_vs_speculative"]
    assert set(sbt) == {"speculative_g4", "speculative_g6",
                        "dsbd_single_beam_g4w2t0.9 vs speculative_g4",
                        "dsbd_single_beam_g4w2t0.9 vs speculative_g6"}
    assert sbt["speculative_g4"]["decode"] == pytest.approx(0.75)
    v = sbt["dsbd_single_beam_g4w2t0.9 vs speculative_g4"]
    assert v["decode"] == pytest.approx((3.8 / 380) / (4 / 400))  # 1.0x: reaches 0.95x
    assert v["reached_by"] == [k for k in v if k not in ("decode", "end_to_end", "reached_by")
                               and v[k] >= 0.95]
    again = bench.summarize(out)["batches"]["b1"]["drafts"]["d"]["targets"]
    assert again == t


def test_summary_of_dsbd_alone():
    """A run of the beam-W4 point alone (``--methods dsbd_beamW4_point``, no speculative
    sampling) is summarised, not refused at its end: its DSBD target only."""
    bench = load_bench("draft_terms")
    w4 = {"tokens_per_iteration": 2.5, "decode_ms_per_iteration": 400.0, "tokens_per_s": 5.0,
          "draft_passes_ms": 100.0, "target_passes_ms": 250.0, "rest_ms": 50.0,
          "decode_ms_per_token": 160.0}
    ref = {"tokens_per_s": 4.0, "decode_ms_per_token": 200.0, "target_passes_ms": 190.0}
    out = {"batches": {"b1": {"references": {"sample": ref, "beam_sample_W4": ref},
                              "target_one_row_pass_ms": 180.0,
                              "drafts": {"int8": {"dsbd_beamW4_point": w4}}}}}
    drec = bench.summarize(out)["batches"]["b1"]["drafts"]["int8"]
    assert drec["best_speculative"] is None
    assert drec["targets"]["speculative_vs_sample"] == {}
    d = drec["targets"]["dsbd_w4_vs_beam_w4"]["dsbd_beamW4_point"]
    assert d["decode"] == pytest.approx(200 / 160) and d["end_to_end"] == pytest.approx(1.25)
