"""``benchmarks/forest_budget.py --small``: the pass's curve, the probe's budget and DSBD at each
node budget beside beam sampling, on the tiny pair."""

import json

import pytest

from bench_setup import load_bench


@pytest.mark.extended   # a benchmark script's --small run (DSBD_TEST_EXTENDED=1)
def test_small_pair(tmp_path):
    bench = load_bench("forest_budget")
    out = tmp_path / "fb.json"
    res = bench.main(["--small", "--dtypes", "float32", "--budgets", "off", "16", "--out",
                      str(out)])
    curve = res["curve"]["float32"]
    assert set(curve["ms"]) == {"1", "12", "16"} and all(v > 0 for v in curve["ms"].values())
    assert curve["over_one_token"]["12"] == curve["ms"]["12"] / curve["ms"]["1"]
    probe = res["probe"]["float32"]
    assert set(probe["over_one_token"]) == {"12", "16"}
    assert probe["budget"] in (None, 12, 16) and probe["whole_pass_budget"] in (None, 12, 16)
    dec = res["decoders"]
    assert set(dec) == {"beam_W4", "dsbd_w4_budget_off", "dsbd_w4_budget_16"}
    # W4's forest: 4 input beams + 2 layers of 4; a budget of 16 widens the layers to 6
    assert (dec["dsbd_w4_budget_off"]["forest_nodes"], dec["dsbd_w4_budget_off"]["layer_width"]) \
        == (12, 4)
    assert (dec["dsbd_w4_budget_16"]["forest_nodes"], dec["dsbd_w4_budget_16"]["layer_width"]) \
        == (16, 6)
    for name in ("dsbd_w4_budget_off", "dsbd_w4_budget_16"):
        r = dec[name]
        assert r["tokens_per_s"] > 0 and r["vs_beam_W4"] > 0 and r["mean_accepted_width"] >= 0
        assert [p["tokens"] for p in r["runs"][0]["prompts"]] == [6, 6]
    assert res["draft"]["kind"] == "model"
    text = out.read_text()
    assert json.loads(text)["machine"]["cpu_flags"] is not None and "/tmp/" not in text
