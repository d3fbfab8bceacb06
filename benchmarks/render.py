"""Render the results tables of README.md and docs/ from the committed JSON under results/.

A page (README.md, CHANGELOG.md, docs/**/*.md) marks each rendered block with two comments::

    <!-- render:NAME -->

    ...what BLOCKS[NAME] returns for the results folder...

    <!-- /render -->

``python -m benchmarks.render`` rewrites every block in place; ``--check`` rewrites nothing and
exits 1 naming each stale block (CI runs it through ``tests/test_rendered_pages.py``). Running it
twice changes nothing. Each page's tables are functions of the results in
``benchmarks/_pages/<page>.py``, with its ``BLOCKS``. Only the standard library: no jax, no model.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from benchmarks._pages import (accelerators, cli, cpu, draft, getting_started, headline, memory,
                               performance, precision, quality, speed)
from benchmarks._pages.common import Results

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- render:(?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /render -->)", re.S)

# every page's blocks by name (a template per page: benchmarks/_pages/<page>.py)
BLOCKS: dict = {}
for _page in (accelerators, cli, cpu, draft, getting_started, headline, memory, performance,
              precision, quality, speed):
    assert not set(_page.BLOCKS) & set(BLOCKS), set(_page.BLOCKS) & set(BLOCKS)
    BLOCKS.update(_page.BLOCKS)


def pages(root: Path = ROOT):
    yield root / "README.md"
    yield root / "CHANGELOG.md"
    yield from sorted(p for p in (root / "docs").rglob("*.md") if "_build" not in p.parts)


def render_text(text: str, results: Results) -> str:
    """``text`` with every block rendered from ``results``."""
    def body(m):
        name = m.group("name")
        if name not in BLOCKS:
            raise KeyError(f"no renderer for block {name!r}")
        return m.group(1) + "\n" + BLOCKS[name](results) + "\n" + m.group(4)
    return BLOCK.sub(body, text)


def stale(root: Path = ROOT, results_dir: Path | None = None, write: bool = False):
    """``[(page, block name)]`` of the blocks whose text differs from what rendering gives;
    with ``write``, the pages are rewritten."""
    results = Results(results_dir or root)
    found = []
    for page in pages(root):
        text = page.read_text()
        new = render_text(text, results)
        if new != text:
            old_blocks = {m.group("name"): m.group("body") for m in BLOCK.finditer(text)}
            new_blocks = {m.group("name"): m.group("body") for m in BLOCK.finditer(new)}
            found += [(page.relative_to(root).as_posix(), n) for n in new_blocks
                      if new_blocks[n] != old_blocks.get(n)]
            if write:
                page.write_text(new)
    return found


def used(root: Path = ROOT):
    """The block names the pages hold."""
    return {m.group("name") for page in pages(root) for m in BLOCK.finditer(page.read_text())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.render", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="rewrite nothing; exit 1 when a block is stale")
    parser.add_argument("--results", type=Path, default=None,
                        help="the folder holding results/ (default: the checkout)")
    args = parser.parse_args(argv)
    found = stale(ROOT, args.results, write=not args.check)
    for page, name in found:
        print(f"{page}: render:{name} {'is stale' if args.check else 'rewritten'}")
    return 1 if (args.check and found) else 0


if __name__ == "__main__":
    sys.exit(main())
