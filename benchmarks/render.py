"""Render the results tables of README.md and docs/ from the committed JSON under results/.

A page (README.md, CHANGELOG.md, docs/**/*.md) marks each rendered block with two comments::

    <!-- render:NAME -->

    ...what BLOCKS[NAME] returns for the results folder...

    <!-- /render -->

``python -m benchmarks.render`` rewrites every block in place; ``--check`` rewrites nothing and
exits 1 naming each stale block (CI runs it through ``tests/test_rendered_pages.py``). Running it
twice changes nothing. Only the standard library: no jax, no model.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"(<!-- render:(?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /render -->)", re.S)

# the decoder settings of the speed grid, in the words the pages use
DEFAULT = "dsbd_g3_WS3_t0.9_Wmin1"          # the command line's default
BEAM_W4_POINT = "dsbd_g2_WS4_t0.7_Wmin2"    # the setting that keeps beam sampling W=4's loglik


# --- reading the results ---------------------------------------------------------------------

class Results:
    """The JSON files of one results folder, each read once."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)

    @lru_cache(maxsize=None)
    def __call__(self, name: str) -> dict:
        return json.loads((self.folder / name).read_text())


def speed_row(doc: dict, method: str, weights: str = "float", impl: str = "dsbd_jax"):
    for row in doc["rows"]:
        if (row["method"] == method and row.get("impl") == impl
                and row.get("weights", "float") == weights):
            return row
    return None


def method_label(method: str) -> str:
    """``dsbd_g2_WS4_t0.7_Wmin2`` -> ``DSBD g2 W_S 4 t 0.7 W_min 2``; the baselines in words."""
    m = re.fullmatch(r"dsbd_g(\d+)_WS(\d+)_t([\d.]+)_Wmin(\d+)(_single)?", method)
    if m:
        g, ws, t, wmin, single = m.groups()
        label = f"DSBD g{g} W_S {ws} t {t} W_min {wmin}"
        label += " single-beam" if single else ""
        if method == DEFAULT:
            label += " (the default)"
        if method == BEAM_W4_POINT:
            label += " (the beam-W4 point)"
        return label
    m = re.fullmatch(r"beam_sample_W(\d+)", method)
    if m:
        return f"beam sampling W={m.group(1)}"
    m = re.fullmatch(r"speculative_g(\d+)", method)
    if m:
        return f"speculative sampling g{m.group(1)}"
    return {"sample": "sampling"}.get(method, method)


def host_line(doc: dict, source: str, dtype: str) -> str:
    m = doc["machine"]
    return (f"`{source}`: {m['cpu_model']}, {m['cpu_count']} cores, {dtype}, "
            f"jax {m['jax']}")


def x(value: float) -> str:
    return f"{value:.2f}x"


def table(header, rows) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# --- the speed grid (benchmarks/speed.py) ----------------------------------------------------

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
    """Sampling against llama.cpp on the same GGUF file (benchmarks/llama_cpp.py)."""
    doc = r(source)
    ref = next(row for row in doc["rows"] if row["impl"] == "llama.cpp")
    rows = []
    for row in doc["rows"]:
        prefill = " / ".join(f"{s:.2f}" for s in row["prefill_s"])
        if row["impl"] == "llama.cpp":
            rows.append(["llama.cpp, the GGUF as stored", prefill, f"{row['tokens_per_s']:.2f}",
                         f"{row['decode_tokens_per_s']:.2f}", ""])
        else:
            rows.append([f"ours, {row['weights']} target, {row['dtype']}", prefill,
                         f"{row['tokens_per_s']:.2f}", f"{row['decode_tokens_per_s']:.2f}",
                         f"{x(row['tokens_per_s'] / ref['tokens_per_s'])} "
                         f"({x(row['decode_tokens_per_s'] / ref['decode_tokens_per_s'])})"])
    lengths = " / ".join(str(n) for n in doc["prompt_lengths"])
    return table(["sampling, batch 1", f"prompt pass, s ({lengths} tokens)", "tok/s",
                  "decode tok/s", "over llama.cpp (decode)"], rows)


