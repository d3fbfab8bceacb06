"""benchmarks/head_ablation.py on the tiny pair: each variant is the first steps of the recipe's
own run (same data, order and schedule), counted on the same held-out positions."""

import json
import sys
from pathlib import Path

import pytest

from dsbd_jax.training import head as th

ROOT = Path(__file__).resolve().parents[2]


def test_variants_are_the_recipes_first_steps(tmp_path, tiny, monkeypatch):
    monkeypatch.setenv("DSBD_JAX_CACHE", str(tmp_path / "cache"))
    text = (ROOT / "configs" / "head_tiny.yaml").read_text()
    text = text.replace("/tmp/dsbd_tiny/target", str(tiny / "target"))
    text = text.replace("runs/head_tiny", str(tmp_path / "run"))
    recipe = tmp_path / "head_tiny.yaml"
    recipe.write_text(text)
    sys.path.insert(0, str(ROOT))
    from benchmarks.head_ablation import main
    out = tmp_path / "ablation.json"
    with pytest.raises(SystemExit, match="dsbd train-head"):   # no data yet
        main([str(recipe), "--steps", "10", "--out", str(out)])
    run = th.run_recipe(recipe, progress=False, stop_after=10)    # writes the data, 10 steps
    main([str(recipe), "--steps", "10", "--out", str(out)])
    res = json.loads(out.read_text())
    v = res["variants"]
    assert set(v) == {"recipe", "random_init", "no_feature_loss", "one_step"}
    # the recipe's variant is the recipe's own run: the same held-out figures at step 10
    ref = {r["step"]: r for r in run["log"]}
    got = {r["step"]: r for r in v["recipe"]["log"]}
    assert sorted(got) == [0, 10]
    for k in ("heldout_acceptance_1", "heldout_acceptance_2", "heldout_kl_1"):
        assert got[10][k] == pytest.approx(ref[10][k], rel=1e-5), k
    # a random block starts elsewhere than the target's last layer; every variant is counted
    # with a second draft token, also the one trained without it
    assert v["random_init"]["log"][0]["heldout_kl_1"] != pytest.approx(
        got[0]["heldout_kl_1"], rel=1e-3)
    assert "heldout_acceptance_2" not in v["one_step"]["log"][-1]
    for name, row in v.items():
        assert 0.0 <= row["acceptance_2"] <= 1.0 and row["steps"] == 10, name
    assert "feature_1" not in v["no_feature_loss"]["log"][-1]
    assert res["data"]["counted_positions"] > 0 and res["machine"]["cpu_count"] >= 1
    # resumable: a second call finds every variant at its step and only counts again
    main([str(recipe), "--steps", "10", "--variants", "recipe", "--out", str(out)])
    again = json.loads(out.read_text())["variants"]["recipe"]
    assert again["acceptance_1"] == pytest.approx(v["recipe"]["acceptance_1"])
