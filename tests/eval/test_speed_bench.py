"""``benchmarks/speed.py``'s ratios: per dtype and target kind, never across kinds, and the int8
target against the float one method by method."""

import pytest

from bench_setup import load_bench


def _row(method, tps, weights="float", impl="dsbd_jax", dtype="float32"):
    return {"impl": impl, "method": method, "dtype": dtype, "weights": weights,
            "tokens_per_s": tps, "decode_tokens_per_s": 2 * tps}


def test_ratios_stay_within_a_target_kind():
    speed = load_bench("speed")
    rows = [_row("sample", 2.0), _row("beam_sample_W4", 1.0), _row("speculative_g4", 3.0),
            _row("dsbd_g2_WS4_t0.7_Wmin2", 1.5),
            _row("sample", 3.0, "int8"), _row("beam_sample_W4", 2.5, "int8"),
            _row("speculative_g4", 3.3, "int8"), _row("dsbd_g2_WS4_t0.7_Wmin2", 4.0, "int8"),
            {**_row("beam_sample_W4", 0.5, impl="transformers"), "weights": None}]
    f = speed.dtype_ratios(rows, "float32", "float")
    i8 = speed.dtype_ratios(rows, "float32", "int8", prefix="int8: ")
    assert f["tokens_per_s: dsbd_g2_WS4_t0.7_Wmin2 / beam_sample_W4 (ours)"] == pytest.approx(1.5)
    assert f["tokens_per_s: dsbd_g2_WS4_t0.7_Wmin2 / beam_sample_W4 (transformers)"] == \
        pytest.approx(3.0)
    assert f["tokens_per_s: speculative_g4 / sample"] == pytest.approx(1.5)
    # the int8 target's decoders against its own beam sampling; transformers ran the float one
    assert i8["int8: tokens_per_s: dsbd_g2_WS4_t0.7_Wmin2 / beam_sample_W4 (ours)"] == \
        pytest.approx(1.6)
    assert i8["int8: tokens_per_s: speculative_g4 / sample"] == pytest.approx(1.1)
    assert not any("transformers" in k for k in i8)
    k = speed.target_kind_ratios(rows)
    assert k["tokens_per_s: beam_sample_W4: ours float32 int8 target / ours float32 float "
             "target"] == pytest.approx(2.5)
    assert k["decode_tokens_per_s: sample: ours float32 int8 target / ours float32 float "
             "target"] == pytest.approx(1.5)
    assert len(k) == 8      # four methods, two keys: the transformers row has no int8 peer


def test_llama_cpp_bench_refuses_a_python_without_it_at_once():
    """``benchmarks/llama_cpp.py`` checks its peer's interpreter before loading any model."""
    import sys
    import time
    bench = load_bench("llama_cpp")
    t0 = time.perf_counter()
    with pytest.raises(SystemExit, match="cannot import llama_cpp.*pip install llama-cpp-python"):
        bench.main(["--llama-python", sys.executable, "--out", "/dev/null"])
    assert time.perf_counter() - t0 < 30


def test_llama_cpp_bench_ratios_name_each_decoder_and_refuse_a_bad_point():
    """Every row of ours (sampling on both targets; beam sampling W=4 and DSBD on the int8 pair)
    is set against llama.cpp's sampling, and a malformed ``--dsbd`` is refused before any
    model loads."""
    import sys
    bench = load_bench("llama_cpp")
    rows = [_row("sample", 2.0), _row("sample", 4.0, "int8"),
            _row("beam_sample_W4", 3.0, "int8"), _row("dsbd_g2_WS4_t0.7_Wmin2", 5.0, "int8"),
            {"impl": "llama.cpp", "tokens_per_s": 4.0, "decode_tokens_per_s": 10.0}]
    r = bench.ratios(rows)
    assert len(r) == 8
    assert r["tokens_per_s: ours dsbd_g2_WS4_t0.7_Wmin2 float32 int8 weights / llama.cpp "
             "sampling"] == pytest.approx(1.25)
    assert r["decode_tokens_per_s: ours sample float32 float weights / llama.cpp sampling"] \
        == pytest.approx(0.4)
    old = {k: v for k, v in rows[0].items() if k != "method"}     # a run from before methods
    assert "ours sample" in next(iter(bench.ratios([old, rows[-1]])))
    for bad in ("2,4,0.7", "a,4,0.7,2", "2,4,1.5,2"):
        with pytest.raises(SystemExit, match="--dsbd"):
            bench.main(["--llama-python", sys.executable, "--dsbd", bad, "--out", "/dev/null"])
