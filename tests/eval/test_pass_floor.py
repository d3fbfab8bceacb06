"""``benchmarks/pass_floor.py``: a ``--small`` run of the products floor and the pass on it (both
tiny models, bfloat16, the host's form and transposed kernels, 1 and 12 new tokens), its JSON's
sections (the pass without its attention among them), and by hand that the floor runs the model's
own projections, one product each, in the pass's order, plus the head."""

import pytest
import json

from bench_setup import load_bench

ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def test_shapes_of_a_row_count():
    bench = load_bench("pass_floor")
    assert bench.shape_of(1) == (1, 1, "rows") and bench.shape_of(4) == (4, 1, "rows")
    assert bench.shape_of(12) == (1, 12, "tokens") and bench.shape_of(64) == (1, 64, "tokens")
    assert bench.shape_of(4, "tokens") == (1, 4, "tokens")
    assert bench.shape_of(16, "rows") == (16, 1, "rows")


def _kernel_paths(tree, path=()):
    """Every parameter dict of the tree that holds a projection kernel (of any kind), as a
    dotted path: the model's Dense layers, found by walking the tree."""
    out = []
    for k, v in tree.items():
        if hasattr(v, "items"):
            out += _kernel_paths(v, path + (k,))
        elif k == "kernel":
            out.append(".".join(path))
    return out


@pytest.mark.extended   # a benchmark script's --small run (DSBD_TEST_EXTENDED=1)
def test_small_run(tmp_path, monkeypatch):
    monkeypatch.setenv("DSBD_JAX_CPU_OPTIONS", "default")  # no host measurement in CI
    from dsbd_jax.host import cpu_options
    from dsbd_jax.models.config import ModelConfig
    cpu_options.choice.cache_clear()
    bench = load_bench("pass_floor")
    out = tmp_path / "floor.json"
    try:
        bench.main(["--small", "--dtypes", "bfloat16", "--forms", "host", "transposed",
                    "--rows", "1", "12", "--repeats", "2", "--slots", "16", "--out", str(out)])
    finally:
        cpu_options.choice.cache_clear()
    data = json.loads(out.read_text())
    assert data["machine"]["cpu_model"] and data["settings"]["small"] is True
    assert set(data["models"]) == set(data["results"]) == {"target", "draft"}
    for model, by_dtype in data["results"].items():
        shapes = data["models"][model]
        L, d, V = shapes["num_layers"], shapes["hidden_size"], shapes["vocab_size"]
        tied = shapes.get("tie_word_embeddings", False)
        head = "embed (tied head)" if tied else "lm_head"
        assert set(by_dtype) == {"bfloat16"}
        # the host's form of a tiny model is plain (under kernels.MIN_ELEMENTS)
        assert set(by_dtype["bfloat16"]) == {"plain", "transposed"}
        for form, rec in by_dtype["bfloat16"].items():
            # per layer q, k, v, o, gate, up, down, then the head: layers * 7 + 1 products
            names = [p["name"] for p in rec["products"]]
            want = [f"layers_{i}.{blk}.{p}" for i in range(L)
                    for blk, ps in (("attn", ATTENTION), ("mlp", MLP)) for p in ps] + [head]
            assert names == want and rec["num_products"] == 7 * L + 1
            # ... which are every projection kernel of the model's own tree, and its head
            config = ModelConfig(**shapes, dtype="bfloat16")
            params = bench.build_params(config, form)
            assert sorted(_kernel_paths(params)) == sorted(n for n in names if n != head
                                                           or not tied)
            assert all(p["dtype"] == "bfloat16" for p in rec["products"])
            stored = {p["stored"] for p in rec["products"][:-1]}
            assert stored == ({"RowBlocks"} if form == "transposed" else {"plain"})
            last = rec["products"][-1]
            if tied:  # the embedding's [V, d] rows, in either form
                assert last["stored"] == "embedding" and last["shape"] == [V, d]
            elif form == "transposed":  # a 16-bit model's head as [V, d] rows (load_model)
                assert last["stored"] == "Rows" and last["shape"] == [V, d]
            else:
                assert last["stored"] == "plain" and last["shape"] == [d, V]
            # one dot_general per product; the pass adds attention's four per layer (scores and
            # values over the cache, and over the new tokens), which the pass without attention
            # has not (it was traced without them)
            assert rec["dots"] == {"floor": 7 * L + 1, "pass": 11 * L + 1,
                                   "no_attention": 7 * L + 1}
            assert rec["options"] == "default"
            assert set(rec["rows"]) == {"1", "12"}
            assert (rec["rows"]["1"]["B"], rec["rows"]["1"]["T"]) == (1, 1)
            assert (rec["rows"]["12"]["B"], rec["rows"]["12"]["T"]) == (1, 12)
            assert rec["rows"]["12"]["shape"] == "tokens"
            for r in rec["rows"].values():
                assert r["floor_ms"] > 0 and r["pass_ms"] > 0 and r["no_attention_ms"] > 0
                assert abs(r["no_attention_over_floor"]
                           - r["no_attention_ms"] / r["floor_ms"]) < 1e-9
                assert abs(r["pass_over_floor"] - r["pass_ms"] / r["floor_ms"]) < 1e-9
                assert set(r["first_call_s"]) == {"floor", "pass", "no_attention"}
            # the products' work, counted from the jaxprs: at 12 tokens (no padded row) the
            # floor's is every projection's and the head's, the attention's its two products
            # over the slots and the new tokens
            r = rec["rows"]["12"]
            H, K, D, F = (shapes["num_heads"], shapes["num_kv_heads"], shapes["head_dim"],
                          shapes["intermediate_size"])
            per_row = L * (d * H * D + 2 * d * K * D + H * D * d + 3 * d * F) + d * V
            assert abs(r["floor_gflop"] - 2 * 12 * per_row / 1e9) < 1e-12
            assert abs(r["attention_gflop"] - 2 * 2 * 12 * H * (16 + 12) * D * L / 1e9) < 1e-12
            assert abs(r["attention_flop_share"] - r["attention_gflop"] / r["floor_gflop"]) < 1e-12
            assert abs(r["floor_gflop_per_s"] - r["floor_gflop"] / r["floor_ms"] * 1e3) < 1e-6
            att_ms = r["pass_ms"] - r["no_attention_ms"]
            assert (r["attention_gflop_per_s"] is None) == (att_ms <= 0)
    assert "| target | bfloat16 | transposed | 12 | 1 x 12 |" in bench.table(data["results"])
    # the patch is gone: a pass traced now has its attention
    from dsbd_jax.models import llama
    assert llama.attend.__name__ == "attend"


