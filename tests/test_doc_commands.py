"""Every ``dsbd`` command the README, the docs and the configs' comments show parses with the
command line's own parser, and every ``python benchmarks/*.py`` or ``scripts/*.py`` command
with its script's (``python -m benchmarks.NAME`` read as ``benchmarks/NAME.py``; a script
retired from the tree must be named, with the commit it ran at, in the page's *Retired scripts*
section): a renamed or mistyped option, a wrong choice or a missing required argument
in a shown command fails here, not in a user's terminal.

Commands in fenced shell blocks are whole commands and must parse as they are (one with ``...``
leaves arguments out on purpose). Commands in inline code are often a name and an option in
running text (`dsbd generate --dtype`): there, as after ``...``, only a missing argument is
allowed; an unknown option or a bad choice still fails. A script's command, inline or not, is a
command to run and must be whole but for ``...``. A script is parsed by running it as
``__main__`` with ``argparse`` stopped right after its ``parse_args`` (nothing after it runs;
the environment it may set at import is put back)."""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import runpy
import shlex
import sys
from pathlib import Path

import jax
import pytest

from dsbd_jax.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", ROOT / "benchmarks" / "README.md",
         *sorted((ROOT / "docs").rglob("*.md"))]
CONFIGS = sorted((ROOT / "configs").rglob("*.yaml"))
SHELL = ("bash", "sh", "shell", "console", "")
PROGRAM = r"(?:\S*/)?(?:dsbd|python -m dsbd_jax)\s+"
# where a command starts on a shell line: its start, or after && ; ( and any VAR=value
START = r"(?:^|&&\s*|;\s*|\(\s*)(?:\w+=\S*\s+)*"
IN_BLOCK = re.compile(START + PROGRAM + r"(.*)")
INLINE = re.compile(r"^" + PROGRAM + r"(.*)$")
DEMO = re.compile(r"\bbash scripts/demo\.sh\b")
# a script's name in lower case (benchmarks/NAME.py is a placeholder), or a benchmark module
# run with -m (python -m benchmarks.speed: read as benchmarks/speed.py)
SCRIPT = (r"(?:\S*/)?python3?\s+(-m\s+benchmarks\.[a-z0-9_]+|"
          r"(?:benchmarks|scripts)/[a-z0-9_/]+\.py)\b\s*")
# a page that shows a retired script's command names the commit it ran at, in this section
RETIRED = re.compile(r"## Retired scripts\n(?P<body>.*?)(?=\n#|\Z)", re.S)
COMMIT = re.compile(r"commit\s+`([0-9a-f]{7,40})`")
SCRIPT_IN_BLOCK = re.compile(START + SCRIPT + r"(.*)")
SCRIPT_INLINE = re.compile(r"^" + SCRIPT + r"(.*)$")
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


def commands(text: str, scripts: bool = False):
    """``[(argv text, whole)]`` of the ``dsbd`` commands (``scripts``: ``[(script, argv text,
    whole)]`` of the script commands): ``whole`` for a command in a fenced shell block
    (continuation lines joined, comments cut), else an inline mention (its line breaks
    joined)."""
    out = []
    shell, outside = blocks(text)
    in_block, inline = (SCRIPT_IN_BLOCK, SCRIPT_INLINE) if scripts else (IN_BLOCK, INLINE)
    lines = [(line, True) for block in shell
             for line in re.sub(r"\s*\\\n\s*", " ", block).splitlines()]
    lines += [(" ".join(span.split()), False) for span in re.findall(r"`([^`]+)`", outside)]
    for line, whole in lines:
        line = DEMO.sub("dsbd demo", line)  # the quickstart's demo passes its arguments on
        if whole:
            line = re.sub(r"(^|\s)#.*$", "", line).strip()
            line = line[2:] if line.startswith("$ ") else line
        m = (in_block.search if whole else inline.match)(line.strip())
        if m and scripts:
            script = m.group(1)
            if script.startswith("-m"):
                script = script.split()[-1].replace(".", "/") + ".py"
            out.append((script, m.group(2), whole))
        elif m:
            out.append(m.groups() + (whole,))
    return out


