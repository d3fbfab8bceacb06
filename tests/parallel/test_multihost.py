"""Many processes (JAX's multi-controller runtime): 2 processes x 4 virtual CPU devices, one global
mesh ``data=4, model=2``, started here as subprocesses (``tests/parallel/multihost_worker.py``)
with a coordinator on a free local port and gloo collectives.

- every decoder, each process passing its own prompts (3 and 5 of a batch of 8), equals the
  one-device run on the whole batch (a third subprocess): tokens bit for bit, log-likelihoods and
  float stats to float rounding; ``gather="all"`` gives every process the whole batch. CI runs
  DSBD (its weights placed onto each process's shards as they load), beam sampling and
  speculative sampling (``CI_METHODS``: beams, a drafted chain, a forest); the other decoders,
  which differ from these only in the rule each step applies, not in what crosses processes,
  are the extended test's;
- inputs the processes disagree on raise a ValueError on every process;
- a process killed mid-run ends the other with a non-zero exit and a clear message within
  ``FAULT_BOUND_S`` seconds.

Every subprocess has a timeout, so a hang fails the test instead of blocking CI. The pure helpers
of ``dsbd_jax.parallel.distributed`` are tested below on one device.
"""

import os
import random
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
WORKER = HERE / "multihost_worker.py"
TIMEOUT_S = 900       # a hang fails the test after this (the decode took 220-320 s here)
SPLIT = [slice(0, 3), slice(3, 8)]
# the survivor of a killed process exits within this many seconds of its death (heartbeat 10 s,
# parallel.distributed.HEARTBEAT_TIMEOUT_S, plus slack for a loaded 2-core CI host)
FAULT_BOUND_S = 30


def free_port() -> int:
    """A free port for the coordinator, drawn below the kernel's ephemeral range
    (``/proc/sys/net/ipv4/ip_local_port_range``, 32768-60999 by default): the coordinator binds
    it seconds later, and a port from the ephemeral range could meanwhile be handed to any
    other socket on the machine (the other test lane's notebook kernels, gloo's connections)."""
    rng = random.Random(os.getpid() ^ time.time_ns())
    for _ in range(200):
        port = rng.randrange(20000, 32000)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port in 20000-32000")


def worker_env(devices: int):
    """Every subprocess (the processes and the one-device reference alike) compiles at XLA's
    backend optimisation level 0: about a third less compile time, which dominates here."""
    flags = f"--xla_force_host_platform_device_count={devices} --xla_backend_optimization_level=0"
    return dict(os.environ, XLA_FLAGS=flags,
                JAX_PLATFORMS="cpu", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1",
                PYTHONPATH=os.pathsep.join([str(HERE.parents[1]),
                                            os.environ.get("PYTHONPATH", "")]))


def start(args, devices, log):
    return subprocess.Popen([sys.executable, str(WORKER), *map(str, args)], env=worker_env(devices),
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)


def finish(procs, logs, timeout=TIMEOUT_S):
    """Wait for every process (killing all on timeout); returns the exit codes."""
    end = time.time() + timeout
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(end - time.time(), 1)))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("multi-process run timed out:\n" + "\n".join(
                Path(f).read_text()[-2000:] for f in logs))
    return codes


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, torch):
    from dsbd_jax.testing import make_tiny_pair
    d = tmp_path_factory.mktemp("multihost")
    make_tiny_pair(d / "tiny")
    return d


CI_METHODS = ("dsbd", "beam", "spec")
EXTENDED_METHODS = ("sample", "beam_search", "tree", "dsbd_single")


def decode_processes(tiny, methods):
    """The two processes and the one-device reference, run side by side, on ``methods``."""
    port, out, tag = free_port(), tiny, methods[0]
    logs = [out / f"ref-{tag}.log", out / f"p0-{tag}.log", out / f"p1-{tag}.log"]
    t0 = time.time()
    which = ",".join(methods)
    procs = [start(["reference", out / "tiny", out, which], 1, logs[0])]
    procs += [start(["decode", out / "tiny", out, port, 2, i, which], 4, logs[1 + i])
              for i in (0, 1)]
    codes = finish(procs, logs)
    assert codes == [0, 0, 0], "\n".join(Path(f).read_text()[-3000:] for f in logs)
    print(f"multi-process decode of {which}: {time.time() - t0:.0f} s")
    return (np.load(out / f"reference-{tag}.npz"),
            [np.load(out / f"process{i}-{tag}.npz") for i in (0, 1)])


