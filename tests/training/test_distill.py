"""Draft distillation (dsbd_jax.training): the losses on warped distributions, a tiny pair whose
held-out acceptance rises, resume == uninterrupted (bitwise), the exported checkpoint, and
exactness of speculative sampling with the distilled draft. Run with ``PYTHONPATH=tests``."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import exact_reference as ref
from dsbd_jax.decoding.warping import warp_logits
from dsbd_jax.training import DistillConfig, distill, divergence, target_topk
from dsbd_jax.training.distill import draft_params, init_lora, prepare_data


def test_tv_is_one_minus_sum_min_on_warped_distributions():
    """TV from the stored top-k equals ``1 - sum(min(p, q))`` of the dense warped distributions;
    forward and reverse KL equal their dense definitions."""
    key = jax.random.key(0)
    lt = 2.0 * jax.random.normal(key, (3, 5, 40))
    ld = 2.0 * jax.random.normal(jax.random.fold_in(key, 1), (3, 5, 40))
    for temp, top_k, top_p in ((1.3, 6, 0.9), (0.7, 10, 1.0), (1.0, 4, 0.5)):
        p = np.exp(np.asarray(warp_logits(lt, temp, top_k, top_p), np.float64))
        q = np.exp(np.asarray(warp_logits(ld, temp, top_k, top_p), np.float64))
        idx, ps, dropped = target_topk(lt, temp, top_k, top_p, store_k=12)
        np.testing.assert_allclose(np.asarray(dropped), 0.0, atol=1e-6)
        tv = np.asarray(divergence("tv", ld, idx, ps, temp, top_k, top_p))
        np.testing.assert_allclose(tv, 1.0 - np.minimum(p, q).sum(-1), atol=1e-6)
        np.testing.assert_allclose(tv, 0.5 * np.abs(p - q).sum(-1), atol=1e-6)
        qt = np.exp(np.asarray(jax.nn.log_softmax(ld / temp), np.float64))
        with np.errstate(divide="ignore", invalid="ignore"):
            fkl = np.where(p > 0, p * np.log(p / qt), 0).sum(-1)
            qs = np.where(p > 0, qt, 0)
            qs = qs / qs.sum(-1, keepdims=True)
            rkl = np.where(qs > 0, qs * np.log(qs / p), 0).sum(-1)
        np.testing.assert_allclose(divergence("fkl", ld, idx, ps, temp, top_k, top_p), fkl,
                                   rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(divergence("rkl", ld, idx, ps, temp, top_k, top_p), rkl,
                                   rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="divergence must be one of"):
        divergence("js", ld, idx, ps, 1.0, None, 1.0)


def test_warped_tv_has_no_gradient_where_the_warped_draft_keeps_one_token():
    """The property behind the loss advice (losses module doc): where top-p leaves the draft one
    token, ``q`` is 1 there whatever the logits, so the warped TV's gradient is exactly zero even
    though the target puts mass elsewhere; forward KL still has a gradient there."""
    ld = jnp.asarray([[4.0, 1.0, 0.5, 0.0, -1.0, -2.0]])   # the draft: 0.89 on token 0
    lt = jnp.asarray([[1.0, 1.0, 0.5, 0.0, -1.0, -2.0]])   # the target: tokens 0 and 1 alike
    idx, p, _ = target_topk(lt, 1.0, None, 0.8, store_k=6)
    q = np.exp(np.asarray(warp_logits(ld, 1.0, None, 0.8)))
    assert (q > 0).sum() == 1 and float(np.asarray(p)[0, 1]) > 0.2
    tv = float(divergence("tv", ld, idx, p, 1.0, None, 0.8)[0])
    assert tv > 0.2                                          # far from the target ...
    g_tv = jax.grad(lambda l: divergence("tv", l, idx, p, 1.0, None, 0.8).sum())(ld)
    np.testing.assert_array_equal(np.asarray(g_tv), 0.0)     # ... and no way to move
    g_fkl = jax.grad(lambda l: divergence("fkl", l, idx, p, 1.0, None, 0.8).sum())(ld)
    assert float(jnp.abs(g_fkl).max()) > 0.1


def test_config_errors():
    for bad, msg in ((dict(loss="js"), "loss must be"), (dict(mode="half"), "mode must be"),
                     (dict(steps=0), "steps must be"), (dict(warmup_steps=5, steps=5), "warmup"),
                     (dict(compute_dtype="fp8"), "compute_dtype"), (dict(policy="me"), "policy")):
        with pytest.raises(ValueError, match=msg):
            DistillConfig(**bad)


V = 24


def pair():
    tc, tp = ref.toy_model(V, seed=1, scale=2.0, layers=2)
    dc, dp = ref.toy_model(V, seed=2, scale=2.0, layers=1)
    return (tc, tp), (dc, dp)


def prompts(n, seed):
    rng = np.random.default_rng(seed)
    return [list(rng.integers(1, V, size=rng.integers(2, 6))) for _ in range(n)]


SMALL = dict(steps=6, batch_size=4, learning_rate=3e-3, warmup_steps=2, max_new_tokens=6,
             top_k=8, top_p=1.0, store_k=8, eval_every=3, checkpoint_every=2, mode="full")


def test_distillation_raises_heldout_acceptance(tmp_path):
    target, draft = pair()
    dc = DistillConfig(**{**SMALL, "steps": 80, "learning_rate": 1e-2, "warmup_steps": 5,
                          "eval_every": 40, "checkpoint_every": 40})
    res = distill(target, draft, prompts(32, 0), prompts(16, 1), dc, tmp_path, progress=False)
    (s0, a0), (s1, a1) = res["heldout_acceptance"][0], res["heldout_acceptance"][-1]
    print(f"held-out acceptance {a0:.3f} (step {s0}) -> {a1:.3f} (step {s1})")
    assert s0 == 0 and s1 == 80
    assert a1 > a0 + 0.1, (a0, a1)


@pytest.mark.parametrize("mode", ["full", "lora"])
def test_resume_equals_uninterrupted(tmp_path, mode):
    """Stopped after 3 of 6 steps and started again: the same parameters, bit for bit."""
    target, draft = pair()
    dc = DistillConfig(**{**SMALL, "mode": mode, "learning_rate": 1e-2})
    P, H = prompts(8, 0), prompts(4, 1)
    full = distill(target, draft, P, H, dc, tmp_path / "a", progress=False)
    part = distill(target, draft, P, H, dc, tmp_path / "b", progress=False, stop_after=3)
    assert part["step"] == 3 and not (tmp_path / "b" / "model").exists()
    rest = distill(target, draft, P, H, dc, tmp_path / "b", progress=False)
    assert rest["step"] == 6
    for a, b in zip(jax.tree.leaves(full["params"]), jax.tree.leaves(rest["params"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    changed = any(not np.array_equal(np.asarray(a), np.asarray(b))
                  for a, b in zip(jax.tree.leaves(full["params"]), jax.tree.leaves(draft[1])))
    assert changed


def test_training_needs_the_target_only_for_the_rollouts(tmp_path):
    """Once a run's rollouts exist, training runs without the target (``dsbd distill`` frees it)
    and reaches the same parameters; without them, a clear error. Every step logs its RSS."""
    import json
    target, draft = pair()
    dc = DistillConfig(**SMALL)
    P, H = prompts(8, 0), prompts(4, 1)
    with pytest.raises(ValueError, match="the target model is needed to make the rollouts"):
        distill(None, draft, P, H, dc, tmp_path / "b", progress=False)
    full = distill(target, draft, P, H, dc, tmp_path / "a", progress=False)
    prepare_data(target, draft, P, H, dc, tmp_path / "b", progress=False)
    alone = distill(None, draft, P, H, dc, tmp_path / "b", progress=False)
    for a, b in zip(jax.tree.leaves(full["params"]), jax.tree.leaves(alone["params"])):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    recs = [json.loads(x) for x in (tmp_path / "b" / "log.jsonl").read_text().splitlines()]
    assert all(r["rss_gb"] > 0 for r in recs if "loss" in r)


def test_lora_starts_at_the_draft_and_bf16_runs(tmp_path):
    target, (dcf, dp) = pair()
    lora = init_lora(dp, 4, jax.random.key(0))
    assert len(lora) == 7 * dcf.num_layers
    dc = DistillConfig(**{**SMALL, "mode": "lora", "lora_rank": 4, "compute_dtype": "bfloat16"})
    same = draft_params(dc, dp, lora)
    for a, b in zip(jax.tree.leaves(same), jax.tree.leaves(dp)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    res = distill(target, (dcf, dp), prompts(8, 0), prompts(4, 1), dc, tmp_path, progress=False)
    assert np.isfinite(res["heldout_acceptance"][-1][1])


def test_export_is_read_back_by_load_model(tmp_path):
    from dsbd_jax import load_model
    from dsbd_jax.models.llama import logits
    target, draft = pair()
    dc = DistillConfig(**SMALL)
    res = distill(target, draft, prompts(8, 0), prompts(4, 1), dc, tmp_path, progress=False)
    m = load_model(tmp_path / "model", progress=False, layout="stacked")
    assert m.config.replace(architecture=draft[0].architecture) == draft[0].replace(
        max_position_embeddings=m.config.max_position_embeddings)
    ids = jnp.asarray([[1, 2, 3, 4]])
    np.testing.assert_allclose(np.asarray(logits(m.config, m.params, ids)),
                               np.asarray(logits(draft[0], res["params"], ids)), atol=1e-5)


def test_distilled_draft_keeps_speculative_sampling_exact(tmp_path):
    """The output distribution of speculative sampling with the distilled draft is still the
    target's (chi-square against enumeration, as test_speculative.py)."""
    from dsbd_jax.decoding import speculative as spec
    from dsbd_jax.decoding.configs import SpeculativeConfig
    tc, tp = ref.toy_model(6, seed=1, scale=2.0)
    dcf, dp = ref.toy_model(6, seed=2, scale=2.0)
    dc = DistillConfig(**{**SMALL, "steps": 20, "learning_rate": 1e-2, "top_k": None,
                          "store_k": 6})
    res = distill((tc, tp), (dcf, dp), [[1, 2], [2, 3, 1], [4, 1]] * 4, [[1, 2]], dc, tmp_path,
                  progress=False)
    a0, a1 = res["heldout_acceptance"][0][1], res["heldout_acceptance"][-1][1]
    assert a1 > a0, (a0, a1)
    cfg = SpeculativeConfig(target=tc, draft=dcf, gamma=2, max_new_tokens=3)
    ids = np.tile(np.asarray([[1, 2]], np.int32), (20000, 1))
    out = spec.speculative_sample({"target": tp, "draft": res["params"]}, ids,
                                  jax.random.key(0), cfg)
    exact = ref.exact_sample_dist(ref.make_lp_fn(tc, tp), (1, 2), 3)
    r = ref.chi_square_test([tuple(s) for s in np.asarray(out.sequences[:, 0]).tolist()], exact)
    print(f"distilled draft (held-out acceptance {a0:.3f} -> {a1:.3f}): p={r.pvalue:.3g} "
          f"(chi2={r.statistic:.1f}, dof={r.dof}), "
          f"acceptance={float(out.stats['acceptance_rate']):.3f}")
    assert r.pvalue > 1e-3, r


