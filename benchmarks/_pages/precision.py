"""docs/results/precision.md: dtypes, eight-bit products, passes and distances."""

from __future__ import annotations

import json  # noqa: F401
import re  # noqa: F401

from benchmarks._pages.common import (BEAM_W4_POINT, DEFAULT, MODEL_NAMES, Results,  # noqa: F401
                                      host_class, host_line, method_label, span, span_of,
                                      speed_row, table, x)


def dtype_runs(r: Results, source: str) -> str:
    """``dsbd host`` run N times on empty caches (the retired benchmarks/dtype_runs.py): each
    model's dtype on every run and its probe's passes, lowest and highest over the runs."""
    doc = r(source)
    rows = []
    for model in doc["models"]:
        picks, f1, f12, b1, b12 = [], [], [], [], []
        for run in doc["runs"]:
            c = run["choices"][model]
            picks.append(c["dtype"])
            m = re.search(r"float32 ([\d.]+) / ([\d.]+) ms, bfloat16 ([\d.]+) / ([\d.]+) ms",
                          c["why"])
            if m:
                for xs, v in zip((f1, f12, b1, b12), m.groups()):
                    xs.append(float(v))
        ratio = [(b + bb) / (f + ff) for f, ff, b, bb in zip(f1, f12, b1, b12)]
        rows.append([f"{MODEL_NAMES.get(model, model)} (cut to 4 blocks)",
                     " / ".join(sorted(set(picks))) + f" on {len(picks)} of {len(picks)} runs",
                     f"{span_of(f1)} / {span_of(f12)}", f"{span_of(b1)} / {span_of(b12)}",
                     span_of(ratio, ".2f")])
    return table(["model", "dtype picked", "float32: 1 token / 12-node forest, ms",
                  "bfloat16: 1 token / 12-node forest, ms", "bfloat16 / float32, both passes"],
                 rows)


def speed_dtypes(r: Results, source: str) -> str:
    """Our decoders in float32 and in bfloat16 in one run (speed --dtypes float32 bfloat16)."""
    doc = r(source)
    rows = []
    for row in doc["rows"]:
        if row["dtype"] != "float32":
            continue
        b = next(o for o in doc["rows"]
                 if o["method"] == row["method"] and o["dtype"] == "bfloat16")
        rows.append([method_label(row["method"]),
                     f"{row['tokens_per_s']:.2f} ({row['decode_tokens_per_s']:.2f})",
                     f"{b['tokens_per_s']:.2f} ({b['decode_tokens_per_s']:.2f})",
                     f"{x(b['tokens_per_s'] / row['tokens_per_s'])} "
                     f"({x(b['decode_tokens_per_s'] / row['decode_tokens_per_s'])})"])
    return table(["decoder", "float32: tok/s (decode)", "bfloat16: tok/s (decode)",
                  "bfloat16 / float32"], rows)


def int8_products(r: Results, source: str) -> str:
    """Chained MLP products per kernel kind and row count (the retired int8_products.py), ms,
    int8 against each float kind, and int8's relative RMS error against float32."""
    rows = []
    for res in r(source)["results"]:
        ms = res["ms"]
        rows.append([res["rows"], *(f"{ms[k]:.1f}" for k in (
            "float32 plain", "float32 transposed", "bfloat16 rows", "int8", "int8 one-row",
            "int8 eigen_dot")),
            " / ".join(x(ms["int8"] / ms[k]) for k in ("float32 plain", "float32 transposed",
                                                        "bfloat16 rows")),
            f"{res['rel_rms_vs_float32']['int8']:.3f}"])
    return table(["rows M", "float32 plain", "float32 transposed", "bfloat16 rows", "int8",
                  "int8, one row unpadded", "int8 under `eigen_dot`",
                  "int8 / f32 plain / f32 transposed / bf16", "int8 error"], rows)


def pass_floor_passes(r: Results, source: str, cases) -> str:
    """Whole passes (benchmarks.pass_floor), ms, at 1 token, 4 rows and a 12-token forest."""
    res = r(source)["results"]
    rows = []
    for label, model, dtype, form in cases:
        got = res[model][dtype][form]["rows"]
        rows.append([label, *(f"{got[n]['pass_ms']:.1f}" for n in ("1", "4", "12")),
                     x(got["12"]["pass_ms"] / got["1"]["pass_ms"])])
    return table(["pass", "1 token", "4 rows", "12-token forest", "forest / token"], rows)