# --- quality runs (dsbd bench + benchmarks/quality_report.py) -------------------------------

_Q4 = "dsbd g=2 WS=4 t=0.7 Wmin=2"           # the beam-W4 point
_Q3 = "dsbd g=3 WS=3 t=0.9 Wmin=1"
_Q1 = "dsbd g=3 WS=3 t=0.9 Wmin=1 single-beam"
Q_ROWS = (("sampling", "sample"), ("beam sampling W=2", "beam W=2"),
          ("beam sampling W=4", "beam W=4"), ("speculative sampling g4", "spec g=4"),
          ("DSBD g2 W_S 4 t 0.7 W_min 2 (the beam-W4 point)", _Q4),
          ("DSBD g3 W_S 3 t 0.9 W_min 1", _Q3), ("the same, single-beam", _Q1))
Q_DIFFS = (("DSBD beam-W4 point minus beam sampling W=4", _Q4, "beam W=4"),
           ("DSBD beam-W4 point minus sampling", _Q4, "sample"),
           ("DSBD g3 W_S 3 minus beam sampling W=4", _Q3, "beam W=4"),
           ("DSBD single-beam minus speculative sampling", _Q1, "spec g=4"),
           ("DSBD single-beam minus sampling", _Q1, "sample"),
           ("the yardstick: beam sampling W=4 minus sampling", "beam W=4", "sample"))


def interval(d: dict, pct: bool, sign: str = "") -> str:
    scale, fmt = (100, sign + ".1f") if pct else (1, sign + ".3f")
    return (f"{format(d['mean'] * scale, fmt)} [{format(d['lo'] * scale, fmt)}, "
            f"{format(d['hi'] * scale, fmt)}]")


def quality_table(r: Results, run: str) -> str:
    """Each method setting's task metrics (%) and log-likelihoods, with 95 % intervals."""
    rows = {row["label"]: row for row in r(f"{run}/report.json")["summary"]["rows"]}
    out = []
    for name, label in Q_ROWS:
        row = rows[label]
        out.append([name, interval(row["task_intervals"]["humaneval/pass@1"], True),
                    interval(row["task_intervals"]["gsm8k/exact_match"], True),
                    interval(row["loglik_by_task"]["humaneval"], False),
                    interval(row["loglik_by_task"]["gsm8k"], False),
                    interval(row["loglik_by_task"]["mtbench"], False),
                    f"{row['target_calls_per_token']:.2f}"])
    return table(["method", "HumanEval pass@1 % [95%]", "GSM8K exact match % [95%]",
                  "log-likelihood / token, HumanEval [95%]", "GSM8K", "MT-Bench",
                  "target calls / token"], out)


def quality_differences(r: Results, run: str) -> str:
    """Paired differences on the same problems: DSBD against its baselines, and the yardstick."""
    doc = r(f"{run}/report.json")
    found = {(d["dsbd"], d["baseline"], d["figure"]): d
             for d in doc["summary"]["quality_differences"] + doc["yardstick"]}
    out = []
    for name, a, b in Q_DIFFS:
        out.append([name, interval(found[(a, b, "pooled/task_metric")], True, "+")]
                   + [interval(found[(a, b, f"{task}/loglik_per_token")], False, "+")
                      for task in ("humaneval", "gsm8k", "mtbench")])
    return table(["paired, same problems", "HumanEval and GSM8K pooled, points [95%]",
                  "log-likelihood / token, HumanEval [95%]", "GSM8K", "MT-Bench"], out)


