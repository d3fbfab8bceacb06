"""What every page's tables share: reading results/*.json, the decoders' labels, Markdown
tables."""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

# the decoder settings of the speed grid, in the words the pages use
DEFAULT = "dsbd_g3_WS3_t0.9_Wmin1"          # the command line's default
BEAM_W4_POINT = "dsbd_g2_WS4_t0.7_Wmin2"    # the setting that keeps beam sampling W=4's loglik


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


def span(values) -> str:
    lo, hi = min(values), max(values)
    return x(lo) if f"{lo:.2f}" == f"{hi:.2f}" else f"{lo:.2f}-{hi:.2f}x"


def span_of(values, fmt: str = ".1f") -> str:
    lo, hi = format(min(values), fmt), format(max(values), fmt)
    return lo if lo == hi else f"{lo}-{hi}"


MODEL_NAMES = {"qwen2.5-coder-1.5b-instruct": "1.5B target", "qwen2.5-coder-0.5b-instruct": "0.5B draft"}


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
