"""Batched and resumable benchmark runs, and the intervals of the quality figures.

* ``plan_batches``: one bucket per batch, datasets and buckets take turns, deterministic.
* Per-prompt keys: a prompt gets the same key (so the same sample) in any batch.
* A batched run gives each prompt the completion it gets at batch size 1.
* An interrupted run (killed part way through a batch, a cut-off last line) resumes: records
  written are kept byte for byte, nothing is run twice, the result equals an uninterrupted run's,
  and a changed config is refused naming the key.
* ``dsbd bench`` stops within seconds of Ctrl-C in the middle of a batch that XLA is running,
  keeps the finished batches' records and says that the same command resumes (which it does:
  the records then resume as above).
* Wilson / bootstrap / paired intervals against known values; a wrong interval formula fails.
"""

import json
import os
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from bench_setup import bench_config, write_bench_config
from ctrl_c import ctrl_c_after
import dsbd_jax
from dsbd_jax.decoding import common
from dsbd_jax.decoding._jit import calls, inputs
from dsbd_jax.eval.plan import default_batch_size, make_config, plan_batches, prompt_keys
from dsbd_jax.eval.records import read_records, resume_state
from dsbd_jax.eval.run import CompileClock, run_bench
from dsbd_jax.eval.summary import format_summary, summary_of
from dsbd_jax.eval import stats

GSM_LOCAL = [  # short GSM8K-format problems (the byte-level tiny tokenizer makes long prompts)
    {"question": "1+1?", "answer": "one and one #### 2"},
    {"question": "2+3?", "answer": "#### 5"},
    {"question": "Half of 10?", "answer": "#### 5"},
    {"question": "What is 7 minus 4, in words and digits?", "answer": "#### 3"},
    {"question": "3*3?", "answer": "#### 9"},
]
METHODS = [{"method": "sample"}, {"method": "beam", "num_beams": 2},
           {"method": "dsbd", "gamma": 2, "draft_width": 2, "threshold": 0.9, "min_width": 1}]


def config(pair, gsm_file, **extra):
    settings = {"limit": 5, "max_new_tokens": 6, "warping": {"top_k": 10, "top_p": 0.8},
                "batch_size": 2, **extra}
    return make_config(bench_config(pair[0], pair[1], gsm_file, METHODS, **settings))


def run(cfg, out, pair):
    return run_bench(cfg, out, progress=False, log=lambda s: None,
                     models=(pair[2], pair[3]))


def samples(path):
    return [r for r in read_records(path) if r["type"] == "sample"]


def key_of(r):
    return r["label"], r["prompt_index"]


ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------------
def test_plan_batches_groups_by_bucket_and_takes_turns():
    buckets = [32, 64, 32, 32, 64, 32, 32]
    sources = [0, 0, 0, 1, 1, 1, 1]
    plan = plan_batches(buckets, sources, 2)
    assert plan == plan_batches(buckets, sources, 2)  # deterministic
    assert sorted(i for b in plan for i in b.prompts) == list(range(7))
    for b in plan:
        assert 1 <= len(b.prompts) <= 2 and {buckets[i] for i in b.prompts} == {b.bucket}
    assert [b.index for b in plan] == list(range(len(plan)))
    # bucket 32: sources interleave 0,1,0,1,1 -> (0,3) (2,5) (6); bucket 64: (1,4)
    assert [(b.bucket, b.prompts) for b in plan] == [(32, (0, 3)), (64, (1, 4)), (32, (2, 5)),
                                                     (32, (6,))]
    assert [len(b.prompts) for b in plan_batches(buckets, sources, 1)] == [1] * 7
    with pytest.raises(ValueError, match="batch_size"):
        plan_batches(buckets, sources, 0)


def test_prompt_keys_do_not_depend_on_the_batch():
    k = prompt_keys(3, [5, 0, 5])
    single = inputs.row_keys(jax.random.fold_in(jax.random.key(3), 5), 1)
    np.testing.assert_array_equal(jax.random.key_data(k[0]), jax.random.key_data(single[0]))
    np.testing.assert_array_equal(jax.random.key_data(k[0]), jax.random.key_data(k[2]))
    assert not np.array_equal(jax.random.key_data(k[0]), jax.random.key_data(k[1]))