@pytest.fixture(scope="module")
def decoded(tiny):
    return decode_processes(tiny, CI_METHODS)


def same(a, b) -> bool:
    if a.shape != b.shape:
        return False
    if np.issubdtype(a.dtype, np.floating):
        return bool(np.allclose(a, b, rtol=1e-5, atol=1e-5, equal_nan=True))
    return bool(np.array_equal(a, b))


def matches_one_device(decoded, methods):
    ref, procs = decoded
    assert {k.split("[")[0].split(".")[0] for k in ref.files} == set(methods)
    for p, out in enumerate(procs):
        bad = []
        for name in ref.files:
            r = ref[name]
            rows = r[SPLIT[p]] if r.ndim and r.shape[0] == 8 else r   # batch leaves: own rows
            if not same(rows, out[name]):
                bad.append((name, rows.shape, out[name].shape))
        assert bad == [], (p, bad)
        first = f"{methods[0]}.sequences"
        assert out[first].shape[0] == SPLIT[p].stop - SPLIT[p].start
        assert out["compiles"].tolist() == [1] * len(methods)    # one compile per decoder


def test_ci_decoders_match_one_device(decoded):
    matches_one_device(decoded, CI_METHODS)


@pytest.mark.extended
def test_other_decoders_match_one_device(tiny):
    assert set(CI_METHODS) | set(EXTENDED_METHODS) == set(_worker_methods())
    matches_one_device(decode_processes(tiny, EXTENDED_METHODS), EXTENDED_METHODS)


def _worker_methods():
    sys.path.insert(0, str(HERE))
    try:
        import multihost_worker
    finally:
        sys.path.remove(str(HERE))
    return multihost_worker.METHODS


def test_gather_all_returns_the_whole_batch(decoded):
    ref, procs = decoded
    for out in procs:
        for name in (n for n in ref.files if n.startswith("dsbd.")):
            assert same(ref[name], out["all/" + name]), name


def test_disagreeing_processes_all_raise(decoded):
    _, (p0, p1) = decoded
    for out in (p0, p1):
        assert "same width" in str(out["error/width"]) and "[12, 10]" in str(out["error/width"])
        assert "same PRNG key" in str(out["error/key"])
    assert "token ids" in str(p1["error/ids"])
    assert "process(es) [1] rejected their prompts" in str(p0["error/ids"])


def test_a_killed_process_stops_the_other(tiny):
    port, out = free_port(), tiny
    logs = [out / "f0.log", out / "f1.log"]
    procs = [start(["fault", out / "tiny", out, port, 2, i], 4, logs[i]) for i in (0, 1)]
    victim, survivor = procs[1], procs[0]
    try:
        assert victim.wait(timeout=TIMEOUT_S) == -9, Path(logs[1]).read_text()[-3000:]
        died = time.time()
        code = survivor.wait(timeout=FAULT_BOUND_S + 30)
    finally:
        for p in procs:
            p.kill()
    waited = time.time() - died
    log = Path(logs[0]).read_text()
    print(f"survivor exited {waited:.1f} s after the other process was killed (code {code})")
    assert code != 0, log[-3000:]
    assert waited <= FAULT_BOUND_S, (waited, log[-3000:])
    assert "first call done" in log
    assert ("PeerFailure" in log and "another process died or was killed" in log
            or "another task died" in log), log[-3000:]


# ---------------------------------------------------------------------------------------------
# the host-side helpers, on one device (no subprocess)

def test_process_share_covers_the_batch():
    from dsbd_jax.parallel.distributed import process_share
    for n, count in ((8, 2), (8, 3), (2, 4), (0, 2)):
        rows = [list(range(n))[process_share(n, i, count)] for i in range(count)]
        assert sum(rows, []) == list(range(n))
        assert max(map(len, rows)) - min(map(len, rows)) <= 1