def quality_against(r: Results, run: str) -> str:
    """A run minus another run (``quality_report --against``), per setting, in points."""
    found = {(d["dsbd"], d["figure"]): d for d in r(f"{run}/report.json")["against"]["differences"]}
    out = [[name] + [interval(found[(label, f)], True, "+")
                     for f in ("humaneval/pass@1", "gsm8k/exact_match", "pooled/task_metric")]
           for name, label in Q_ROWS]
    return table(["method setting", "HumanEval pass@1, points [95%]",
                  "GSM8K exact match, points [95%]", "pooled, points [95%]"], out)


# --- memory ----------------------------------------------------------------------------------

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


# --- accelerators (benchmarks/accelerator.py) --------------------------------------------------

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


# --- drafts (benchmarks/draft_terms.py, head training) ----------------------------------------

TERM_RATIOS = (("speculative / sampling", "speculative_vs_sample", "speculative_g4"),
               ("DSBD at the beam-W4 point / beam sampling W=4", "dsbd_w4_vs_beam_w4",
                "dsbd_beamW4_point"),
               ("single-beam DSBD / speculative", "single_beam_vs_speculative",
                "speculative_g4"))
DRAFT_NAMES = {"base": "0.5B draft", "head": "head", "int8": "int8 draft"}


def terms_targets(r: Results, source: str, draft: str = "base", batch: str = "b1") -> str:
    """Each ratio end to end and in decode, recomputed with one term changed; the terms that
    alone reach the script's goal."""
    targets = r(source)["batches"][batch]["drafts"][draft]["targets"]
    rows = []
    for label, key, method in TERM_RATIOS:
        v = targets.get(key, {}).get(method)
        if not v:
            continue
        changed = ", ".join(f"{k} {x(val)}" for k, val in v.items()
                            if k not in ("decode", "end_to_end", "reached_by"))
        rows.append([label, x(v["end_to_end"]), x(v["decode"]), changed,
                     ", ".join(v["reached_by"]) or "none alone"])
    return table(["ratio", "end to end", "decode", "with one term changed (decode)",
                  "reached by"], rows)


def terms_passes(r: Results, source: str, batch: str = "b1") -> str:
    """Each model's one-token pass alone, the decoders' cache, and its share of the target's."""
    b = r(source)["batches"][batch]
    rows = [["target (1.5B)", f"{b['one_token_pass_ms']['target']:.1f}", "1"]]
    rows += [[DRAFT_NAMES.get(k, k), f"{b['one_token_pass_ms'][k]:.1f}", f"{v:.3f}"]
             for k, v in b["draft_pass_vs_target"].items()]
    return table(["pass alone, one token", "ms", "/ the target's"], rows)


def terms_decoders(r: Results, source: str, batch: str = "b1") -> str:
    """Each decoder's tok/s, tokens per iteration and decode ms per iteration split into draft
    passes, target pass and the rest (negative: a pass ran faster in the loop than alone)."""
    b = r(source)["batches"][batch]
    rows = [["(none)", method_label(m), f"{v['tokens_per_s']:.2f}",
             f"{v['tokens_per_iteration']:.0f}", f"{v['decode_ms_per_token']:.0f} per token"]
            for m, v in b["references"].items()]
    names = {"speculative_g4": "speculative, gamma 4", "dsbd_single_beam": "single-beam DSBD",
             "dsbd_beamW4_point": "DSBD at the beam-W4 point"}
    for draft, methods in b["drafts"].items():
        for m, name in names.items():
            v = methods.get(m)
            if v:
                rest = v["rest_ms"]
                rows.append([DRAFT_NAMES.get(draft, draft), name, f"{v['tokens_per_s']:.2f}",
                             f"{v['tokens_per_iteration']:.2f}",
                             f"{v['draft_passes_ms']:.0f} + {v['target_passes_ms']:.0f} "
                             f"{'+' if rest >= 0 else '-'} {abs(rest):.0f}"])
    return table(["draft", "method", "tok/s", "tokens / iteration",
                  "ms / iteration: draft + target + rest"], rows)


