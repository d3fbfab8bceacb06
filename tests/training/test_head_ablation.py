"""benchmarks/head_ablation.py on the tiny pair: each variant is the first steps of the recipe's
own run (same data, order and schedule), counted on the same held-out positions."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from dsbd_jax.training import head as th
from dsbd_jax.training.head_data import answer_texts

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.extended
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
    # the data variants train on every second text, both tasks kept, same steps
    main([str(recipe), "--steps", "10", "--variants", "half_data", "--out", str(out)])
    half = json.loads(out.read_text())["variants"]["half_data"]
    n = v["recipe"]["train_texts"]
    assert half["train_texts"] == (n + 1) // 2 and half["steps"] == 10
    assert 0 < half["train_positions"] < v["recipe"]["train_positions"]
    assert half["log"][-1]["heldout_kl_1"] != pytest.approx(got[10]["heldout_kl_1"], rel=1e-4)
    # fused layers: the stored texts' features of other layers, from one pass each (cached)
    main([str(recipe), "--steps", "10", "--variants", "fused_layers", "--out", str(out)])
    fused = json.loads(out.read_text())["variants"]["fused_layers"]
    z = np.load(tmp_path / "run_ablation" / "fused_layers" / "features.npz")
    layers = fused["feature_layers"]
    assert len(layers) >= 2 and list(z["layers"]) == layers
    d = np.load(tmp_path / "run" / "data.npz")
    n, T, dm = d["train_feats"].shape
    assert z["train"].shape == (n, T, len(layers) * dm)
    # the last fused layer is the last layer: final-normed, its features are the stored ones
    # (the continuations' features came from the rollouts' own passes), zeros past each text
    from dsbd_jax.loading.load import load_model
    t = load_model(str(tiny / "target"), "float32", progress=False)
    assert layers[-1] == t.config.num_layers - 1
    assert dm == t.config.hidden_size
    last = z["train"][..., -dm:]
    normed = last / np.sqrt(np.mean(last ** 2, -1, keepdims=True) + t.config.rms_norm_eps)
    normed = normed * np.asarray(t.params["final_norm"]["weight"], np.float32)
    for i, L in enumerate(d["train_lengths"]):
        np.testing.assert_allclose(normed[i, :L], d["train_feats"][i, :L], rtol=2e-3, atol=2e-4)
        assert not z["train"][i, L:].any()
    assert 0.0 <= fused["acceptance_1"] <= 1.0 and fused["steps"] == 10


@pytest.mark.extended
def test_more_text_adds_answer_texts_scored_once(tmp_path, tiny, monkeypatch):
    """``more_text``: the recipe's data plus 400 GSM8K answers, each scored by one target pass
    (cached), the loss on the answer's positions alone; on its own 600-step schedule."""
    monkeypatch.setenv("DSBD_JAX_CACHE", str(tmp_path / "cache"))
    text = (ROOT / "configs" / "head_tiny.yaml").read_text()
    text = text.replace("/tmp/dsbd_tiny/target", str(tiny / "target"))
    text = text.replace("runs/head_tiny", str(tmp_path / "run"))
    text = text.replace("max_tokens: 96", "max_tokens: 320")
    recipe = tmp_path / "head_tiny.yaml"
    recipe.write_text(text)
    sys.path.insert(0, str(ROOT))
    from benchmarks.head_ablation import VARIANTS, main
    th.run_recipe(recipe, progress=False, stop_after=1)           # writes the data
    out = tmp_path / "ablation.json"
    with pytest.raises(SystemExit, match="schedule of recipe"):
        main([str(recipe), "--steps", "30", "--variants", "recipe", "more_text", "--out",
              str(out)])
    main([str(recipe), "--steps", "4", "--variants", "recipe", "more_text", "--out", str(out)])
    v = json.loads(out.read_text())["variants"]
    cache = tmp_path / "run_ablation" / "more_text" / "texts.npz"
    z = np.load(cache)
    from dsbd_jax.loading.load import load_model
    tok = load_model(str(tiny / "target"), "float32", progress=False).tokenizer
    texts, answer_from = answer_texts(tok, VARIANTS["more_text"]["texts"])
    assert len(texts) == 400 == z["tokens"].shape[0]
    T = z["tokens"].shape[1]
    want = [max(0, min(len(t), T) - 1 - f) for t, f in zip(texts, answer_from)]
    assert list(z["mask"].sum(-1)) == want and sum(want) > 0
    m = v["more_text"]
    assert m["train_texts"] == v["recipe"]["train_texts"] + 400
    assert m["train_positions"] == v["recipe"]["train_positions"] + sum(want)
    assert m["steps"] == 4 and 0.0 <= m["acceptance_1"] <= 1.0
    # counted again from the cache, not scored again
    stamp = cache.stat().st_mtime_ns
    main([str(recipe), "--steps", "4", "--variants", "more_text", "--out", str(out)])
    assert cache.stat().st_mtime_ns == stamp
    again = json.loads(out.read_text())["variants"]["more_text"]
    assert again["acceptance_1"] == pytest.approx(m["acceptance_1"])
    # the variant's head, a draft by path
    hc, params, meta = th.load_head(str((ROOT / again["head"]).resolve()))
    assert meta["variant"] == "more_text" and meta["steps"] == 4
