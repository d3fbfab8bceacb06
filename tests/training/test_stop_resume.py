"""Long training phases stop on Ctrl-C and resume from their last finished batch
(``dsbd_jax.training.rollouts``: ``ready``, ``BatchStore``): a head recipe's rollouts stopped
in their third batch compute only the missing batches on the rerun, with the same data; the
command line stops within seconds of SIGINT and says how to resume."""

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from ctrl_c import ctrl_c_after
from dsbd_jax.training import head as th
from dsbd_jax.training import head_data
from dsbd_jax.training.rollouts import BatchStore, fingerprint, ready

ROOT = Path(__file__).resolve().parents[2]


def _recipe(tmp_path, tiny, name="head_stop"):
    text = (ROOT / "configs" / "head_tiny.yaml").read_text()
    text = text.replace("/tmp/dsbd_tiny/target", str(tiny / "target"))
    text = text.replace("runs/head_tiny", str(tmp_path / "run"))
    text = text.replace("name: head_tiny", f"name: {name}")
    # rollouts: 10 prompts, 2 per batch -> 5 batches (sorted by length, one program per width)
    text += ("train_rollouts: [{task: gsm8k, start: 60, stop: 70}]\n"
             "rollout_tokens: 8\nrollout_batch: 2\n")
    p = tmp_path / f"{name}.yaml"
    p.write_text(text)
    return p


def test_ready_returns_and_raises():
    assert ready(lambda x: x + 1, np.int32(2)) == 3

    def bad():
        raise ValueError("inside")
    with pytest.raises(ValueError, match="inside"):
        ready(bad)


def test_batch_store_keeps_batches_of_its_own_data_only(tmp_path):
    s = BatchStore(tmp_path / "b", fingerprint([1, 2], "x"), "rollouts")
    s.put("000000", {"a": np.arange(3)})
    again = BatchStore(tmp_path / "b", fingerprint([1, 2], "x"), "rollouts")
    assert again.get("000000")["a"].tolist() == [0, 1, 2] and again.get("000002") is None
    assert not list((tmp_path / "b").glob(".*tmp*"))        # written whole, then renamed
    other = BatchStore(tmp_path / "b", fingerprint([1, 3], "x"), "rollouts")  # other data
    assert other.get("000000") is None and not list((tmp_path / "b").glob("*.npz"))