def terms_ratios(r: Results, source: str, batch: str = "b1") -> str:
    """Per draft, each ratio end to end, with every draft accepted and with free draft passes
    (decode), the other terms as measured."""
    b = r(source)["batches"][batch]
    rows = []
    for draft, methods in b["drafts"].items():
        for label, key, method in TERM_RATIOS:
            v = methods["targets"].get(key, {}).get(method)
            if v:
                rows.append([DRAFT_NAMES.get(draft, draft), label, x(v["end_to_end"]),
                             x(v["all_accepted"]) if "all_accepted" in v else "",
                             x(v["free_draft"]) if "free_draft" in v else ""])
    return table(["draft", "ratio", "end to end", "every draft accepted (decode)",
                  "free draft passes (decode)"],
                 rows)


def training_runs(r: Results, sources) -> str:
    """Training runs under /usr/bin/time (benchmarks.head_training): wall time, peak memory and
    held-out acceptance at each evaluation (a head's first / second draft token)."""
    rows = []
    for source in sources:
        doc = r(source)
        evals = []
        for e in doc["log"]:
            if "heldout_acceptance_1" in e:
                evals.append(f"{e['step']}: {e['heldout_acceptance_1']:.3f} / "
                             f"{e['heldout_acceptance_2']:.3f}")
            elif "heldout_acceptance" in e:
                evals.append(f"{e['step']}: {e['heldout_acceptance']:.3f}")
        rows.append([f"`{source}`", host_class(doc["machine"]),
                     f"{doc['wall_s'] / 60:.0f} min", f"{doc['peak_rss_kb'] / 1e6:.1f} GB",
                     "; ".join(evals)])
    return table(["run", "host class", "wall", "peak RSS", "held-out acceptance by step"], rows)


def heads_table(r: Results, source: str, key: str, labels: dict) -> str:
    """Heads (or training variants) counted on the same held-out continuations."""
    doc = r(source)[key]
    rows = []
    for name, label in labels.items():
        v = doc[name]
        rows.append([label, f"{v['train_texts']} ({v['train_positions']})" if "train_texts" in v
                     else "", str(v.get("steps", "")), f"{v['acceptance_1']:.3f}",
                     f"{v['acceptance_2']:.3f}", f"{v['kl_1']:.2f}"])
    return table(["head", "training texts (positions)", "steps", "first draft token",
                  "second draft token", "token KL"], rows)


def head_acceptance(r: Results, source: str) -> str:
    s = r(source)["summary"]
    return table(["draft", "on the continuations", "on the prompts", "counted by the decoder"],
                 [["draft head", f"{s['head']['continuation']:.3f}",
                   f"{s['head']['prompt']:.3f}", f"{s['decoded_head']:.3f}"],
                  ["0.5B draft model", f"{s['draft']['continuation']:.3f}",
                   f"{s['draft']['prompt']:.3f}", ""]])


def head_data_speed(r: Results, source: str) -> str:
    d = r(source)
    sec = d["seconds"]
    return table(["rollout_data", "seconds (second run)", "/ rescore"],
                 [["rescore", f"{sec['rescore']['second_run_s']:.0f}", "1"],
                  ["own_passes", f"{sec['own_passes']['second_run_s']:.0f}",
                   f"{d['own_passes_over_rescore']:.2f}"]])


# --- precision -------------------------------------------------------------------------------

MODEL_NAMES = {"qwen2.5-coder-1.5b-instruct": "1.5B target", "qwen2.5-coder-0.5b-instruct": "0.5B draft"}


def span_of(values, fmt: str = ".1f") -> str:
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo}-{hi}"


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


# --- what an iteration executes, variants side by side (the retired profile and probes) ------

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


# --- the command line -------------------------------------------------------------------------

def cli_latency(r: Results, source: str) -> str:
    """Whole ``dsbd`` commands timed from outside (the retired cli_latency.py), median seconds."""
    doc = r(source)
    # the JSON keeps each command's words, not its quoting: printed as words, not as code
    return table(["command (its words)", "seconds"],
                 [[doc["commands"][k], f"{v:.1f}"] for k, v in doc["seconds"].items()])


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


