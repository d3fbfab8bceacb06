"""``benchmarks/probes/embed_gather.py --small``: the lookups of a bfloat16 pair side by side, each in
its own process; the plain lookup's programs convert the whole table, the bits without the
barrier copy it out of the loop, the decoders' do neither."""

import pytest
import json

from bench_setup import load_bench


@pytest.mark.extended   # a benchmark script's --small run (DSBD_TEST_EXTENDED=1)
def test_small_pair(tmp_path):
    bench = load_bench("embed_gather")
    out = tmp_path / "gather.json"
    res = bench.main(["--small", "--rounds", "1", "--max-new-tokens", "4", "--out", str(out)])
    by = {r["variant"]: r for r in res["runs"]}
    assert set(by) == {"plain_lookup", "bits_hoisted", "rows_as_bits"}
    for name in ("dsbd_g2_WS4_t0.7_Wmin2", "speculative_g4"):
        assert by["plain_lookup"]["decoders"][name]["table_converts"], name
        assert by["bits_hoisted"]["decoders"][name]["table_copies"], name
        assert not by["rows_as_bits"]["decoders"][name]["table_converts"], name
        assert not by["rows_as_bits"]["decoders"][name]["table_copies"], name
        assert by["rows_as_bits"]["decoders"][name]["tokens"] == [4, 4]
        assert res["ratios"][f"{name}: rows_as_bits / plain_lookup, seconds"] > 0
    assert by["rows_as_bits"]["dtypes"] == {"target": "bfloat16", "draft": "bfloat16"}
    stored = json.loads(out.read_text())
    assert stored["machine"]["cpu_flags"] is not None and "/tmp/" not in out.read_text()


def test_a_conversion_is_found_in_a_program_text():
    bench = load_bench("embed_gather")
    hlo = ("  %wrapped_convert.1 = f32[512,32]{1,0} fusion(%params__draft__embed), kind=kLoop\n"
           "  %dot = f32[1,512]{1,0} dot(%a, %b)\n")
    assert len(bench.table_converts(hlo, 512)) == 1
    assert bench.table_converts(hlo, 1024) == []
    hlo = "  %wrapped_bitcast-convert = u16[512,32]{1,0} fusion(%params__draft__embed), kind=kLoop\n"
    assert len(bench.table_copies(hlo, 512)) == 1 and bench.table_converts(hlo, 512) == []
