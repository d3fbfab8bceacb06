"""benchmarks/probes/matmul.py in its ``--small`` mode: every kernel variant (``[in, out]``,
``[out, in]``, blocked ``[out / n, in, n]``) computes the same products as torch (the script
checks it) and lands in the JSON with its timings."""

import pytest
import json

import jax.numpy as jnp
import numpy as np

from bench_setup import load_bench


def load_script():
    return load_bench("matmul")


def test_blocked_product_equals_plain_product():
    bench = load_script()
    rng = np.random.default_rng(0)
    w = rng.standard_normal((48, 96)).astype(np.float32)
    for n in (8, 32, 48):
        wb = jnp.asarray(w.reshape(48, -1, n).transpose(1, 0, 2))
        for m in (1, 3, 16):
            x = rng.standard_normal((m, 48)).astype(np.float32)
            got = np.asarray(bench.blocked_product(jnp.asarray(x), wb))
            np.testing.assert_allclose(got, x @ w, rtol=1e-5, atol=1e-5)


@pytest.mark.extended   # a benchmark script's --small run (DSBD_TEST_EXTENDED=1)
def test_small_run_times_every_variant(tmp_path):
    bench = load_script()
    out = tmp_path / "mm.json"
    bench.main(["--small", "--rows", "1", "4", "--blocks", "32", "64", "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["machine"]["cpu_model"] and data["blocks"] == [32, 64]
    variants = data["shapes"]["up"]["variants"]
    for label in ("jax in_out default", "jax out_in default", "jax blocked32 default",
                  "jax blocked64 default", "torch"):
        assert set(variants[label]) == {"1", "4"}, label
        assert all(v["min_ms"] > 0 for v in variants[label].values())