# --- the node budget (benchmarks/forest_budget.py, retired) ----------------------------------

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


# --- the README's headline: one table per host class -----------------------------------------

# (title, dtype, [(source, batch)]): a speed JSON gives batch 1, a draft_terms JSON its batches
HOSTS = {
    "amx": ("Intel Xeon with AMX", "bfloat16",
            [("results/speed_int8_draft_amx_xeon.json", 1),
             ("results/draft_terms_int8_batch4_amx_xeon.json", 4)]),
    "avx512bf16": ("AMD EPYC with AVX512-BF16", "bfloat16",
                   [("results/speed_int8_draft_avx512bf16_epyc.json", 1),
                    ("results/draft_terms_int8_avx512bf16_epyc.json", 4)]),
    "avx2": ("AMD EPYC with AVX2 only", "float32",
             [("results/draft_terms_int8_avx2_epyc.json", 1)]),
}


def headline_rows(r: Results, host: str):
    """``[(decoder, batch, end to end, decode, loglik/tok or None, beam W=4's or None)]``."""
    out = []
    for source, batch in HOSTS[host][2]:
        doc = r(source)
        if "rows" in doc:   # the speed grid
            beam4, sample = speed_row(doc, "beam_sample_W4"), speed_row(doc, "sample")
            for method in (DEFAULT, BEAM_W4_POINT):
                row = speed_row(doc, method)
                if row:
                    out.append((method_label(method), batch,
                                row["tokens_per_s"] / beam4["tokens_per_s"],
                                row["decode_tokens_per_s"] / beam4["decode_tokens_per_s"],
                                row["loglik_per_token"], beam4["loglik_per_token"]))
            spec = speed_row(doc, "speculative_g4")
            out.append(("speculative sampling g4 / our sampling", batch,
                        spec["tokens_per_s"] / sample["tokens_per_s"],
                        spec["decode_tokens_per_s"] / sample["decode_tokens_per_s"],
                        None, None))
        else:               # benchmarks/draft_terms.py, the int8 draft
            targets = doc["batches"][f"b{batch}"]["drafts"]["int8"]["targets"]
            point = targets["dsbd_w4_vs_beam_w4"]["dsbd_beamW4_point"]
            spec = targets["speculative_vs_sample"]["speculative_g4"]
            out.append((method_label(BEAM_W4_POINT), batch, point["end_to_end"],
                        point["decode"], None, None))
            out.append(("speculative sampling g4 / our sampling", batch, spec["end_to_end"],
                        spec["decode"], None, None))
    return out


def headline(r: Results, host: str) -> str:
    title, dtype, sources = HOSTS[host]
    rows = [[label, batch, x(e2e), x(dec),
             "" if ll is None else f"{ll:.3f} ({ref:.3f})"]
            for label, batch, e2e, dec, ll, ref in headline_rows(r, host)]
    cpu = {r(s)["machine"]["cpu_model"] for s, _ in sources}
    return (f"**{title}**, {dtype} ({', '.join(sorted(cpu))}; "
            + ", ".join(f"`{s}`" for s, _ in sources) + ")\n\n"
            + table(["int8 draft, over our beam sampling W=4", "batch", "end to end", "decode",
                     "loglik/tok (beam W=4's)"], rows))


def span(values) -> str:
    lo, hi = min(values), max(values)
    return x(lo) if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}x"


