"""docs/results/speed.md: the speed grid (benchmarks.speed), llama.cpp and the node budget."""

from __future__ import annotations

import json  # noqa: F401
import re  # noqa: F401

from benchmarks._pages.common import (BEAM_W4_POINT, DEFAULT, MODEL_NAMES, Results,  # noqa: F401
                                      host_class, host_line, method_label, span, span_of,
                                      speed_row, table, x)


def speed_all_rows(r: Results, source: str) -> str:
    """Every row of a speed JSON: impl, method, tok/s, decode tok/s, target calls, loglik, KV."""
    doc = r(source)
    rows = []
    for row in doc["rows"]:
        ours = row["impl"] == "dsbd_jax"
        rows.append([row["impl"], row["method"], f"{row['tokens_per_s']:.2f}",
                     f"{row['decode_tokens_per_s']:.2f}",
                     f"{row['target_calls_per_token']:.3f}" if ours else "-",
                     f"{row['loglik_per_token']:.4f}" if ours else "-",
                     f"{row['kv_cache_bytes'] / 1e6:.1f}" if ours else "-"])
    return table(["impl", "method", "tok/s", "decode tok/s", "target calls/tok", "loglik/tok",
                  "KV MB"], rows)


def speed_ratios(r: Results, source: str) -> str:
    """The ratios a speed JSON records, end to end and in decode."""
    ratios = r(source)["ratios"]
    names = {"sample: dsbd_jax / transformers": "our sampling / transformers' sampling",
             "beam_sample_W4: dsbd_jax / transformers": "our beam sampling W=4 / transformers' W=4",
             "speculative_g4 / sample": "speculative sampling g4 / our sampling"}
    rows = []
    for key, value in ratios.items():
        if not key.startswith("tokens_per_s: "):
            continue
        what = key[len("tokens_per_s: "):]
        m = re.fullmatch(r"(\S+) / (\S+) \((ours|transformers)\)", what)
        if what in names:
            label = names[what]
        elif m:
            a, b, whose = m.groups()
            label = f"{method_label(a)} / {'our' if whose == 'ours' else 'transformers'}' " \
                    f"{method_label(b)}".replace("our' ", "our ")
        else:
            label = what
        rows.append([label, x(value), x(ratios["decode_tokens_per_s: " + what])])
    return table(["comparison", "end to end", "decode only"], rows)


def speed_vs_beam(r: Results, source: str) -> str:
    """A speed JSON's rows against our beam sampling W=4 (speculative against sampling)."""
    doc = r(source)
    beam4 = speed_row(doc, "beam_sample_W4")
    rows, last = [], []
    for row in doc["rows"]:
        method = row["method"]
        if row["impl"] != "dsbd_jax" or method == "sample":
            continue
        if method.startswith("speculative"):
            base = speed_row(doc, "sample")
            last.append([f"{method_label(method)} / our sampling",
                         f"{row['tokens_per_s']:.2f} / {base['tokens_per_s']:.2f}",
                         x(row["tokens_per_s"] / base["tokens_per_s"]), "", ""])
            continue
        over = "" if method.startswith("beam_sample_W2") else x(
            row["tokens_per_s"] / beam4["tokens_per_s"])
        rows.append([method_label(method), f"{row['tokens_per_s']:.2f}", over,
                     f"{row['target_calls_per_token']:.3f}", f"{row['loglik_per_token']:.3f}"])
    return table(["method (int8 draft)", "tok/s", "over our beam sampling W=4",
                  "target calls/tok", "loglik/tok"], rows + last)


def speed_target_kinds(r: Results, source: str) -> str:
    """The float and the int8 target side by side (``--target-weights float int8``)."""
    doc = r(source)
    rows = []
    for row in doc["rows"]:
        if row.get("weights") != "float":
            continue
        q = speed_row(doc, row["method"], "int8")
        rows.append([method_label(row["method"]),
                     f"{row['tokens_per_s']:.2f} ({row['decode_tokens_per_s']:.2f})",
                     f"{q['tokens_per_s']:.2f} ({q['decode_tokens_per_s']:.2f})",
                     f"{x(q['tokens_per_s'] / row['tokens_per_s'])} "
                     f"({x(q['decode_tokens_per_s'] / row['decode_tokens_per_s'])})"])
    return table(["method (float32, int8 draft)", "float target: tok/s (decode)",
                  "int8 target: tok/s (decode)", "int8 / float target"], rows)


def llama_cpp(r: Results, source: str) -> str:
    """Ours against llama.cpp's sampling on the same GGUF file (benchmarks/llama_cpp.py):
    sampling, and where the run has them beam sampling W=4 and DSBD on the int8 pair."""
    doc = r(source)
    ref = next(row for row in doc["rows"] if row["impl"] == "llama.cpp")
    rows = []
    for row in doc["rows"]:
        prefill = " / ".join(f"{s:.2f}" for s in row["prefill_s"])
        if row["impl"] == "llama.cpp":
            rows.append(["llama.cpp, the GGUF as stored", prefill, f"{row['tokens_per_s']:.2f}",
                         f"{row['decode_tokens_per_s']:.2f}", ""])
        else:
            method = row.get("method", "sample")
            who = (f"{row['weights']} target" if method == "sample" else
                   f"{method_label(method)}, int8 pair")
            rows.append([f"ours, {who}, {row['dtype']}", prefill,
                         f"{row['tokens_per_s']:.2f}", f"{row['decode_tokens_per_s']:.2f}",
                         f"{x(row['tokens_per_s'] / ref['tokens_per_s'])} "
                         f"({x(row['decode_tokens_per_s'] / ref['decode_tokens_per_s'])})"])
    lengths = " / ".join(str(n) for n in doc["prompt_lengths"])
    return table(["batch 1", f"prompt pass, s ({lengths} tokens)", "tok/s",
                  "decode tok/s", "over llama.cpp's sampling (decode)"], rows)