def test_rows_pack_and_concatenate():
    from dsbd_jax.parallel import distributed as d
    ids, lens = np.arange(6).reshape(2, 3) + 2 ** 20, np.array([3, 1])
    keys = np.array([[1, 2 ** 32 - 1], [3, 4]], np.uint32)
    packed = d.pack_rows(ids, lens, keys, 4)
    assert packed.shape == (4, 6) and not packed[2:].any()
    a, b, k = d.unpack_rows(packed[:2], 3)
    assert (a == ids).all() and (b == lens).all() and (k == keys).all() and k.dtype == np.uint32
    stacked = np.stack([packed, d.pack_rows(ids[:1] + 1, lens[:1], keys[:1], 4)])
    glob = d.concat_rows(stacked, [2, 1])
    assert glob.shape == (3, 6) and (glob[2, :3] == ids[0] + 1).all()
    assert d.row_offsets([3, 5]).tolist() == [0, 3, 8]


def test_headers_disagreeing_raise():
    from dsbd_jax.parallel.distributed import HEADER, check_headers
    ok = dict(error=0, rows=3, width=12, key_kind=1, key_hash=5, settings=9)

    def headers(**other):
        return np.array([[ok[k] for k in HEADER], [{**ok, **other}[k] for k in HEADER]])
    check_headers(headers(rows=0))         # a process without prompts
    with pytest.raises(ValueError, match="no process passed a prompt"):
        check_headers(np.array([[{**ok, "rows": 0}[k] for k in HEADER]] * 2))
    for change, match in ((dict(width=10), r"same width.*\[12, 10\]"),
                          (dict(settings=1), "different decoders"),
                          (dict(key_hash=6), "same PRNG key"), (dict(key_kind=2), "same PRNG key"),
                          (dict(error=1), r"process\(es\) \[1\] rejected")):
        with pytest.raises(ValueError, match=match):
            check_headers(headers(**change))
    with pytest.raises(ValueError, match="own"):
        check_headers(headers(), ValueError("own"))
    ok.update(key_kind=2, key_hash=0)       # each its own batch of keys: nothing to agree on
    check_headers(headers(rows=5))


def test_env_settings():
    from dsbd_jax.parallel.distributed import env_settings
    assert env_settings({}) is None
    env = dict(JAX_COORDINATOR_ADDRESS="h:1", JAX_NUM_PROCESSES="2", JAX_PROCESS_ID="1")
    assert env_settings(env) == dict(coordinator_address="h:1", num_processes=2, process_id=1)
    for bad in (dict(JAX_PROCESS_ID="2"), dict(JAX_NUM_PROCESSES="x")):
        with pytest.raises(ValueError, match="JAX_"):
            env_settings({**env, **bad})


def test_gather_option_checked(toy):
    import jax
    from dsbd_jax import SampleConfig, sample
    from dsbd_jax.parallel import ShardedDecoder, make_mesh
    config, params, _ = toy
    dec = ShardedDecoder(sample, SampleConfig(target=config, max_new_tokens=2), make_mesh(1, 1))
    with pytest.raises(ValueError, match="gather must be one of"):
        dec(dec.place(params), np.ones((1, 3), np.int32), jax.random.key(0), gather="some")


# ---------------------------------------------------------------------------------------------
# the command line, started once per process

GENERATE = ["generate", "--method", "sample", "--max-new-tokens", "4", "--no-progress",
            "--prompt", "hi", "--prompt", "hello there", "--prompt", "x"]


def cli(args, env, out: Path):
    return subprocess.Popen([sys.executable, "-m", "dsbd_jax", *map(str, args)], env=env,
                            stdout=open(out.with_suffix(".out"), "w"),
                            stderr=open(out.with_suffix(".err"), "w"))


def process_env(port, count, pid):
    return dict(worker_env(4), JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                JAX_NUM_PROCESSES=str(count), JAX_PROCESS_ID=str(pid))


GLOO = re.compile(r"\[Gloo\] Rank |\d+ is connected to \d+ peer ranks\. "
                  r"Expected number of connected peer ranks is : \d+")
GLOO_MESSAGE = re.sub(r"[\d\s]", "", "[Gloo] Rank 0 is connected to 1 peer ranks. "
                                        "Expected number of connected peer ranks is : 1")