def verdict(r: Results) -> str:
    """The headline's verdict, its figures taken from the host tables."""
    def pick(hosts, batch, label):
        return [row for h in hosts for row in headline_rows(r, h)
                if row[1] == batch and row[0] == label]

    point = method_label(BEAM_W4_POINT)
    fast = pick(("amx", "avx512bf16"), 1, point)
    default = pick(("amx", "avx512bf16"), 1, method_label(DEFAULT))
    batch4 = pick(("amx", "avx512bf16"), 4, point)
    avx2 = pick(("avx2",), 1, point)
    return (
        f"**With the int8 draft, at batch 1 on the AVX512-BF16 and AMX hosts, DSBD runs at "
        f"{span([row[2] for row in fast])} our beam sampling W=4 "
        f"({span([row[3] for row in fast])} in decode) at the beam-W4 point**, the setting "
        f"that keeps beam sampling W=4's log-likelihood per token, and at "
        f"{span([row[2] for row in default])} at the command line's default. "
        f"It does not yet pay at batch 4 ({span([row[2] for row in batch4])}) "
        f"or on the AVX2-only host ({span([row[2] for row in avx2])}).\n")


def changelog_speed(r: Results) -> str:
    """One row per host class: the release's speed in one table."""
    point, default = method_label(BEAM_W4_POINT), method_label(DEFAULT)
    rows = []
    for host, (title, dtype, _) in HOSTS.items():
        got = {(label, batch): e2e for label, batch, e2e, *_ in headline_rows(r, host)}
        rows.append([f"{title} ({dtype})",
                     x(got[(point, 1)]) if (point, 1) in got else "",
                     x(got[(default, 1)]) if (default, 1) in got else "",
                     x(got[(point, 4)]) if (point, 4) in got else ""])
    return table(["host class", "beam-W4 point", "default", "beam-W4 point, batch 4"], rows)


def host_class(machine: dict) -> str:  # noqa: D401
    """A result's host class, from its ``machine`` block: the GPU, or the CPU's deciding flags."""
    if machine.get("platform") == "gpu" or str(machine.get("device", "")).startswith("NVIDIA"):
        return str(machine["device"])
    flags = set(machine.get("cpu_flags", []))
    vendor = "AMD EPYC" if "EPYC" in machine["cpu_model"] else "Intel Xeon"
    if any(f.startswith("amx") for f in flags):
        return f"{vendor} with AMX"
    if "avx512_bf16" in flags:
        return f"{vendor} with AVX512-BF16"
    if "avx512f" in flags:
        return f"{vendor} with AVX-512, no AVX512-BF16 or AMX"
    return f"{vendor} with AVX2 only"


def hosts(r: Results) -> str:
    """Every committed result JSON under its host class, read from its ``machine`` block."""
    found: dict = {}
    for path in sorted((r.folder / "results").rglob("*.json")):
        doc = json.loads(path.read_text())
        machine = doc.get("machine") or doc.get("summary", {}).get("machine")
        if isinstance(machine, dict) and "cpu_model" in machine:
            rel = path.relative_to(r.folder).as_posix()
            found.setdefault(host_class(machine), []).append(f"`{rel}`")
    return table(["host class", "results"], [[k, ", ".join(v)] for k, v in sorted(found.items())])


# --- the blocks ------------------------------------------------------------------------------

