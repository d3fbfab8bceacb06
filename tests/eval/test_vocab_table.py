"""Token-frequency tables and the ``dsbd vocab`` command (dsbd_jax.eval.vocab,
dsbd_jax.models.vocab), ``load_model(head_rows=...)``, and the sharding rules of the new leaves."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dsbd_jax.cli import main
from dsbd_jax.models import vocab as mv


def test_top_rows_ties_keep_and_errors():
    counts = np.array([5, 0, 7, 5, 1, 0])
    np.testing.assert_array_equal(mv.top_rows(counts, 3), [0, 2, 3])      # 7, 5, 5 (lower id)
    np.testing.assert_array_equal(mv.top_rows(counts, 3, keep=[5]), [0, 2, 5])
    np.testing.assert_array_equal(mv.top_rows(counts, 6), np.arange(6))
    with pytest.raises(ValueError, match=r"\[1, 6\]"):
        mv.top_rows(counts, 0)
    with pytest.raises(ValueError, match="do not fit"):
        mv.top_rows(counts, 1, keep=[1, 2])
    with pytest.raises(ValueError, match=r"\[0, 6\)"):
        mv.count_tokens([[1, 9]], 6)


def test_table_round_trip_and_places(tmp_path):
    p = mv.save_table(tmp_path / "t.npz", np.arange(4), {"sources": ["x"]})
    counts, meta = mv.load_table(p)
    np.testing.assert_array_equal(counts, np.arange(4))
    assert meta == {"sources": ["x"]}
    assert mv.table_path(tmp_path) == tmp_path / "dsbd_vocab.npz"
    assert mv.table_path(p) == tmp_path / "t.npz.dsbd_vocab.npz"
    assert mv.table_path("some-preset", cache_dir=tmp_path) == tmp_path / "vocab/some-preset.npz"
    with pytest.raises(ValueError, match="dsbd vocab build"):
        mv.find_table("some-preset", cache_dir=tmp_path)
    shipped = mv.find_table("qwen2.5-coder-0.5b-instruct", cache_dir=tmp_path)
    counts, meta = mv.load_table(shipped)
    assert counts.shape == (151936,) and counts.sum() > 100_000
    assert "task:gsm8k:40:" in meta["sources"] and "task:humaneval:40:" in meta["sources"]


def test_task_slices_are_training_side_text():
    from dsbd_jax.eval import vocab as ev
    assert ev.parse_slice("gsm8k:40:") == ("gsm8k", 40, -1)
    assert ev.parse_slice("humaneval:40:164") == ("humaneval", 40, 164)
    for bad in ("gsm8k", "gsm8k:a:b", "gsm8k:5:5", ":1:2"):
        with pytest.raises(ValueError, match="slice"):
            ev.parse_slice(bad)
    texts = ev.task_texts("gsm8k:40:42")
    assert len(texts) == 2 and "####" in texts[0]  # the worked answer is counted


def test_vocab_cli_and_load_model(bench_pair, tmp_path, capsys):
    from dsbd_jax import load_model
    t, d, _, draft = bench_pair
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(json.dumps({"text": s, "n": 1}) for s in ("abc abc", "bca")))
    assert main(["vocab", "build", "--model", str(d), "--text", str(corpus)]) == 0
    counts, meta = mv.load_table(mv.table_path(d))
    tok = draft.tokenizer
    want = mv.count_tokens([tok(s, add_special_tokens=False)["input_ids"]
                            for s in ("abc abc", "bca")], draft.config.vocab_size)
    np.testing.assert_array_equal(counts, want)
    assert meta["sources"] == [f"text:{corpus}"]
    # generations add exactly the sampled tokens (<= prompts x max_new_tokens)
    prompts = tmp_path / "p.txt"
    prompts.write_text("hi\nabc\n")
    out = tmp_path / "gen.npz"
    assert main(["vocab", "build", "--model", str(d), "--generate-with", str(t), "--prompts",
                 str(prompts), "--max-new-tokens", "4", "--out", str(out)]) == 0
    g, _ = mv.load_table(out)
    assert 2 <= g.sum() <= 8
    assert f"generator {t}: float32 (auto for sampling: a small model" in capsys.readouterr().err
    assert main(["vocab", "show", str(out), "--n", "3"]) == 0
    assert "N =      3" in capsys.readouterr().out
    # load_model picks the table beside the model up
    m = load_model(d, progress=False, head_rows=5)
    rows = np.asarray(m.params["vocab_head"]["rows"])
    assert len(rows) == 5 and m.info["head_rows"] == 5
    assert set(np.flatnonzero(counts)) <= set(rows) | set(np.argsort(-counts, kind="stable")[5:])
    assert set(m.config.eos_token_id or ()) <= set(rows.tolist())
    with pytest.raises(ValueError, match="head_rows is not"):
        load_model(d, progress=False, vocab_table=out)
    # one-line errors
    assert main(["vocab", "build", "--model", str(d)]) == 2
    assert main(["vocab", "build", "--model", str(d), "--task", "gsm8k:x:"]) == 2
    assert main(["vocab", "build", "--model", str(d), "--generate-with", str(t)]) == 2
    err = capsys.readouterr().err
    assert err.count("dsbd: error:") == 3


def test_sharding_rules_cover_the_truncated_head():
    import jax
    from exact_reference import toy_model
    from dsbd_jax.parallel import logical_axes
    from dsbd_jax.parallel.mesh import make_mesh
    from dsbd_jax.parallel.rules import ShardingRules
    assert logical_axes(("vocab_head", "rows"), 1) == ("head_rows",)
    assert logical_axes(("vocab_head", "kernel"), 2) == ("embed", "head_rows")
    assert logical_axes(("vocab_head", "embedding"), 2) == ("head_rows", "embed")
    for tie in (False, True):
        cfg, params = toy_model(6, seed=0, tie_word_embeddings=tie)
        cut = mv.truncate_head(params, cfg, [1, 2, 4])
        specs = ShardingRules(make_mesh(1, 1)).param_specs(cfg, cut)
        leaf = "kernel" if not tie else "embedding"
        assert specs["vocab_head"][leaf] == jax.sharding.PartitionSpec(None, None)


def test_sharded_decoder_takes_a_truncated_draft():
    """A truncated draft through ShardedDecoder (a (1, 1) mesh): the single-device result."""
    import jax
    from exact_reference import toy_model
    from dsbd_jax.decoding.configs import SpeculativeConfig
    from dsbd_jax.decoding.speculative import speculative_sample
    from dsbd_jax.parallel import ShardedDecoder, make_mesh
    tc, tp = toy_model(6, seed=1)
    dc, dp = toy_model(6, seed=2)
    cfg = SpeculativeConfig(target=tc, draft=dc, gamma=2, max_new_tokens=4, eos_token_id=())
    ids = np.array([[1, 2, 3], [3, 2, 1]], np.int32)
    dec = ShardedDecoder(speculative_sample, cfg, make_mesh(1, 1))
    for prompt_rows in (False, True):  # with prompt rows, the full kernel is placed too
        params = {"target": tp, "draft": mv.truncate_head(dp, dc, [0, 2, 3],
                                                          prompt_rows=prompt_rows)}
        out = dec(dec.place(params), ids, jax.random.key(3))
        ref = speculative_sample(params, ids, jax.random.key(3), cfg)
        np.testing.assert_array_equal(np.asarray(out.sequences), np.asarray(ref.sequences))


def test_generate_with_a_truncated_draft(bench_pair, tmp_path, capsys):
    """``dsbd generate --draft-head-rows N``: the draft's head cut to N rows of its table."""
    t, d, _, draft = bench_pair
    table = mv.save_table(tmp_path / "t.npz", np.arange(draft.config.vocab_size))
    args = ["generate", "--target", str(t), "--draft", str(d), "--prompt", "hi", "--method",
            "spec", "--max-new-tokens", "4", "--no-progress", "--raw"]
    assert main(args + ["--draft-head-rows", "6", "--draft-vocab-table", str(table)]) == 0
    assert "draft head truncated to 6 rows" in capsys.readouterr().err
    assert main(args + ["--draft-head-rows", "3", "--draft-vocab-table", str(table),
                        "--draft-prompt-rows"]) == 0
    assert "3 rows" in capsys.readouterr().err
    assert main(args + ["--draft-prompt-rows"]) == 2
    assert "need --draft-head-rows" in capsys.readouterr().err
    assert main(args + ["--draft-vocab-table", str(table)]) == 2
    assert "need --draft-head-rows" in capsys.readouterr().err
    from dsbd_jax import load_model
    with pytest.raises(ValueError, match="give head_rows"):
        load_model(d, progress=False, prompt_rows=True)
    m = load_model(d, progress=False, head_rows=4, vocab_table=table, prompt_rows=True)
    assert m.info["prompt_rows"] and mv.has_prompt_rows(m.params)


