"""Markdown tables of a quality run (``dsbd bench configs/quality_cpu.yaml``) for ``docs/results/quality.md``,
finished or not.

    python -m benchmarks.quality_report runs/quality_cpu [--out runs/quality_cpu/report.md]

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
6. with ``--against OTHER`` (another run of the same problems and method settings, e.g. the
   float target's beside the int8 target's): each method setting of this run minus the same
   setting of the other on the same problems, task metrics only, with bootstrap 95% intervals
   (:func:`against`; log-likelihoods are each run's own target's, not comparable across two
   targets);
7. ``report.json`` with the same figures.

    python -m benchmarks.quality_report results/quality_cpu_int8_target \
        --against results/quality_cpu_int8
"""

from __future__ import annotations

import argparse
import json
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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


def _difference_cells(d) -> str:
    """``mean difference [95%] | P(a better) | prompts`` of one paired difference (points for
    a task metric, nats per token for a log-likelihood)."""
    scale, nd, unit = (1, 3, "") if d["figure"].endswith("loglik_per_token") else (100, 1, " pts")
    return (f"{scale * d['mean']:+.{nd}f}{unit} [{scale * d['lo']:+.{nd}f}, "
            f"{scale * d['hi']:+.{nd}f}] | {d['p_a_better']:.2f} | {d['n']}")


def difference_table(diffs, baselines=("beam W=4", "sample", "spec g=4", "beam W=1"),
                     first="DSBD setting", better="P(DSBD better)"):
    out = [f"| {first} | minus | figure | mean difference [95%] | {better} | prompts |",
           "|---|---|---|---|---|---|"]
    for d in diffs:
        if baselines is not None and d["baseline"] not in baselines:
            continue
        out.append(f"| {d['dsbd']} | {d['baseline']} | {d['figure']} | {_difference_cells(d)} |")
    return "\n".join(out)


def against_table(diffs) -> str:
    """:func:`against`'s differences, one row per method setting and figure."""
    out = ["| method setting | figure | this run minus the other [95%] | P(this run better) | "
           "prompts |", "|---|---|---|---|---|"]
    out += [f"| {d['dsbd']} | {d['figure']} | {_difference_cells(d)} |" for d in diffs]
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


def records_path(results: str) -> str:
    """A bench output folder's ``records.jsonl`` (a ``.jsonl`` path is taken as it is)."""
    return results if results.endswith(".jsonl") else os.path.join(results, "records.jsonl")


def against(records, other_records):
    """``(differences, only_here, only_there)``: each method setting (label) both runs hold,
    this run minus the other on the prompts both ran (paired by task and example), for every
    task metric and, where there are two or more, the pooled task metric
    (:func:`dsbd_jax.eval.summary.quality_differences`); the labels only one run holds. The
    log-likelihoods are left out: each run's are its own target's."""
    samples = {}
    for side, recs in (("this", records), ("other", other_records)):
        samples[side] = [dict(r, label=(side, r["label"]),
                              prompt_index=(r["task"], r["example_id"]))
                         for r in recs if r.get("type") == "sample"]
    labels = {side: {r["label"][1] for r in rs} for side, rs in samples.items()}
    both = sorted(labels["this"] & labels["other"])
    diffs = quality_differences(samples["this"] + samples["other"],
                                [(("this", lab), ("other", lab)) for lab in both])
    out = [dict(d, dsbd=d["dsbd"][1], baseline=d["baseline"][1]) for d in diffs
           if not d["figure"].endswith("loglik_per_token")]
    return (out, sorted(labels["this"] - labels["other"]),
            sorted(labels["other"] - labels["this"]))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="a bench output folder (or its records.jsonl)")
    ap.add_argument("--out", default=None, help="Markdown file (default: <folder>/report.md)")
    ap.add_argument("--against", default=None, metavar="OTHER",
                    help="another run of the same problems and settings (a folder or its "
                         "records.jsonl): this run minus it, per setting, task metrics")
    args = ap.parse_args()
    path = records_path(args.results)
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
    extra = {}
    if args.against:
        other = summary_of(records_path(args.against))
        diffs, here, there = against(records, read_records(records_path(args.against)))
        other_status = ("complete" if other["complete"] else
                        f"PARTIAL: {other['done']} of {other['total']} pairs")
        text += (f"\n\n### This run minus `{other['name']}` ({other_status}) on the same "
                 "problems, per method setting\n\nTask metrics only: the log-likelihoods "
                 "are each run's own target's.\n\n"
                 + against_table(diffs))
        for name, labs in (("this run", here), (f"`{other['name']}`", there)):
            if labs:
                text += f"\n\nOnly in {name}: " + ", ".join(labs) + "."
        extra["against"] = {"run": other["name"], "complete": other["complete"],
                            "differences": diffs, "only_here": here, "only_there": there}
    out = args.out or os.path.join(folder, "report.md")
    with open(out, "w") as f:
        f.write(text + "\n")
    with open(os.path.join(os.path.dirname(out), "report.json"), "w") as f:
        # the host and dtype of the records it reports on (their header's), not this process's
        json.dump({"machine": summary["machine"], "dtype": summary.get("dtype"),
                   "summary": summary, "ratios": rs, "yardstick": yard, "batches": batch_rows,
                   **extra}, f, indent=1)
    print(text)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