BLOCKS = {
    "headline-verdict": verdict,
    "changelog-speed": changelog_speed,
    "results-hosts": hosts,
    "headline-amx": lambda r: headline(r, "amx"),
    "headline-avx512bf16": lambda r: headline(r, "avx512bf16"),
    "headline-avx2": lambda r: headline(r, "avx2"),
    "speed-float32-rows": lambda r: speed_all_rows(r, "results/speed_float32_host.json"),
    "speed-float32-ratios": lambda r: speed_ratios(r, "results/speed_float32_host.json"),
    "speed-int8-draft-epyc": lambda r: speed_vs_beam(
        r, "results/speed_int8_draft_avx512bf16_epyc.json"),
    "speed-int8-draft-amx": lambda r: speed_vs_beam(r, "results/speed_int8_draft_amx_xeon.json"),
    "speed-int8-target-amx": lambda r: speed_target_kinds(
        r, "results/speed_int8_target_amx_xeon.json"),
    "speed-int8-target-epyc": lambda r: speed_target_kinds(
        r, "results/speed_int8_target_avx512bf16_epyc.json"),
    "llama-cpp-amx": lambda r: llama_cpp(r, "results/llama_cpp_amx_xeon.json"),
    "quality-int8-draft": lambda r: quality_table(r, "results/quality_cpu_int8"),
    "quality-int8-draft-differences": lambda r: quality_differences(
        r, "results/quality_cpu_int8"),
    "quality-int8-target": lambda r: quality_table(r, "results/quality_cpu_int8_target"),
    "quality-int8-target-against": lambda r: quality_against(
        r, "results/quality_cpu_int8_target"),
    "memory-kv-cache": lambda r: kv_cache(r, "results/speed_float32_host.json"),
    "memory-soak": lambda r: soak(r, ["results/soak_avx512bf16_epyc.json",
                                      "results/soak_amx_xeon.json"]),
    "demo-runs": lambda r: demo_runs(r, ["results/demo_memory_default_amx_xeon.json",
                                         "results/demo_memory_int8_amx_xeon.json",
                                         "results/demo_memory_float32_amx_xeon.json",
                                         "results/demo_memory_float32_amx_xeon_resident.json",
                                         "results/demo_memory_int8_avx512bf16_epyc.json",
                                         "results/demo_memory_float32_avx512bf16_epyc.json"]),
    "cpu-kernel-blocks": lambda r: kernel_blocks(r, ["results/kernel_blocks_64_epyc.json",
                                                     "results/kernel_blocks_halves_epyc.json",
                                                     "results/kernel_blocks_64_float32_epyc.json"]),
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
    "draft-terms-targets": lambda r: terms_targets(r, "results/draft_terms_head.json"),
    "draft-training": lambda r: training_runs(r, ["results/head_qwen_training.json",
                                                  "results/head_qwen_training_epyc.json",
                                                  "results/distill_qwen_fkl_training.json"]),
    "draft-heldout": lambda r: heads_table(r, "results/head_heldout.json", "heads", {
        "head_qwen": "this recipe (`head_qwen`)",
        "head_qwen_own": "own passes, 122 prompts, former unroll (`head_qwen_own`)",
        "head_qwen_rescore": "rescored, 122 prompts, former unroll (`head_qwen_rescore`)"}),
    "draft-ablation": lambda r: heads_table(r, "results/head_ablation.json", "variants", {
        "recipe": "the recipe: the target's last layer, token KL + feature regression, "
                  "two unrolled steps",
        "random_init": "a random block instead of the target's last layer (`init: random`)",
        "no_feature_loss": "token KL only (`feature_weight: 0`)",
        "one_step": "one step, no unrolled second step (`unroll: 1`)"}),
    "draft-ablation-data": lambda r: heads_table(
        r, "results/head_ablation_data_layers.json", "variants", {
            "recipe": "the recipe", "half_data": "every second text (`half_data`)",
            "fused_layers": "a low, a middle and the last layer fused (`fused_layers`)"}),
    "draft-ablation-more": lambda r: heads_table(
        r, "results/head_ablation_more.json", "variants", {
            "longer": "five times the steps (`longer`)",
            "more_text": "and 400 worked answers (`more_text`)"}),
    "draft-more-text-ratios": lambda r: terms_ratios(
        r, "results/draft_terms_head_more_text_epyc.json"),
    "draft-data-speed": lambda r: head_data_speed(r, "results/head_data_speed.json"),
    "draft-acceptance": lambda r: head_acceptance(r, "results/head_acceptance.json"),
    "draft-head-xeon-passes": lambda r: terms_passes(r, "results/draft_terms_head_rollouts.json"),
    "draft-head-xeon-decoders": lambda r: terms_decoders(
        r, "results/draft_terms_head_rollouts.json"),
    "draft-head-xeon-ratios": lambda r: terms_ratios(r, "results/draft_terms_head_rollouts.json"),
    "draft-head-epyc-passes": lambda r: terms_passes(r, "results/draft_terms_head_epyc.json"),
    "draft-head-epyc-b1": lambda r: terms_decoders(r, "results/draft_terms_head_epyc.json"),
    "draft-head-epyc-b1-ratios": lambda r: terms_ratios(r, "results/draft_terms_head_epyc.json"),
    "draft-head-epyc-b4": lambda r: terms_decoders(
        r, "results/draft_terms_head_epyc.json", "b4"),
    "draft-head-epyc-b4-ratios": lambda r: terms_ratios(
        r, "results/draft_terms_head_epyc.json", "b4"),
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
    "precision-terms-amx": lambda r: terms_runs(
        r, (("earlier", "results/draft_terms_int8_amx_xeon_earlier.json"),
            ("later", "results/draft_terms_int8_amx_xeon.json"))),
    "precision-terms-amx-b4": lambda r: terms_runs(
        r, (("batch 4", "results/draft_terms_int8_batch4_amx_xeon.json"),), "b4"),
    "precision-int8-distance-amx": lambda r: int8_distance(
        r, "results/int8_distance_amx_xeon.json"),
    "precision-int8-distance-epyc": lambda r: int8_distance(
        r, "results/int8_distance_avx512bf16_epyc.json"),
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
    "cli-latency": lambda r: cli_latency(r, "results/cli_latency.json"),
    "cli-progress-chunks": lambda r: progress_chunks(
        r, "results/progress_chunks_avx512bf16_epyc.json"),
    "forest-curve-epyc": lambda r: forest_curve(r, "results/forest_budget_epyc.json"),
    "forest-head-epyc": lambda r: forest_decoders(r, "results/forest_budget_epyc.json"),
    "forest-draft-model-epyc": lambda r: forest_decoders(
        r, "results/forest_budget_epyc_draft_model.json"),
    "forest-no-replacement-epyc": lambda r: forest_decoders(
        r, "results/forest_budget_epyc_no_replacement.json"),
}


