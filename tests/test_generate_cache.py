"""``dsbd generate`` keeps its decoder's compiled programs: with the default progress (elapsed
seconds from the host) a second process reads every program back (the decoder's core from the
program store, the rest from JAX's compilation cache) and writes nothing new; ``--progress
tokens`` (the host runs the loop in chunks: three programs without a callback) stores its
programs the first time and reads all three back the second."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# runs `dsbd ARGS` with every program kept (MIN_COMPILE_S 0); reports jax's own count of cache
# hits (its monitoring events) and the cache's entries after the run
CHILD = r"""
import json, sys
from jax._src import monitoring
hits, reads = [], []
monitoring.register_event_listener(
    lambda name, **kw: hits.append(name) if name == "/jax/compilation_cache/cache_hits" else None)
monitoring.register_event_duration_secs_listener(
    lambda name, d, **kw: reads.append(name) if name.startswith("/dsbd_jax/program_store") else None)
from dsbd_jax.host import compilation_cache
compilation_cache.MIN_COMPILE_S = 0.0
from dsbd_jax.cli import main
rc = main(sys.argv[1:])
import jax
from pathlib import Path
folder = Path(jax.config.jax_compilation_cache_dir)
entries = sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.exists() else []
print(json.dumps({"rc": rc, "hits": len(hits), "reads": len(reads), "entries": entries}))
"""


def generate(cache, pair, *extra):
    t, d = pair
    # forced options: a fresh cache would first measure XLA:CPU's (15-20 s), not this test's subject
    env = {**os.environ, "DSBD_JAX_CACHE": str(cache), "DSBD_JAX_COMPILATION_CACHE": "1",
           "JAX_PLATFORMS": "cpu", "DSBD_JAX_CPU_OPTIONS": "default"}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)
    prompts = [] if "--prompt" in extra else ["--prompt", "hi"]
    args = ["generate", "--target", str(t), "--draft", str(d), *prompts, "--raw",
            "--method", "spec", "--max-new-tokens", "3", *extra]
    out = subprocess.run([sys.executable, "-c", CHILD, *args], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["rc"] == 0, out.stderr[-3000:]
    res["stderr"], res["stdout"] = out.stderr, out.stdout
    return res


def test_a_second_generate_reads_its_decoder_back(bench_pair, tmp_path):
    pair = bench_pair[:2]
    first = generate(tmp_path, pair)
    assert first["entries"] and first["reads"] == 0, first      # the programs were written
    assert any(e.startswith("programs/") for e in first["entries"]), first   # the core's
    assert "spec: " in first["stderr"]                  # the elapsed-seconds line
    second = generate(tmp_path, pair)
    assert second["reads"] == 1 and second["hits"] >= 1, second
    assert second["entries"] == first["entries"], second
    none = generate(tmp_path, pair, "--no-progress")     # the same program as the default
    assert none["reads"] == 1 and none["hits"] == second["hits"]
    assert none["entries"] == first["entries"]
    tokens = generate(tmp_path, pair, "--progress", "tokens")
    # the chunked run's three programs: compiled and stored the first time ...
    stored = [e for e in tokens["entries"] if e not in first["entries"]]
    assert tokens["reads"] == 0 and len([e for e in stored if e.startswith("programs/")]) == 3
    assert "tok [" in tokens["stderr"]                   # the token bar
    again = generate(tmp_path, pair, "--progress", "tokens")
    # ... and all read back the second time, nothing written
    assert again["reads"] == 3 and again["entries"] == tokens["entries"], again


def test_int8_weights_from_the_command_line(bench_pair, tmp_path):
    """``--draft-weights int8`` and ``--weights int8`` load both models with int8 kernels (the
    load lines say so), and a second run reads the int8 programs back like any other."""
    pair = bench_pair[:2]
    first = generate(tmp_path, pair, "--draft-weights", "int8", "--weights", "int8")
    assert first["stderr"].count("int8 weights") == 2, first["stderr"][-2000:]
    second = generate(tmp_path, pair, "--draft-weights", "int8", "--weights", "int8")
    assert second["reads"] == 1 and second["entries"] == first["entries"], second


def test_generate_prints_each_prompt_when_done(bench_pair, tmp_path):
    """With the token bar, each prompt's beams are printed when that prompt is done, before the
    run's summary line; without it, after. Each prompt once."""
    prompts = ["--prompt", "hi", "--prompt", "a longer prompt"]
    for extra, before in ((["--progress", "tokens"], True), (["--no-progress"], False)):
        out = generate(tmp_path, bench_pair[:2], *prompts, "--max-new-tokens", "8", *extra)
        lines = out["stdout"].splitlines()
        blocks = [i for i, line in enumerate(lines) if line.startswith("--- prompt ")]
        summary = [i for i, line in enumerate(lines) if line.startswith("=== spec:")]
        assert len(blocks) == 2 and len(summary) == 1, out["stdout"]
        assert sorted(lines[i][:12] for i in blocks) == ["--- prompt 0", "--- prompt 1"]
        assert all((i < summary[0]) == before for i in blocks), out["stdout"]
