"""docs/results/memory.md: KV caches and the soak runs."""

from __future__ import annotations

import json  # noqa: F401
import re  # noqa: F401

from benchmarks._pages.common import (BEAM_W4_POINT, DEFAULT, MODEL_NAMES, Results,  # noqa: F401
                                      host_class, host_line, method_label, span, span_of,
                                      speed_row, table, x)


def kv_cache(r: Results, source: str) -> str:
    """The KV cache (target + draft) each method allocates per prompt, from a speed JSON."""
    rows = [[method_label(row["method"]), f"{row['kv_cache_bytes'] / 1e6:.1f} MB"]
            for row in r(source)["rows"] if row["impl"] == "dsbd_jax"]
    return table(["method", "KV cache per prompt"], rows)


def soak(r: Results, sources) -> str:
    """Soak runs side by side (benchmarks/soak.py, retired): compiles, memory growth, NaNs."""
    docs = [r(s) for s in sources]

    def mb(v):
        return f"{v / 1e6:,.1f} MB"
    rows = [
        ["host", *(d["cpu_model"] for d in docs)],
        ["batches per round", *(str(d["batches_per_round"]) for d in docs)],
        ["compilations in round 1 / combinations",
         *(f"{d['compiles_first_round']} / {d['compile_combinations']}" for d in docs)],
        ["compilations in later rounds", *(str(d["compiles_later_rounds"]) for d in docs)],
        ["host RSS, end of round 1 / end",
         *(f"{mb(d['growth_after_round_1']['rss']['end_of_round_1'])} / "
           f"{mb(d['growth_after_round_1']['rss']['end'])}" for d in docs)],
        ["live device arrays, end of round 1 / end",
         *(f"{d['growth_after_round_1']['live_arrays']['end_of_round_1']} / "
           f"{d['growth_after_round_1']['live_arrays']['end']}" for d in docs)],
        ["NaN / malformed outputs",
         *(f"{d['nan_outputs']} / {d['malformed_outputs']}" for d in docs)],
    ]
    return table(["", *(f"`{s}`" for s in sources)], rows)


BLOCKS = {
    "memory-kv-cache": lambda r: kv_cache(r, "results/speed_float32_host.json"),
    "memory-soak": lambda r: soak(r, ["results/soak_avx512bf16_epyc.json",
                                      "results/soak_amx_xeon.json"]),
}
