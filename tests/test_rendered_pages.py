"""The rendered blocks of README.md and docs/ (``<!-- render:NAME -->`` ... ``<!-- /render -->``)
are what ``python -m benchmarks.render`` makes of the committed results/*.json: a JSON that
changes without its page fails here. The check is shown to fail on purpose: a figure changed in
a copy of the results makes the pages that quote it stale. Outside the rendered blocks the pages
carry no measured ratio, and every table of a results page is rendered (the paper's tables and
one run's test counts aside). Only the standard library."""

from __future__ import annotations

import json
import re
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


# --- what stays hand-written ------------------------------------------------------------------
# A measured figure lives in a rendered table; the prose around it says what the table means.
# So a ratio figure (1.57x, 0.30-0.31x) on README.md or docs/ outside a rendered block and a code
# block is one of these, each with why it is no measurement of ours; and every table of a results
# page is rendered, but for the tables named here.
RATIO = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?x\b")
ALLOWED_RATIOS = {
    ("docs/results/quality.md", "1.36x"): "the paper's Table 1",
    ("docs/results/quality.md", "1.70x"): "the paper's Table 1",
    ("docs/results/quality.md", "0.98x"): "the paper's Table 2, copied",
    ("docs/results/quality.md", "0.95x"): "the paper's Table 2, copied",
    ("docs/results/quality.md", "1.5-1.9x"): "the paper's published speed-up",
    ("docs/results/quality.md", "8-190x"): "the paper's model sizes, a size ratio",
    ("docs/results/quality.md", "3x"): "the pair's parameter counts, a size ratio",
    ("docs/loading.md", "8x"): "parameter counts of a model pair, a size ratio",
    ("docs/loading.md", "3x"): "parameter counts of a model pair, a size ratio",
    ("docs/loading.md", "13x"): "parameter counts of a model pair, a size ratio",
    ("docs/loading.md", "3.7x"): "parameter counts of a model pair, a size ratio",
    ("docs/dsbd.md", "1.3x"): "the node budget's rule (forest_budget.FREE), a setting",
    ("docs/performance.md", "1.3x"): "the node budget's rule (forest_budget.FREE), a setting",
}
HAND_TABLES = {  # results pages' tables that come from no JSON of ours
    ("docs/results/quality.md", "| | method | quality | tokens/s |"): "the paper's Table 1",
    ("docs/results/quality.md", "| | multinomial sampling | speculative (SpD) |"):
        "the paper's Table 2",
    ("docs/results/accelerators.md", "| folder | passed | failed | skipped |"):
        "test counts of one run of the suite under jax 0.11.2 (scripts/jax011_check.sh)",
}
FENCE = re.compile(r"```.*?```", re.S)


def hand_text(text: str) -> str:
    """``text`` without its rendered blocks and its fenced code."""
    return FENCE.sub("", render.BLOCK.sub("", text))


def loose_ratios(root: Path = ROOT):
    for page in render.pages(root):
        if page.name == "CHANGELOG.md":
            continue
        rel = page.relative_to(root).as_posix()
        for m in RATIO.finditer(hand_text(page.read_text())):
            if (rel, m.group()) not in ALLOWED_RATIOS:
                yield rel, m.group()


def hand_tables(root: Path = ROOT):
    for page in sorted((root / "docs" / "results").glob("*.md")):
        rel = page.relative_to(root).as_posix()
        lines = hand_text(page.read_text()).splitlines()
        for i, line in enumerate(lines):
            starts = line.startswith("|") and (i == 0 or not lines[i - 1].startswith("|"))
            if starts and not any(rel == p and line.startswith(h) for p, h in HAND_TABLES):
                yield rel, line[:80]


def test_prose_holds_no_measured_ratio():
    assert not list(loose_ratios()), "a measured ratio belongs in a rendered table"


def test_every_results_table_is_rendered():
    assert not list(hand_tables()), "a results table belongs in benchmarks/render.py"


def test_the_hand_written_checks_see_a_figure(tmp_path):
    """Both checks find what they must: a ratio in prose and a hand table on a results page;
    the same inside a rendered block or a code block is left alone."""
    (tmp_path / "docs" / "results").mkdir(parents=True)
    (tmp_path / "README.md").write_text(
        "Ours runs at 1.57x.\n\n<!-- render:x -->\n\n2.00x\n\n<!-- /render -->\n\n```\n3.1x\n```\n")
    (tmp_path / "docs" / "results" / "p.md").write_text("| a | b |\n|---|---|\n| 1 | 2 |\n")
    assert list(loose_ratios(tmp_path)) == [("README.md", "1.57x")]
    assert list(hand_tables(tmp_path)) == [("docs/results/p.md", "| a | b |")]
    for allowed in [*ALLOWED_RATIOS.values(), *HAND_TABLES.values()]:
        assert len(allowed) > 10
