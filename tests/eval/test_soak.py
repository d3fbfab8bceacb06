"""``benchmarks/soak.py --small`` runs and its checks can fail."""

import json

import numpy as np

from bench_setup import load_bench


def load_soak():
    return load_bench("soak")


def test_soak_small(tmp_path, torch):
    soak = load_soak()
    out = tmp_path / "soak.json"
    res = soak.main(["--small", "--out", str(out)])
    saved = json.loads(out.read_text())
    assert saved["cpu_model"] and saved["what"].endswith("--small")
    assert res["compiles_ok"], (res["compile_combinations"], res["compiles_first_round"],
                                res["compiles_later_rounds"])
    assert res["nan_outputs"] == 0 and res["malformed_outputs"] == 0, res["malformed"]
    assert res["growth_after_round_1"]["live_arrays"]["change_after_round_1"] == 0


def test_soak_checks_can_fail():
    """``problems`` finds a NaN, a token past the vocabulary, a non-pad after the length and a
    set ``invalid`` flag; ``slope`` sees growth."""
    from dsbd_jax.decoding.common import GenerateOutput

    class Cfg:
        max_new_tokens, pad_id = 3, 0
    seqs = np.array([[[1, 2, 0]]])
    good = GenerateOutput(sequences=seqs, lengths=np.array([[2]]),
                          log_likelihoods=np.array([[-1.0]]), best=np.array([0]), stats={},
                          invalid=np.array([False]))
    soak = load_soak()
    assert soak.problems(good, Cfg, 5) == []
    assert "NaN log-likelihood" in soak.problems(good.replace(log_likelihoods=np.array([[np.nan]])), Cfg, 5)
    assert soak.problems(good, Cfg, 2)  # token 2 outside a vocabulary of 2
    assert soak.problems(good.replace(sequences=np.array([[[1, 2, 3]]])), Cfg, 5)
    assert soak.problems(good.replace(invalid=np.array([True])), Cfg, 5)
    assert soak.slope([1, 2, 3]) > 0.99 and abs(soak.slope([5, 5, 5])) < 1e-9