def test_batch_size_is_validated(pair, gsm_file):
    assert config(pair, gsm_file, batch_size=None)["batch_size"] == default_batch_size()
    for bad in (0, -1, 1.5, True, "4"):
        with pytest.raises(ValueError, match="batch_size must be an int >= 1"):
            config(pair, gsm_file, batch_size=bad)


def test_batched_run_matches_batch_one(tmp_path, pair, gsm_file):
    """Each prompt's completion and log-likelihood do not depend on its batch mates (keys are
    per prompt), the last short batch is filled up without records for the fillers, and the
    speed is the batch's: tokens / summed batch wall time."""
    # warmup 0: compiled ahead of time, no untimed runs (which would double this test's work)
    one = run(config(pair, gsm_file, batch_size=1, warmup=0), tmp_path / "b1", pair)
    two = run(config(pair, gsm_file, batch_size=2, warmup=0), tmp_path / "b2", pair)
    r1 = {key_of(r): r for r in samples(tmp_path / "b1" / "records.jsonl")}
    r2 = {key_of(r): r for r in samples(tmp_path / "b2" / "records.jsonl")}
    assert set(r1) == set(r2) and len(r2) == 3 * 5
    for k in r1:
        assert r1[k]["completion"] == r2[k]["completion"], k
        assert r1[k]["loglik"] == pytest.approx(r2[k]["loglik"], abs=1e-4), k
    assert {r["batch_size"] for r in r2.values()} == {2}
    batches = {}
    for r in r2.values():
        batches.setdefault((r["label"], r["batch"]), []).append(r)
    assert sorted(len(v) for v in batches.values()).count(1) == 3  # 5 prompts: 2 + 2 + 1
    for rs in batches.values():
        assert len({r["batch_seconds"] for r in rs}) == 1
        assert sum(r["seconds"] for r in rs) == pytest.approx(rs[0]["batch_seconds"])
    row = {r["label"]: r for r in two["rows"]}["sample"]
    secs = sum(v[0]["batch_seconds"] for (lab, _), v in batches.items() if lab == "sample")
    assert row["tokens_per_s"] == pytest.approx(5 * 6 / secs)
    # decode speed = tokens / (batch seconds - the prompt passes' seconds, timed alone): the
    # records carry each batch's prefill share, and the row is that arithmetic (which of the two
    # times is longer is the host's timing, not a property to assert on tiny models)
    pres = [r["prefill_s"] for r in r2.values() if r["label"] == "sample"]
    assert all(isinstance(p, float) and p > 0 for p in pres)
    for rs in batches.values():
        assert len({r["prefill_s"] for r in rs}) == 1  # the batch's prompt pass, shared out
    decode = secs - sum(pres)
    assert row["batch_size"] == 2
    if decode > 0:
        assert row["decode_tokens_per_s"] == pytest.approx(5 * 6 / decode)
    else:
        assert row["decode_tokens_per_s"] is None
    assert row["target_calls_per_token"] == pytest.approx(1.0)
    assert {r["label"]: r for r in one["rows"]}["sample"]["batch_size"] == 1
    assert two["complete"] and two["done"] == two["total"] == 15


class Killed(Exception):
    pass


