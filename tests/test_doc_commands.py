"""Every ``dsbd`` command the README and the docs show parses with the command line's own
parser: a renamed or mistyped option, a wrong choice or a missing positional in a shown command
fails here, not in a user's terminal.

Commands in fenced shell blocks are whole commands and must parse as they are (one with ``...``
leaves arguments out on purpose). Commands in inline code are often a name and an option in
running text (`dsbd generate --dtype`): there, as after ``...``, only a missing argument is
allowed; an unknown option or a bad choice still fails."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from dsbd_jax.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SHELL = ("bash", "sh", "shell", "console", "")
PROGRAM = r"(?:\S*/)?(?:dsbd|python -m dsbd_jax)\s+"
IN_BLOCK = re.compile(r"(?:^|&&\s*|;\s*|\(\s*)(?:\w+=\S*\s+)*" + PROGRAM + r"(.*)")
INLINE = re.compile(r"^" + PROGRAM + r"(.*)$")
ENDS = ("|", "&", "&&", ";", ")", "2>&1")
# what an inline mention may leave out (a name and an option in running text)
PARTIAL = ("the following arguments are required", "expected one argument")


def blocks(text: str):
    """``(shell blocks, text outside every fence)``: the bodies of the fenced blocks marked as
    shell (``bash``, ``sh``, ``shell``, ``console`` or unmarked), fences read line by line."""
    shell, outside, body, lang = [], [], None, None
    for line in text.splitlines():
        fence = re.match(r"\s*```+\s*([\w{}-]*)", line)
        if fence and body is None:
            body, lang = [], fence.group(1).lower()
        elif fence:
            if lang in SHELL:
                shell.append("\n".join(body))
            body = None
        elif body is None:
            outside.append(line)
        else:
            body.append(line)
    return shell, "\n".join(outside)


def commands(text: str):
    """``[(argv text, whole)]``: ``whole`` for a command in a fenced shell block (continuation
    lines joined, comments cut), else an inline mention."""
    out = []
    shell, outside = blocks(text)
    for block in shell:
        for line in re.sub(r"\s*\\\n\s*", " ", block).splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line).strip()
            line = line[2:] if line.startswith("$ ") else line
            m = IN_BLOCK.search(line)
            if m:
                out.append((m.group(1), True))
    for span in re.findall(r"`([^`\n]+)`", outside):
        m = INLINE.match(span.strip())
        if m:
            out.append((m.group(1), False))
    return out


def argv_of(rest: str):
    """The arguments up to the first shell operator or redirection."""
    argv = shlex.split(rest)
    for i, a in enumerate(argv):
        if a in ENDS or a.startswith(">") or a.startswith("2>"):
            return argv[:i]
    return argv


def parse_error(argv) -> str:
    """The parser's error for ``argv`` (the last line it prints), or ``""`` when it parses."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit as e:
        if e.code not in (0, None):
            return (err.getvalue().strip().splitlines() or ["exit %s" % e.code])[-1]
    return ""


def shown():
    found = []
    for page in PAGES:
        for rest, whole in commands(page.read_text()):
            found.append(pytest.param(rest, whole, id=f"{page.relative_to(ROOT)}: {rest[:60]}"))
    return found


@pytest.mark.parametrize("rest, whole", shown())
def test_shown_command_parses(rest, whole):
    argv = argv_of(rest)
    error = parse_error([a for a in argv if a != "..."])
    if (not whole or "..." in argv) and any(p in error for p in PARTIAL):
        return
    assert not error, f"`dsbd {rest}` does not parse: {error}"


def test_the_pages_show_commands_and_a_wrong_one_fails():
    """The collection finds whole commands on the pages, and the check refuses what it must: an
    option the command does not have, a choice it does not offer, a missing positional."""
    found = [c for p in PAGES for c in commands(p.read_text())]
    assert sum(whole for _, whole in found) >= 20
    assert parse_error(["bench", "--config", "configs/quality_cpu.yaml"])
    assert parse_error(["generate", "--prompt", "x", "--method", "no-such-method"])
    assert parse_error(["bench"])
    assert not parse_error(argv_of("bench configs/quality_cpu.yaml --out runs/q | tee log"))
    assert commands("```bash\nA=1 dsbd plot runs/q \\\n  --out x  # a comment\n```") == [
        ("plot runs/q --out x", True)]
