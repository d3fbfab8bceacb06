"""`dsbd train-head` on the tiny random pair (dsbd_jax/training/head.py): data from the target's
passes, optax training that raises held-out acceptance, resume, save/register, and the command
line drafting with the trained head by name."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dsbd_jax.training import head as th

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    from dsbd_jax.testing import make_tiny_pair
    d = tmp_path_factory.mktemp("pair")
    make_tiny_pair(d)
    return d


def _recipe(tmp_path, tiny, steps=20):
    text = (ROOT / "configs" / "head_tiny.yaml").read_text()
    text = text.replace("/tmp/dsbd_tiny/target", str(tiny / "target"))
    text = text.replace("runs/head_tiny", str(tmp_path / "run"))
    text = text.replace("steps: 20", f"steps: {steps}")
    p = tmp_path / "head_tiny.yaml"
    p.write_text(text)
    return p


def test_recipe_errors(tmp_path, tiny):
    p = _recipe(tmp_path, tiny)
    bad = tmp_path / "bad.yaml"
    bad.write_text(p.read_text() + "\nbogus: 1\n")
    with pytest.raises(ValueError, match="unknown keys"):
        th.load_recipe(bad)
    bad.write_text(p.read_text().replace("init: target_last", "init: zeros"))
    with pytest.raises(ValueError, match="head.init"):
        th.load_recipe(bad)
    with pytest.raises(ValueError, match="no such"):
        th.load_recipe(tmp_path / "missing.yaml")


def test_train_resume_register_and_generate(tmp_path, tiny, monkeypatch):
    monkeypatch.setenv("DSBD_JAX_CACHE", str(tmp_path / "cache"))
    p = _recipe(tmp_path, tiny)
    first = th.run_recipe(p, progress=False, stop_after=12)
    assert first["step"] == 12 and "head_dir" not in first
    res = th.run_recipe(p, progress=False)           # resumes from the step-10 checkpoint
    assert res["step"] == 20 and Path(res["plot"]).is_file()
    log = res["log"]
    assert [r["step"] for r in log] == [0, 10, 20]
    assert log[-1]["heldout_acceptance_1"] > log[0]["heldout_acceptance_1"] + 0.02, log
    assert all(np.isfinite(r["heldout_loss"]) for r in log)
    cfg, params, meta = th.load_head("head_tiny")      # by the registered name
    assert meta["steps"] == 20 and meta["data"]["train_texts"][0]["task"] == "gsm8k"
    env = dict(os.environ, PYTHONPATH=str(ROOT), DSBD_JAX_CACHE=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-m", "dsbd_jax", "generate", "--target",
                        str(tiny / "target"), "--draft", "head_tiny", "--method", "spec",
                        "--prompt", "hi", "--max-new-tokens", "6", "--no-progress"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "best beam" in r.stdout and "draft_calls" in r.stdout, r.stdout
    # the demo drafts with the head registered for its target, and says so
    from dsbd_jax.cli import demo_draft
    assert th.trained_heads(tiny / "target")[0].name == "head_tiny"
    r = subprocess.run([sys.executable, "-m", "dsbd_jax", "demo", "--target", str(tiny / "target"),
                        "--prompt", "hi", "--max-new-tokens", "6"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "draft: the trained draft head head_tiny" in r.stdout and "=== dsbd" in r.stdout, \
        r.stdout
    assert "dsbd train-head" not in r.stdout
    assert demo_draft(str(tiny / "target"), "other")[0] == "other"   # --draft wins


def test_demo_without_a_head_names_the_command_that_trains_one(tmp_path, monkeypatch):
    from dsbd_jax.cli import DEFAULT_DRAFT, DEFAULT_TARGET, demo_draft
    monkeypatch.setenv("DSBD_JAX_CACHE", str(tmp_path / "empty"))
    assert th.trained_heads(DEFAULT_TARGET) == []
    assert th.recipes_for(DEFAULT_TARGET) == [ROOT / "configs" / "head_qwen.yaml"]
    draft, note, hint = demo_draft(DEFAULT_TARGET, None)
    assert (draft, note) == (DEFAULT_DRAFT, None)
    record = json.loads((ROOT / "results" / "head_qwen_training.json").read_text())
    assert "`dsbd train-head configs/head_qwen.yaml`" in hint
    assert f"about {record['wall_s'] / 60:.0f} minutes" in hint, hint
    # a target without a recipe: the default draft, nothing to suggest
    assert demo_draft(str(tmp_path / "elsewhere"), None) == (DEFAULT_DRAFT, None, None)
