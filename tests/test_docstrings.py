"""Module docstrings say what a module is for and its key invariant, in at most 12 lines; the
longer explanations and histories live on ``docs/results/design_notes.md``, one section per
module that points there. Only the standard library: no jax, no model."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "dsbd_jax"
NOTES = ROOT / "docs" / "results" / "design_notes.md"
MAX_LINES = 12


def module_docstrings():
    """``{module name: docstring}`` of every module of the package that has one (not cleaned:
    its lines as written)."""
    out = {}
    for path in sorted(PKG.rglob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
        if doc is not None:
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = doc
    return out


def long_docstrings(docs: dict) -> dict:
    """``{module: lines}`` of the docstrings over :data:`MAX_LINES` lines."""
    return {name: len(doc.splitlines()) for name, doc in docs.items()
            if len(doc.splitlines()) > MAX_LINES}


def test_every_module_docstring_fits_in_12_lines():
    long = long_docstrings(module_docstrings())
    listing = "\n".join(f"  {name}: {n} lines" for name, n in sorted(long.items()))
    assert not long, (f"module docstrings over {MAX_LINES} lines (what the module is for and its "
                      f"invariant; move the rest to {NOTES.relative_to(ROOT)}):\n{listing}")


def test_the_check_sees_a_long_docstring():
    docs = {"a": "\n".join(["line"] * MAX_LINES), "b": "\n".join(["line"] * (MAX_LINES + 1))}
    assert long_docstrings(docs) == {"b": MAX_LINES + 1}


def test_each_pointer_to_the_design_notes_has_its_section():
    """A docstring that sends its reader to the design notes finds its module's section there."""
    sections = set(re.findall(r"^## `([\w.]+)`$", NOTES.read_text(), flags=re.M))
    pointing = {name for name, doc in module_docstrings().items() if "design_notes.md" in doc}
    assert pointing, "no module points to the design notes"
    assert pointing <= sections, sorted(pointing - sections)
    assert sections <= set(module_docstrings()), sorted(sections - set(module_docstrings()))
