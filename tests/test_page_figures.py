"""Every measured figure a reader sees in README.md and docs/ equals the committed JSON it comes
from, and every figure of the kinds the pages quote is accounted for.

1. Each entry of ``page_figures.FIGURES`` (the page, a passage of it with each figure written as
   a key path or a small expression over the JSON, and the format the page prints) is rendered
   from the JSON and must appear on the page: a figure that rounds otherwise fails.
2. Completeness: every ratio figure (``1.57x``, ``0.30-0.31x``, ``3x``) in README.md and
   docs/**/*.md, and every number in a table of docs/results/*.md (the first column, the labels,
   and the header rows aside; decoder settings such as ``gamma 4`` aside), is a figure of an
   entry or lies in an entry of ``page_figures.ALLOWED`` (the paper's figures, size ratios...,
   each with its reason).
3. The check itself fails on a page whose figure differs from the JSON by one unit in the last
   printed place.

Only the standard library: no jax, no model.
"""

from __future__ import annotations

import re
from pathlib import Path

import page_figures as pf

ROOT = pf.ROOT
PLACE = re.compile(r"\{(?P<get>[^{}]+?):(?P<fmt>\+?,?(?:\.\d+)?[fd])\}")
RATIO = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?x\b")
NUMBER = re.compile(r"(?<![\w.=])\d+(?:,\d{3})*(?:\.\d+)?(?:-\d+(?:\.\d+)?)?(?![\w-]|\.\d)")
SEPARATOR = re.compile(r"^\|[-:| ]+\|\s*$")


def pages():
    yield ROOT / "README.md"
    yield from sorted(p for p in (ROOT / "docs").rglob("*.md") if "_build" not in p.parts)


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


# --- whitespace-insensitive matching ---------------------------------------------------------

def normalize(text: str):
    """``text`` with every run of whitespace made one space, and for each character kept its
    index in ``text``."""
    out, where, space = [], [], False
    for i, ch in enumerate(text):
        if ch.isspace():
            if not space:
                out.append(" ")
                where.append(i)
            space = True
        else:
            out.append(ch)
            where.append(i)
            space = False
    return "".join(out), where


def occurrences(page_text: str, passage: str, spans):
    """Where ``passage`` (normalized) occurs in ``page_text``: for each occurrence, the spans of
    ``passage`` given as ``spans`` (``[start, end)`` in ``passage``), as offsets in
    ``page_text``."""
    page_n, page_at = normalize(page_text)
    passage_n, passage_at = normalize(passage)
    back = {orig: i for i, orig in enumerate(passage_at)}
    found, start = [], page_n.find(passage_n)
    while start >= 0:
        found.append([(page_at[start + back[s]], page_at[start + back[e - 1]] + 1)
                      for s, e in spans])
        start = page_n.find(passage_n, start + 1)
    return found


# --- rendering an entry ----------------------------------------------------------------------

def namespace(source: str, at: str):
    def v(path):
        if path.startswith("/"):
            return pf.resolve(pf.load(source), path[1:])
        return pf.resolve(pf.load(source), f"{at}.{path}" if at else path)

    def w(rel_json, path):
        return pf.resolve(pf.load(rel_json), path)

    consts = {k: x for k, x in vars(pf).items() if k.lstrip("_").isupper()
              and isinstance(x, (str, tuple))}
    return {"__builtins__": {}, **consts, **pf.HELPERS, "v": v, "w": w}


def render_value(x, fmt: str) -> str:
    if isinstance(x, tuple):
        return "-".join(render_value(y, fmt) for y in x)
    return format(x, fmt)


def render(entry):
    """The passage as the JSON says it should be printed, and the spans of its figures."""
    page, source, text, at = entry
    ns = namespace(source, at)
    out, spans, last = [], [], 0
    for m in PLACE.finditer(text):
        out.append(text[last:m.start()])
        get = m.group("get")
        x = eval(get[1:], ns) if get.startswith("=") else ns["v"](get)  # noqa: S307
        figure = render_value(x, m.group("fmt"))
        pos = sum(map(len, out))
        spans.append((pos, pos + len(figure)))
        out.append(figure)
        last = m.end()
    out.append(text[last:])
    return "".join(out), spans


