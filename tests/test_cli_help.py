"""Every option of every ``dsbd`` subcommand has help text, and each one with a default
shows it in ``--help`` (as rendered, every subparser walked); the help agrees with the program."""

from __future__ import annotations

import argparse

import pytest

from dsbd_jax.cli import DEFAULT_TARGET, ProgressBar, build_parser


def subparsers(parser, name="dsbd"):
    """``(name, parser)`` for ``parser`` and every subcommand below it."""
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub, p in action.choices.items():
                yield from subparsers(p, f"{name} {sub}")


def shows_default(action) -> bool:
    """Whether ``--help`` must name ``action``'s default: not for None, a flag's False or an
    empty list (nothing to show)."""
    d = action.default
    return not (d is None or d is False or d is argparse.SUPPRESS
                or (isinstance(d, list) and not d))


PARSERS = dict(subparsers(build_parser()))


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_every_option_has_help_and_shows_its_default(name):
    parser = PARSERS[name]
    text = " ".join(parser.format_help().split())  # undo the line wrapping
    checked = 0
    for action in parser._actions:
        if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
            continue
        what = f"{name}: {action.option_strings or action.dest}"
        assert action.help and action.help.strip(), f"{what} has no help text"
        if shows_default(action):
            assert f"(default: {action.default})" in text, f"{what}: default not shown"
        checked += 1
    assert checked or name in ("dsbd", "dsbd vocab"), name


def option_help(parser, option: str) -> str:
    """The rendered help block of one option (unwrapped)."""
    action = next(a for a in parser._actions if option in a.option_strings)
    return " ".join(parser._get_formatter()._format_action(action).split())


def test_generate_help_names_the_issue_options_defaults():
    gen = PARSERS["dsbd generate"]
    for option, default in (("--max-new-tokens", 32), ("--gamma", 3), ("--beams", 2),
                            ("--draft", "qwen2.5-coder-0.5b-instruct"), ("--seed", 0),
                            ("--temperature", 1.0), ("--target", DEFAULT_TARGET)):
        assert option_help(gen, option).endswith(f"(default: {default})"), option
    assert "(default" not in option_help(gen, "--prompt")  # required, no default


def test_top_level_help_agrees_with_the_readme():
    """``dsbd --help`` recommends the README's distillation recipe (fkl) and does not claim the
    bar shows tokens/s (it shows none: one figure per run, printed at the end)."""
    text = " ".join(build_parser().format_help().split())
    assert "configs/distill_qwen_fkl.yaml" in text and "distill_qwen.yaml" not in text
    assert "no rate" in text and "tokens/s" in text.split("no rate", 1)[1]


def test_the_generate_bar_shows_what_the_help_says():
    """Tokens, iterations, target calls and DSBD's accepted/layer; no rate."""
    np = pytest.importorskip("numpy")
    bar = ProgressBar(total=8, desc="dsbd", method="dsbd")
    bar(dict(generated=np.array([3, 2]), iterations=np.array(2), target_calls=np.array(3),
             accepted=np.array(3), verified=np.array(4)))
    line = str(bar.bar)
    bar.close()
    assert "5/8 tok" in line and "iter=2" in line and "target calls=3" in line, line
    assert "accepted/layer=0.75" in line, line
    assert "/s" not in line and "s/tok" not in line, line


def test_demo_verdict_names_what_held_dsbd_back():
    """The demo's last line: faster at equal or better log-likelihood, or slower with the tokens
    per target pass and, on a CPU, the forest pass's cost in the model's dtype."""
    from dsbd_jax.cli import demo_verdict
    stats = {"generated_tokens": [32, 32], "target_calls": [6, 5]}
    fast = demo_verdict(1.3, 0.01, stats, "bfloat16", backend="gpu")
    assert fast.startswith("DSBD was 1.30x as fast as beam sampling at equal or better")
    assert "5.82 new tokens per target pass" in fast
    slow = demo_verdict(0.77, -0.2, stats, "bfloat16", backend="cpu")
    assert slow.startswith("DSBD was slower than beam sampling here (0.77x, lower log-likelihood)")
    assert "forest costs more than a one-token pass (bfloat16" in slow
    assert "forest" not in demo_verdict(0.9, 0.0, stats, "float32", backend="gpu")
    # rounds on both sides of 1: the run cannot tell them apart, whatever the best ratio says
    noisy = demo_verdict(1.04, 0.0, stats, "bfloat16", backend="cpu", rounds=[0.97, 1.08])
    assert noisy.startswith("DSBD and beam sampling were within this run's noise (0.97x to "
                            "1.08x round by round"), noisy
    assert demo_verdict(1.3, 0.0, stats, "bfloat16", backend="gpu",
                        rounds=[1.2, 1.3]).startswith("DSBD was 1.30x as fast")


