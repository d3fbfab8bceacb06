"""``benchmarks/progress_chunks.py --small``: each decoder as one program, in host-driven
chunks and with the in-loop callback, the chunks' cost per chunk in the JSON."""

import json

import pytest

from bench_setup import load_bench


@pytest.mark.extended   # a benchmark script's --small run (DSBD_TEST_EXTENDED=1)
def test_small_run_times_every_form(tmp_path):
    out = tmp_path / "p.json"
    load_bench("progress_chunks").main(["--small", "--methods", "dsbd", "--out", str(out)])
    data = json.loads(out.read_text())
    assert data["machine"]["cpu_model"]
    dsbd = data["methods"]["dsbd"]
    assert dsbd["loop_trips"] >= 1
    forms = dsbd["forms"]
    assert set(forms) == {"one_program", "every_1", "every_4", "callback"}
    assert forms["every_1"]["chunks"] == dsbd["loop_trips"]
    assert forms["every_4"]["chunks"] == -(-dsbd["loop_trips"] // 4)
    assert forms["one_program"]["over_one_program"] == 1.0
    assert all(f["seconds"] > 0 for f in forms.values())
