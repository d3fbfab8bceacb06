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
from dsbd_jax.training.head_data import answer_texts

ROOT = Path(__file__).resolve().parents[2]


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
    # the training record the demo quotes (benchmarks/head_training.py), from a run made
    time_log = tmp_path / "time.log"
    time_log.write_text("train-head: ...\nCommand terminated by signal 15\n"
                        "\tElapsed (wall clock) time (h:mm:ss or m:ss): 1:02:03\n"
                        "\tMaximum resident set size (kbytes): 2048\n"
                        "\tElapsed (wall clock) time (h:mm:ss or m:ss): 0:30.5\n"
                        "\tMaximum resident set size (kbytes): 4096\n")
    sys.path.insert(0, str(ROOT))
    from benchmarks.head_training import main as record
    rec = record([str(p), "--time-log", str(time_log), "--out", str(tmp_path / "ht.json")])
    assert rec["wall_s"] == 3723 + 30.5 and rec["peak_rss_kb"] == 4096
    # one part per report: a run stopped by a signal, then resumed
    assert [(q["wall_s"], q["peak_rss_kb"]) for q in rec["parts"]] == [(3723, 2048), (30.5, 4096)]
    assert "stopped by a signal" in rec["parts"][0]["what"]
    assert "stopped" not in rec["parts"][1]["what"]
    assert rec["num_params_own"] > 0 and [r["step"] for r in rec["log"]] == [0, 10, 20]
    assert rec["machine"]["cpu_count"] >= 1 and rec["meta"]["steps"] == 20
    cfg, params, meta = th.load_head("head_tiny")      # by the registered name
    assert meta["steps"] == 20 and meta["data"]["train_texts"][0]["task"] == "gsm8k"
    # forced options: a fresh cache would first measure XLA:CPU's (15-20 s), not this test's subject
    env = dict(os.environ, PYTHONPATH=str(ROOT), DSBD_JAX_CACHE=str(tmp_path / "cache"),
               DSBD_JAX_CPU_OPTIONS="default")
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
    assert "a forest of " in r.stdout, r.stdout
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
    assert f"{record['peak_rss_kb'] / 1e6:.1f} GB" in hint, hint   # the pages' decimal GB
    # a target without a recipe: the default draft, nothing to suggest
    assert demo_draft(str(tmp_path / "elsewhere"), None) == (DEFAULT_DRAFT, None, None)


def test_rollout_data_counts_the_target_continuation_only(tiny):
    """The target's rollouts: prompt + the target's own continuation, the loss positions from
    the one that predicts the first continuation token, and the stored distribution at each of
    them equal to the target's warped distribution at that position of a fresh pass."""
    import jax
    import jax.numpy as jnp
    from dsbd_jax.decoding.warping import warp_logits
    from dsbd_jax.eval.datasets import chat_prompts, encode_chat
    from dsbd_jax.models.llama import causal_mask, forward
    from dsbd_jax.loading.load import load_model
    target = load_model(str(tiny / "target"), progress=False)
    cfg = th.HeadTrainConfig(store_k=4, top_k=4, top_p=1.0)
    specs = [{"task": "gsm8k", "start": 44, "stop": 47}]
    texts, loss_from = th.rollouts_of(target.config, target.params, target.tokenizer, specs, cfg,
                                      6, 2, None, jax.random.PRNGKey(0), progress=False)
    prompts = encode_chat(target.tokenizer, chat_prompts("gsm8k", 47)[44:])
    assert len(texts) == 3
    for t, f, p in zip(texts, loss_from, prompts):
        assert t[:len(p)] == p and f == len(p) - 1 and 1 <= len(t) - len(p) <= 6
    data = th.prepare_data(target.config, target.params, texts, (), cfg, 4096, False, loss_from)
    for i, (t, f) in enumerate(zip(texts, loss_from)):
        n = len(t) - 1 - f
        assert data["mask"][i].sum() == n and not data["mask"][i, n:].any()
        assert list(data["pos"][i, :n]) == list(range(f, f + n))
    i, (t, f) = 0, (texts[0], loss_from[0])
    T = len(t)
    logits, _ = forward(target.config, target.params, jnp.asarray([t]),
                        jnp.arange(T, dtype=jnp.int32)[None], causal_mask(jnp.asarray([T]), T))
    p = np.asarray(jnp.exp(warp_logits(logits[0], 1.0, 4, 1.0)))
    n = T - 1 - f
    for j in range(n):
        want = p[f + j][data["ids"][0, j]]
        np.testing.assert_allclose(data["probs"][0, j], want, atol=1e-5)
        assert abs(data["probs"][0, j].sum() - 1.0) < 1e-4


def test_recipe_needs_texts_or_rollouts(tmp_path, tiny):
    p = _recipe(tmp_path, tiny)
    bad = tmp_path / "bad.yaml"
    bad.write_text(p.read_text().replace("heldout_texts:", "other_texts:"))
    with pytest.raises(ValueError, match="unknown keys"):
        th.load_recipe(bad)
    text = "\n".join(line for line in p.read_text().splitlines()
                     if not line.startswith("heldout_texts"))
    bad.write_text(text)
    with pytest.raises(ValueError, match="'heldout_texts' or 'heldout_rollouts' is required"):
        th.load_recipe(bad)
    bad.write_text(text + "\nheldout_rollouts: [{task: gsm8k, start: 1310, stop: 1312}]\n"
                   "rollout_tokens: 0\n")
    with pytest.raises(ValueError, match="rollout_tokens must be a positive integer"):
        th.load_recipe(bad)