def config_text(path: Path) -> str:
    """A config's commented commands (``#   dsbd bench ...``, indented under a ``#``) as one
    shell block, the way :func:`commands` reads a page."""
    lines = [m.group(1) for m in re.finditer(r"(?m)^#\s{2,}((?:\S*/)?(?:dsbd|python3?)\s.*)$",
                                             path.read_text())]
    return "```bash\n" + "\n".join(lines) + "\n```\n"


def texts():
    """``[(name, text)]``: the pages, and each config's commented commands."""
    return ([(str(p.relative_to(ROOT)), p.read_text()) for p in PAGES]
            + [(str(p.relative_to(ROOT)), config_text(p)) for p in CONFIGS])


def argv_of(rest: str):
    """The arguments up to the first shell operator or redirection."""
    argv = shlex.split(rest)
    for i, a in enumerate(argv):
        if a in ENDS or a.startswith(">") or a.startswith("2>"):
            return argv[:i]
    return argv


def _last_line(err: io.StringIO, code) -> str:
    """The last line a parser printed (its error), or the exit code where it printed none."""
    return (err.getvalue().strip().splitlines() or ["exit %s" % code])[-1]


def parse_error(argv) -> str:
    """The parser's error for ``argv`` (the last line it prints), or ``""`` when it parses."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            build_parser().parse_args(argv)
    except SystemExit as e:
        if e.code not in (0, None):
            return _last_line(err, e.code)
    return ""


class _Parsed(Exception):
    """Raised right after a script's ``parse_args``: the script stops there."""


def script_error(script: str, argv) -> str:
    """The error of ``script``'s own parser for ``argv`` (the last line it prints), or ``""``.
    The script runs as ``__main__`` until its ``parse_args`` returns, never further; the
    process environment, ``sys.argv`` and ``sys.path`` are put back after."""
    path = ROOT / script
    assert "parse_args(" in path.read_text(), f"{script} has no parse_args: it would run"
    jax.devices()  # this process's backend starts before any script's XLA_FLAGS, never after
    parse = argparse.ArgumentParser.parse_args

    def stop(self, args=None, namespace=None):
        parse(self, args, namespace)
        raise _Parsed

    environ, argv0, path0 = dict(os.environ), sys.argv, list(sys.path)
    err = io.StringIO()
    argparse.ArgumentParser.parse_args = stop
    try:
        sys.argv = [str(path), *argv]
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(str(path), run_name="__main__")
    except _Parsed:
        return ""
    except SystemExit as e:
        if e.code not in (0, None):
            return _last_line(err, e.code)
        return ""
    finally:
        argparse.ArgumentParser.parse_args = parse
        sys.argv, sys.path[:] = argv0, path0
        os.environ.clear()
        os.environ.update(environ)
    raise AssertionError(f"{script} returned without calling parse_args")


def shown():
    return [pytest.param(rest, whole, id=f"{name}: {rest[:60]}")
            for name, text in texts() for rest, whole in commands(text)]


def shown_scripts():
    return [pytest.param(script, rest, whole, name, id=f"{name}: {script} {rest[:50]}")
            for name, text in texts() for script, rest, whole in commands(text, scripts=True)]


def retired_at(page_text: str, script: str):
    """The commit a page names for a retired ``script`` (its *Retired scripts* section), or
    None."""
    m = RETIRED.search(page_text)
    if not m or f"`{script}`" not in m.group("body"):
        return None
    commit = COMMIT.search(m.group("body"))
    return commit and commit.group(1)


@pytest.mark.parametrize("rest, whole", shown())
def test_shown_command_parses(rest, whole):
    argv = argv_of(rest)
    error = parse_error([a for a in argv if a != "..."])
    if (not whole or "..." in argv) and any(p in error for p in PARTIAL):
        return
    assert not error, f"`dsbd {rest}` does not parse: {error}"


@pytest.mark.parametrize("script, rest, whole, page", shown_scripts())
def test_shown_script_command_parses(script, rest, whole, page):
    if not (ROOT / script).exists():
        # a retired script: the page names the commit it ran at, and that commit holds it
        commit = retired_at((ROOT / page).read_text(), script)
        assert commit, f"{page} shows `{script}`, which is not in the tree, without its commit"
        if (ROOT / ".git").exists():
            import subprocess
            there = subprocess.run(["git", "cat-file", "-e", f"{commit}:{script}"], cwd=ROOT,
                                   capture_output=True)
            assert there.returncode == 0 or "Not a valid object" in there.stderr.decode(), \
                f"{page}: commit {commit} has no {script}"
        return
    argv = argv_of(rest)
    error = script_error(script, [a for a in argv if a != "..."])
    if "..." in argv and any(p in error for p in PARTIAL):
        return
    assert not error, f"`python {script} {rest}` does not parse: {error}"


