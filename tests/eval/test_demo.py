"""``dsbd demo`` compares like with like: DSBD at the beam-W4 point against beam sampling W=4,
the log-likelihood difference printed with a 95% interval over the prompts, ``--beams N``
beams per prompt, and repeated beams pointed out with the way to draw distinct ones."""

from __future__ import annotations

import re
import types

import numpy as np
import pytest

from dsbd_jax.cli import demo as commands
from dsbd_jax.cli.running import prompt_block


def fake_out(ll, lengths, best, seqs=None):
    ll, lengths = np.asarray(ll, np.float32), np.asarray(lengths, np.int32)
    if seqs is None:
        seqs = np.arange(ll.size * 4).reshape(ll.shape + (4,)) % 7
    return types.SimpleNamespace(log_likelihoods=ll, lengths=lengths,
                                 best=np.asarray(best), sequences=np.asarray(seqs))


def test_the_difference_is_paired_by_prompt_with_an_interval():
    """Per-prompt log-likelihood per token of the best beam, DSBD minus beam sampling, and its
    bootstrap interval: prompts that differ a lot from each other (both methods alike) do not
    widen it, since the differences are paired."""
    beam = fake_out([[-4.0, -5.0], [-40.0, -50.0], [-8.0, -9.0], [-20.0, -30.0]],
                    [[4, 4], [4, 4], [4, 4], [4, 4]], [0, 0, 0, 0])
    dsbd = fake_out([[-4.4, -9.0], [-40.0, -60.0], [-8.4, -9.0], [-20.0, -30.0]],
                    [[4, 4], [4, 4], [4, 4], [4, 4]], [0, 0, 0, 0])
    d = commands.loglik_difference(dsbd, beam)
    assert d["n"] == 4 and d["mean"] == pytest.approx(-0.05)
    assert d["lo"] <= d["mean"] <= d["hi"] and d["hi"] - d["lo"] <= 0.11
    text = commands.interval_text(d)
    assert text.startswith("-0.050 (95% interval -0.100 to +0.000 over 4 prompts")
    one = commands.loglik_difference(fake_out([[-1.0]], [[2]], [0]),
                                     fake_out([[-2.0]], [[2]], [0]))
    assert "one prompt: no interval" in commands.interval_text(one)


def test_the_verdict_follows_the_interval():
    stats = {"generated_tokens": np.array([8]), "target_calls": np.array([4])}
    assert "cannot tell from beam sampling's" in commands.demo_verdict(
        1.2, -0.2, stats, "float32", backend="cpu", ll_interval=(-0.3, 0.1))
    assert "at lower log-likelihood" in commands.demo_verdict(
        1.2, -0.2, stats, "float32", backend="cpu", ll_interval=(-0.3, -0.1))
    assert "at higher log-likelihood" in commands.demo_verdict(
        1.2, 0.2, stats, "float32", backend="cpu", ll_interval=(0.1, 0.3))


def test_beams_shows_n_and_names_repeats():
    tok = types.SimpleNamespace(decode=lambda ids, skip_special_tokens: " ".join(map(str, ids)))
    seqs = np.asarray([[[1, 2, 3], [1, 2, 3], [4, 5, 6]]])
    out = fake_out([[-1.0, -1.0, -3.0]], [[3, 3, 3]], [0], seqs)
    text = prompt_block(tok, out, 0, "hi", limit=2, method="beam")
    assert text.count("beam 0") == 1 and "beam 2" not in text.replace("beams", "")
    assert "(3 beams in the output; the 2 most likely shown, as --beams asks)" in text
    assert "beams 0 and 1 are the same text: beam sampling draws its beams with replacement" \
        in text and "--no-replacement draws distinct beams" in text
    assert "same text" not in prompt_block(tok, out, 0, "hi", limit=1, method="beam")


def test_demo_on_a_tiny_pair(pair, capsys, monkeypatch, tmp_path):
    """The whole demo on tiny random models: the beam-W4 point's settings, ``--beams 2`` beams
    per prompt, and the difference printed with its interval over four prompts."""
    from dsbd_jax.cli import main
    monkeypatch.setenv("DSBD_JAX_CACHE", str(tmp_path))
    prompts = [a for p in ("hi", "two plus two", "a poem", "sort a list") for a in ("--prompt", p)]
    code = main(["demo", "--target", str(pair[0]), "--draft", str(pair[1]), *prompts,
                 "--max-new-tokens", "4", "--no-eos", "--beams", "2", "--min-width", "1",
                 "--progress", "none"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "width threshold t=0.7" in out and "gamma=2" in out and "W_S=4" in out
    assert "beam sampling: W=2" in out
    assert "DSBD minus beam sampling: " in out and "over 4 prompts, bootstrap)" in out
    for block in out.split("--- prompt ")[1:]:
        shown = [line for line in block.splitlines()
                 if re.match(r"\s+(best )?beam \d+: log-lik", line)]
        assert 1 <= len(shown) <= 2, block
    assert f"target {pair[0]}: float32 (--dtype auto for beam, dsbd" in out


def test_a_slow_first_plan_says_what_it_measures(capsys):
    """The host's first run measures its passes before any load: past ``after_s`` seconds a
    line says what runs, and one says how long it took; a quick (cached) plan says nothing."""
    import time
    from dsbd_jax.cli.running import announced
    with announced("measuring", after_s=0.05):
        time.sleep(0.3)
    err = capsys.readouterr().err
    assert "measuring ..." in err and "measuring: done in 0 s (cached for later runs" in err
    with announced("measuring", after_s=5.0):
        pass
    assert capsys.readouterr().err == ""