def test_interrupted_run_resumes(tmp_path, pair, gsm_file, monkeypatch):
    cfg = config(pair, gsm_file)
    run(cfg, tmp_path / "full", pair)
    full = {key_of(r): r for r in samples(tmp_path / "full" / "records.jsonl")}

    # kill the run while it scores the 7th record: 3 batch-method calls of 2 were written
    calls = [0]
    from dsbd_jax.eval import tasks

    def dying_score(ex, completion, *a, **k):
        calls[0] += 1
        if calls[0] == 7:
            raise Killed
        return real(ex, completion, *a, **k)
    real = tasks.score
    monkeypatch.setattr(tasks, "score", dying_score)
    out = tmp_path / "part"
    with pytest.raises(Killed):
        run(cfg, out, pair)
    monkeypatch.setattr(tasks, "score", real)
    path = out / "records.jsonl"
    written = path.read_bytes()
    assert len(samples(path)) == 6
    partial = summary_of(path)  # a stopped run can be summarised as it is
    assert (partial["done"], partial["total"], partial["complete"]) == (6, 15, False)
    assert "PARTIAL run: 6/15 done" in format_summary(partial)
    # and a kill in the middle of a line: the cut-off line is dropped on resume
    path.write_bytes(written + b'{"type": "sample", "label": "sam')

    # a changed config is refused before anything runs, naming what changed
    with pytest.raises(ValueError, match="differs in: max_new_tokens"):
        run(config(pair, gsm_file, max_new_tokens=7), out, pair)
    with pytest.raises(ValueError, match="differs in: batch_size"):
        run(config(pair, gsm_file, batch_size=1), out, pair)
    assert path.read_bytes().startswith(written)

    # warmup may change between sessions (it only decides how compiling is kept out of timings)
    summary = run(config(pair, gsm_file, warmup=0), out, pair)
    text = path.read_bytes()
    assert text.startswith(written)  # the records written before the kill are kept as they were
    recs = read_records(path)
    assert [r["type"] for r in recs].count("run") == 1
    assert [r["type"] for r in recs].count("resume") == 1
    got = [key_of(r) for r in recs if r["type"] == "sample"]
    assert len(got) == len(set(got)) == 15  # nothing duplicated, nothing missing
    for r in recs:
        if r["type"] == "sample":
            assert r["completion"] == full[key_of(r)]["completion"]
    assert summary["complete"] and summary["done"] == 15
    # a finished run started again does nothing but re-summarize
    again = run(cfg, out, pair)
    assert len(samples(path)) == 15 and again["complete"]


@pytest.mark.parametrize("method, setting", [
    ("sample", {}), ("beam", {"num_beams": 2}), ("beam_search", {"num_beams": 2}),
    ("spec", {"gamma": 2}), ("tree", {"gamma": 2, "tree_widths": (2, 1)}),
    ("dsbd", {"gamma": 2, "draft_width": 2, "threshold": 0.9, "min_width": 1})])
def test_compile_ahead_of_time(pair, method, setting):
    """``Decoder.compiled`` compiles the program the call runs, without running it: the call that
    follows neither traces nor compiles, and gives what the compiled program gives."""
    from dsbd_jax.decoding.methods import build, model_params
    CompileClock.install()
    dec = build(method, pair[2].config, pair[3].config, max_new_tokens=5, top_k=10,
                eos_token_id=(), **setting)
    params = model_params(dec, pair[2].params, pair[3].params)
    ids, lengths = common.pad_prompts([[5, 6, 7], [8, 9]], pad_id=0, length=8)
    keys = prompt_keys(3, [0, 1])
    call = dec.core_call(params, ids, keys, prompt_lengths=lengths)
    assert isinstance(call, calls.CoreCall) and set(call.kwargs) == {"config"}
    clock = CompileClock.total()
    compiled = dec.compiled(params, ids, keys, prompt_lengths=lengths)
    assert CompileClock.total() > clock  # it compiled ...
    traces, clock = dsbd_jax.compile_count(), CompileClock.total()
    out = dec(params, ids, keys, prompt_lengths=lengths)
    assert dsbd_jax.compile_count() == traces  # ... so the call neither traces
    assert CompileClock.total() == clock  # nor compiles
    direct = compiled(*call.args)
    np.testing.assert_array_equal(np.asarray(out.sequences), np.asarray(direct.sequences))
    with pytest.raises(ValueError):  # the host-side checks run before anything is captured
        dec.core_call(params, ids, keys, prompt_lengths=np.array([9, 2]))


def test_resume_refuses_foreign_files(tmp_path, pair, gsm_file):
    cfg = config(pair, gsm_file)
    p = tmp_path / "records.jsonl"
    p.write_text('{"type": "sample"}\n')
    with pytest.raises(ValueError, match="not a run header"):
        resume_state(p, cfg)
    p.write_text('{"type": "run", "config": {}}\nnot json\n{"type": "sample"}\n')
    with pytest.raises(ValueError, match=":2: not a JSON line"):
        resume_state(p, cfg)
    assert resume_state(tmp_path / "none.jsonl", cfg) is None