def gloo_residue(line: str) -> bool:
    """Whether ``line`` holds only pieces of gloo's connection message (digits and spaces
    aside): one piece, or pieces of at least 4 characters each, matched from the left."""
    rest = re.sub(r"[\d\s]", "", line)
    while rest and rest not in GLOO_MESSAGE:
        n = max((k for k in range(4, len(rest)) if rest[:k] in GLOO_MESSAGE), default=0)
        if not n:
            return False
        rest = rest[n:]
    return True


def python_lines(text: str) -> str:
    """Less gloo's connection messages (written by C++ threads straight to the process's
    stdout, at times interleaved mid-line: "...connected to 3[Gloo] Rank 2 is connected to 3
    peer ranks. ...", then " peer ranks. ..." or a lone digit on a line of its own), and the
    blank lines and pieces of those messages they leave."""
    return "".join(line for line in GLOO.sub("", text).splitlines(True)
                   if not gloo_residue(line))


def beams(text: str) -> str:
    """The printed prompts and beams (not the timing or the batch-summed stats)."""
    return text[text.index("--- prompt"):]


def test_cli_generate_many_processes(tiny):
    """``dsbd generate --mesh`` started once per process prints, on process 0 only, the beams
    of one process without a mesh."""
    port, t = free_port(), tiny / "tiny"
    args = GENERATE + ["--target", t / "target", "--draft", t / "draft"]
    logs = [tiny / "cli0", tiny / "cli1", tiny / "cli_ref"]
    procs = [cli(args + ["--mesh", "data=4,model=2"], process_env(port, 2, i), logs[i])
             for i in (0, 1)]
    procs.append(cli(args, worker_env(1), logs[2]))
    codes = finish(procs, [f.with_suffix(".err") for f in logs])
    out = [python_lines(f.with_suffix(".out").read_text()) for f in logs]
    assert codes == [0, 0, 0], [f.with_suffix(".err").read_text()[-2000:] for f in logs]
    assert "mesh data=4,model=2 over 8 cpu devices" in out[0]
    assert out[0].count("--- prompt") == 3 and beams(out[0]) == beams(out[2])
    assert out[1] == ""


@pytest.mark.extended   # a benchmark script's --small run (DSBD_TEST_EXTENDED=1)
def test_cli_bench_many_processes(tiny):
    """``dsbd bench --mesh`` started once per process: process 0 writes the records of a
    one-process run (same completions), process 1 writes nothing."""
    sys.path.insert(0, str(HERE.parent))
    from bench_setup import write_bench_config, write_gsm
    t = tiny / "tiny"
    gsm = write_gsm(tiny / "gsm.jsonl", [{"question": f"{i}+1?", "answer": f"#### {i + 1}"}
                                         for i in range(3)])
    cfg = write_bench_config(tiny / "bench.yaml", t / "target", t / "draft", gsm,
                             [{"method": "sample"}], limit=3, batch_size=4)
    port = free_port()
    logs = [tiny / "bench0", tiny / "bench1", tiny / "bench_ref"]
    outs = [tiny / "bench_out0", tiny / "bench_out1", tiny / "bench_ref_out"]
    procs = [cli(["bench", cfg, "--no-progress", "--out", outs[i], "--mesh", "data=4,model=2"],
                 process_env(port, 2, i), logs[i]) for i in (0, 1)]
    procs.append(cli(["bench", cfg, "--no-progress", "--out", outs[2]], worker_env(1), logs[2]))
    codes = finish(procs, [f.with_suffix(".err") for f in logs])
    assert codes == [0, 0, 0], [f.with_suffix(".err").read_text()[-2000:] for f in logs]
    from dsbd_jax.eval.records import read_records
    (h0, *r0), (_, *ref) = (read_records(o / "records.jsonl") for o in (outs[0], outs[2]))
    assert h0["mesh"] == {"data": 4, "model": 2}
    same_keys = ("prompt_index", "completion", "new_tokens", "score")
    assert [{k: r[k] for k in same_keys} for r in r0] == [{k: r[k] for k in same_keys}
                                                           for r in ref]
    assert len(r0) == 3 and (outs[0] / "summary.json").exists()
    assert not outs[1].exists()
    assert "wrote" in logs[0].with_suffix(".out").read_text()
    assert python_lines(logs[1].with_suffix(".out").read_text()) == ""