@pytest.mark.parametrize("argv, words", [
    (["--prompt", "hi", "--threshold", "1.5"], "--threshold: must be a number in [0, 1]"),
    (["--prompt", "hi", "--beams", "0"], "--beams: must be an int >= 1"),
    (["--method", "beam", "--prompt", "hi", "--max-new-tokens", "0"],
     "--max-new-tokens: must be an int >= 1"),
    (["--prompt", "hi", "--draft", "no-such-draft"], "--draft 'no-such-draft': no such model"),
    (["--prompt", "hi", "--target", "no/such/dir/"], "--target 'no/such/dir/': no such model"),
    (["--raw", "--prompt", ""], "--prompt 1 is empty"),
])
def test_generate_refuses_bad_options_before_reading_a_model(argv, words, monkeypatch, capsys):
    """A bad setting or an empty ``--raw`` prompt is refused before any model config, tokenizer
    or weight is read (the default models' configs and tokenizer can take seconds to read)."""
    from dsbd_jax import cli
    from dsbd_jax.loading import load as loading

    def fail(*a, **k):
        raise AssertionError("a model was read before the options were checked")
    for name in ("read_config", "load_tokenizer", "load_model"):
        monkeypatch.setattr(loading, name, fail)
    assert cli.main(["generate", *argv]) == 2
    assert words in capsys.readouterr().err


def test_beams_help_says_what_dsbd_outputs():
    """DSBD's output width is the width of the layer a run ends on (the extra layer's --beams
    only when every layer passed), so the help gives the range, not W."""
    from dsbd_jax.cli import _settings
    text = option_help(dict(subparsers(build_parser()))["dsbd generate"], "--beams")
    assert "max(--beams, --draft-width)" in text and "--min-width" in text
    args = build_parser().parse_args(["generate", "--prompt", "hi", "--beams", "2",
                                      "--draft-width", "3"])
    s = _settings("dsbd", args)
    assert (s["num_beams"], s["min_width"], s["max_width"]) == (2, 1, 3)


@pytest.mark.parametrize("argv, words", [
    (["generate", "--prompt", "hi", "--draft", "no-such-draft"],
     ["--draft 'no-such-draft'", "dsbd train-head RECIPE"]),
    (["generate", "--prompt", "hi", "--beams", "0"], ["--beams:"]),
    (["vocab", "build", "--model", "qwen2.5-coder-0.5b-instruct", "--generate-with",
      "qwen2.5-coder-0.5b-instruct", "--prompts", "missing.txt"], ["--prompts missing.txt"]),
    (["vocab", "build", "--model", "no-such-model", "--text", "README.md"],
     ["--model 'no-such-model'"]),
    (["train-head", "configs/head_tiny.yaml"],
     ["target '/tmp/dsbd_tiny_missing/target'", "dsbd make-tiny-pair /tmp/dsbd_tiny_missing"]),
    (["distill", "configs/distill_qwen.yaml"], ["draft 'no-such-draft'"]),
])
def test_refusals_come_at_once_with_an_empty_cache(argv, words, tmp_path, monkeypatch, capsys):
    """Every documented bad input is refused within 3 s with an empty cache, before any model
    is read or converted, naming the option or recipe key the user wrote and, where one exists,
    the command that fixes it."""
    import time
    from pathlib import Path
    from dsbd_jax import cli
    from dsbd_jax.loading import load as loading
    from dsbd_jax.loading import presets
    root = Path(__file__).resolve().parents[1]
    monkeypatch.setenv("DSBD_JAX_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)

    def fail(*a, **k):
        raise AssertionError("a model was read or converted before the input was refused")
    for name in ("read_config", "load_tokenizer", "load_model"):
        monkeypatch.setattr(loading, name, fail)
    monkeypatch.setattr(presets, "load_preset", fail)
    (tmp_path / "README.md").write_text("some text")
    if argv[0] in ("train-head", "distill"):          # recipes pointing at missing models
        text = (root / argv[1]).read_text()
        text = (text.replace("/tmp/dsbd_tiny/", "/tmp/dsbd_tiny_missing/") if argv[0] == "train-head"
                else text.replace("models: models/qwen_offline.yaml",
                                  "target: qwen2.5-coder-1.5b-instruct\ndraft: no-such-draft"))
        (tmp_path / "recipe.yaml").write_text(text)
        argv = [argv[0], "recipe.yaml"]
    t0 = time.perf_counter()
    assert cli.main(argv) == 2
    assert time.perf_counter() - t0 < 3.0
    err = capsys.readouterr().err
    for w in words:
        assert w in err, err