def test_distill_cli_on_the_tiny_pair(bench_pair, tmp_path, capsys, monkeypatch):
    """``dsbd distill CONFIG`` on the tiny HF pair: checked config, a stop and a resume, the
    exported draft readable by ``load_model``; one-line errors for bad recipes."""
    from dsbd_jax import load_model
    from dsbd_jax.cli import main
    monkeypatch.setenv("DSBD_JAX_CACHE", str(tmp_path / "cache"))
    t, d, _, _ = bench_pair
    (tmp_path / "p.txt").write_text("hello there\nabc abc\nwhat is 2+2\nbye\n")
    (tmp_path / "h.txt").write_text("hi\n")
    cfg = tmp_path / "distill.yaml"
    cfg.write_text(f"name: tiny\ntarget: {t}\ndraft: {d}\nrun_dir: {tmp_path / 'run'}\n"
                   f"raw: true\ntrain_prompts: [{{file: {tmp_path / 'p.txt'}}}]\n"
                   f"heldout_prompts: [{{file: {tmp_path / 'h.txt'}}}]\n"
                   "distill: {steps: 4, batch_size: 2, warmup_steps: 1, max_new_tokens: 4, "
                   "store_k: 10, eval_every: 2, checkpoint_every: 2}\n")
    assert main(["distill", str(cfg), "--no-progress", "--stop-after", "2"]) == 0
    assert "step 2 of 4" in capsys.readouterr().out
    assert main(["distill", str(cfg)]) == 0
    out, err = capsys.readouterr()
    assert "load_model('tiny')" in out
    # one line per model on what it runs as, and why
    for role, m in (("target", t), ("draft", d)):
        assert f"{role} {m}: float32 (dtype: float32 in {cfg}); float weights (float: " in err
    m = load_model("tiny", progress=False)  # the preset-like name save_as (default: name)
    assert m.tokenizer is not None and m.config.vocab_size == load_model(d).config.vocab_size
    # the run's record (benchmarks/head_training.py reads a distillation recipe too)
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root))
    from benchmarks.head_training import main as record
    time_log = tmp_path / "time.log"
    time_log.write_text("\tElapsed (wall clock) time (h:mm:ss or m:ss): 0:42.5\n"
                        "\tMaximum resident set size (kbytes): 1024\n")
    rec = record([str(cfg), "--time-log", str(time_log), "--out", str(tmp_path / "d.json")])
    assert rec["command"] == f"dsbd distill {cfg}" and rec["wall_s"] == 42.5
    assert rec["meta"]["steps"] == 4 and rec["meta"]["loss"] == "fkl"
    log = rec["log"]
    # a start record per run: the fresh one (step 0) and the resumed one (step 2)
    assert [r["step"] for r in log if "heldout_acceptance" in r] == [0, 2, 2, 4]
    assert [r["step"] for r in log if r.get("start")] == [0, 2]
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"target: {t}\ndraft: {d}\ntrain_prompts: [{{file: x}}]\n"
                   "heldout_prompts: [{file: x}]\ndistill: {lr: 1}\n")
    assert main(["distill", str(bad)]) == 2
    assert "unknown distill settings ['lr']" in capsys.readouterr().err


