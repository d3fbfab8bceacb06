"""Markdown tables of a quality run (``dsbd bench configs/quality_cpu.yaml``) for ``docs/results/quality.md``,
finished or not.

    python benchmarks/quality_report.py runs/quality_cpu [--out runs/quality_cpu/report.md]

From the records alone (``dsbd_jax.eval.summary.summary_of``), it writes:

1. the quality table: per method setting, each task metric with its Wilson 95% interval, the
   best beam's log-likelihood per token per task with its bootstrap 95% interval, mean new
   tokens, end-to-end and decode tokens/s (at the run's batch size), target calls per token and
   KV-cache MB per prompt;
2. speed ratios measured in the run: each DSBD setting against beam sampling W=4 and W=2 and
   plain sampling, single-beam DSBD against speculative sampling;
3. paired differences: each DSBD setting minus beam W=4 / sampling / speculative on the same
   problems, with bootstrap 95% intervals (``quality_differences``), per task and pooled over
   the tasks that have a task metric (``pooled/task_metric``);
4. the yardstick: each beam-sampling setting minus plain sampling, paired the same way, which
   says whether the run can separate beam sampling's quality from sampling's at all;
5. where a batch's time goes: ms per loop iteration of a batch, and the lockstep idle share
   (iterations in which a prompt had finished but its row was still computed);
6. ``report.json`` with the same figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, _ROOT)

from dsbd_jax.eval.records import read_records  # noqa: E402
from dsbd_jax.eval.summary import quality_differences, summary_of  # noqa: E402

TASK_ORDER = ("humaneval/pass@1", "gsm8k/exact_match", "squad/exact_match",
              "spider/execution_accuracy")


def pct(iv):
    if not iv or iv.get("mean") is None:
        return "-"
    return f"{100 * iv['mean']:.1f} [{100 * iv['lo']:.1f}, {100 * iv['hi']:.1f}]"


def ll(iv):
    if not iv or iv.get("mean") is None:
        return "-"
    return f"{iv['mean']:.3f} [{iv['lo']:.3f}, {iv['hi']:.3f}]"


def num(v, nd=2):
    return "-" if v is None else f"{v:.{nd}f}"


def quality_table(summary):
    rows = summary["rows"]
    metrics = [m for m in TASK_ORDER if any(m in r["task_intervals"] for r in rows)]
    tasks = sorted({t for r in rows for t in r["loglik_by_task"]})
    head = (["method", "prompts"] + [f"{m} % [95%]" for m in metrics]
            + [f"{t} loglik/tok [95%]" for t in tasks]
            + ["new tok/prompt", "tok/s", "decode tok/s", "target calls/tok", "KV MB/prompt"])
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [r["label"], str(r["prompts"])]
        cells += [pct(r["task_intervals"].get(m)) for m in metrics]
        cells += [ll(r["loglik_by_task"].get(t)) for t in tasks]
        cells += [num(r["mean_new_tokens"], 0), num(r["tokens_per_s"]),
                  num(r["decode_tokens_per_s"]), num(r["target_calls_per_token"]),
                  num(r["kv_cache_bytes"] / 1e6, 1)]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def find(rows, method, **setting):
    for r in rows:
        if r["method"] == method and all(r["setting"].get(k) == v for k, v in setting.items()):
            if method != "dsbd" or bool(r["setting"].get("single_beam")) == bool(
                    setting.get("single_beam")):
                return r
    return None


def ratios(summary):
    rows = summary["rows"]
    base = {"beam W=4": find(rows, "beam", num_beams=4), "beam W=2": find(rows, "beam", num_beams=2),
            "sample": find(rows, "sample") or find(rows, "beam", num_beams=1),
            "spec": find(rows, "spec")}
    out = []
    for r in rows:
        if r["method"] != "dsbd":
            continue
        names = ["spec", "sample"] if r["setting"].get("single_beam") else \
            ["beam W=4", "beam W=2", "sample"]
        for n in names:
            b = base.get(n)
            if b and b["tokens_per_s"] and r["tokens_per_s"]:
                out.append({"dsbd": r["label"], "baseline": b["label"],
                            "speedup": r["tokens_per_s"] / b["tokens_per_s"],
                            "decode_speedup": (r["decode_tokens_per_s"] / b["decode_tokens_per_s"]
                                               if r["decode_tokens_per_s"] and
                                               b["decode_tokens_per_s"] else None),
                            "prompts": min(r["prompts"], b["prompts"])})
    return out


def ratio_table(rs):
    out = ["| DSBD setting | baseline | tok/s ratio | decode tok/s ratio | prompts |",
           "|---|---|---|---|---|"]
    out += [f"| {r['dsbd']} | {r['baseline']} | {r['speedup']:.2f}x | "
            f"{num(r['decode_speedup'])}x | {r['prompts']} |" for r in rs]
    return "\n".join(out)


def difference_table(diffs, baselines=("beam W=4", "sample", "spec g=4", "beam W=1"),
                     first="DSBD setting", better="P(DSBD better)"):
    out = [f"| {first} | minus | figure | mean difference [95%] | {better} | prompts |",
           "|---|---|---|---|---|---|"]
    for d in diffs:
        if baselines is not None and d["baseline"] not in baselines:
            continue
        scale = 100 if not d["figure"].endswith("loglik_per_token") else 1
        unit = " pts" if scale == 100 else ""
        out.append(f"| {d['dsbd']} | {d['baseline']} | {d['figure']} | "
                   f"{scale * d['mean']:+.{1 if scale == 100 else 3}f}{unit} "
                   f"[{scale * d['lo']:+.{1 if scale == 100 else 3}f}, "
                   f"{scale * d['hi']:+.{1 if scale == 100 else 3}f}] | "
                   f"{d['p_a_better']:.2f} | {d['n']} |")
    return "\n".join(out)


def yardstick(summary, records):
    """Each beam-sampling setting against each plain-sampling setting, paired: whether the run
    can tell beam sampling's quality from sampling's at all."""
    labels = {m: [r["label"] for r in summary["rows"] if r["method"] == m]
              for m in ("beam", "sample")}
    return quality_differences(records, [(b, s) for b in labels["beam"] for s in labels["sample"]])


def batch_table(records):
    """Per method: ms per loop iteration of a batch (batch seconds minus the prompt passes, over
    the batch's target calls), tokens per iteration for the prompts, and the lockstep idle share:
    the part of the batch's iterations in which a prompt had already finished (its row still
    computed) = 1 - sum of per-prompt target calls / (batch target calls x prompts in batch)."""
    by = {}
    for r in records:
        if r.get("type") == "sample":
            by.setdefault(r["label"], {}).setdefault(r["batch"], []).append(r)
    out = ["| method | ms / batch iteration | batch iterations | lockstep idle share |",
           "|---|---|---|---|"]
    rows = {}
    for lab, batches in by.items():
        ms, iters, own, slots = [], 0, 0, 0
        for rs in batches.values():
            calls = rs[0]["target_calls"]
            loop_s = rs[0]["batch_seconds"] - sum(r["prefill_s"] or 0 for r in rs) * \
                rs[0]["batch_prompts"] / len(rs)
            ms.append(1000 * loop_s / max(calls - 1, 1))  # the prefill is one of the calls
            iters += calls
            own += sum(r["row_target_calls"] for r in rs)
            slots += calls * len(rs)
        rows[lab] = {"ms_per_iteration": sum(ms) / len(ms), "idle_share": 1 - own / slots}
        rows[lab]["iterations"] = iters
        out.append(f"| {lab} | {rows[lab]['ms_per_iteration']:.0f} | {iters} | "
                   f"{rows[lab]['idle_share']:.2f} |")
    return "\n".join(out), rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="a bench output folder (or its records.jsonl)")
    ap.add_argument("--out", default=None, help="Markdown file (default: <folder>/report.md)")
    args = ap.parse_args()
    path = args.results if args.results.endswith(".jsonl") else os.path.join(args.results,
                                                                               "records.jsonl")
    folder = os.path.dirname(path)
    summary = summary_of(path)
    records = read_records(path)
    rs = ratios(summary)
    batch_text, batch_rows = batch_table(records)
    yard = yardstick(summary, records)
    status = ("complete" if summary["complete"] else
              f"PARTIAL: {summary['done']} of {summary['total']} (method, prompt) pairs done")
    text = "\n\n".join([
        f"Run `{summary['name']}` ({status}; batch size {summary['batch_size']}; "
        f"{summary['sessions']} part(s), one per start of `dsbd bench`).",
        "### Quality and speed per method setting\n\n" + quality_table(summary),
        "### Speed ratios (same run, same prompts)\n\n" + ratio_table(rs),
        "### Paired differences on the same problems (DSBD minus baseline)\n\n"
        + difference_table(summary["quality_differences"]),
        "### The yardstick: beam sampling minus sampling on the same problems\n\n"
        + difference_table(yard, None, "beam setting", "P(beam better)"),
        "### Where a batch's time goes\n\n" + batch_text])
    out = args.out or os.path.join(folder, "report.md")
    with open(out, "w") as f:
        f.write(text + "\n")
    with open(os.path.join(os.path.dirname(out), "report.json"), "w") as f:
        # the host and dtype of the records it reports on (their header's), not this process's
        json.dump({"machine": summary["machine"], "dtype": summary.get("dtype"),
                   "summary": summary, "ratios": rs, "yardstick": yard, "batches": batch_rows}, f,
                  indent=1)
    print(text)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