def test_a_wrong_script_command_fails_and_nothing_runs():
    """A script's unknown option and a missing required option are refused; a right command
    stops at its parser (the benchmark would take minutes: the test takes none); the
    environment stays as it was."""
    assert script_error("benchmarks/pass_floor.py", ["--no-such-option"])
    assert "--llama-python" in script_error("benchmarks/llama_cpp.py", ["--prompts", "4"])
    assert not script_error("benchmarks/pass_floor.py", ["--rows", "2", "--out", "x.json"])
    flags = os.environ.get("XLA_FLAGS")
    assert not script_error("benchmarks/accelerator.py", ["--help"])
    assert os.environ.get("XLA_FLAGS") == flags
    found = [c for _, text in texts() for c in commands(text, scripts=True)]
    assert sum(whole for *_, whole in found) >= 10 and len(found) >= 40


def test_the_pages_show_commands_and_a_wrong_one_fails():
    """The collection finds whole commands on the pages, and the check refuses what it must: an
    option the command does not have, a choice it does not offer, a missing positional."""
    found = [c for _, text in texts() for c in commands(text)]
    assert sum(whole for _, whole in found) >= 30
    assert parse_error(["bench", "--config", "configs/quality_cpu.yaml"])
    assert parse_error(["generate", "--prompt", "x", "--method", "no-such-method"])
    assert parse_error(["bench"])
    assert not parse_error(argv_of("bench configs/quality_cpu.yaml --out runs/q | tee log"))
    assert commands("```bash\nA=1 dsbd plot runs/q \\\n  --out x  # a comment\n```") == [
        ("plot runs/q --out x", True)]
    assert commands("`bash scripts/demo.sh --beams 3`") == [("demo --beams 3", False)]
    assert commands("see `python benchmarks/a.py --x\n1` here", scripts=True) == [
        ("benchmarks/a.py", "--x 1", False)]
    assert commands("```bash\n.venv/bin/python -m benchmarks.speed --out x\n```",
                    scripts=True) == [("benchmarks/speed.py", "--out x", True)]
    page = "x\n\n## Retired scripts\n\n`benchmarks/a.py` ran at commit `90d572c`.\n"
    assert retired_at(page, "benchmarks/a.py") == "90d572c"
    assert retired_at(page, "benchmarks/b.py") is None


def test_int8_host_script_steps_parse_and_resume():
    """``scripts/int8_host.sh`` (the int8 issue's measurements on a host class not yet
    measured): each of its four steps is a command its benchmark's parser takes, named for the
    label; a step whose JSON exists is skipped (the script resumes); a bad label is refused."""
    import subprocess
    label = f"test_{os.getpid()}"
    env = dict(os.environ, PYTHON=sys.executable, DSBD_INT8_HOST_DRY="1")

    def dry():
        out = subprocess.run(["bash", "scripts/int8_host.sh", label], cwd=ROOT, env=env,
                             capture_output=True, text=True, check=True).stdout
        return [[line.split()[2].replace(".", "/") + ".py", *line.split()[3:]]
                for line in out.splitlines() if line.startswith(sys.executable + " -m ")]

    steps = dry()
    assert [s[0] for s in steps] == ["benchmarks/pass_floor.py", "benchmarks/speed.py",
                                     "benchmarks/speed.py", "benchmarks/draft_terms.py"]
    for script, *argv in steps:
        assert not script_error(script, argv), (script, argv)
        assert argv[argv.index("--out") + 1].endswith(f"_{label}.json")
    first = ROOT / "results" / f"pass_floor_int8_{label}.json"
    try:
        first.write_text("{}")
        assert [s[0] for s in dry()][0] == "benchmarks/speed.py"
    finally:
        first.unlink()
    bad = subprocess.run(["bash", "scripts/int8_host.sh", "a/b"], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "LABEL" in bad.stderr
