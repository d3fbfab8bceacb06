"""``scripts/test.sh``'s lanes (``scripts/lanes.sh``) stream each lane's output as it
happens, every line prefixed by its lane, with a line per finished folder, and end with the summed
line and the suite's exit status. Run on tiny fake test folders (``DSBD_TEST_LANES``), no jax."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LANES = REPO / "scripts" / "lanes.sh"

# lane A's first test passes at once; its second waits until the reader has seen the first one's
# line (the file "seen" appears): so it passes only if the line reached the reader while lane A
# still ran, and fails after 30 s if the output were held back until the lane ends
STREAMED = '''
import os, time

def test_first():
    pass

def test_waits_until_the_first_line_is_seen():
    deadline = time.time() + 30
    while not os.path.exists(os.environ["SEEN_FILE"]):
        assert time.time() < deadline, "lane A's first line never reached the reader"
        time.sleep(0.05)
'''
MIXED = '''
import pytest

def test_passes():
    pass

def test_fails():
    assert False

@pytest.mark.skip(reason="fake")
def test_skipped():
    pass
'''


def fake_folders(tmp_path: Path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    a, b = tmp_path / "lane_a", tmp_path / "lane_b"
    a.mkdir(), b.mkdir()
    (a / "test_streamed.py").write_text(STREAMED)
    (b / "test_mixed.py").write_text(MIXED)
    return a, b


def run_lanes(lanes: str, env_extra: dict):
    """Run lanes.sh; returns ``(lines with their arrival times, exit status)``. Creates
    ``SEEN_FILE`` as soon as lane A's first test line arrives."""
    env = {**os.environ, "PY": sys.executable, "DSBD_TEST_LANES": lanes, **env_extra}
    proc = subprocess.Popen(["bash", str(LANES), "-p", "no:cacheprovider"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    for line in proc.stdout:
        lines.append((line.rstrip("\n"), proc.poll() is None))
        if re.match(r"\[A\] .*test_first PASSED", line) and "SEEN_FILE" in env_extra:
            Path(env_extra["SEEN_FILE"]).touch()
    return lines, proc.wait()


def test_lanes_stream_prefixed_lines_and_sum_the_folders(tmp_path):
    a, b = fake_folders(tmp_path)
    seen = tmp_path / "seen"
    t0 = time.time()
    lines, rc = run_lanes(f"{a};{b}", {"SEEN_FILE": str(seen)})
    text = [t for t, _ in lines]
    assert rc == 1, text                      # lane B has a failing test
    assert time.time() - t0 < 30, "lane A's line arrived only when the lane ended"
    # the streamed line arrived while the lanes still ran, and lane A's waiting test passed
    first = next(i for i, t in enumerate(text) if re.match(r"\[A\] .*test_first PASSED", t))
    assert lines[first][1]
    assert any(re.match(r"\[A\] .*test_waits_until_the_first_line_is_seen PASSED", t)
               for t in text), text
    # headers, then only prefixed lines, then the summed line
    assert text[0] == f"== lane A: {a}" and text[1] == f"== lane B: {b}"
    body = text[2:-1]
    assert body and all(t.startswith(("[A] ", "[B] ")) for t in body), text
    done_a = [t for t in body if t.startswith(f"[A] == done {a}: ")]
    done_b = [t for t in body if t.startswith(f"[B] == done {b}: ")]
    assert len(done_a) == 1 and re.fullmatch(r".*: 2 passed in [0-9.]+s \(\d+ s\)", done_a[0])
    assert len(done_b) == 1 and re.fullmatch(
        r".*: 1 failed, 1 passed, 1 skipped in [0-9.]+s \(\d+ s\)", done_b[0]), done_b
    # a lane's lines come in its own order: lane A's folder line after its tests' lines
    assert text.index(done_a[0]) > first
    assert text[-1] == "3 passed, 1 failed, 1 skipped"


def test_lanes_exit_0_when_every_folder_passes(tmp_path):
    a, _ = fake_folders(tmp_path)
    (a / "test_streamed.py").write_text("def test_one():\n    pass\n")
    lines, rc = run_lanes(f"{a};{a}", {})
    assert rc == 0
    assert lines[-1][0] == "2 passed, 0 failed, 0 skipped"


def test_the_summary_names_the_failed_tests_and_the_host(tmp_path):
    """``scripts/suite_summary.py`` (test.sh's last lines) on the lanes' real output, a slow-lane
    log and a newest-JAX log: the host, each failed test once, then the summed line."""
    a, b = fake_folders(tmp_path)
    (a / "test_streamed.py").write_text("def test_one():\n    pass\n")
    lines, rc = run_lanes(f"{a};{b}", {})
    assert rc == 1
    logs = [tmp_path / n for n in ("lanes.log", "slow.log", "newest.log")]
    logs[0].write_text("\n".join(t for t, _ in lines) + "\n")
    logs[1].write_text("[S] 5 passed, 0 failed, 0 skipped\n")
    logs[2].write_text("[N] FAILED tests/x.py::test_new - assert 1 == 2\n"
                       "[N] 3 passed, 1 failed, 0 skipped\n")
    out = subprocess.run([sys.executable, str(REPO / "scripts" / "suite_summary.py"),
                          *map(str, logs)], capture_output=True, text=True, check=True)
    text = out.stdout.splitlines()
    assert re.fullmatch(r"== host: .+, \d+ cores, .+", text[0]), text
    assert text[1] == "== failed (2):", text
    assert re.fullmatch(r"FAILED .*test_mixed\.py::test_fails( - .*)?", text[2]), text
    assert text[3] == "FAILED tests/x.py::test_new - assert 1 == 2", text
    assert text[-1] == "10 passed, 2 failed, 1 skipped", text


def _listed_lanes(repo: Path) -> list[list[str]]:
    """The default lanes of ``repo/scripts/lanes.sh`` (``DSBD_TEST_LANES_LIST=1``: nothing runs)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DSBD_TEST_LANE")}
    env["DSBD_TEST_LANES_LIST"] = "1"
    proc = subprocess.run(["bash", str(repo / "scripts" / "lanes.sh")], env=env, text=True,
                          capture_output=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return [line.split(": ", 1)[1].split() for line in proc.stdout.splitlines()
            if line.startswith("== lane ")]


def test_the_default_lanes_run_every_test_folder_and_file_once():
    """Every folder of ``tests/`` that holds tests (``tests/host``, ``tests/loading``, ...) and
    every top-level test file is in exactly one lane: a folder left out would never run."""
    lanes = _listed_lanes(REPO)
    assert len(lanes) == 2, lanes
    named = [p for lane in lanes for p in lane]
    assert len(named) == len(set(named)), named
    tests = REPO / "tests"
    want = {f"tests/{d.name}" for d in tests.iterdir()
            if d.is_dir() and any(d.rglob("test_*.py"))}
    want |= {f"tests/{f.name}" for f in tests.glob("test_*.py")}
    assert set(named) == want, (set(named) ^ want)
    assert {"tests/host", "tests/loading", "tests/models"} <= set(lanes[0]), lanes


def test_a_new_test_folder_joins_lane_b(tmp_path):
    """A test folder the script does not name yet still runs: it is added to lane B."""
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "lanes.sh").write_text(LANES.read_text())
    for folder in ("models", "decoding", "newroom", "data_only"):
        (tmp_path / "tests" / folder).mkdir(parents=True)
    for name in ("models/test_m.py", "decoding/test_d.py", "newroom/test_n.py",
                 "test_top.py", "data_only/table.json"):
        (tmp_path / "tests" / name).write_text("")
    lanes = _listed_lanes(tmp_path)
    assert "tests/newroom" in lanes[1] and "tests/newroom" not in lanes[0], lanes
    assert "tests/data_only" not in lanes[0] + lanes[1], lanes
