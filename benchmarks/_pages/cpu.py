"""docs/results/cpu.md: blocked kernels against plain ones."""

from __future__ import annotations

import json  # noqa: F401
import re  # noqa: F401

from benchmarks._pages.common import (BEAM_W4_POINT, DEFAULT, MODEL_NAMES, Results,  # noqa: F401
                                      host_class, host_line, method_label, span, span_of,
                                      speed_row, table, x)


def kernel_blocks(r: Results, sources) -> str:
    """Blocked kernels against plain ones in whole decoders (the retired kernel_blocks probe)."""
    rows = []
    for source in sources:
        doc = r(source)
        blocks = "64 columns" if str(doc["settings"]["blocks"]) == "64" else doc["settings"]["blocks"]
        dtype = "float32" if "float32" in source else "bfloat16"
        cells = [f"{v['plain']['tokens_per_s']:.2f} / {v['blocked']['tokens_per_s']:.2f} "
                 f"({x(v['blocked_vs_plain'])})"
                 for v in (doc["runs"]["sample"], doc["runs"]["beam_sample_W4"])]
        rows.append([blocks, dtype, *cells])
    return table(["blocks", "dtype", "sampling: plain / blocked",
                  "beam sampling W=4: plain / blocked"], rows)


def prefill(r: Results, source: str) -> str:
    """The prompt pass over its whole bucket against chunks up to the longest prompt
    (``benchmarks.speed --prefill``), ms and the chunked pass over the whole one."""
    doc = r(source)
    chunks = [str(c) for c in doc["settings"]["chunks"]]
    rows = [[row["dtype"], row["model"], ", ".join(str(n) for n in row["prompt_tokens"]),
             row["bucket"], f"{row['ms']['0']:.0f}",
             *[f"{row['ms'][c]:.0f} ({x(row['ratio'][c])})" for c in chunks]]
            for row in doc["rows"]]
    return (host_line(doc, source, " and ".join(doc["settings"]["dtypes"])) + "\n\n"
            + table(["dtype", "model", "prompt tokens", "bucket", "whole bucket, ms",
                     *[f"chunks of {c}, ms" for c in chunks]], rows))


BLOCKS = {
    "cpu-prefill": lambda r: prefill(r, "results/prefill_amx_xeon.json"),
    "cpu-prefill-avx2": lambda r: prefill(r, "results/prefill_avx2_epyc.json"),
    "cpu-kernel-blocks": lambda r: kernel_blocks(r, ["results/kernel_blocks_64_epyc.json",
                                                     "results/kernel_blocks_halves_epyc.json",
                                                     "results/kernel_blocks_64_float32_epyc.json"]),
}