# ---------------------------------------------------------------------------------------------
def test_wilson_interval_known_values():
    # 0/10: [0, z^2/(n+z^2)] = [0, 0.2775]; 5/10: 0.5 +- 0.2634 (Wilson 1927; Agresti & Coull 1998)
    iv = stats.wilson_interval(0, 10)
    assert iv["lo"] == 0 and iv["hi"] == pytest.approx(0.27753, abs=1e-4)
    iv = stats.wilson_interval(5, 10)
    assert iv["lo"] == pytest.approx(0.23659, abs=1e-4) and iv["hi"] == pytest.approx(0.76341, abs=1e-4)
    iv = stats.wilson_interval(40, 40)
    assert iv["hi"] == 1 and iv["lo"] == pytest.approx(0.91238, abs=1e-4)
    assert stats.wilson_interval(0, 0)["mean"] is None
    # the rate always lies inside its interval (rounding put 0/3, 10/10, ... a hair outside,
    # which made the plots' error bars negative)
    for n in range(1, 61):
        for k in range(n + 1):
            iv = stats.wilson_interval(k, n)
            assert 0 <= iv["lo"] <= k / n <= iv["hi"] <= 1, (k, n)


def test_intervals_cover_at_their_level():
    """Exact coverage at n = 40 (summed over the binomial distribution, no simulation noise):
    Wilson's 95% interval holds the true rate 92-97% of the time over rates 0.02-0.8 (its
    coverage oscillates around 95%; Brown, Cai & DasGupta 2001). The Wald interval, the formula
    Wilson corrects, covers only 55% at a rate of 0.02 and 87% at 0.05, so it fails this test.
    The bootstrap interval of a mean covers 88-99% over 200 simulated runs (the rate's sd is 1.5%)."""
    import math
    n = 40

    def coverage(interval, p):
        pmf = [math.comb(n, k) * p ** k * (1 - p) ** (n - k) for k in range(n + 1)]
        return sum(m for k, m in enumerate(pmf) if interval(k)[0] <= p <= interval(k)[1])

    def wilson(k):
        iv = stats.wilson_interval(k, n)
        return iv["lo"], iv["hi"]

    def wald(k):
        h = stats.Z95 * math.sqrt(k / n * (1 - k / n) / n)
        return k / n - h, k / n + h

    for p in (0.02, 0.05, 0.1, 0.3, 0.5, 0.8):
        assert 0.92 <= coverage(wilson, p) <= 0.97, p
    assert coverage(wald, 0.02) < 0.9 and coverage(wald, 0.05) < 0.9
    mu, hits = -0.3, 0
    for s in range(200):
        x = np.random.default_rng(100 + s).normal(mu, 0.2, size=40)
        iv = stats.bootstrap_interval(x, seed=s, resamples=2000)
        hits += iv["lo"] <= mu <= iv["hi"]
    assert 0.88 <= hits / 200 <= 0.99


def test_paired_difference():
    a = {i: float(i % 2) for i in range(40)}
    d = stats.paired_difference(a, dict(a))
    assert d["mean"] == 0 and d["lo"] == 0 and d["hi"] == 0 and d["p_a_better"] == 0
    b = {i: 0.0 for i in range(30)}  # only the 30 shared keys count
    d = stats.paired_difference(a, b)
    assert d["n"] == 30 and d["mean"] == pytest.approx(0.5) and 0.3 < d["lo"] < 0.5 < d["hi"]
    assert d["p_a_better"] == 1.0
    assert stats.paired_difference({}, b)["n"] == 0


def _sample_record(label, method, task, i, score, ll):
    return {"type": "sample", "label": label, "method": method, "task": task,
            "example_id": f"{task}/{i}", "prompt_index": (0 if task == "humaneval" else 100) + i,
            "metric": "pass@1" if task == "humaneval" else "exact_match", "score": score,
            "loglik_per_token": ll}