def nearest(page_text: str, text: str) -> str:
    """The page's text where the entry's passage should be: from the passage's words before its
    first figure (for the failure message)."""
    head = normalize(text[:PLACE.search(text).start()] if PLACE.search(text) else text)[0]
    page_n = normalize(page_text)[0]
    for cut in (len(head), 40, 20):
        i = page_n.find(head[-cut:]) if head[-cut:].strip() else -1
        if i >= 0:
            return page_n[i:i + len(head) + 60]
    return "(the passage's words are not on the page)"


def mismatches(entries, read=lambda page: (ROOT / page).read_text()):
    bad = []
    for entry in entries:
        page, source, text, at = entry
        passage, spans = render(entry)
        if not occurrences(read(page), passage, spans):
            bad.append(f"{page} ({source}):\n  expected: {normalize(passage)[0]}\n"
                       f"  the page: {nearest(read(page), text)}")
    return bad


# --- the checks ------------------------------------------------------------------------------

def test_figures_equal_their_json():
    bad = mismatches(pf.FIGURES)
    assert not bad, (f"{len(bad)} figures differ from their JSON (or their passage changed):\n"
                     + "\n".join(bad))


def test_every_constant_is_bound_once():
    """The templates read page_figures' upper-case constants by name when rendered, so the last
    binding of a name wins for every template: a name bound twice would silently point earlier
    entries' ``w(NAME, ...)`` at the later file."""
    import ast
    tree = ast.parse(Path(pf.__file__).read_text())
    names = [t.id for node in tree.body if isinstance(node, ast.Assign) for t in node.targets
             if isinstance(t, ast.Name) and t.id.lstrip("_").isupper()]
    twice = sorted({n for n in names if names.count(n) > 1})
    assert not twice, f"bound more than once in page_figures.py: {twice}"


def test_every_entry_names_a_results_file_and_a_page():
    for page, source, text, at in pf.FIGURES:
        assert (ROOT / page).is_file(), page
        assert source.startswith("results/") and (ROOT / source).is_file(), source
        assert PLACE.search(text), f"{page}: an entry without a figure: {text!r}"


def covered_spans():
    """Per page, the spans of the registered figures and of the allowed passages."""
    spans = {}
    for entry in pf.FIGURES:
        page = entry[0]
        passage, figs = render(entry)
        for found in occurrences((ROOT / page).read_text(), passage, figs):
            spans.setdefault(page, []).extend(found)
    for page, phrase, reason in pf.ALLOWED:
        for path in pages() if page == "*" else [ROOT / page]:
            spans.setdefault(rel(path), []).extend(allowed_spans(path.read_text(), phrase))
    return spans


def allowed_spans(text: str, phrase: str):
    table = phrase.startswith("table:")
    phrase = phrase[len("table:"):] if table else phrase
    out = []
    for (s, e), in occurrences(text, phrase, [(0, len(phrase))]):
        if table:  # the whole table: the run of lines starting with "|" around the phrase
            s = text.rfind("\n", 0, s) + 1
            while s > 0 and text[text.rfind("\n", 0, s - 1) + 1:].startswith("|"):
                s = text.rfind("\n", 0, s - 1) + 1
            e = s
            for line in text[s:].splitlines(keepends=True):
                if not line.startswith("|"):
                    break
                e += len(line)
        out.append((s, e))
    return out


def table_numbers(text: str):
    """``(offset, figure)`` of every number in the tables' cells past the first column, header
    rows and decoder settings aside."""
    lines = text.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    for i, line in enumerate(lines):
        if not line.startswith("|") or SEPARATOR.match(line):
            continue
        if i + 1 < len(lines) and SEPARATOR.match(lines[i + 1]):
            continue  # a header row
        cells = [m.end() for m in re.finditer(r"\|", line)]
        body_from = cells[1] if len(cells) > 1 else len(line)  # past the first column
        settings = [m.span() for m in pf.SETTING.finditer(line)]
        for m in NUMBER.finditer(line, body_from):
            if any(s <= m.start() < e for s, e in settings):
                continue
            yield offsets[i] + m.start(), m.group()


