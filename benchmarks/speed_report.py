"""Markdown tables from the speed benchmarks' JSON (for ``docs/results/speed.md``).

    python benchmarks/speed_report.py [--forward results/forward.json]
        [--profile results/profile_float32_host.json] [--speed results/speed_float32_host.json]

Prints: the forward passes of both weight layouts against transformers; the phase profile of
every decoder (ms per iteration, tokens per iteration, overhead share); the end-to-end table
(ours and transformers) and the ratios of the speed issue's targets.
"""

from __future__ import annotations

import argparse
import json
import os
from collections import defaultdict

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PHASES = ("target forward", "draft forward", "warp", "log-softmax", "random", "verify", "width",
          "cache", "other")


def forward_table(d):
    shapes = list(d["per_layer"])
    out = ["| pass | stacked (ms) | per-layer (ms) | transformers (ms) | per-layer / transformers "
           "| per-layer / 1 token |", "|---|---|---|---|---|---|"]
    for s in shapes:
        tr = d.get("transformers", {}).get(s, {}).get("ms")
        pl = d["per_layer"][s]["ms"]
        out.append(f"| {s} | {d['stacked'][s]['ms']:.0f} | {pl:.0f} | "
                   f"{'-' if tr is None else f'{tr:.0f}'} | "
                   f"{'-' if tr is None else f'{pl / tr:.2f}'} | "
                   f"{pl / d['per_layer']['1 token']['ms']:.2f} |")
    comp = {k: max(v["compile_s"] for v in d[k].values()) for k in ("stacked", "per_layer")}
    out.append(f"\nCompile time of one forward (largest shape): stacked {comp['stacked']:.1f} s, "
               f"per-layer {comp['per_layer']:.1f} s.")
    return "\n".join(out)


def profile_table(d):
    runs = defaultdict(list)
    for r in d["runs"]:
        runs[r["name"]].append(r)
    cols = ["method", "tok/iter", "decode ms/iter", "bare fwd ms/iter", "overhead"] + list(PHASES)
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for name, rs in runs.items():
        its = sum(r["iterations"] for r in rs)
        tok = sum(r["generated_tokens"] for r in rs)
        dec = sum(r["decode_s"] for r in rs) * 1e3 / its
        bare = sum(r["bare_forward_ms_per_iteration"] * r["iterations"] for r in rs) / its
        ov = sum(r["overhead_frac"] * r["iterations"] for r in rs) / its
        ph = [sum(r["phases_s"][p] for r in rs) * 1e3 / its for p in PHASES]
        out.append(f"| {name} | {tok / its:.2f} | {dec:.0f} | {bare:.0f} | {100 * ov:.1f}% | "
                   + " | ".join(f"{x:.1f}" for x in ph) + " |")
    return "\n".join(out)


def speed_table(d):
    cols = ["impl", "method", "tok/s", "decode tok/s", "target calls/tok", "loglik/tok",
            "KV MB"]
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in d["rows"]:
        f = lambda k, fmt: "-" if r.get(k) is None else fmt.format(r[k])  # noqa: E731
        kv = "-" if r.get("kv_cache_bytes") is None else f"{r['kv_cache_bytes'] / 1e6:.1f}"
        out.append(f"| {r['impl']} | {r['method']} | {f('tokens_per_s', '{:.2f}')} | "
                   f"{f('decode_tokens_per_s', '{:.2f}')} | "
                   f"{f('target_calls_per_token', '{:.3f}')} | {f('loglik_per_token', '{:.4f}')} "
                   f"| {kv} |")
    out.append("")
    out += [f"- {k}: **{v:.2f}x**" for k, v in d["ratios"].items()]
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--forward", default=os.path.join(_ROOT, "results", "forward.json"))
    ap.add_argument("--profile", default=os.path.join(_ROOT, "results", "profile_float32_host.json"))
    ap.add_argument("--speed", default=os.path.join(_ROOT, "results", "speed_float32_host.json"))
    args = ap.parse_args(argv)
    for title, path, fn in (("Forward passes", args.forward, forward_table),
                            ("Phase profile (ms per iteration)", args.profile, profile_table),
                            ("End to end", args.speed, speed_table)):
        if os.path.exists(path):
            with open(path) as f:
                print(f"### {title}\n\n{fn(json.load(f))}\n")


if __name__ == "__main__":
    main()
