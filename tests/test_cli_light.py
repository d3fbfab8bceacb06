"""The command line answers before JAX is imported: ``dsbd --help``, a subcommand's help,
argument errors and the settings' refusals run in plain Python (``dsbd_jax.cli.options``), and
the help is plain text, grouped. Each case runs ``python -m dsbd_jax`` in a subprocess and
reports, after the command, whether ``jax`` (or the library's heavy modules) were imported; a
regression that imports jax at the top of the parser's modules fails every case. The seconds
themselves are measured by ``python -m benchmarks.speed --cli``, not here (a shared test host's
timings are noise)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# runs the command line in-process, then prints which heavy modules it imported
PROBE = """
import json, sys
from dsbd_jax.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as e:
    code = e.code
heavy = sorted(m for m in ("jax", "jaxlib", "numpy", "flax", "dsbd_jax.decoding",
                           "dsbd_jax.loading", "dsbd_jax.models", "dsbd_jax.host.plan")
               if m in sys.modules)
print("\\nPROBE " + json.dumps({"code": code, "heavy": heavy}))
"""

CASES = {
    "help": (["--help"], 0, "usage: dsbd"),
    "demo help": (["demo", "--help"], 0, "DSBD's settings"),
    "generate help": (["generate", "--help"], 0, "the decoder's settings"),
    "train-head help": (["train-head", "--help"], 0, "usage: dsbd train-head"),
    "unknown option": (["generate", "--prompt", "hi", "--bogus"], 2, "unrecognized arguments"),
    "bad choice": (["generate", "--prompt", "hi", "--method", "greedy"], 2, "invalid choice"),
    "threshold": (["generate", "--prompt", "hi", "--threshold", "1.5"], 2,
                  "dsbd: error: --threshold: must be a number in [0, 1], got 1.5"),
    "top-p": (["demo", "--top-p", "0"], 2, "--top-p: must be in (0, 1]"),
    "widths": (["generate", "--prompt", "hi", "--draft-width", "1", "--min-width", "2"], 2,
               "--draft-width: must be at least --min-width (2)"),
    "bench tokens": (["bench", "configs/quick_cpu.yaml", "--max-new-tokens", "0"], 2,
                     "--max-new-tokens: must be an int >= 1"),
}


def probe(args):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    line = [x for x in r.stdout.splitlines() if x.startswith("PROBE ")]
    assert line, r.stdout + r.stderr
    return json.loads(line[-1][6:]), r.stdout + r.stderr


@pytest.mark.parametrize("case", sorted(CASES))
def test_answers_without_jax(case):
    args, code, expected = CASES[case]
    got, text = probe(args)
    assert got["code"] == code, text
    assert expected in text, text
    assert got["heavy"] == [], f"dsbd {' '.join(args)} imported {got['heavy']}"


def test_the_parser_spells_the_methods_as_the_decoders_do():
    from dsbd_jax.cli import options
    from dsbd_jax.decoding import methods
    assert options.METHODS == methods.METHODS and options.NEEDS_DRAFT == methods.NEEDS_DRAFT
    assert options.WITH_REPLACEMENT == {m for m in methods.METHODS
                                        if "replacement" in methods.allowed(m)}


def test_help_is_plain_text_and_grouped():
    from dsbd_jax.cli import build_parser
    from test_cli_help import PARSERS
    for name, parser in PARSERS.items():
        text = parser.format_help()
        assert "``" not in text and ":mod:" not in text and ":func:" not in text, name
    for name in ("dsbd demo", "dsbd generate"):
        text = PARSERS[name].format_help()
        heads = ["models and loading:", "the decoder's settings:",
                 "DSBD's settings (and the drafted methods'):", "output:"]
        assert all(h in text for h in heads), name
        dsbd_part = text.split(heads[2])[1].split(heads[3])[0]
        assert "--threshold" in dsbd_part and "--min-width" in dsbd_part
        assert "--threshold" not in text.split(heads[1])[1].split(heads[2])[0]
    top = " ".join(build_parser().format_help().split())
    # one story of what --progress caches: both modes keep their programs
    assert "compiled on every run" not in top and "Both keep their compiled programs" not in top
    assert "both keep them in the compilation cache" in top
    for name in ("dsbd demo", "dsbd generate"):
        sub = " ".join(PARSERS[name].format_help().split())
        assert "Both keep their compiled programs in the compilation cache" in sub


def test_the_demo_defaults_are_the_beam_w4_point():
    from dsbd_jax.cli import build_parser
    args = build_parser().parse_args(["demo"])
    assert (args.beams, args.gamma, args.draft_width, args.threshold, args.min_width) == (
        4, 2, 4, 0.7, 2)
    gen = build_parser().parse_args(["generate", "--prompt", "hi"])
    assert (gen.beams, gen.threshold, gen.min_width) == (2, 0.9, 1)   # generate keeps its own
