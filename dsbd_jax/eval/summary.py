"""Summaries of a benchmark run: :func:`summarize` (one row per method setting),
:func:`comparisons` (DSBD's speed-up over the baselines), :func:`quality_differences` (paired
differences on the same problems), :func:`summary_of` (all of it from a records file, finished or
not) and :func:`format_summary` (as text or Markdown). Intervals come from :mod:`.stats`.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from dsbd_jax.eval.records import read_records


def summary_of(records_path) -> Dict[str, Any]:
    """The summary of a records file, finished or not (``dsbd summary``): the rows of
    :func:`summarize`, :func:`comparisons`, :func:`quality_differences`, and how much of the
    run is done (``done`` / ``total`` (method, prompt) pairs, ``complete``)."""
    records = read_records(records_path)
    head = records[0] if records and records[0].get("type") == "run" else {}
    rows = summarize(records)
    done = sum(1 for r in records if r.get("type") == "sample")
    total = len(head.get("runs", [])) * head.get("num_prompts", 0) or done
    return {"name": head.get("name"), "machine": head.get("machine"), "dtype": head.get("dtype"),
            "energy": head.get("energy"),
            "batch_size": head.get("batch_size"), "complete": done >= total, "done": done,
            "total": total, "sessions": 1 + sum(r.get("type") == "resume" for r in records),
            "rows": rows, "comparisons": comparisons(rows),
            "quality_differences": quality_differences(records)}


def summarize(records: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """One row per method setting (in first-seen order) from ``type: "sample"`` lines.

    Speeds: tokens/s = all new tokens / all timed seconds (each prompt holds its share of its
    batch's wall time, so this is the throughput at the batch size used, ``batch_size``);
    ``decode_tokens_per_s`` leaves out the prompt passes (``prefill_s``, timed alone).
    ``target_calls_per_token``: target passes each prompt took part in / its tokens, summed
    (comparable across batch sizes); ``batch_target_calls_per_token``: the batch's passes.
    Quality: mean over prompts of log-likelihood per token with a bootstrap 95% interval
    (``loglik_interval``; per task in ``loglik_by_task``), and each task's metric
    (``task_metrics``: the mean; ``task_intervals``: Wilson 95% intervals, see :mod:`.stats`).
    Energy = joules / token where every line has a reading (else ``None``)."""
    from dsbd_jax.eval.stats import bootstrap_interval, wilson_interval
    groups: Dict[str, List[Dict[str, Any]]] = {}
    for r in records:
        if r.get("type") == "sample":
            groups.setdefault(r["label"], []).append(r)
    rows = []
    for lab, rs in groups.items():
        tok = sum(r["new_tokens"] for r in rs)
        sec = sum(r["seconds"] for r in rs)
        lls = [r["loglik_per_token"] for r in rs if r["loglik_per_token"] is not None]
        ll = float(np.mean(lls)) if lls else None
        pre = [r.get("prefill_s") for r in rs]
        decode_s = sec - sum(pre) if all(p is not None for p in pre) else None
        batches = {}  # one record per batch: its target_calls / draft_calls are the batch's
        for n, r in enumerate(rs):  # records without a batch (older files) are batches of one
            batches.setdefault(r.get("batch", f"line{n}"), r)
        row = {"label": lab, "method": rs[0]["method"], "setting": rs[0]["setting"],
               "prompts": len(rs), "new_tokens": tok, "seconds": sec,
               "batch_size": max(r.get("batch_size", 1) for r in rs),
               "tokens_per_s": tok / sec if sec > 0 else None,
               "decode_tokens_per_s": tok / decode_s if decode_s and decode_s > 0 else None,
               "mean_new_tokens": tok / len(rs),
               "target_calls_per_token": sum(r.get("row_target_calls", r["target_calls"])
                                             for r in rs) / max(tok, 1),
               "batch_target_calls_per_token": sum(b["target_calls"] for b in batches.values())
               / max(tok, 1),
               "draft_calls_per_token": sum(b["draft_calls"] for b in batches.values())
               / max(tok, 1),
               "loglik_per_token": ll,
               "loglik_interval": bootstrap_interval(lls),
               "perplexity": None if ll is None else math.exp(min(-ll, 700.0)),
               "compile_s": sum(r.get("compile_s", 0.0) for r in rs),
               "kv_cache_bytes": max(r["kv_cache_bytes"] for r in rs)}
        for k in ("mean_accepted_width", "mean_layers_per_iteration"):
            vals = [r[k] for r in rs if r.get(k) is not None]
            row[k] = float(np.mean(vals)) if vals else None
        profs = [r["profile"]["overhead_frac"] for r in rs if r.get("profile")]
        row["overhead_frac"] = float(np.mean(profs)) if profs else None
        peaks = [r["peak_device_bytes"] for r in rs if r.get("peak_device_bytes") is not None]
        row["peak_device_bytes"] = max(peaks) if peaks else None
        joules = [r.get("energy_j") for r in rs]
        row["joules_per_token"] = (sum(joules) / max(tok, 1)
                                   if all(j is not None for j in joules) else None)
        tasks, by_task = {}, {}
        for r in rs:
            if r.get("score") is not None:
                tasks.setdefault(f"{r['task']}/{r['metric']}", []).append(r["score"])
            if r["loglik_per_token"] is not None:
                by_task.setdefault(r["task"], []).append(r["loglik_per_token"])
        row["task_metrics"] = {k: float(np.mean(v)) for k, v in tasks.items()}
        row["task_intervals"] = {k: wilson_interval(sum(v), len(v)) for k, v in tasks.items()}
        row["loglik_by_task"] = {k: bootstrap_interval(v) for k, v in by_task.items()}
        rows.append(row)
    return rows


def quality_differences(records: Iterable[Dict[str, Any]],
                        pairs: Optional[Sequence[Tuple[str, str]]] = None) -> List[Dict[str, Any]]:
    """Paired differences on the prompts both settings ran: by default each DSBD setting against
    each other (non-DSBD) method setting; ``pairs`` names other ``(a, b)`` label pairs (``a``
    minus ``b``; both keys of the result keep the names ``dsbd`` and ``baseline``). For every
    task metric and the log-likelihood per token per task: the mean difference with a bootstrap
    95% interval over prompts (:func:`.stats.paired_difference`). Where the records hold two or
    more task metrics, ``pooled/task_metric`` pairs them over all their prompts together (each
    score is 0 or 1 for pass@1 and exact match), which narrows the interval. An interval above 0
    says ``a`` is better on these problems; one containing 0 says the run cannot tell them
    apart."""
    from dsbd_jax.eval.stats import paired_difference
    per: Dict[str, Dict[str, Dict[Any, float]]] = {}
    method_of = {}
    metrics = set()
    for r in records:
        if r.get("type") != "sample":
            continue
        key = r.get("prompt_index", (r["task"], r["example_id"]))
        figs = per.setdefault(r["label"], {})
        method_of[r["label"]] = r["method"]
        if r.get("score") is not None:
            metrics.add(f"{r['task']}/{r['metric']}")
            figs.setdefault(f"{r['task']}/{r['metric']}", {})[key] = r["score"]
        if r["loglik_per_token"] is not None:
            figs.setdefault(f"{r['task']}/loglik_per_token", {})[key] = r["loglik_per_token"]
    if len(metrics) >= 2:  # one metric alone: the pooled row would repeat that task's row
        for figs in per.values():
            figs["pooled/task_metric"] = {(m, k): v for m in sorted(metrics) if m in figs
                                          for k, v in figs[m].items()}
    if pairs is None:
        pairs = [(a, b) for a in per if method_of[a] == "dsbd"
                 for b in per if b != a and method_of[b] != "dsbd"]
    out = []
    for a, b in pairs:
        if a not in per or b not in per:
            raise ValueError(f"quality_differences: no records for {a if a not in per else b!r} "
                             f"(labels: {sorted(per)})")
        fa, fb = per[a], per[b]
        for fig in sorted(set(fa) & set(fb)):
            d = paired_difference(fa[fig], fb[fig])
            if d["n"]:
                out.append({"dsbd": a, "baseline": b, "figure": fig, **d})
    return out


def comparisons(rows: Sequence[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """DSBD against the baselines, from ``summarize`` rows:

    * each multi-beam DSBD setting vs the beam-sampling setting of the highest quality it matches
      or beats (log-likelihood per token): ``speedup`` = DSBD tokens/s / beam tokens/s; if it
      beats none, vs the lowest-quality beam setting, flagged ``quality_matched: False``;
    * each single-beam DSBD setting vs every speculative-sampling setting.
    """
    rows = [r for r in rows if r["tokens_per_s"] and r["loglik_per_token"] is not None]
    beams = [r for r in rows if r["method"] == "beam"]
    specs = [r for r in rows if r["method"] == "spec"]
    out = []
    for r in rows:
        if r["method"] != "dsbd":
            continue
        if r["setting"].get("single_beam"):
            for s in specs:
                out.append({"dsbd": r["label"], "baseline": s["label"], "kind": "single-beam vs spec",
                            "speedup": r["tokens_per_s"] / s["tokens_per_s"],
                            "dsbd_loglik_per_token": r["loglik_per_token"],
                            "baseline_loglik_per_token": s["loglik_per_token"]})
            continue
        if not beams:
            continue
        matched = [b for b in beams if r["loglik_per_token"] >= b["loglik_per_token"]]
        b = max(matched, key=lambda b: b["loglik_per_token"]) if matched else \
            min(beams, key=lambda b: b["loglik_per_token"])
        out.append({"dsbd": r["label"], "baseline": b["label"], "kind": "vs beam sampling",
                    "quality_matched": bool(matched),
                    "speedup": r["tokens_per_s"] / b["tokens_per_s"],
                    "dsbd_loglik_per_token": r["loglik_per_token"],
                    "baseline_loglik_per_token": b["loglik_per_token"]})
    return out


def format_summary(summary: Dict[str, Any], markdown: bool = False) -> str:
    """The summary table and the comparisons as plain text (``markdown=True``: a Markdown table
    and a bullet list, as pasted into docs/results/quality.md)."""
    def fmt(v, nd=3):
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.{nd}f}" if abs(v) < 1e4 else f"{v:.3g}"
        return str(v)
    cols = [("label", "method"), ("tokens_per_s", "tok/s"), ("decode_tokens_per_s", "decode tok/s"),
            ("target_calls_per_token", "tgt calls/tok"),
            ("mean_accepted_width", "acc. width"), ("mean_layers_per_iteration", "layers/iter"),
            ("loglik_per_token", "loglik/tok"), ("joules_per_token", "J/tok"),
            ("kv_cache_bytes", "KV MB"), ("compile_s", "compile s")]
    if not summary["rows"]:
        return "no results"
    metric_keys = sorted({k for r in summary["rows"] for k in r["task_metrics"]})
    header = [c[1] for c in cols] + metric_keys
    lines = []
    for r in summary["rows"]:
        cells = []
        for k, _ in cols:
            v = r.get(k)
            cells.append(fmt(v / 1e6, 1) if k == "kv_cache_bytes" and v is not None
                         else fmt(v, 4 if k == "loglik_per_token" else 3))
        for k in metric_keys:
            iv = r.get("task_intervals", {}).get(k)
            cells.append(fmt(r["task_metrics"].get(k)) if not iv else
                         f"{iv['mean']:.3f} [{iv['lo']:.2f}, {iv['hi']:.2f}] n={iv['n']}")
        lines.append(cells)
    if markdown:
        text = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        text += ["| " + " | ".join(cells) + " |" for cells in lines]
        bullet = "- "
    else:
        widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(header)]
        text = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
        text += ["  ".join(c.ljust(w) for c, w in zip(cells, widths)) for cells in lines]
        bullet = ""
    if summary.get("energy", {}).get("source") is None:
        text.append(f"{bullet}energy: unavailable ({summary.get('energy', {}).get('reason')})")
    if summary.get("batch_size"):
        text.append(f"{bullet}batch size {summary['batch_size']}; task metrics with Wilson 95% "
                    "intervals" + ("" if summary.get("complete", True) else
                                   f"; PARTIAL run: {summary['done']}/{summary['total']} done"))
    for c in summary.get("comparisons", []):
        note = "" if c.get("quality_matched", True) else " (quality NOT matched)"
        text.append(f"{bullet}{c['dsbd']} vs {c['baseline']}: {c['speedup']:.2f}x{note} "
                    f"(loglik/tok {c['dsbd_loglik_per_token']:.4f} vs "
                    f"{c['baseline_loglik_per_token']:.4f})")
    return "\n".join(text)
