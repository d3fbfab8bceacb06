"""docs/performance.md: the products floor, iteration counts and variants."""

from __future__ import annotations

import json  # noqa: F401
import re  # noqa: F401

from benchmarks._pages.common import (BEAM_W4_POINT, DEFAULT, MODEL_NAMES, Results,  # noqa: F401
                                      host_class, host_line, method_label, span, span_of,
                                      speed_row, table, x)
from benchmarks._pages.precision import pass_floor_passes


def iteration_counts(r: Results, columns, phases: bool = False) -> str:
    """Per decode-loop iteration, what each decoder's compiled loop executed on XLA:CPU
    (``dsbd_jax.eval.profile.executed_counts``): ``columns`` is ``[(label, JSON, run name)]``."""
    counts = []
    for label, source, name in columns:
        run = next(x for x in r(source)["runs"] if x["name"] == name)
        counts.append(run["per_iteration_counts"])
    metrics = [("thunks outside the forward passes", lambda c: f"{c['thunks_outside_passes']:.0f}")]
    if phases:
        metrics += [(f"of them: {ph}", (lambda ph: lambda c: f"{c['thunks'][ph]:.0f}")(ph))
                    for ph in ("warp", "verify", "random", "width")]
    metrics += [("trips of loops inside the iteration", lambda c: f"{c['loop_trips']:.0f}"),
                ("vocabulary-axis thunks outside the passes",
                 lambda c: f"{c['vocab_thunks_outside_passes']:.0f}"),
                ("the target's thunks per pass per layer",
                 lambda c: f"{c['target_thunks_per_pass_per_layer']:.1f}")]
    return table(["per iteration", *(label for label, _, _ in columns)],
                 [[name, *(f(c) for c in counts)] for name, f in metrics])


def fused_projections(r: Results, source: str) -> str:
    rows = [[x_["kind"], x_["rows"], f"{x_['separate_ms']:.2f}", f"{x_['fused_ms']:.2f}",
             x(x_["fused_over_separate"])] for x_ in r(source)["rows"]]
    return table(["kind", "rows", "separate, ms", "fused, ms", "fused / separate"], rows)


def lowered_counts(r: Results, source: str) -> str:
    runs = {(x_["platform"], x_["name"]): x_ for x_ in r(source)["runs"]}
    names = (("beam4", "beam sampling W=4"), ("dsbd_w4", "DSBD g2 W_S 4 t 0.7 W_min 2"),
             ("sample", "sampling"), ("spec4", "speculative g4"))

    def cell(platform, name, key):
        run = runs[(platform, name)]
        ratio = run.get("against_beam4", {}).get(key)
        return f"{run[key]}" + (f" ({x(ratio)})" if ratio and name != "beam4" else "")
    rows = [["operations outside the passes, `cuda`",
             *(cell("cuda", n, "ops_outside_passes") for n, _ in names)],
            ["the same, each conditional's first branch only, `cuda`",
             *(cell("cuda", n, "ops_outside_passes_first_branches") for n, _ in names)],
            ["the same, `cpu` (all branches)",
             *(cell("cpu", n, "ops_outside_passes") for n, _ in names)],
            ["loop trips inside the iteration, `cuda`",
             *(str(runs[("cuda", n)]["loop_trips"]) for n, _ in names)],
            ["the same, `cpu`", *(str(runs[("cpu", n)]["loop_trips"]) for n, _ in names)]]
    return table(["per iteration, XLA's input program", *(label for _, label in names)], rows)


def variant_ratios(r: Results, sources) -> str:
    """Two forms of one piece of code side by side in one run, each in its own process: the
    ratios each JSON records."""
    rows = [[f"`{source}`", key, f"{value:.3f}"]
            for source in sources for key, value in r(source)["ratios"].items()]
    return table(["run", "ratio", "value"], rows)


def pass_floor_summary(r: Results, source: str) -> str:
    """Each model's and dtype's passes against their products floor, over the row counts."""
    rows = []
    for model, dtypes in r(source)["results"].items():
        for dtype, forms in dtypes.items():
            for form, v in forms.items():
                got = v["rows"]
                rows.append([model, dtype, form,
                             span_of([g["pass_over_floor"] for g in got.values()], ".2f"),
                             span_of([g["no_attention_over_floor"] for g in got.values()], ".2f")
                             if all("no_attention_over_floor" in g for g in got.values()) else "",
                             f"{got['1']['pass_ms']:.0f}",
                             f"{got['12']['pass_ms']:.0f}" if "12" in got else ""])
    return table(["model", "dtype", "form", "pass / floor", "without attention / floor",
                  "1 token, ms", "12 tokens, ms"], rows)


BLOCKS = {
    "perf-pass-floor-epyc": lambda r: pass_floor_summary(r, "results/pass_floor_epyc.json"),
    "perf-pass-floor-epyc-softmax": lambda r: pass_floor_summary(
        r, "results/pass_floor_epyc_softmax_attention.json"),
    "perf-attention-forms": lambda r: variant_ratios(
        r, ["results/attention_form_epyc.json", "results/attention_parts_amx_xeon.json",
            "results/attention_parts_avx512bf16_epyc.json"]),
    "perf-int8-passes-epyc": lambda r: pass_floor_passes(
        r, "results/pass_floor_int8_avx512bf16_epyc.json",
        (("1.5B target, bfloat16", "target", "bfloat16", "transposed"),
         ("1.5B target, int8", "target", "bfloat16", "int8"),
         ("0.5B draft, bfloat16", "draft", "bfloat16", "transposed"),
         ("0.5B draft, int8", "draft", "bfloat16", "int8"))),
    "perf-iteration-counts-epyc": lambda r: iteration_counts(r, [
        ("beam sampling W=4", "results/iteration_counts_avx512bf16_epyc.json", "beam4"),
        ("DSBD, before", "results/iteration_counts_avx512bf16_epyc_before.json", "dsbd_w4"),
        ("DSBD, loops cut", "results/iteration_counts_avx512bf16_epyc_loops_cut.json", "dsbd_w4"),
        ("DSBD, fewer sums", "results/iteration_counts_avx512bf16_epyc.json", "dsbd_w4"),
        ("sampling", "results/iteration_counts_avx512bf16_epyc.json", "sample"),
        ("speculative g4", "results/iteration_counts_avx512bf16_epyc.json", "spec4")]),
    "perf-iteration-counts-tops": lambda r: iteration_counts(r, [
        ("beam sampling W=4", "results/iteration_counts_amx_xeon_tops.json", "beam4"),
        ("DSBD, whole rows", "results/iteration_counts_amx_xeon_rows.json", "dsbd_w4"),
        ("DSBD, the tops", "results/iteration_counts_amx_xeon_tops.json", "dsbd_w4")],
        phases=True),
    "perf-verify-timings": lambda r: variant_ratios(
        r, ["results/verify_sums_avx512bf16_epyc.json", "results/verify_tops_amx_xeon.json"]),
    "perf-fused-cpu": lambda r: fused_projections(r, "results/fused_projections_amx_xeon.json"),
    "perf-fused-gpu": lambda r: fused_projections(
        r, "results/gpu/NVIDIA_H200_fused_projections.json"),
    "perf-lowered": lambda r: lowered_counts(r, "results/lowered_counts.json"),
}