def terms_runs(r: Results, runs, batch: str = "b1") -> str:
    """benchmarks.draft_terms runs of the float and the int8 draft side by side, tok/s."""
    rows = []
    for label, source in runs:
        b = r(source)["batches"][batch]
        d = b["drafts"]
        rows.append([label, f"{b['references']['sample']['tokens_per_s']:.2f}",
                     f"{b['references']['beam_sample_W4']['tokens_per_s']:.2f}",
                     *(" / ".join(f"{d[k][m]['tokens_per_s']:.2f}" for k in ("base", "int8"))
                       for m in ("speculative_g4", "dsbd_beamW4_point")),
                     " / ".join(x(d[k]["targets"]["dsbd_w4_vs_beam_w4"]["dsbd_beamW4_point"]
                                  ["end_to_end"]) for k in ("base", "int8")),
                     f"{b['one_token_pass_ms']['target']:.1f} ms",
                     " / ".join(x(b["draft_pass_vs_target"][k]) for k in ("base", "int8"))])
    return table(["run", "sampling", "beam sampling W=4", "speculative g4, float / int8 draft",
                  "DSBD beam-W4 point, float / int8 draft", "DSBD / beam sampling W=4",
                  "target's one-token pass", "draft's pass / target's, float / int8"], rows)


def int8_distance(r: Results, source: str) -> str:
    """How far int8 weights move each model on held-out texts (the retired int8_distance.py)."""
    def iv(v, fmt):
        return f"{format(v['mean'], fmt)} [{format(v['ci95'][0], fmt)}, {format(v['ci95'][1], fmt)}]"
    rows = []
    models = r(source)["models"]
    for key, label in (("target", "1.5B target"), ("draft", "0.5B draft")):
        m = models[key]
        row = m["row"]
        rows.append([label, f"{m['positions']:,} ({row['kl_float_int8']['texts']})",
                     iv(row["kl_float_int8"], ".4f"), iv(row["top1_agree"], ".3f"),
                     iv(row["loglik_loss"], ".4f"),
                     iv(row["acceptance_change"], ".4f") if "acceptance_change" in row else ""])
    return table(["model", "positions (texts)", "mean KL(float, int8) per token",
                  "same top-1 token", "log-likelihood of int8's tokens under the float model, "
                  "minus float's own", "int8 draft's acceptance minus the float draft's"], rows)


BLOCKS = {
    "precision-dtype-runs-xeon": lambda r: dtype_runs(r, "results/dtype_runs.json"),
    "precision-dtype-runs-epyc": lambda r: dtype_runs(r, "results/dtype_runs_epyc.json"),
    "precision-speed-dtypes-xeon": lambda r: speed_dtypes(r, "results/speed_dtypes_host.json"),
    "precision-speed-dtypes-epyc": lambda r: speed_dtypes(r, "results/speed_dtypes_epyc.json"),
    "precision-int8-products-avx2": lambda r: int8_products(
        r, "results/int8_products_avx2_epyc.json"),
    "precision-int8-products-avx512bf16": lambda r: int8_products(
        r, "results/int8_products_avx512bf16_epyc.json"),
    "precision-int8-products-amx": lambda r: int8_products(
        r, "results/int8_products_amx_xeon.json"),
    "precision-passes-amx": lambda r: pass_floor_passes(
        r, "results/pass_floor_int8_amx_xeon.json",
        (("1.5B target, bfloat16", "target", "bfloat16", "transposed"),
         ("1.5B target, float32", "target", "float32", "transposed"),
         ("1.5B target, int8", "target", "bfloat16", "int8"),
         ("0.5B draft, bfloat16", "draft", "bfloat16", "transposed"),
         ("0.5B draft, int8", "draft", "bfloat16", "int8"))),
    "precision-passes-avx2": lambda r: pass_floor_passes(
        r, "results/pass_floor_int8_avx2_epyc.json",
        (("1.5B target, float32", "target", "float32", "transposed"),
         ("1.5B target, bfloat16", "target", "bfloat16", "transposed"),
         ("1.5B target, int8", "target", "float32", "int8"),
         ("0.5B draft, float32", "draft", "float32", "transposed"),
         ("0.5B draft, int8", "draft", "float32", "int8"))),
    "precision-terms-amx": lambda r: terms_runs(
        r, (("earlier", "results/draft_terms_int8_amx_xeon_earlier.json"),
            ("later", "results/draft_terms_int8_amx_xeon.json"))),
    "precision-terms-amx-b4": lambda r: terms_runs(
        r, (("batch 4", "results/draft_terms_int8_batch4_amx_xeon.json"),), "b4"),
    "precision-int8-distance-amx": lambda r: int8_distance(
        r, "results/int8_distance_amx_xeon.json"),
    "precision-int8-distance-epyc": lambda r: int8_distance(
        r, "results/int8_distance_avx512bf16_epyc.json"),
}