def test_placed_load_is_the_same_model(tiny):
    """``load_model(place=...)`` (each tensor onto its shards as it loads) gives the values of a
    plain load, in both weight layouts, and the stacked leaves carry the rules' specs (one
    device here; the two-process decode above loads DSBD's pair this way)."""
    import jax
    from dsbd_jax import load_model
    from dsbd_jax.parallel import ShardingRules, make_mesh
    path = tiny / "tiny" / "target"
    config = load_model(path, tokenizer=False, progress=False).config
    rules = ShardingRules(make_mesh(1, 1))
    placed = {}
    for layout in ("stacked", "per_layer"):
        placed[layout] = load_model(path, tokenizer=False, progress=False, layout=layout,
                                    place=rules.placer(config)).params
        ref = load_model(path, tokenizer=False, progress=False, layout=layout, kernel_blocks=None)
        same_values = jax.tree.map(lambda a, b: bool(np.array_equal(a, b)), ref.params,
                                   placed[layout])
        assert all(jax.tree.leaves(same_values)), layout
    is_spec = lambda x: isinstance(x, jax.sharding.PartitionSpec)   # noqa: E731
    specs = jax.tree.leaves(rules.param_specs(config, placed["stacked"]), is_leaf=is_spec)
    assert [tuple(s) for s in specs] == [tuple(x.sharding.spec)
                                         for x in jax.tree.leaves(placed["stacked"])]
    with pytest.raises(ValueError, match="no sharding rule"):
        rules.placer(config)(("extra", "kernel"), np.zeros((2, 2)), np.float32)


def test_cli_bench_killed_process_resumes(tiny):
    """``dsbd bench --mesh`` over 2 processes, one of them killed once the first setting's
    records are written: the other stops (never hangs), and the same two commands again resume
    from the records like a one-process run: only the missing setting runs, nothing twice."""
    sys.path.insert(0, str(HERE.parent))
    from bench_setup import write_bench_config, write_gsm
    from dsbd_jax.eval.records import read_records
    t = tiny / "tiny"
    gsm = write_gsm(tiny / "gsm_resume.jsonl", [{"question": f"{i}+2?", "answer": f"#### {i + 2}"}
                                                for i in range(3)])
    cfg = write_bench_config(tiny / "bench_resume.yaml", t / "target", t / "draft", gsm,
                             [{"method": "sample"}, {"method": "beam", "num_beams": 2}],
                             limit=3, batch_size=4)
    out = tiny / "bench_resume_out"
    logs = [tiny / "resume0", tiny / "resume1"]

    def launch(tag):
        port = free_port()
        return [cli(["bench", cfg, "--no-progress", "--out", out, "--mesh", "data=4,model=2"],
                    process_env(port, 2, i), logs[i].with_name(f"{logs[i].name}{tag}"))
                for i in (0, 1)]

    procs = launch("a")
    records = out / "records.jsonl"
    try:
        end = time.time() + TIMEOUT_S
        while time.time() < end:  # the first setting's 3 records (after the run header)
            if records.exists() and records.read_text().count('"type": "sample"') >= 3:
                break
            assert all(p.poll() is None for p in procs), "a process ended before the kill"
            time.sleep(0.2)
        else:
            pytest.fail("no records written")
        procs[1].kill()
        codes = [p.wait(timeout=FAULT_BOUND_S + 30) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert codes[1] == -9 and codes[0] != 0, codes
    samples = lambda: [r for r in read_records(records) if r.get("type") == "sample"]  # noqa: E731
    before = samples()
    assert 3 <= len(before) < 6, len(before)
    procs = launch("b")
    codes = finish(procs, [f.with_name(f"{f.name}b").with_suffix(".err") for f in logs])
    err0 = logs[0].with_name("resume0b").with_suffix(".err").read_text()
    assert codes == [0, 0], err0[-3000:]
    after = samples()
    out0 = logs[0].with_name("resume0b").with_suffix(".out").read_text()
    assert f"resuming: {len(before)}/6 done" in out0, out0[-2000:]
    keys = [(r["label"], r["prompt_index"]) for r in after]
    assert len(after) == 6 and len(set(keys)) == 6, keys
    assert after[:len(before)] == before  # the records of the first run are kept as they were