def test_hlo_ops_reads_the_entry_computation():
    bench = load_bench("pass_floor")
    text = "\n".join([
        "HloModule m",
        "fused_computation {",
        "  p = f32[2]{0} parameter(0)",
        "  ROOT n = f32[2]{0} negate(p)",
        "}",
        "ENTRY main {",
        "  %p0 = f32[2,3]{1,0} parameter(0)",
        "  %p1 = bf16[3,4]{1,0} parameter(1)",
        "  dot.1 = f32[2,4]{1,0} dot(f32[2,3]{1,0} %p0, bf16[3,4]{1,0} %p1), "
        "lhs_contracting_dims={1}",
        "  ROOT fusion.2 = f32[2,4]{1,0} fusion(f32[2,4]{1,0} dot.1), kind=kLoop, "
        "calls=fused_computation",
        "}",
    ])
    assert bench.hlo_ops(text) == {"dot": 1, "fusion kLoop": 1, "parameter": 2}


def test_dot_flops_counts_every_product_and_a_scans_body_per_step():
    import jax
    import jax.numpy as jnp
    bench = load_bench("pass_floor")
    a, b = jnp.ones((3, 5)), jnp.ones((5, 7))
    assert bench.dot_flops(lambda a, b: a @ b, a, b) == 2 * 3 * 5 * 7
    # a batched einsum: batch 4, out 3 x 7, contracted 5
    x, y = jnp.ones((4, 3, 5)), jnp.ones((4, 5, 7))
    assert bench.dot_flops(lambda x, y: jnp.einsum("bij,bjk->bik", x, y), x, y) == 2 * 4 * 3 * 5 * 7

    def scanned(a, b):
        return jax.lax.scan(lambda c, _: (c @ b[:, :5], None), a, None, length=6)[0]
    assert bench.dot_flops(scanned, a, b) == 6 * 2 * 3 * 5 * 5


def test_small_int8_run(tmp_path, monkeypatch):
    """``--forms int8``: every projection and the head (a tied one untied) as int8 codes, the
    pass run with the untied config."""
    monkeypatch.setenv("DSBD_JAX_CPU_OPTIONS", "default")
    from dsbd_jax.host import cpu_options
    cpu_options.choice.cache_clear()
    bench = load_bench("pass_floor")
    out = tmp_path / "floor.json"
    try:
        bench.main(["--small", "--dtypes", "float32", "--forms", "int8", "--rows", "1",
                    "--repeats", "1", "--slots", "16", "--out", str(out)])
    finally:
        cpu_options.choice.cache_clear()
    data = json.loads(out.read_text())
    for model, by_dtype in data["results"].items():
        rec = by_dtype["float32"]["int8"]
        L = data["models"][model]["num_layers"]
        assert [p["name"] for p in rec["products"]][-1] == "lm_head"       # untied
        assert {p["stored"] for p in rec["products"]} == {"Int8"}
        assert {p["dtype"] for p in rec["products"]} == {"int8"}
        assert rec["dots"]["floor"] == 7 * L + 1
        r = rec["rows"]["1"]
        assert r["floor_ms"] > 0 and r["pass_ms"] > 0
