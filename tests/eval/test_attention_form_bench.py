"""``benchmarks/attention_form.py --small``: the attention's former and current forms on a tiny
bfloat16 pair, each in its own process, every decoder; both give the same number of tokens, and
the former form is really the one its process ran (its programs differ)."""

import json

import jax
import jax.numpy as jnp
import numpy as np

from bench_setup import load_bench


def test_small_pair(tmp_path):
    bench = load_bench("attention_form")
    out = tmp_path / "attention.json"
    res = bench.main(["--small", "--rounds", "1", "--max-new-tokens", "4", "--out", str(out)])
    by = {r["variant"]: r for r in res["runs"]}
    assert set(by) == set(bench.VARIANTS)
    for name in bench.DECODERS:
        for v in bench.VARIANTS:
            assert by[v]["decoders"][name]["tokens"] == [4, 4], (v, name)
        former, current = (by[v]["decoders"][name]["instructions"] for v in bench.VARIANTS)
        assert former["dot"] + former["fusion"] > 0 and former != current, name
        assert res["ratios"][f"{name}: normalised_after_values / softmax_then_values, "
                             f"seconds"] > 0
    assert by["normalised_after_values"]["dtypes"] == {"target": "bfloat16", "draft": "bfloat16"}
    stored = json.loads(out.read_text())
    assert stored["machine"]["cpu_flags"] is not None and "/tmp/" not in out.read_text()


def test_the_former_form_computes_the_same_attention(monkeypatch):
    """What the comparison patches in is the same function up to float32 roundings."""
    from dsbd_jax.models import llama
    current = llama.attend
    bench = load_bench("attention_form")
    monkeypatch.setattr(llama, "attend", current)  # restored after the patch below
    bench.softmax_then_values()
    former = llama.attend
    assert former is not current
    r = np.random.default_rng(0)
    q = jnp.asarray(r.normal(size=(2, 3, 2, 2, 8)), jnp.float32)
    keys, values = (jnp.asarray(r.normal(size=(2, 5, 2, 8)), jnp.float32) for _ in range(2))
    mask = jnp.asarray(r.random((2, 3, 5)) < 0.7).at[..., 0].set(True)
    for cap in (None, 4.0):
        np.testing.assert_allclose(np.asarray(former(q, keys, values, mask, 0.3, cap)),
                                   np.asarray(current(q, keys, values, mask, 0.3, cap)),
                                   rtol=1e-5, atol=1e-6)
    jax.clear_caches()