def forest_curve(r: Results, source: str) -> str:
    """The target's pass over a forest as a multiple of its one-token pass, per size."""
    doc = r(source)
    sizes = sorted({int(n) for dt in doc["curve"].values() for n in dt["over_one_token"]})
    rows = [[dt] + [x(v["over_one_token"][str(n)]) for n in sizes]
            for dt, v in doc["curve"].items()]
    rows += [[f"{dt}, the probe"] + [x(v["over_one_token"][str(n)]) for n in sizes]
             for dt, v in doc.get("probe", {}).items()]
    return table(["forest nodes"] + [str(n) for n in sizes], rows)


def forest_decoders(r: Results, source: str) -> str:
    """DSBD at the beam-W4 point with each node budget, against beam sampling W=4."""
    doc = r(source)
    rows = []
    for key, v in doc["decoders"].items():
        if not key.startswith("dsbd_w4_budget_"):
            continue
        budget = key[len("dsbd_w4_budget_"):]
        rows.append(["none (12 nodes)" if budget == "off" else budget, v["layer_width"],
                     f"{v['vs_beam_W4']:.3f}x", f"{v['tokens_per_target_call']:.2f}",
                     f"{v['loglik_per_token']:.3f}"])
    beam = doc["decoders"].get("beam_W4")
    if beam:
        rows.append(["beam sampling W=4", "", "1.000x", "1.00", f"{beam['loglik_per_token']:.3f}"])
    return table(["node budget", "nodes per layer", "DSBD / beam sampling W=4",
                  "tokens per target pass", "loglik/tok"], rows)


def same_speed(r: Results, source: str) -> str:
    """A change that keeps every program: the speed grid run by the commit before and after it,
    taking turns in one session (``rounds``), tok/s per method and round, after over before."""
    doc = r(source)
    by = {(run["checkout"], run["round"]): {row["method"]: row for row in run["rows"]}
          for run in doc["runs"]}
    rounds = sorted({k[1] for k in by})
    rows = []
    for method in by[("before", rounds[0])]:
        cells, ratios = [method_label(method)], []
        for i in rounds:
            old, new = by[("before", i)][method], by[("after", i)][method]
            cells += [f"{old['tokens_per_s']:.2f}", f"{new['tokens_per_s']:.2f}"]
            ratios.append(new["tokens_per_s"] / old["tokens_per_s"])
        same = all(by[("before", i)][method]["loglik_per_token"]
                   == by[("after", i)][method]["loglik_per_token"] for i in rounds)
        rows.append(cells + [", ".join(x(v) for v in ratios), "yes" if same else "no"])
    header = ["method"] + [f"{w} {i}: tok/s" for i in rounds for w in ("before", "after")]
    return table(header + ["after / before", "same log-likelihood"], rows)


BLOCKS = {
    "speed-dsbd-room-amx": lambda r: same_speed(r, "results/speed_dsbd_room_amx_xeon.json"),
    "speed-float32-rows": lambda r: speed_all_rows(r, "results/speed_float32_host.json"),
    "speed-float32-ratios": lambda r: speed_ratios(r, "results/speed_float32_host.json"),
    "speed-int8-draft-epyc": lambda r: speed_vs_beam(
        r, "results/speed_int8_draft_avx512bf16_epyc.json"),
    "speed-int8-draft-amx": lambda r: speed_vs_beam(r, "results/speed_int8_draft_amx_xeon.json"),
    "speed-int8-draft-avx2": lambda r: speed_vs_beam(r, "results/speed_int8_draft_avx2_epyc.json"),
    "speed-fixed-width-amx": lambda r: speed_vs_beam(
        r, "results/speed_fixed_width_amx_xeon.json"),
    "speed-int8-target-amx": lambda r: speed_target_kinds(
        r, "results/speed_int8_target_amx_xeon.json"),
    "speed-int8-target-epyc": lambda r: speed_target_kinds(
        r, "results/speed_int8_target_avx512bf16_epyc.json"),
    "speed-int8-target-avx2": lambda r: speed_target_kinds(
        r, "results/speed_int8_target_avx2_epyc.json"),
    "llama-cpp-amx": lambda r: llama_cpp(r, "results/llama_cpp_amx_xeon.json"),
    "llama-cpp-avx2": lambda r: llama_cpp(r, "results/llama_cpp_avx2_epyc.json"),
    "forest-curve-epyc": lambda r: forest_curve(r, "results/forest_budget_epyc.json"),
    "forest-head-epyc": lambda r: forest_decoders(r, "results/forest_budget_epyc.json"),
    "forest-draft-model-epyc": lambda r: forest_decoders(
        r, "results/forest_budget_epyc_draft_model.json"),
    "forest-no-replacement-epyc": lambda r: forest_decoders(
        r, "results/forest_budget_epyc_no_replacement.json"),
}