def test_stopped_rollouts_resume_from_the_last_finished_batch(tmp_path, tiny, monkeypatch):
    from dsbd_jax import load_model
    r = th.load_recipe(_recipe(tmp_path, tiny))
    cfg = r["train"]
    target = load_model(r["target"], progress=False)
    hc = th.head_config(target.config, r["head"])
    full = head_data.recipe_data(r, target, hc.feature_layers, cfg, progress=False)

    calls = []
    real = head_data._rollout_passes

    def stops_in_the_third(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    import shutil
    shutil.rmtree(Path(r["run_dir"]) / "data-parts")
    monkeypatch.setattr(head_data, "_rollout_passes", stops_in_the_third)
    with pytest.raises(KeyboardInterrupt):
        head_data.recipe_data(r, target, hc.feature_layers, cfg, progress=False)
    kept = sorted(p.name for p in (Path(r["run_dir"]) / "data-parts" / "train-rollouts")
                  .glob("*.npz"))
    assert kept == ["000000.npz", "000002.npz"]              # the two finished batches
    calls.clear()
    monkeypatch.setattr(head_data, "_rollout_passes", lambda *a, **k: (calls.append(1),
                                                                       real(*a, **k))[1])
    again = head_data.recipe_data(r, target, hc.feature_layers, cfg, progress=False)
    assert len(calls) == 3                                    # batches 3, 4, 5 only
    for a, b in zip(full, again):
        assert a.keys() == b.keys()
        for k in a:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def test_sigint_stops_train_head_at_once_and_says_how_to_resume(tmp_path, tiny):
    p = _recipe(tmp_path, tiny, "head_sigint")
    # forced options: a fresh cache would first measure XLA:CPU's (15-20 s), not this test's subject
    env = dict(os.environ, PYTHONPATH=str(ROOT), DSBD_JAX_CACHE=str(tmp_path / "cache"),
               DSBD_JAX_CPU_OPTIONS="default")
    code, err, took = ctrl_c_after(
        [sys.executable, "-u", "-m", "dsbd_jax", "train-head", str(p)],
        "target rollouts 2/10", env=env, cwd=ROOT, timeout=60)   # the first finished batch
    assert code == 130, err[-2000:]
    assert took < 5, took
    assert "stopped (Ctrl-C)" in err and "resumes" in err, err[-2000:]
    assert list((tmp_path / "run" / "data-parts" / "train-rollouts").glob("*.npz"))


def test_train_head_shows_its_rollouts_and_resumes_from_their_parts(tmp_path, tiny):
    """``dsbd train-head`` says what its rollouts will do as soon as the target is ready, says
    while a batch runs that it runs (a heartbeat, here every half second), is stopped by SIGINT
    after its first finished rollout batch, and the same command resumes: it reads the
    finished batches from ``RUN/data-parts`` (it says how many) and samples only the others."""
    import subprocess
    p = _recipe(tmp_path, tiny, "head_resume")
    env = dict(os.environ, PYTHONPATH=str(ROOT), DSBD_JAX_CACHE=str(tmp_path / "cache"),
               DSBD_JAX_CPU_OPTIONS="default", DSBD_JAX_HEARTBEAT_S="0.5")
    argv = [sys.executable, "-u", "-m", "dsbd_jax", "train-head", str(p)]
    import signal
    # a test lane runs in a script's background, where the shell starts every command with
    # SIGINT ignored and Python keeps ignoring it: give the child the default back (ctrl_c.py)
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if "target rollouts 2/10" in line:        # the first batch is kept: stop here,
                break                                # three batches before the run could end
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(lines)
    assert proc.returncode == 130, out
    ready_at = next(i for i, x in enumerate(lines) if "train-head: target " in x and " ready in " in x)
    start = next(i for i, x in enumerate(lines) if "target rollouts: 10 prompts in 5 batch(es)" in x)
    first_done = next(i for i, x in enumerate(lines) if "target rollouts 2/10" in x)
    assert ready_at < start < first_done, out            # said at once, before any batch ends
    # the target's dtype and weight kind, and why each, in one line after it is ready
    assert f"train-head: target {tiny / 'target'}: float32 (dtype: float32 in {p}); float weights (" \
        in lines[ready_at + 1], out
    assert "data-parts" in lines[start]
    assert any("running for" in x and "compiles first" in x for x in lines[start:first_done]), out
    kept = sorted((tmp_path / "run" / "data-parts" / "train-rollouts").glob("*.npz"))
    assert 1 <= len(kept) < 5, kept
    r = subprocess.run(argv + ["--stop-after", "1"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"{len(kept)} of them finished earlier, read from" in r.stdout, r.stdout
    done = [x for x in r.stdout.splitlines() if "train-head: target rollouts " in x
            and "/10 with their features" in x]
    assert len(done) == 5 - len(kept), r.stdout            # only the missing batches ran
    assert f"{len(kept)} batch(es) read from" in done[0]


def test_sigint_stops_train_head_in_its_training_phase(tmp_path, tiny):
    """Ctrl-C between training steps: the last checkpoint is kept and the rerun resumes there."""
    p = _recipe(tmp_path, tiny, "head_sigint_train")
    # long enough that the signal lands while it trains (a tiny step takes milliseconds)
    p.write_text(p.read_text().replace("steps: 20,", "steps: 5000,"))
    env = dict(os.environ, PYTHONPATH=str(ROOT), DSBD_JAX_CACHE=str(tmp_path / "cache"),
               DSBD_JAX_CPU_OPTIONS="default")
    argv = [sys.executable, "-u", "-m", "dsbd_jax", "train-head", str(p)]
    code, err, took = ctrl_c_after(argv, "step 10/5000", env=env, cwd=ROOT, timeout=60)
    assert code == 130, err[-2000:]
    assert took < 5, took
    assert "stopped (Ctrl-C)" in err and "resumes" in err, err[-2000:]
    from flax import serialization
    step = serialization.msgpack_restore((tmp_path / "run" / "checkpoint.msgpack")
                                         .read_bytes())["step"]
    assert 10 <= int(step) < 5000


def test_sigint_stops_distill_mid_rollouts_and_keeps_the_finished_batches(tmp_path, tiny):
    """``dsbd distill``'s progress bars are on stderr: Ctrl-C after its first rollout batch."""
    (tmp_path / "p.txt").write_text("".join(f"prompt number {i} says\n" for i in range(12)))
    (tmp_path / "h.txt").write_text("hi\n")
    cfg = tmp_path / "distill.yaml"
    cfg.write_text(f"name: tiny_sigint\ntarget: {tiny / 'target'}\ndraft: {tiny / 'draft'}\n"
                   f"run_dir: {tmp_path / 'run'}\nraw: true\n"
                   f"train_prompts: [{{file: {tmp_path / 'p.txt'}}}]\n"
                   f"heldout_prompts: [{{file: {tmp_path / 'h.txt'}}}]\n"
                   "distill: {steps: 4, batch_size: 2, warmup_steps: 1, max_new_tokens: 24, "
                   "store_k: 10, eval_every: 2, checkpoint_every: 2}\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT), DSBD_JAX_CACHE=str(tmp_path / "cache"),
               DSBD_JAX_CPU_OPTIONS="default")
    code, err, took = ctrl_c_after(
        [sys.executable, "-u", "-m", "dsbd_jax", "distill", str(cfg)],
        "rollouts (12 prompts):  33%", env=env, cwd=ROOT, timeout=60, stream="stderr")
    assert code == 130, err[-2000:]
    assert took < 5, took
    assert "stopped (Ctrl-C)" in err and "resumes" in err, err[-2000:]
    assert list((tmp_path / "run").glob("rollouts-*/*.npz"))


# benchmarks/head_training.py's parts: a stand-in run that stops on SIGINT with exit status 130
# (as train-head and distill do), then a second part that finishes
_PART = r"""
import signal, sys, time
signal.signal(signal.SIGINT, lambda *a: sys.exit(130))
print("part started", flush=True)
if sys.argv[1] == "stop":
    time.sleep(60)
"""
_WRAPPER = r"""
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from benchmarks.head_training import run_part
code, text = run_part("distill", "recipe.yaml", Path(sys.argv[2]),
                      argv=[sys.executable, "-c", sys.argv[3], sys.argv[4]])
print("wrapper saw exit status", code, flush=True)
"""


def test_a_recorded_run_keeps_the_time_of_a_part_stopped_by_ctrl_c(tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) stops the run but not
    the recording script, and the stopped part's /usr/bin/time report is kept in the run folder's
    time.log beside the next part's: the record of a resumed run has both parts."""
    import signal
    import subprocess
    import time
    sys.path.insert(0, str(ROOT))
    from benchmarks.head_training import time_reports
    run = tmp_path / "run"
    argv = [sys.executable, "-c", _WRAPPER, str(ROOT), str(run), _PART]
    proc = subprocess.Popen(argv + ["stop"], stdout=subprocess.PIPE, text=True,
                            start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert "part started" in proc.stdout.readline()
        time.sleep(0.5)
        os.killpg(proc.pid, signal.SIGINT)
        rest = proc.communicate(timeout=30)[0]
    finally:
        proc.kill()
    assert proc.returncode == 0 and "wrapper saw exit status 130" in rest, rest
    done = subprocess.run(argv + ["finish"], capture_output=True, text=True, timeout=60)
    assert "wrapper saw exit status 0" in done.stdout, done.stdout + done.stderr
    parts = time_reports((run / "time.log").read_text())
    assert [stopped for _, _, stopped in parts] == [True, False]
    assert parts[0][0] < 30 and all(rss > 0 for _, rss, _ in parts)
