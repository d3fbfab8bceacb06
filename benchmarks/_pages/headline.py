"""README.md's headline, CHANGELOG.md's speed table and the results index's hosts."""

from __future__ import annotations

import json  # noqa: F401
import re  # noqa: F401

from benchmarks._pages.common import (BEAM_W4_POINT, DEFAULT, MODEL_NAMES, Results,  # noqa: F401
                                      host_class, host_line, method_label, span, span_of,
                                      speed_row, table, x)


# (title, dtype, [(source, batch)]): a speed JSON gives batch 1, a draft_terms JSON its batches
HOSTS = {
    "amx": ("Intel Xeon with AMX", "bfloat16",
            [("results/speed_int8_draft_amx_xeon.json", 1),
             ("results/draft_terms_int8_batch4_amx_xeon.json", 4)]),
    "avx512bf16": ("AMD EPYC with AVX512-BF16", "bfloat16",
                   [("results/speed_int8_draft_avx512bf16_epyc.json", 1),
                    ("results/draft_terms_int8_avx512bf16_epyc.json", 4)]),
    "avx2": ("AMD EPYC with AVX2 only", "float32",
             [("results/speed_int8_draft_avx2_epyc.json", 1)]),
}


# what 0.3.0's changelog quoted, where a later run replaced a host's source in HOSTS
RELEASED_0_3_0 = {"avx2": [("results/draft_terms_int8_avx2_epyc.json", 1)]}


def headline_rows(r: Results, host: str, sources=None):
    """``[(decoder, batch, end to end, decode, loglik/tok or None, beam W=4's or None)]``."""
    out = []
    for source, batch in sources or HOSTS[host][2]:
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
        f"It does not yet pay at batch 4 ({span([row[2] for row in batch4])})"
        + (f" or on the AVX2-only host ({span([row[2] for row in avx2])}).\n"
           if max(row[2] for row in avx2) < 1 else
           f"; on the AVX2-only host it runs at {span([row[2] for row in avx2])}.\n"))


def changelog_speed(r: Results) -> str:
    """One row per host class: 0.3.0's speed in one table (as it quoted it: RELEASED_0_3_0)."""
    point, default = method_label(BEAM_W4_POINT), method_label(DEFAULT)
    rows = []
    for host, (title, dtype, _) in HOSTS.items():
        got = {(label, batch): e2e for label, batch, e2e, *_ in headline_rows(
            r, host, RELEASED_0_3_0.get(host))}
        rows.append([f"{title} ({dtype})",
                     x(got[(point, 1)]) if (point, 1) in got else "",
                     x(got[(default, 1)]) if (default, 1) in got else "",
                     x(got[(point, 4)]) if (point, 4) in got else ""])
    return table(["host class", "beam-W4 point", "default", "beam-W4 point, batch 4"], rows)


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


BLOCKS = {
    "headline-verdict": verdict,
    "changelog-speed": changelog_speed,
    "results-hosts": hosts,
    "headline-amx": lambda r: headline(r, "amx"),
    "headline-avx512bf16": lambda r: headline(r, "avx512bf16"),
    "headline-avx2": lambda r: headline(r, "avx2"),
}
