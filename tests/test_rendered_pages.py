"""The rendered blocks of README.md and docs/ (``<!-- render:NAME -->`` ... ``<!-- /render -->``)
are what ``python -m benchmarks.render`` makes of the committed results/*.json: a JSON that
changes without its page fails here. The check is shown to fail on purpose: a figure changed in
a copy of the results makes the pages that quote it stale. Only the standard library."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from benchmarks import render

ROOT = Path(__file__).resolve().parents[1]


def test_every_block_is_current():
    assert render.stale(ROOT) == [], "run: python -m benchmarks.render"


def test_every_renderer_has_a_page_and_every_block_a_renderer():
    assert render.used(ROOT) == set(render.BLOCKS)


def test_a_changed_figure_makes_its_pages_stale(tmp_path):
    shutil.copytree(ROOT / "results", tmp_path / "results")
    path = tmp_path / "results" / "speed_int8_draft_amx_xeon.json"
    doc = json.loads(path.read_text())
    row = next(r for r in doc["rows"] if r["method"] == "beam_sample_W4")
    row["tokens_per_s"] *= 1.1   # beam sampling W=4 10 % faster: every DSBD ratio moves
    path.write_text(json.dumps(doc))
    found = render.stale(ROOT, tmp_path)
    assert ("README.md", "headline-amx") in found, found
    assert ("README.md", "headline-verdict") in found, found
    assert ("docs/results/speed.md", "speed-int8-draft-amx") in found, found
    assert ("docs/results/speed.md", "speed-int8-draft-epyc") not in found, found


def test_rendering_twice_changes_nothing(tmp_path):
    for page in render.pages(ROOT):
        copy = tmp_path / page.relative_to(ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(page.read_text().replace("| 1.", "| 9."))   # stale figures
    assert render.stale(tmp_path, ROOT, write=True)
    once = {p: p.read_text() for p in render.pages(tmp_path)}
    assert render.stale(tmp_path, ROOT, write=True) == []
    assert once == {p: p.read_text() for p in render.pages(tmp_path)}


def test_the_command_checks():
    proc = subprocess.run([sys.executable, "-m", "benchmarks.render", "--check"], cwd=ROOT,
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
