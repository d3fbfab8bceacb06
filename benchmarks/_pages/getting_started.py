"""docs/getting_started.md: the demo as a user runs it."""

from __future__ import annotations

import json  # noqa: F401
import re  # noqa: F401

from benchmarks._pages.common import (BEAM_W4_POINT, DEFAULT, MODEL_NAMES, Results,  # noqa: F401
                                      host_class, host_line, method_label, span, span_of,
                                      speed_row, table, x)


def demo_runs(r: Results, sources) -> str:
    """``dsbd demo`` as a user runs it, twice on a new cache (benchmarks/demo_memory.py,
    retired): each run's wall time and peak memory, and the cache it leaves."""
    rows = []
    for source in sources:
        doc = r(source)
        first, second = doc["runs"][0], doc["runs"][1]
        args = " ".join(doc["settings"].get("demo_args") or []) or "(the defaults)"
        rows.append([f"`{source}`", host_class(doc["machine"]), f"`{args}`",
                     f"{first['wall_s']:.0f} s / {first['peak_rss_bytes'] / 1e9:.2f} GB",
                     f"{second['wall_s']:.0f} s / {second['peak_rss_bytes'] / 1e9:.2f} GB",
                     f"{sum(second['cache_bytes'].values()) / 1e9:.2f} GB"])
    return table(["run", "host class", "demo arguments", "first run: wall / peak RSS",
                  "second run: wall / peak RSS", "cache after"], rows)


BLOCKS = {
    "demo-runs": lambda r: demo_runs(r, ["results/demo_memory_default_amx_xeon.json",
                                         "results/demo_memory_int8_amx_xeon.json",
                                         "results/demo_memory_float32_amx_xeon.json",
                                         "results/demo_memory_float32_amx_xeon_resident.json",
                                         "results/demo_memory_int8_avx512bf16_epyc.json",
                                         "results/demo_memory_float32_avx512bf16_epyc.json"]),
}
