"""benchmarks/int8_products.py and benchmarks/int8_distance.py in their ``--small`` modes: every
kind lands in the JSON with its time and error, the blocked activation variant computes the
integer product it claims, and the distance run gives intervals for both models."""

import json

import jax.numpy as jnp
import numpy as np

from bench_setup import load_bench
from dsbd_jax.models import products, weights


def test_small_products_run_times_every_kind(tmp_path):
    bench = load_bench("int8_products")
    out = tmp_path / "p.json"
    bench.main(["--small", "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["machine"]["cpu_model"]
    assert [r["rows"] for r in data["results"]] == [1, 2, 4]
    for r in data["results"]:
        for kind in ("float32 plain", "float32 transposed", "bfloat16 rows", "int8",
                     "int8 one-row"):
            assert r["ms"][kind] > 0, kind
        assert 0 < r["rel_rms_vs_float32"]["int8"] < 0.1
    # int8 programs run under XLA's own options; Eigen's are timed as a variant
    assert data["options"]["int8"] == {}


def test_blocked_activations_are_the_integer_product_per_block():
    bench = load_bench("int8_distance")
    rng = np.random.default_rng(0)
    w = jnp.asarray(rng.standard_normal((64, 24)).astype(np.float32))
    k = weights.Int8.quantize(w)
    x = jnp.asarray(rng.standard_normal((3, 64)).astype(np.float32))
    got = np.asarray(bench.blocked_product(16)(k, x))
    xq, xs = products.quantize_rows(x.reshape(3, 4, 16))
    want = np.einsum("mbk,obk->mob", np.asarray(xq, np.int64),
                     np.asarray(k.codes, np.int64).reshape(24, 4, 16)).astype(np.float64)
    want = (want * np.asarray(xs)[:, None, :]).sum(-1) * np.asarray(k.scales)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    with bench.activations("block16"):
        np.testing.assert_allclose(np.asarray(weights.product(x, k)), got, rtol=1e-6)
    assert weights.Int8.product is not bench.blocked_product   # restored
    np.testing.assert_allclose(np.asarray(weights.product(x, k)),
                               np.asarray(products.int8_rows(x, k.codes, k.scales)))


def test_small_distance_run(tmp_path):
    bench = load_bench("int8_distance")
    out = tmp_path / "d.json"
    bench.main(["--small", "--out", str(out)])
    data = json.loads(out.read_text())
    for role in ("target", "draft"):
        rec = data["models"][role]
        assert rec["positions"] > 0
        for kind in ("row", "block32"):
            kl = rec[kind]["kl_float_int8"]
            assert kl["mean"] >= 0 and kl["ci95"][0] <= kl["mean"] <= kl["ci95"][1]
            assert 0 <= rec[kind]["top1_agree"]["mean"] <= 1
    assert 0 < data["models"]["draft"]["row"]["acceptance_int8_draft"]["mean"] <= 1


def test_qwix_variants_or_a_clear_refusal(tmp_path, capsys):
    """``--qwix``: qwix's products beside the kind's where qwix is installed (it is not a
    dependency), else a one-line refusal that says how to install it."""
    import importlib.util

    import pytest
    bench = load_bench("int8_products")
    out = tmp_path / "q.json"
    if importlib.util.find_spec("qwix") is None:
        with pytest.raises(SystemExit):
            bench.main(["--small", "--qwix", "--out", str(out)])
        assert "pip install --no-deps qwix" in capsys.readouterr().err
        assert not out.exists()
        return
    bench.main(["--small", "--qwix", "--rows", "2", "--out", str(out)])
    row = json.loads(out.read_text())["results"][0]
    for kind in ("qwix int8 [out, in]", "qwix int8 [in, out]", "qwix weight-only"):
        assert row["ms"][kind] > 0 and 0 < row["rel_rms_vs_float32"][kind] < 0.1, kind