def test_rollout_data_from_the_rollouts_own_passes_equals_a_pass_over_the_texts(tiny):
    """``rollout_data: own_passes``: the features, tokens and warped distributions taken from the
    passes that sample the rollouts equal those of one pass over each finished text (what
    ``rescore`` stores), every drawn token is in the support it was drawn from, and a recipe
    with texts and rollouts holds both (``concat_data``)."""
    import jax
    from dsbd_jax.eval.datasets import chat_prompts, encode_chat
    from dsbd_jax.loading.load import load_model
    from dsbd_jax.training import head_data
    target = load_model(str(tiny / "target"), progress=False)
    cfg = th.HeadTrainConfig(store_k=4, top_k=4, top_p=0.9)
    prompts = encode_chat(target.tokenizer, chat_prompts("gsm8k", 47)[44:])
    # lengths out of order, and a batch of 2 over 3 prompts: sorting, padding, filling
    prompts = [prompts[0][:40], prompts[1], prompts[2][:70]]
    own = head_data.rollout_data(target.config, target.params, prompts, (), cfg, 6, 2, 4096,
                                 jax.random.PRNGKey(0), progress=False)
    texts = [list(own["tokens"][i, :own["lengths"][i]]) for i in range(3)]
    for t, p in zip(texts, prompts):
        assert t[:len(p)] == list(p) and 1 <= len(t) - len(p) <= 6
    ref = th.prepare_data(target.config, target.params, texts, (), cfg, 4096, False,
                          [len(p) - 1 for p in prompts])
    assert own["feats"].shape[1] == ref["feats"].shape[1]
    for k in ("tokens", "lengths", "pos", "mask"):
        np.testing.assert_array_equal(own[k], ref[k], err_msg=k)
    for i in range(3):
        L = own["lengths"][i]
        np.testing.assert_allclose(own["feats"][i, :L], ref["feats"][i, :L], atol=2e-4, rtol=1e-3)
        m = own["mask"][i]
        np.testing.assert_allclose(own["probs"][i][m], ref["probs"][i][m], atol=1e-4)
        np.testing.assert_array_equal(np.sort(own["ids"][i][m], -1), np.sort(ref["ids"][i][m], -1))
        # position f0 + j drew the text's token at f0 + j + 1, inside its stored support
        for j in np.nonzero(m)[0]:
            tok = own["tokens"][i, own["pos"][i, j] + 1]
            assert tok in own["ids"][i, j][own["probs"][i, j] > 0]
    both = head_data.concat_data(ref, own)
    assert both["feats"].shape[0] == 6 and both["mask"].sum() == 2 * own["mask"].sum()


def test_recipe_rollout_data_setting(tmp_path, tiny):
    p = _recipe(tmp_path, tiny)
    assert th.load_recipe(p)["rollout_data"] == "own_passes"
    bad = tmp_path / "bad.yaml"
    bad.write_text(p.read_text() + "\nrollout_data: twice\n")
    with pytest.raises(ValueError, match="rollout_data must be one of"):
        th.load_recipe(bad)


def test_answer_texts_count_the_answer_alone(tmp_path, tiny):
    """``text_loss: answer``: a text's loss counts from the prompt's last position (the one that
    predicts the answer's first token), as a rollout counts its continuation; ``all`` (the
    default) counts every position; anything else is refused."""
    from dsbd_jax.eval.datasets import chat_prompt, encode_chat, load
    from dsbd_jax.loading.load import load_model
    target = load_model(str(tiny / "target"), progress=False)
    tok = target.tokenizer
    specs = [{"task": "gsm8k", "start": 40, "stop": 42}, {"task": "humaneval", "start": 40,
                                                          "stop": 41}]
    texts, answer_from = answer_texts(tok, specs)
    assert texts == th.texts_of(tok, specs) and len(texts) == 3
    records = [("gsm8k", r, "answer") for r in load("gsm8k", 42)[40:]]
    records += [("humaneval", r, "canonical_solution") for r in load("humaneval", 41)[40:]]
    for t, f, (task, rec, field) in zip(texts, answer_from, records):
        prompt = encode_chat(tok, [chat_prompt(task, rec)])[0]
        assert f == len(prompt) - 1 and t[:len(prompt)] == prompt
        assert rec[field].strip()[:12] in tok.decode(t[f + 1:])
    # the recipe's data: the answer's positions only, or every position
    p = _recipe(tmp_path, tiny)
    counted = {}
    for mode in ("answer", "all"):
        q = tmp_path / f"{mode}.yaml"
        q.write_text(p.read_text().replace("max_tokens: 96", "max_tokens: 512")
                     + f"\ntext_loss: {mode}\n")
        r = th.load_recipe(q)
        train, _ = th.recipe_data(r, target, (), r["train"], progress=False)
        t2, f2 = answer_texts(tok, r["train_texts"])
        T = train["tokens"].shape[1]
        lens = [min(len(t), T) for t in t2]
        counted[mode] = train["mask"].sum(-1)
        want = [max(0, n - 1 - f) for n, f in zip(lens, f2)] if mode == "answer" else \
            [n - 1 for n in lens]
        assert list(counted[mode]) == want, mode
    assert (counted["answer"] < counted["all"]).all() and (counted["answer"] > 0).any()
    assert th.load_recipe(p)["text_loss"] == "all"
    bad = tmp_path / "bad.yaml"
    bad.write_text(p.read_text() + "\ntext_loss: prompt\n")
    with pytest.raises(ValueError, match="text_loss must be one of"):
        th.load_recipe(bad)