def test_rollout_counts_are_expected_counts(tmp_path):
    """Each real position adds its stored probabilities (one token's worth); padded positions
    add nothing; the table keeps fractional counts and ranks by them."""
    idx = np.array([[[1, 2], [3, 1]], [[4, 0], [2, 3]]])
    p = np.array([[[0.75, 0.25], [0.5, 0.5]], [[1.0, 0.0], [0.9, 0.1]]])
    mask = np.array([[True, True], [True, False]])
    got = mv.rollout_counts({"idx": idx, "p": p, "mask": mask}, 6)
    np.testing.assert_allclose(got, [0.0, 1.25, 0.25, 0.5, 1.0, 0.0])
    assert got.sum() == pytest.approx(mask.sum())
    data = tmp_path / "data_train.npz"
    np.savez(data, idx=idx, p=p, mask=mask, tokens=np.zeros((2, 3)))
    np.testing.assert_allclose(mv.rollout_counts(data, 6), got)
    table = mv.save_table(tmp_path / "t.npz", got + np.arange(6))
    counts, _ = mv.load_table(table)
    assert counts.dtype == np.float64 and counts[1] == pytest.approx(2.25)
    np.testing.assert_array_equal(mv.top_rows(counts, 2), [4, 5])  # 5.0 and 5.0 > 3.5 ...
    assert mv.load_table(mv.save_table(tmp_path / "i.npz", np.arange(3.0)))[0].dtype == np.int64
    with pytest.raises(ValueError, match="stored target distributions"):
        np.savez(tmp_path / "bad.npz", tokens=np.zeros(3))
        mv.rollout_counts(tmp_path / "bad.npz", 6)
    with pytest.raises(ValueError, match=r"\[0, 6\)"):
        mv.rollout_counts({"idx": idx + 5, "p": p, "mask": mask}, 6)
    with pytest.raises(ValueError, match="one finite count"):
        mv.save_table(tmp_path / "n.npz", np.array([1.0, -0.5]))


def test_vocab_cli_rollouts_source(bench_pair, tmp_path):
    """``dsbd vocab build --rollouts`` adds a distill run's stored distributions."""
    _, d, _, draft = bench_pair
    V = draft.config.vocab_size
    data = tmp_path / "data_train.npz"
    np.savez(data, idx=np.array([[[7, 9]]]), p=np.array([[[0.6, 0.4]]]),
             mask=np.array([[True]]))
    out = tmp_path / "r.npz"
    assert main(["vocab", "build", "--model", str(d), "--rollouts", str(data),
                 "--out", str(out)]) == 0
    counts, meta = mv.load_table(out)
    assert counts.shape == (V,) and counts[7] == pytest.approx(0.6)
    assert counts[9] == pytest.approx(0.4) and counts.sum() == pytest.approx(1.0)
    assert meta["sources"] == [f"rollouts:{data}"]
