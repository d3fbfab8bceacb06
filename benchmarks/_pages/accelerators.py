"""docs/results/accelerators.md: GPU runs of benchmarks.accelerator."""

from __future__ import annotations

import json  # noqa: F401
import re  # noqa: F401

from benchmarks._pages.common import (BEAM_W4_POINT, DEFAULT, MODEL_NAMES, Results,  # noqa: F401
                                      host_class, host_line, method_label, span, span_of,
                                      speed_row, table, x)


# the names gpu_kernels.py's --label gave the programs in a dump, per decoder
KERNEL_LABELS = {"beam_sample_W4": "beam_sample",
                 "dsbd_g2_WS4_t0.7_Wmin2": "dsbd (forward_L24_d896)",
                 "dsbd_g2_WS4_t0.7_Wmin2_head": "dsbd (draft_head_d1536)"}


def gpu_decoder_label(name: str) -> str:
    if name.startswith("tree_g"):
        g, w = re.fullmatch(r"tree_g(\d+)_w(\d+)", name).groups()
        return f"tree speculative sampling g{g}, {w} children"
    if name.endswith("_head"):
        return f"{method_label(name[:-len('_head')])}, the head as its draft"
    return method_label(name) + (", 0.5B draft" if name.startswith(("dsbd", "spec")) else "")


def gpu_passes(r: Results, sources, models=("target", "draft", "head")) -> str:
    """Forward passes at 512 slots, ms, per model; one figure per run, ``a / b``."""
    runs = [r(s)["runs"][0]["forward"] for s in sources]
    names = {"target": "target", "draft": "0.5B draft", "head": "head"}
    rows = []
    for what in ("1 token", "4 rows", "forest 12", "forest 16"):
        cells = []
        for m in models:
            got = [run.get(f"{m} {what} @512", {}).get("ms") for run in runs]
            cells.append(" / ".join(f"{v:.2f}" for v in got if v is not None))
        rows.append([what, *cells])
    return table(["pass, ms", *(names[m] for m in models)], rows)


def gpu_decoders(r: Results, source: str, kernels: str | None = None) -> str:
    """Each decoder's ms per iteration inside its compiled loop at batch 1, its forward passes,
    the share outside them, the JSON's own projection against beam sampling W=4 (tokens per
    iteration measured on the CPU: a projection, not a measurement) and, from XLA's dump, its
    kernel launches per iteration. The share outside the passes is left blank where the passes
    timed alone took longer than the loop."""
    run = r(source)["runs"][0]
    projection = run.get("projection", {}).get("batch 1", {})
    counts = r(kernels)["programs"] if kernels else {}
    header = ["decoder", "ms per iteration", "its forward passes", "outside the passes",
              "projected / beam W=4"]
    if counts:
        header += ["kernels", "in the passes", "outside", "outside, of one block"]
    rows = []
    for name, v in run["decoders"]["1"].items():
        row = [gpu_decoder_label(name), f"{v['ms_per_iteration']:.2f}",
               f"{v['forward_ms_per_iteration']:.2f}",
               f"{100 * v['overhead_share']:.0f} %" if v["overhead_share"] >= 0 else "",
               x(projection[name]["projected_ratio_to_beam_W4"]) if name in projection else ""]
        if counts:
            c = counts.get(name) or counts.get(KERNEL_LABELS.get(name, ""), {})
            row += [c.get("launches_per_iteration", ""), c.get("in_passes", ""),
                    c.get("outside_passes", ""), c.get("single_block_outside_passes", "")]
        rows.append(row)
    return table(header, rows)


BLOCKS = {
    "gpu-h100-passes": lambda r: gpu_passes(
        r, ["results/gpu/NVIDIA_H100_80GB_HBM3_qwen_per_layer.json"], ("target", "draft")),
    "gpu-h100-decoders": lambda r: gpu_decoders(
        r, "results/gpu/NVIDIA_H100_80GB_HBM3_qwen_per_layer.json"),
    "gpu-h100-head-passes": lambda r: gpu_passes(
        r, ["results/gpu/NVIDIA_H100_80GB_HBM3_qwen_head.json",
            "results/gpu/NVIDIA_H100_80GB_HBM3_qwen_head_dsbd.json"]),
    "gpu-h100-head-decoders": lambda r: gpu_decoders(
        r, "results/gpu/NVIDIA_H100_80GB_HBM3_qwen_head_dsbd.json"),
    "gpu-h200-decoders": lambda r: gpu_decoders(
        r, "results/gpu/NVIDIA_H200.json", "results/gpu/NVIDIA_H200_kernels.json"),
    "gpu-h200-again-decoders": lambda r: gpu_decoders(
        r, "results/gpu/NVIDIA_H200_again.json", "results/gpu/NVIDIA_H200_again_kernels.json"),
}