def test_quality_differences_pooled_and_pairs():
    """``pooled/task_metric`` pairs every task-metric prompt of two tasks together (its mean is
    the mean over both tasks' prompts, its n their sum); explicit ``pairs`` compare two non-DSBD
    settings; an unknown label is an error, not an empty table."""
    from dsbd_jax.eval.summary import quality_differences
    rng = np.random.default_rng(0)
    recs = []
    for task, n in (("humaneval", 30), ("gsm8k", 10)):
        for i in range(n):
            s = float(rng.random() < 0.5)
            recs.append(_sample_record("dsbd A", "dsbd", task, i, 1.0, -0.1))
            recs.append(_sample_record("beam W=4", "beam", task, i, s, -0.1))
            recs.append(_sample_record("sample", "sample", task, i, 0.0, -0.3))
    ds = {(d["dsbd"], d["baseline"], d["figure"]): d for d in quality_differences(recs)}
    assert {k[:2] for k in ds} == {("dsbd A", "beam W=4"), ("dsbd A", "sample")}  # DSBD vs others
    pooled = ds[("dsbd A", "beam W=4", "pooled/task_metric")]
    beam = [r["score"] for r in recs if r["label"] == "beam W=4"]
    assert pooled["n"] == 40 and pooled["mean"] == pytest.approx(1 - np.mean(beam))
    he = ds[("dsbd A", "beam W=4", "humaneval/pass@1")]
    assert he["n"] == 30 and pooled["hi"] - pooled["lo"] < he["hi"] - he["lo"] + 1e-9
    assert ds[("dsbd A", "sample", "pooled/task_metric")]["mean"] == 1.0
    # explicit pairs: the yardstick, beam minus sampling
    yard = quality_differences(recs, [("beam W=4", "sample")])
    assert {d["figure"] for d in yard} >= {"pooled/task_metric", "gsm8k/loglik_per_token"}
    assert next(d for d in yard if d["figure"] == "pooled/task_metric")["mean"] == \
        pytest.approx(np.mean(beam))
    with pytest.raises(ValueError, match="no records for 'beam W=8'"):
        quality_differences(recs, [("beam W=8", "sample")])
    # one task metric only: no pooled figure (it would repeat the task's row)
    one = [r for r in recs if r["task"] == "gsm8k"]
    assert not any(d["figure"].startswith("pooled") for d in quality_differences(one))


