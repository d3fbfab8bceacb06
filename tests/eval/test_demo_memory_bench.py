"""``benchmarks/demo_memory.py --small``: the demo twice on one new cache, each run's wall
seconds and peak RSS, and the cache the runs leave (the models' converted forms after the
first run, nothing new after the second)."""

import json
import os

import pytest

from bench_setup import load_bench


@pytest.mark.extended   # a benchmark script's --small run (DSBD_TEST_EXTENDED=1)
def test_small_pair(tmp_path):
    bench = load_bench("demo_memory")
    out = tmp_path / "demo.json"
    res = bench.main(["--small", "--cache", str(tmp_path / "cache"), "--out", str(out)])
    first, second = res["runs"]
    for run in (first, second):
        assert run["rc"] == 0 and run["wall_s"] > 0 and run["peak_rss_bytes"] > 100e6
        assert run["verdict"] and run["verdict"][0].startswith("DSBD ")
    assert sum(first["cache_bytes"].values()) > 0
    # before the first run the cache is empty; before the second its files are read back (in
    # the page cache, where the host can tell: util-linux fincore)
    assert first["cache_resident_before_bytes"] is None
    if second["cache_resident_before_bytes"] is not None:   # whole pages of the cache's files
        page = os.sysconf("SC_PAGE_SIZE")
        assert 0 <= second["cache_resident_before_bytes"] <= page * sum(
            -(-b // page) for b in first["cache_bytes"].values())
    assert set(second["cache_bytes"]) == set(first["cache_bytes"])   # no new entry
    stored = json.loads(out.read_text())
    assert stored["machine"]["cpu_flags"] is not None
    assert stored["settings"]["cache"] == "given"


def test_demo_arguments_follow_the_separator():
    bench = load_bench("demo_memory")
    with pytest.raises(SystemExit, match="--runs"):
        bench.main(["--runs", "0", "--out", "x.json", "--", "--weights", "int8"])
