"""docs/cli.md: whole commands timed, and what a progress bar costs."""

from __future__ import annotations

import json  # noqa: F401
import re  # noqa: F401

from benchmarks._pages.common import (BEAM_W4_POINT, DEFAULT, MODEL_NAMES, Results,  # noqa: F401
                                      host_class, host_line, method_label, span, span_of,
                                      speed_row, table, x)


def cli_latency(r: Results, source: str) -> str:
    """Whole ``dsbd`` commands timed from outside (``benchmarks.speed --cli``), median seconds."""
    doc = r(source)
    m = doc["machine"]
    host = (f"`{source}`: {m['cpu_model']} ({host_class(m)}), {m['cpu_count']} cores, "
            f"jax {m['jax']}, load {doc.get('load_per_core')} per core, median of "
            f"{doc['settings']['repeats']} runs")
    # the JSON keeps each command's words, not its quoting: printed as words, not as code
    return host + "\n\n" + table(
        ["command (its words)", "seconds"],
        [[doc["commands"][k], f"{v:.2f}"] for k, v in doc["seconds"].items()])


def progress_chunks(r: Results, source: str) -> str:
    """What a progress bar costs: each form's time over the one program's (the retired
    progress_chunks.py)."""
    rows = []
    for method, v in r(source)["methods"].items():
        for form, f in v["forms"].items():
            if form == "one_program":
                continue
            rows.append([method, form, x(f["over_one_program"]),
                         f"{f['ms_per_chunk']:.0f}" if f.get("ms_per_chunk") else ""])
    return table(["method", "form", "over the one program", "ms per chunk"], rows)


BLOCKS = {
    "cli-latency": lambda r: cli_latency(r, "results/cli_latency_amx_xeon.json"),
    "cli-latency-avx2": lambda r: cli_latency(r, "results/cli_latency_avx2_epyc.json"),
    "cli-progress-chunks": lambda r: progress_chunks(
        r, "results/progress_chunks_avx512bf16_epyc.json"),
}