def pages(root: Path = ROOT):
    yield root / "README.md"
    yield root / "CHANGELOG.md"
    yield from sorted(p for p in (root / "docs").rglob("*.md") if "_build" not in p.parts)


def render_text(text: str, results: Results) -> str:
    """``text`` with every block rendered from ``results``."""
    def body(m):
        name = m.group("name")
        if name not in BLOCKS:
            raise KeyError(f"no renderer for block {name!r}")
        return m.group(1) + "\n" + BLOCKS[name](results) + "\n" + m.group(4)
    return BLOCK.sub(body, text)


def stale(root: Path = ROOT, results_dir: Path | None = None, write: bool = False):
    """``[(page, block name)]`` of the blocks whose text differs from what rendering gives;
    with ``write``, the pages are rewritten."""
    results = Results(results_dir or root)
    found = []
    for page in pages(root):
        text = page.read_text()
        new = render_text(text, results)
        if new != text:
            old_blocks = {m.group("name"): m.group("body") for m in BLOCK.finditer(text)}
            new_blocks = {m.group("name"): m.group("body") for m in BLOCK.finditer(new)}
            found += [(page.relative_to(root).as_posix(), n) for n in new_blocks
                      if new_blocks[n] != old_blocks.get(n)]
            if write:
                page.write_text(new)
    return found


def used(root: Path = ROOT):
    """The block names the pages hold."""
    return {m.group("name") for page in pages(root) for m in BLOCK.finditer(page.read_text())}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.render", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true",
                        help="rewrite nothing; exit 1 when a block is stale")
    parser.add_argument("--results", type=Path, default=None,
                        help="the folder holding results/ (default: the checkout)")
    args = parser.parse_args(argv)
    found = stale(ROOT, args.results, write=not args.check)
    for page, name in found:
        print(f"{page}: render:{name} {'is stale' if args.check else 'rewritten'}")
    return 1 if (args.check and found) else 0


if __name__ == "__main__":
    sys.exit(main())
