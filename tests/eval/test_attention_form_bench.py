"""``benchmarks/probes/attention_form.py --small``: the attention's former and current forms on a tiny
bfloat16 pair, every decoder, in one process; both give full outputs, the former form is really
the one its programs ran (they differ), and the patch is gone afterwards. The former forms compute
the current attention up to roundings."""

import pytest
import json

import jax
import jax.numpy as jnp
import numpy as np

from bench_setup import load_bench


@pytest.mark.extended   # a benchmark script's --small run (DSBD_TEST_EXTENDED=1)
def test_small_pair(tmp_path):
    bench = load_bench("attention_form")
    from dsbd_jax.models import llama
    current = llama.attend
    out = tmp_path / "attention.json"
    res = bench.main(["--small", "--repeats", "1", "--max-new-tokens", "4", "--draft-weights",
                      "int8", "--out", str(out)])
    assert llama.attend is current
    assert set(res["decoders"]) == set(bench.DECODERS)
    forms = ("normalised_after_values", "parts_in_cache_dtype")
    assert res["forms"] == list(forms) and res["draft_weights"] == "int8"
    for name, rec in res["decoders"].items():
        assert set(rec) == set(forms)
        for f in forms:
            assert len(rec[f]["median_s"]) == 2 and min(rec[f]["median_s"]) > 0
            best = [max(max(row) for row in lengths) for lengths in rec[f]["lengths"]]
            assert best == [4, 4], (name, f)
        former, now = (rec[f]["instructions"] for f in forms)
        assert former["dot"] + former["fusion"] > 0 and former != now, name
        assert res["ratios"][f"{name}: parts_in_cache_dtype / normalised_after_values, "
                             f"seconds"] > 0
    for f in forms:
        assert res["ratios"][f"dsbd_g2_WS4_t0.7_Wmin2 / beam_sample_W4 under {f}, speed"] > 0
        assert res["ratios"][f"speculative_g4 / sample under {f}, speed"] > 0
    assert res["dtypes"] == {"target": "bfloat16", "draft": "bfloat16"}
    stored = json.loads(out.read_text())
    assert stored["machine"]["cpu_flags"] is not None and "/tmp/" not in out.read_text()


def test_the_former_form_computes_the_same_attention():
    """What the comparison patches in is the same function up to float32 roundings."""
    from dsbd_jax.models import llama
    bench = load_bench("attention_form")
    r = np.random.default_rng(0)
    q = jnp.asarray(r.normal(size=(2, 3, 2, 2, 8)), jnp.float32)
    keys, values = (jnp.asarray(r.normal(size=(2, 5, 2, 8)), jnp.float32) for _ in range(2))
    mask = jnp.asarray(r.random((2, 3, 5)) < 0.7).at[..., 0].set(True)
    parts = lambda a: (a[:, :3], a[:, 3:])  # noqa: E731 (the cache's and the new tokens')
    for cap in (None, 4.0):
        now = np.asarray(llama.attend(q, parts(keys), parts(values), mask, 0.3, cap))
        for former in (bench.softmax_then_values, bench.normalised_after_values):
            np.testing.assert_allclose(np.asarray(former(q, keys, values, mask, 0.3, cap)), now,
                                       rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(
                np.asarray(former(q, parts(keys), parts(values), mask, 0.3, cap)), now,
                rtol=1e-5, atol=1e-6)
    with bench.form("softmax_then_values"):
        assert llama.attend is bench.softmax_then_values
    assert llama.attend is not bench.softmax_then_values
    jax.clear_caches()