def figures_on(path: Path):
    text = pf.hand_written(path.read_text())   # rendered blocks: tests/test_rendered_pages.py
    found = {m.start(): m.group() for m in RATIO.finditer(text)}
    if path.parent == ROOT / "docs" / "results":
        found.update(dict(table_numbers(text)))
    return text, sorted(found.items())


def test_every_figure_on_the_pages_is_registered():
    spans = covered_spans()
    loose = []
    for path in pages():
        text, found = figures_on(path)
        mine = spans.get(rel(path), [])
        for at, figure in found:
            if not any(s <= at < e for s, e in mine):
                line = text.count("\n", 0, at) + 1
                loose.append(f"{rel(path)}:{line}: {figure!r} in "
                             f"{text.splitlines()[line - 1].strip()[:110]!r}")
    assert not loose, ("figures neither in page_figures.FIGURES nor in ALLOWED (a measured figure "
                       "belongs in FIGURES, with its JSON):\n" + "\n".join(loose))


def test_allowed_entries_are_found_and_give_a_reason():
    for page, phrase, reason in pf.ALLOWED:
        paths = list(pages()) if page == "*" else [ROOT / page]
        assert any(allowed_spans(p.read_text(), phrase) for p in paths), (page, phrase)
        assert len(reason) > 10, (page, phrase)


def test_the_check_fails_when_a_figure_is_off_by_one_unit():
    """A page whose figure differs from the JSON by one unit in its last printed place fails,
    and so does a passage whose figure has no JSON value at that path."""
    for entry in (pf.FIGURES[0], pf.FIGURES[-1]):
        page, source, text, at = entry
        passage, spans = render(entry)
        s, e = spans[0]
        figure = passage[s:e]
        digits = [i for i, ch in enumerate(figure) if ch.isdigit()]
        last = digits[-1]
        changed = figure[:last] + str((int(figure[last]) + 1) % 10) + figure[last + 1:]
        original = (ROOT / page).read_text()
        assert not mismatches([entry], read=lambda p: original)
        broken = original.replace(passage, passage[:s] + changed + passage[e:])
        if broken == original:  # the passage spans lines on the page: change it in place
            (cs, ce), = occurrences(original, passage, [(s, e)])[0]
            broken = original[:cs] + changed + original[ce:]
        assert broken != original
        assert mismatches([entry], read=lambda p: broken), entry
    bad_path = (pf.FIGURES[0][0], pf.FIGURES[0][1], "{no.such.key:.2f}", "")
    try:
        mismatches([bad_path])
    except KeyError:
        pass
    else:
        raise AssertionError("a key path the JSON lacks must fail")


def test_the_scan_sees_ratio_and_table_figures(tmp_path):
    """The completeness check finds a ratio in prose and a number in a results table, and leaves
    labels, headers and settings alone."""
    text = ("Ours runs at 1.57x theirs (and 3x smaller).\n\n"
            "| decoder | tok/s | note |\n|---|---|---|\n"
            "| beam W=4, gamma 4 | 2.54 | gamma 4, W_S 2, t 0.9 |\n")
    found = [m.group() for m in RATIO.finditer(text)]
    assert found == ["1.57x", "3x"], found
    assert [f for _, f in table_numbers(text)] == ["2.54"]


def test_head_recipe_gives_the_same_head_on_both_hosts():
    """docs/results/draft.md: the EPYC run of configs/head_qwen.yaml logged the Intel Xeon's
    held-out acceptance at every step, to two decimals."""
    xeon, epyc = pf.load(pf.TRAINING)["log"], pf.load(pf.TRAINING_EPYC)["log"]
    assert [r["step"] for r in xeon] == [r["step"] for r in epyc]
    for a, b in zip(xeon, epyc):
        for k in ("heldout_acceptance_1", "heldout_acceptance_2"):
            assert round(a[k], 2) == round(b[k], 2), (a["step"], k)
