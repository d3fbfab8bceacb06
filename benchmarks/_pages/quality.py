"""docs/results/quality.md: a quality run's report (dsbd bench, benchmarks.quality_report)."""

from __future__ import annotations

import json  # noqa: F401
import re  # noqa: F401

from benchmarks._pages.common import (BEAM_W4_POINT, DEFAULT, MODEL_NAMES, Results,  # noqa: F401
                                      host_class, host_line, method_label, span, span_of,
                                      speed_row, table, x)


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


BLOCKS = {
    "quality-int8-draft": lambda r: quality_table(r, "results/quality_cpu_int8"),
    "quality-int8-draft-differences": lambda r: quality_differences(
        r, "results/quality_cpu_int8"),
    "quality-int8-target": lambda r: quality_table(r, "results/quality_cpu_int8_target"),
    "quality-int8-target-against": lambda r: quality_against(
        r, "results/quality_cpu_int8_target"),
}
