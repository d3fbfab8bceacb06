"""Every file under ``results/`` is cited by the documentation, and every ``results/...`` path
the documentation cites exists.

The documentation is README.md, docs/**/*.md and benchmarks/README.md. A file counts as cited
when its path appears, when a cited pattern with ``*`` matches it (``results/forward*.json``),
or when its run directory is cited (``results/<run>/``: a directory ``dsbd bench``
writes). A figure without its JSON, or a JSON nobody can find from the docs, fails here."""

import fnmatch
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CITE = re.compile(r"(?<![\w/])results/[A-Za-z0-9_./*<>-]*[A-Za-z0-9_*/>]")


def doc_files():
    yield ROOT / "README.md"
    yield ROOT / "benchmarks" / "README.md"
    yield from sorted((ROOT / "docs").rglob("*.md"))


def citations():
    found = set()
    for path in doc_files():
        if "_build" in path.parts:
            continue
        for m in CITE.findall(path.read_text()):
            m = m.rstrip(".")
            # a link from one docs page to a results page (docs/results/*.md), not a file
            if (ROOT / "docs" / m).exists() or (ROOT / "docs" / (m + ".md")).exists():
                continue
            found.add(m)
    return found


def result_files():
    return sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "results").rglob("*")
                  if p.is_file())


def test_every_result_file_is_cited():
    cited = citations()
    dirs = {c.rstrip("/") for c in cited if (ROOT / c).is_dir()}
    patterns = [c for c in cited if "*" in c]
    missing = [f for f in result_files()
               if f not in cited
               and not any(f.startswith(d + "/") for d in dirs)
               and not any(fnmatch.fnmatch(f, p) for p in patterns)]
    assert not missing, f"results files no page cites: {missing}"


def test_every_cited_result_exists():
    files = result_files()
    bad = []
    for c in sorted(citations()):
        if "<" in c or c.startswith("results/tmp") or c.startswith("results/gpu"):
            continue  # placeholders (<host>, <device>) and folders the scripts create
        if "*" in c:
            if not any(fnmatch.fnmatch(f, c) for f in files):
                bad.append(c)
        elif not (ROOT / c).exists():
            bad.append(c)
    assert not bad, f"cited results paths that do not exist: {bad}"