def test_max_prompt_tokens_drops_long_prompts(bench_pair, tmp_path, capsys):
    """``max_prompt_tokens`` keeps the prompts of at most that many tokens, rejects a bad value,
    and says so when it leaves no prompt."""
    from dsbd_jax.cli import main
    from dsbd_jax.training.recipe import cap_prompts, load_recipe
    assert cap_prompts([[1], [1, 2, 3], [1, 2]], 2) == [[1], [1, 2]]
    assert cap_prompts([[1, 2, 3]], None) == [[1, 2, 3]]
    t, d, _, _ = bench_pair
    (tmp_path / "p.txt").write_text("hello there\n")
    base = (f"target: {t}\ndraft: {d}\nrun_dir: {tmp_path / 'run'}\nraw: true\n"
            f"train_prompts: [{{file: {tmp_path / 'p.txt'}}}]\n"
            f"heldout_prompts: [{{file: {tmp_path / 'p.txt'}}}]\n")
    for bad in ("0", "1.5", "true", "-3"):
        cfg = tmp_path / "bad.yaml"
        cfg.write_text(base + f"max_prompt_tokens: {bad}\n")
        with pytest.raises(ValueError, match="max_prompt_tokens must be a positive integer"):
            load_recipe(cfg)
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(base + "max_prompt_tokens: 1\n")
    assert main(["distill", str(cfg), "--no-progress"]) == 2
    assert "no prompt is at most max_prompt_tokens=1" in capsys.readouterr().err
