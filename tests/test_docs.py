"""The documentation site builds with warnings as errors, and the examples of its pages run.

Runs what ``bash scripts/docs.sh`` runs (``sphinx-build -W --keep-going -b html`` and ``-b
doctest``) in a subprocess, into a temporary directory. Skipped only when Sphinx or MyST is not
installed (the ``docs`` extra, part of ``test``; Sphinx 9 needs Python >= 3.11). About a minute.

``docs/examples/multiprocess.py``, the script of docs/multiprocess.md, needs several processes,
so it is no doctest: it runs here as the page says, on the tiny pair, 2 processes against one.
"""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _missing():
    for mod in ("sphinx", "myst_parser", "furo"):
        try:
            __import__(mod)
        except ImportError:
            return mod
    return None


@pytest.mark.skipif(_missing() is not None,
                    reason=f"the docs extra is not installed ({_missing()} missing): "
                           "pip install -e '.[docs]'")
@pytest.mark.parametrize("builder", ["html", "doctest"])
def test_docs_build(builder, tmp_path):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out = tmp_path / builder
    proc = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", builder,
         "-d", str(tmp_path / "doctrees"), str(ROOT / "docs"), str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"sphinx -b {builder} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    if builder == "doctest":
        report = (out / "output.txt").read_text()
        assert "0 failures in tests" in report, report[-2000:]


def _free_port() -> int:
    """A free local port for the coordinator, below the kernel's ephemeral range (as in
    ``tests/parallel/test_multihost.py``)."""
    import random
    import socket
    import time
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


def _rows(text: str) -> list:
    """``[(process, prompt repr, completion repr)]`` of the lines the example prints (gloo's
    connection lines, written by its C++ threads on the same stdout, are skipped)."""
    out = []
    for line in text.splitlines():
        head, sep, completion = line.partition(" -> ")
        if sep and head.startswith("process ") and ": " in head:
            proc, prompt = head[len("process "):].split(": ", 1)
            out.append((int(proc), prompt, completion))
    return out


@pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                    reason="the tiny model pair needs torch (the test extra)")
def test_multiprocess_example_matches_one_process(tmp_path):
    """``docs/examples/multiprocess.py`` (shown on docs/multiprocess.md) run as the page says:
    2 processes x 4 virtual CPU devices joined by the three JAX_* variables, each printing its
    own rows, print together what one process over 8 devices prints for the whole list."""
    from dsbd_jax.testing import make_tiny_pair
    target, draft = make_tiny_pair(tmp_path / "tiny")
    script = ROOT / "docs" / "examples" / "multiprocess.py"

    def env(devices, **extra):
        # optimisation level 0 on every side: a third less compile time, the same comparison
        flags = (f"--xla_force_host_platform_device_count={devices} "
                 "--xla_backend_optimization_level=0")
        base = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
        return dict(base, JAX_PLATFORMS="cpu", XLA_FLAGS=flags, TOKENIZERS_PARALLELISM="false",
                    PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", **extra)

    port = _free_port()
    logs = [tmp_path / f"{name}.out" for name in ("p0", "p1", "one")]
    envs = [env(4, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
                JAX_PROCESS_ID=str(i)) for i in (0, 1)] + [env(8)]
    procs = [subprocess.Popen([sys.executable, str(script), str(target), str(draft)], cwd=ROOT,
                              env=e, stdout=open(log, "w"), stderr=subprocess.STDOUT)
             for e, log in zip(envs, logs)]
    try:
        codes = [p.wait(timeout=900) for p in procs]
    finally:
        for p in procs:
            p.kill()
    texts = [log.read_text() for log in logs]
    assert codes == [0, 0, 0], "\n".join(t[-3000:] for t in texts)
    p0, p1, one = (_rows(t) for t in texts)
    assert [r[0] for r in p0] == [0, 0] and [r[0] for r in p1] == [1, 1], (p0, p1)
    assert len(one) == 4 and {r[0] for r in one} == {0}, one
    # process 0 printed the first two prompts, process 1 the last two: together, one process's
    assert [r[1:] for r in p0 + p1] == [r[1:] for r in one]