def test_quality_report_script(tmp_path, pair, gsm_file):
    """benchmarks/quality_report.py on a finished tiny run: the three tables, the run's ratios
    (tokens/s of the two rows), and report.json."""
    import subprocess
    import sys
    from pathlib import Path
    out = tmp_path / "run"
    summary = run(config(pair, gsm_file), out, pair)
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "quality_report.py"
    res = subprocess.run([sys.executable, str(script), str(out)], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    text = (out / "report.md").read_text()
    assert "(complete; batch size 2; 1 part(s), one per start of `dsbd bench`)" in text
    assert "| dsbd g=2 WS=2 t=0.9 Wmin=1 | beam W=2 |" in text
    assert "gsm8k/exact_match % [95%]" in text and "gsm8k loglik/tok [95%]" in text
    rows = {r["label"]: r for r in summary["rows"]}
    report = json.loads((out / "report.json").read_text())
    r = next(x for x in report["ratios"] if x["baseline"] == "sample")
    assert r["speedup"] == pytest.approx(rows[r["dsbd"]]["tokens_per_s"] / rows["sample"]["tokens_per_s"])
    assert "| dsbd g=2 WS=2 t=0.9 Wmin=1 | sample | gsm8k/exact_match |" in text
    assert "### The yardstick: beam sampling minus sampling" in text
    assert "| beam W=2 | sample | gsm8k/exact_match |" in text
    assert report["yardstick"][0]["dsbd"] == "beam W=2"


# ``dsbd bench`` with every decoder call after the first batch's two (its warm-up and its timed
# call) preceded by minutes of XLA work (a jitted loop of small products), so that the signal
# comes while XLA runs the batch. jax's wait for a computation (and for a compile) sees the
# signal and raises KeyboardInterrupt in the command's thread; the command line then says what
# is kept and leaves at once (cli.commands.main).
SLOW_BENCH = r"""
import sys
import jax, jax.numpy as jnp
from dsbd_jax.decoding import methods
build, calls = methods.build, [0]
busy = jax.jit(lambda x: jax.lax.fori_loop(0, 10_000_000, lambda i, y: jnp.tanh(y @ y), x))

class Slow:
    def __init__(self, dec):
        self._dec = dec
    def __getattr__(self, name):
        return getattr(self._dec, name)
    def __call__(self, *args, **kwargs):
        calls[0] += 1
        if calls[0] > 2:
            x = jax.block_until_ready(jnp.eye(64) * 0.5)
            busy.lower(x).compile()
            print("SLOW BATCH", flush=True)
            jax.block_until_ready(busy(x))
        return self._dec(*args, **kwargs)

methods.build = lambda *a, **k: Slow(build(*a, **k))
from dsbd_jax.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_sigint_stops_bench_in_the_middle_of_a_batch(tmp_path, pair, gsm_file):
    cfg_path = write_bench_config(tmp_path / "bench.yaml", pair[0], pair[1], gsm_file,
                                  [{"method": "sample"}], limit=2, batch_size=1)
    out = tmp_path / "out"
    # forced options: a fresh cache would first measure XLA:CPU's (15-20 s), not this test's subject
    env = dict(os.environ, PYTHONPATH=str(ROOT), DSBD_JAX_CACHE=str(tmp_path / "cache"),
               DSBD_JAX_CPU_OPTIONS="default")
    # the second batch has started in XLA; a blocking call would hold the signal for minutes
    code, err, took = ctrl_c_after(
        [sys.executable, "-u", "-c", SLOW_BENCH, "bench", str(cfg_path), "--out", str(out),
         "--no-progress"], "SLOW BATCH", env=env, cwd=ROOT, timeout=30, settle=1.0)
    assert code == 130, err[-2000:]
    assert took < 5, took
    assert "dsbd bench: stopped (Ctrl-C)" in err and "resumes" in err, err[-2000:]
    # the first batch's record is kept, and the same config resumes after it
    path = out / "records.jsonl"
    assert [r["prompt_index"] for r in samples(path)] == [0]
    from dsbd_jax.eval.plan import load_config
    assert resume_state(path, load_config(cfg_path))["done"] == {("sample", 0)}


def test_quality_report_against_another_run():
    """``quality_report.against``: each setting of one run minus the same setting of another on
    the same problems (paired by task and example, whatever the prompt order), task metrics
    only (no log-likelihood: each run's is its own target's), and the settings only one run
    holds named."""
    from benchmarks.quality_report import against, against_table
    rng = np.random.default_rng(1)
    this, other = [], []
    for task, n in (("humaneval", 12), ("gsm8k", 8)):
        for i in range(n):
            s = float(rng.random() < 0.5)
            this.append(_sample_record("beam W=4", "beam", task, i, 1.0, -0.1))
            this.append(_sample_record("dsbd A", "dsbd", task, i, s, -0.1))
            # the other run met the problems in another order, and has a setting of its own
            o = _sample_record("beam W=4", "beam", task, i, s, -0.5)
            other.append(dict(o, prompt_index=1000 - o["prompt_index"]))
            other.append(_sample_record("dsbd A", "dsbd", task, i, s, -0.5))
            other.append(_sample_record("sample", "sample", task, i, 0.0, -0.5))
    diffs, here, there = against(this, other)
    assert here == [] and there == ["sample"]
    by = {(d["dsbd"], d["figure"]): d for d in diffs}
    assert not any(f.endswith("loglik_per_token") for _, f in by)
    beam = [r["score"] for r in other if r["label"] == "beam W=4"]
    pooled = by[("beam W=4", "pooled/task_metric")]
    assert pooled["n"] == 20 and pooled["mean"] == pytest.approx(1 - np.mean(beam))
    same = by[("dsbd A", "pooled/task_metric")]
    assert same["mean"] == 0 and same["lo"] == 0 and same["hi"] == 0
    assert by[("dsbd A", "humaneval/pass@1")]["n"] == 12
    table = against_table(diffs)
    assert "| beam W=4 | pooled/task_metric | +" in table and "| dsbd A | gsm8k/exact_match |" in table
