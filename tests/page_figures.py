"""The measured figures the documentation prints, each with the committed JSON it comes from.

Read by ``tests/test_page_figures.py``. An entry of :data:`FIGURES` is ``(page, json, text,
at)``: ``text`` is a passage of the page as printed, with each figure written as a placeholder
``{getter:format}``; the test reads the figure from the JSON, formats it, puts it in its place
and asserts that the page holds the passage (whitespace and line breaks count as one space).

- ``getter``: a key path into the JSON, ``.``-separated (a key may hold dots or spaces: at each
  level the longest key that fits is taken; a list takes an index), prefixed by ``at``; or an
  expression after ``=`` over ``v(path)`` (the same paths), ``w(json, path)`` (another results
  file), ``span(values)`` (their lowest and highest, printed ``lo-hi``) and the helpers of
  :data:`HELPERS`.
- ``format``: a Python format spec (``.2f``, ``d``, ``,d``; ``+.3f`` for a signed difference);
  what surrounds the figure on the page (``x``, `` %``, `` ms``) stays in ``text``.

:data:`ALLOWED` names the figures the completeness check of the test finds that are not
measurements of the current code (the paper's figures, settings, size ratios), each with why.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

SPEED = "results/speed_float32_host.json"
DTYPES = "results/speed_dtypes_host.json"
TERMS = "results/draft_terms_head.json"
TERMS2 = "results/draft_terms_head_rollouts.json"
TERMS_EPYC = "results/draft_terms_head_epyc.json"   # the AMD EPYC host, bfloat16
TERMS_MORE = "results/draft_terms_head_more_text_epyc.json"   # the more_text head, same host
PROFILE = "results/profile_float32_host.json"
PROFILE_EPYC = "results/profile_bfloat16_epyc.json"   # the AMD EPYC host, bfloat16
GATHER_EPYC = "results/embed_gather_epyc.json"
FOREST_EPYC = "results/forest_budget_epyc.json"   # the node budget on the AMD EPYC host
FOREST_EPYC_NR = "results/forest_budget_epyc_no_replacement.json"
FOREST_EPYC_DM = "results/forest_budget_epyc_draft_model.json"   # the 0.5B draft model
PROFILE_EPYC_BEFORE = "results/profile_bfloat16_epyc_before_embed_rows.json"
DTYPE_RUNS = "results/dtype_runs.json"
DTYPE_RUNS_EPYC = "results/dtype_runs_epyc.json"   # the AMD EPYC host with AVX512-BF16
DTYPES_EPYC = "results/speed_dtypes_epyc.json"
FLOOR_EPYC = "results/pass_floor_epyc.json"
ATTENTION_EPYC = "results/attention_form_epyc.json"
ATTENTION_AMX = "results/attention_parts_amx_xeon.json"  # the attention in the cache's dtype
FLOOR_EPYC_SOFTMAX = "results/pass_floor_epyc_softmax_attention.json"  # the former attention
ACCEPT = "results/head_acceptance.json"
TRAINING = "results/head_qwen_training.json"
TRAINING_EPYC = "results/head_qwen_training_epyc.json"
HELDOUT = "results/head_heldout.json"
ABLATION = "results/head_ablation.json"
ABLATION2 = "results/head_ablation_data_layers.json"   # 120 steps: the data size, fused layers
ABLATION3 = "results/head_ablation_more.json"   # 600 steps: longer training, more texts
CLI = "results/cli_latency.json"
HEAD_DATA = "results/head_data_speed.json"
H100 = "results/gpu/NVIDIA_H100_80GB_HBM3_qwen_per_layer.json"
H100_HEAD = "results/gpu/NVIDIA_H100_80GB_HBM3_qwen_head.json"
H100_DSBD = "results/gpu/NVIDIA_H100_80GB_HBM3_qwen_head_dsbd.json"
GPU_RUNS = (H100, H100_HEAD, H100_DSBD)
H200 = "results/gpu/NVIDIA_H200.json"                   # with XLA's dump: the kernel counts' run
H200_REPEAT = "results/gpu/NVIDIA_H200_repeat.json"     # default flags, the run before
H200_CMDBUF = "results/gpu/NVIDIA_H200_cmdbuf_while.json"   # loops in command buffers
H200_KERNELS = "results/gpu/NVIDIA_H200_kernels.json"
H200_RUNS = (H200, H200_REPEAT, H200_CMDBUF)
INT8P = "results/int8_products_avx2_epyc.json"   # the AMD EPYC host with AVX2 only
TERMS_INT8 = "results/draft_terms_int8_avx2_epyc.json"   # the int8 draft, same host
INT8P_VNNI = "results/int8_products_avx512bf16_epyc.json"   # the AMD EPYC host with VNNI
TERMS_INT8_VNNI = "results/draft_terms_int8_avx512bf16_epyc.json"   # the int8 drafts there

README = "README.md"
SPEED_MD = "docs/results/speed.md"
DRAFT_MD = "docs/results/draft.md"
PRECISION_MD = "docs/results/precision.md"
ACCEL_MD = "docs/results/accelerators.md"
MEMORY_MD = "docs/results/memory.md"
INDEX_MD = "docs/results/index.md"
CLI_MD = "docs/cli.md"
DRAFT_TOOLS_MD = "docs/draft_tools.md"

# --- reading the JSON -----------------------------------------------------------------------


@lru_cache(maxsize=None)
def load(rel: str):
    return json.loads((ROOT / rel).read_text())


def resolve(doc, path: str):
    """The value at a ``.``-separated key path (the longest key that fits at each level)."""
    node, rest = doc, path
    while rest:
        if isinstance(node, list):
            head, _, rest = rest.partition(".")
            node = node[int(head)]
            continue
        if not isinstance(node, dict):
            raise KeyError(f"{path!r}: {rest!r} below a {type(node).__name__}")
        fits = [k for k in node if rest == k or rest.startswith(k + ".")]
        if not fits:
            raise KeyError(f"{path!r}: no key for {rest!r} (keys: {sorted(node)[:12]})")
        key = max(fits, key=len)
        node, rest = node[key], rest[len(key) + 1:]
    return node


def span(values):
    values = list(values)
    return (min(values), max(values))


def probe(model: str, rel: str = DTYPE_RUNS):
    """``dsbd host``'s passes in each run of ``rel`` (``results/dtype_runs.json``) for ``model``:
    per run ``{dtype: (one token ms, 12-node forest ms)}``, read from the choice's ``why``."""
    out = []
    for run in load(rel)["runs"]:
        why = run["choices"][model]["why"]
        out.append({d: (float(a), float(b))
                    for d, a, b in re.findall(r"(float32|bfloat16) ([\d.]+) / ([\d.]+) ms", why)})
    return out


def forest12(rel: str) -> float:
    """A 12-node forest pass of the target over its one-token pass, 512 slots (a GPU run)."""
    f = load(rel)["runs"][0]["forward"]
    return f["target forest 12 @512"]["ms"] / f["target 1 token @512"]["ms"]


TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"


def faster(model: str, both: bool, rel: str = DTYPE_RUNS):
    """How much less time bfloat16 takes than float32 in each run of ``rel`` (%): the forest
    pass alone, or the two passes together."""
    out = []
    for r in probe(model, rel):
        (f1, f12), (b1, b12) = r["float32"], r["bfloat16"]
        out.append(100 * (1 - ((b1 + b12) / (f1 + f12) if both else b12 / f12)))
    return out


def floor_ratios(model: str, dtype: str, key: str = "pass_over_floor", rel: str = FLOOR_EPYC):
    """``key`` (``pass_over_floor``, ``no_attention_over_floor``) of every row count of
    ``benchmarks/pass_floor.py``'s run ``rel`` for ``model`` (``target`` / ``draft``) in
    ``dtype``, in the host's kernel form."""
    (entry,) = load(rel)["results"][model][dtype].values()
    return [r[key] for r in entry["rows"].values()]


def floor_row(model: str, dtype: str, n: int, key: str, rel: str = FLOOR_EPYC):
    """``key`` of ``n`` new tokens in that run, whatever the host's kernel form."""
    (entry,) = load(rel)["results"][model][dtype].values()
    return entry["rows"][str(n)][key]


def heldout_gap(a: str, b: str) -> float:
    """The largest difference of held-out acceptance (either draft token, any logged step)
    between two runs ``a`` and ``b`` of a head recipe (``benchmarks/head_training.py``)."""
    la, lb = load(a)["log"], load(b)["log"]
    assert [r["step"] for r in la] == [r["step"] for r in lb]
    return max(abs(x[f"heldout_acceptance_{k}"] - y[f"heldout_acceptance_{k}"])
               for x, y in zip(la, lb) for k in (1, 2))


def _recipe120(key: str) -> float:
    """The recipe's row of the 120-step ablation (what the 600-step variants are read against)."""
    return load(ABLATION2)["variants"]["recipe"][key]


def floor_gap(a: str, b: str) -> float:
    """The largest difference of ``pass_over_floor`` between two runs of
    ``benchmarks/pass_floor.py`` (every model, dtype and row count of both)."""
    return max(abs(x - y) for m in ("target", "draft") for dt in ("float32", "bfloat16")
               for x, y in zip(floor_ratios(m, dt, rel=a), floor_ratios(m, dt, rel=b)))


def probe_gap(rel: str) -> float:
    """The largest relative gap, over dtypes and forest sizes, between the probe's ratio to a
    token and the whole pass's in ``benchmarks/forest_budget.py``'s run ``rel``."""
    d = load(rel)
    return max(abs(c["over_one_token"][n] / d["probe"][dt]["over_one_token"][n] - 1)
               for dt, c in d["curve"].items() for n in c["over_one_token"])


HELPERS = {"span": span, "probe_gap": probe_gap, "heldout_gap": heldout_gap,
           "_recipe120": _recipe120,
           "TRAINING": TRAINING, "TRAINING_EPYC": TRAINING_EPYC, "FOREST_EPYC": FOREST_EPYC, "probe": probe, "forest12": forest12, "faster": faster, "min": min,
           "max": max, "abs": abs, "round": round, "sum": sum, "len": len, "GPU_RUNS": GPU_RUNS,
           "H200_RUNS": H200_RUNS, "H200_KERNELS": H200_KERNELS,
           "TARGET": TARGET, "DRAFT": DRAFT, "DTYPE_RUNS_EPYC": DTYPE_RUNS_EPYC,
           "floor_ratios": floor_ratios, "floor_row": floor_row, "floor_gap": floor_gap,
           "FLOOR_EPYC": FLOOR_EPYC,
           "FLOOR_EPYC_SOFTMAX": FLOOR_EPYC_SOFTMAX}

# --- the registry ---------------------------------------------------------------------------

FIGURES: list = []


def add(page: str, source: str, *texts: str, at: str = "") -> None:
    for text in texts:
        FIGURES.append((page, source, text, at))


_HEADLINE = [  # ours against transformers and against each other (speed_float32_host.json)
    "| our sampling / transformers' sampling | {ratios.tokens_per_s: sample: dsbd_jax / "
    "transformers:.2f}x | {ratios.decode_tokens_per_s: sample: dsbd_jax / transformers:.2f}x |",
    "| our beam sampling W=4 / transformers' W=4 | {ratios.tokens_per_s: beam_sample_W4: dsbd_jax"
    " / transformers:.2f}x | {ratios.decode_tokens_per_s: beam_sample_W4: dsbd_jax / "
    "transformers:.2f}x |",
    "| DSBD (g2, W_S 4, t 0.7, W_min 2) / our beam sampling W=4 | {ratios.tokens_per_s: "
    "dsbd_g2_WS4_t0.7_Wmin2 / beam_sample_W4 (ours):.2f}x | {ratios.decode_tokens_per_s: "
    "dsbd_g2_WS4_t0.7_Wmin2 / beam_sample_W4 (ours):.2f}x |",
    "| the same DSBD / transformers' beam sampling W=4 | {ratios.tokens_per_s: "
    "dsbd_g2_WS4_t0.7_Wmin2 / beam_sample_W4 (transformers):.2f}x | {ratios.decode_tokens_per_s: "
    "dsbd_g2_WS4_t0.7_Wmin2 / beam_sample_W4 (transformers):.2f}x |",
    "| speculative sampling (gamma 4) / our sampling | {ratios.tokens_per_s: speculative_g4 / "
    "sample:.2f}x | {ratios.decode_tokens_per_s: speculative_g4 / sample:.2f}x |",
]

# README.md ------------------------------------------------------------------------------------
add(README, SPEED, *_HEADLINE,
    "--out results/speed_float32_host.json`, {=v('wall_s') / 60:.0f} minutes; host: Intel",
    "DSBD verified {rows.3.tokens_per_target_call:.2f} tokens per target pass there, "
    "speculative sampling {rows.2.tokens_per_target_call:.2f}.")
# the draft head paragraph
add(README, TERMS2,
    "Its pass costs {batches.b1.draft_pass_vs_target.head:.3f}x the target's one-token pass",
    "{batches.b1.drafts.head.dsbd_beamW4_point.tokens_per_iteration:.2f} tokens per DSBD "
    "iteration at the beam-W4 point, {batches.b1.drafts.head.targets.dsbd_w4_vs_beam_w4."
    "dsbd_beamW4_point.end_to_end:.2f}x beam sampling W=4 end to end")
add(README, TRAINING, "trained for {=v('wall_s') / 60:.0f} minutes on this CPU")
add(README, TRAINING_EPYC, "the same recipe gives the same head in {=v('wall_s') / 60:.0f} "
    "minutes")
add(README, TERMS_EPYC,
    "costs {batches.b1.draft_pass_vs_target.head:.3f}x the target's there, and DSBD with it runs "
    "at {batches.b1.drafts.head.targets.dsbd_w4_vs_beam_w4.dsbd_beamW4_point.end_to_end:.2f}x "
    "beam sampling W=4 at batch 1 and {batches.b4.drafts.head.targets.dsbd_w4_vs_beam_w4."
    "dsbd_beamW4_point.end_to_end:.2f}x at batch 4 ({batches.b1.drafts.base.targets."
    "dsbd_w4_vs_beam_w4.dsbd_beamW4_point.end_to_end:.2f}x and {batches.b4.drafts.base.targets."
    "dsbd_w4_vs_beam_w4.dsbd_beamW4_point.end_to_end:.2f}x with the")
add(README, ACCEPT, "it is accepted at {summary.head.continuation:.3f} on the target's "
    "continuations of benchmark prompts (the 0.5B draft: {summary.draft.continuation:.3f};")
add(README, H100_DSBD,
    "a 12-node forest costs {=span(forest12(f) for f in GPU_RUNS):.2f}x a one-token pass of the "
    "target",
    "DSBD's iteration takes {dsbd_g2_WS4_t0.7_Wmin2_head.ms_per_iteration:.2f} ms against beam "
    "sampling W=4's {beam_sample_W4.ms_per_iteration:.2f} ms, "
    "{=100 * v('dsbd_g2_WS4_t0.7_Wmin2_head.overhead_share'):.0f} % of it outside the forward "
    "passes", at="runs.0.decoders.1")

# docs/results/index.md -----------------------------------------------------------------------
add(INDEX_MD, SPEED, "| Intel Xeon | \"Intel(R) Xeon(R) Processor\" (the `machine` block of each "
    "JSON, with its CPU flags) | {machine.cpu_count:d} |")
add(INDEX_MD, DTYPE_RUNS,
    "forest) {=span(faster(TARGET, True) + faster(DRAFT, True)):.0f} % faster than float32 "
    "(`results/dtype_runs.json`)")
add(INDEX_MD, H100, "| H100 | one NVIDIA H100 80GB HBM3 ({machine.cpu_count:d} host cores)")
add(INDEX_MD, H200, "| H200 | one NVIDIA H200 ({machine.cpu_count:d} host cores)")

# docs/results/speed.md -----------------------------------------------------------------------
add(SPEED_MD, SPEED, *_HEADLINE,
    "| single-beam DSBD (g3, W_S 2, t 0.9, W_min 1) / our speculative sampling | "
    "{ratios.tokens_per_s: dsbd_g3_WS2_t0.9_Wmin1_single / speculative_g4 (ours):.2f}x | "
    "{ratios.decode_tokens_per_s: dsbd_g3_WS2_t0.9_Wmin1_single / speculative_g4 (ours):.2f}x |",
    "--out results/speed_float32_host.json   # {=v('wall_s') / 60:.0f} min",
    "({prompt_lengths.0:d}, {prompt_lengths.1:d}, {prompt_lengths.2:d} and "
    "{prompt_lengths.3:d} tokens, one 256-token bucket)",
    "(target {rows.0.prefill_s_per_prompt:.2f} s, draft {=v('rows.2.prefill_s_per_prompt') - "
    "v('rows.0.prefill_s_per_prompt'):.2f} s per prompt)",
    "({rows.3.target_calls_per_token:.2f} vs {rows.1.target_calls_per_token:.2f} per token in "
    "`results/speed_float32_host.json`)",
    "({rows.4.tokens_per_target_call:.2f} vs {rows.2.tokens_per_target_call:.2f} in "
    "`results/speed_float32_host.json`)")
for i, (impl, method) in enumerate([("dsbd_jax", "sample"), ("dsbd_jax", "beam_sample_W4"),
                                    ("dsbd_jax", "speculative_g4"),
                                    ("dsbd_jax", "dsbd_g2_WS4_t0.7_Wmin2"),
                                    ("dsbd_jax", "dsbd_g3_WS2_t0.9_Wmin1_single")]):
    add(SPEED_MD, SPEED, f"| {impl} | {method} | {{tokens_per_s:.2f}} | {{decode_tokens_per_s:.2f}}"
        " | {target_calls_per_token:.3f} | {loglik_per_token:.4f} | {=v('kv_cache_bytes') / 1e6:.1f}"
        " |", at=f"rows.{i}")
for i, method in [(5, "sample"), (6, "beam_sample_W4")]:
    add(SPEED_MD, SPEED, f"| transformers | {method} | {{tokens_per_s:.2f}} | "
        "{decode_tokens_per_s:.2f} | - | - | - |", at=f"rows.{i}")
add(SPEED_MD, TERMS,
    "gamma 4, batch 1): {batches.b1.drafts.base.targets.dsbd_w4_vs_beam_w4.dsbd_beamW4_point."
    "end_to_end:.2f}x beam sampling W=4 end to end; speculative sampling "
    "{batches.b1.drafts.base.targets.speculative_vs_sample.speculative_g4.end_to_end:.2f}x our "
    "sampling")
add(SPEED_MD, TERMS,
    "a speculative g4 iteration spends {draft_passes_ms:.0f} ms in draft passes and "
    "{target_passes_ms:.0f} ms in the target pass",
    "a 4-row step costs {=v('/batches.b1.references.beam_sample_W4.target_passes_ms'):.0f} ms "
    "against a 1-row step's {=v('/batches.b1.references.sample.target_passes_ms'):.0f}",
    at="batches.b1.drafts.base.speculative_g4")
_PROFILE_ROWS = [
    ("beam sampling W=4", "| {tokens_per_iteration:.2f} | {per_iteration_ms.target forward:.1f} | "
     "| {per_iteration_ms.warp:.1f} | | | {per_iteration_ms.cache:.1f} | "
     "{per_iteration_ms.other:.1f} | {=100 * v('overhead_frac'):.1f} % |"),
    ("speculative, gamma 4", "| {tokens_per_iteration:.2f} | {per_iteration_ms.target forward:.1f}"
     " | {per_iteration_ms.draft forward:.1f} | {per_iteration_ms.warp:.1f} | "
     "{per_iteration_ms.verify:.1f} | | {per_iteration_ms.cache:.1f} | "
     "{per_iteration_ms.other:.1f} | {=100 * v('overhead_frac'):.1f} % |"),
    ("DSBD g2 / W_S 4 / t 0.7 / W_min 2", "| {tokens_per_iteration:.2f} | "
     "{per_iteration_ms.target forward:.1f} | {per_iteration_ms.draft forward:.1f} | "
     "{per_iteration_ms.warp:.1f} | {per_iteration_ms.verify:.1f} | {per_iteration_ms.width:.1f} |"
     " {per_iteration_ms.cache:.1f} | {per_iteration_ms.other:.1f} | "
     "{=100 * v('overhead_frac'):.1f} % |"),
]
for i, (label, cells) in enumerate(_PROFILE_ROWS):
    add(SPEED_MD, PROFILE, f"| {label} " + cells, at=f"runs.{i}")
def _two(key: str, first: int, pct: bool = False, fmt: str = ".2f") -> str:
    """A placeholder for ``key``'s lowest and highest over the profile's runs ``first`` and
    ``first + 1`` (one decoder's two prompts), as a percentage with ``pct``."""
    s = "100 * " if pct else ""
    return (f"{{=span([{s}v('runs.{first}.{key}'), {s}v('runs.{first + 1}.{key}')])"
            f":{'.1f' if pct else fmt}}}")


for first, label, one in [(0, "sampling", True), (2, "beam sampling W=4", True),
                          (4, "speculative, gamma 4", False),
                          (8, "tree speculative, gamma 3, 2 children per level", False),
                          (6, "DSBD g2 / W_S 4 / t 0.7 / W_min 2", False)]:
    tokens = (f"{{runs.{first}.tokens_per_iteration:.2f}}" if one
              else _two("tokens_per_iteration", first))
    add(SPEED_MD, PROFILE_EPYC, f"| {label} | {tokens} | "
        f"{_two('decode_per_iteration_ms', first, fmt='.0f')} | "
        f"{_two('overhead_frac', first, pct=True)} % |")
add(SPEED_MD, PROFILE_EPYC_BEFORE,
    f"The drafted decoders spent {_two('overhead_frac', 4, pct=True)} % (speculative), "
    f"{_two('overhead_frac', 8, pct=True)} % (tree) and {_two('overhead_frac', 6, pct=True)} % "
    "(DSBD) of their iteration outside the passes",
    f"DSBD {_two('decode_per_iteration_ms', 6, fmt='.0f')} ms per iteration")
add(SPEED_MD, H100_DSBD,
    "on one H100 the same DSBD spends {=100 * v('dsbd_g2_WS4_t0.7_Wmin2.overhead_share'):.0f} % of "
    "its iteration outside them, {=100 * v('dsbd_g2_WS4_t0.7_Wmin2_head.overhead_share'):.0f} % "
    "with a draft head", at="runs.0.decoders.1")

# docs/results/memory.md ----------------------------------------------------------------------
for i, label in enumerate(["sampling", "beam sampling W=4", "speculative g4",
                           "DSBD g2 / W_S 4 / t 0.7 / W_min 2",
                           "single-beam DSBD g3 / W_S 2 / t 0.9 / W_min 1"]):
    add(MEMORY_MD, SPEED, f"| {label} | {{=v('kv_cache_bytes') / 1e6:.1f}} MB |", at=f"rows.{i}")

INT8_DISTANCE = "results/int8_distance_amx_xeon.json"
INT8_DISTANCE_EPYC = "results/int8_distance_avx512bf16_epyc.json"   # before the 16-bit embedding
for _role, _label in (("target", "1.5B target"), ("draft", "0.5B draft")):
    add(PRECISION_MD, INT8_DISTANCE,
        f"| {_label} | {{positions:,d}} ({{row.kl_float_int8.texts:d}}) | "
        "{row.kl_float_int8.mean:.4f} [{row.kl_float_int8.ci95.0:.4f}, "
        "{row.kl_float_int8.ci95.1:.4f}] | {row.top1_agree.mean:.3f} [{row.top1_agree.ci95.0:.3f}, "
        "{row.top1_agree.ci95.1:.3f}] | {row.loglik_loss.mean:.4f} [{row.loglik_loss.ci95.0:.4f}, "
        "{row.loglik_loss.ci95.1:.4f}] |", at=f"models.{_role}")
add(PRECISION_MD, INT8_DISTANCE,
    "is {row.acceptance_int8_draft.mean:.3f} [{row.acceptance_int8_draft.ci95.0:.3f}, "
    "{row.acceptance_int8_draft.ci95.1:.3f}] for the int8 draft against "
    "{acceptance_float_draft.mean:.3f} [{acceptance_float_draft.ci95.0:.3f}, "
    "{acceptance_float_draft.ci95.1:.3f}] for the float draft, a change of "
    "{row.acceptance_change.mean:.4f} [{row.acceptance_change.ci95.0:.4f}, "
    "{row.acceptance_change.ci95.1:.4f}] per token", at="models.draft")
add(PRECISION_MD, INT8_DISTANCE,
    "different model by a KL of about {models.target.row.kl_float_int8.mean:.3f} nats per token")
add(PRECISION_MD, INT8_DISTANCE_EPYC,
    "gave KLs of {models.target.row.kl_float_int8.mean:.4f} [{models.target.row.kl_float_int8.ci95.0:.4f},\n"
    "{models.target.row.kl_float_int8.ci95.1:.4f}] (target) and {models.draft.row.kl_float_int8.mean:.4f} "
    "[{models.draft.row.kl_float_int8.ci95.0:.4f}, {models.draft.row.kl_float_int8.ci95.1:.4f}] "
    "(draft), and an acceptance change of {models.draft.row.acceptance_change.mean:.4f}\n"
    "[{models.draft.row.acceptance_change.ci95.0:.4f}, {models.draft.row.acceptance_change.ci95.1:.4f}]")

DEMO_INT8 = "results/demo_memory_int8_avx512bf16_epyc.json"   # the demo, both models int8


def demo_ratio(run: int) -> float:
    """The speed ratio the demo's verdict line of run ``run`` printed ("... (0.83x, ...")."""
    return float(load(DEMO_INT8)["runs"][run]["verdict"][0].split("(")[1].split("x")[0])


HELPERS.update(demo_ratio=demo_ratio)
add("docs/getting_started.md", DEMO_INT8,
    "the first run took {runs.0.wall_s:.0f} s with a peak of {=v('runs.0.peak_rss_bytes') / 1e9:.2f} "
    "GB resident (the conversions), the second {runs.1.wall_s:.0f} s with a peak of "
    "{=v('runs.1.peak_rss_bytes') / 1e9:.2f} GB, and the cache\n  held "
    "{=sum(v('runs.1.cache_bytes').values()) / 1e9:.2f} GB ({=v('runs.1.cache_bytes')["
    "'qwen2.5-coder-0.5b-instruct/model.gguf'] / 1e9:.2f} GB of it the draft's GGUF",
    "There DSBD was the slower\n  ({=demo_ratio(0):.2f}x and {=demo_ratio(1):.2f}x)")
DEMO_INT8_AMX = "results/demo_memory_int8_amx_xeon.json"   # the same, current code, AMX host
add("docs/getting_started.md", DEMO_INT8_AMX,
    "the first run took {runs.0.wall_s:.0f} s with a peak\n  of {=v('runs.0.peak_rss_bytes') / "
    "1e9:.2f} GB, the second {runs.1.wall_s:.0f} s with a peak of "
    "{=v('runs.1.peak_rss_bytes') / 1e9:.2f} GB, and the cache holds "
    "{=sum(v('runs.1.cache_bytes').values()) / 1e9:.2f} GB (no GGUF)")

DEMO_F32 = "results/demo_memory_float32_avx512bf16_epyc.json"   # the demo, float32 target
_T32 = "qwen2.5-coder-1.5b-instruct/"
_D32 = "qwen2.5-coder-0.5b-instruct/"


def cache_part(rel: str, prefix: str, run: int = 1) -> float:
    """GB under ``prefix`` in the cache a demo_memory run left after run ``run``."""
    return sum(b for k, b in load(rel)["runs"][run]["cache_bytes"].items()
               if k.startswith(prefix)) / 1e9


HELPERS.update(cache_part=cache_part)
DEMO_F32_AMX = "results/demo_memory_float32_amx_xeon.json"   # the same, current code, AMX host
add("docs/getting_started.md", DEMO_F32_AMX,
    "the first\n  run took {runs.0.wall_s:.0f} s with a peak of {=v('runs.0.peak_rss_bytes') / "
    "1e9:.2f} GB resident, the second {runs.1.wall_s:.0f} s with a peak of "
    "{=v('runs.1.peak_rss_bytes') / 1e9:.2f} GB,\n  and the cache holds **"
    "{=sum(v('runs.1.cache_bytes').values()) / 1e9:.2f} GB**: the target's float32 host form "
    "{=v('runs.1.cache_bytes')[_T32 + 'params-v1-host-float32-per_layer-transposed'] / 1e9:.2f} GB",
    "the draft's int8 form {=v('runs.1.cache_bytes')[_D32 + "
    "'params-v1-host-float32-per_layer-int8'] / 1e9:.2f} GB (its embedding in bfloat16)")
DEMO_F32_RES = "results/demo_memory_float32_amx_xeon_resident.json"   # with page-cache bytes
add("docs/getting_started.md", DEMO_F32_RES,
    "first run {runs.0.wall_s:.0f} s, second **{runs.1.wall_s:.0f} s**,\n  with "
    "{=v('runs.1.cache_resident_before_bytes') / 1e9:.2f} of the cache's "
    "{=sum(v('runs.0.cache_bytes').values()) / 1e9:.2f} GB in the page cache before it",
    "the second run took {runs.1.wall_s:.0f} to\n  {=w(DEMO_F32_AMX, 'runs.1.wall_s'):.0f} s in "
    "two measurements")
DEMO_DEFAULT_AMX = "results/demo_memory_default_amx_xeon.json"   # the demo's defaults, AMX host


def verdict_span(rel: str, run: int = 0) -> list:
    """The round-by-round ratios a demo verdict that cannot tell quotes (``0.93x to 1.19x``)."""
    span = load(rel)["runs"][run]["verdict"][0].split("(")[1].split(" round")[0]
    return [float(x.strip().rstrip("x")) for x in span.split(" to ")]


def verdict_ratio(rel: str, run: int) -> float:
    """The ratio a demo verdict that can tell states (``DSBD was 1.19x as fast ...``)."""
    return float(load(rel)["runs"][run]["verdict"][0].split(" was ")[1].split("x")[0])


HELPERS.update(verdict_span=verdict_span, verdict_ratio=verdict_ratio,
               DEMO_DEFAULT_AMX=DEMO_DEFAULT_AMX)
add("docs/getting_started.md", DEMO_DEFAULT_AMX,
    "the first run took {runs.0.wall_s:.0f} s\n  with a peak of {=v('runs.0.peak_rss_bytes') / "
    "1e9:.2f} GB, the second **{runs.1.wall_s:.0f} s** with a peak of "
    "{=v('runs.1.peak_rss_bytes') / 1e9:.2f} GB, and the cache holds\n  "
    "{=sum(v('runs.1.cache_bytes').values()) / 1e9:.2f} GB (the target's bfloat16 host form "
    "{=cache_part(DEMO_DEFAULT_AMX, _T32 + 'params'):.2f} GB, the draft's int8 form "
    "{=cache_part(DEMO_DEFAULT_AMX, _D32 + 'params'):.2f} GB)",
    "within the run's noise ({=verdict_span(DEMO_DEFAULT_AMX)[0]:.2f}x to "
    "{=verdict_span(DEMO_DEFAULT_AMX)[1]:.2f}x round by round) the first time, "
    "DSBD {=verdict_ratio(DEMO_DEFAULT_AMX, 1):.2f}x\n  beam sampling the second")
add("README.md", DEMO_DEFAULT_AMX,
    "{=sum(v('runs.1.cache_bytes').values()) / 1e9:.2f} GB with the defaults on a host that picks "
    "bfloat16,\n  where a second demo took {runs.1.wall_s:.0f} s")
add("README.md", DEMO_F32_AMX,
    "later runs load in seconds: {=sum(v('runs.1.cache_bytes').values()) / 1e9:.2f} GB of disk")
add("README.md", DEMO_INT8_AMX, "{=sum(v('runs.1.cache_bytes').values()) / 1e9:.2f} GB with both "
    "models in int8")
add("docs/getting_started.md", DEMO_F32,
    "found {=sum(v('runs.1.cache_bytes').values()) / 1e9:.2f} GB, with the draft's int8\n  form "
    "at {=v('runs.1.cache_bytes')[_D32 + 'params-v1-host-float32-per_layer-int8'] / 1e9:.2f} GB "
    "and its GGUF at {=v('runs.1.cache_bytes')[_D32 + 'model.gguf'] / 1e9:.2f} GB, and a second "
    "run of {runs.1.wall_s:.0f} s")
add("docs/models.md", DEMO_F32_AMX,
    "| {=sum(v('runs.1.cache_bytes').values()) / 1e9:.2f} GB: target {=cache_part(DEMO_F32_AMX, "
    "_T32):.2f} GB (host form {=v('runs.1.cache_bytes')[_T32 + "
    "'params-v1-host-float32-per_layer-transposed'] / 1e9:.2f} GB: the embedding and the untied "
    "head",
    "draft {=cache_part(DEMO_F32_AMX, _D32):.2f} GB (int8 host form with its embedding in "
    "bfloat16")

SOAK_AMX = "results/soak_amx_xeon.json"   # the same soak, current code, the AMX host
add(MEMORY_MD, SOAK_AMX, "and AMX, 2 cores; jax 0.10.2; {seconds:.0f} s, with a quality run "
    "beside it")
SOAK = "results/soak_avx512bf16_epyc.json"
add(MEMORY_MD, SOAK, "AVX512-BF16; jax 0.10.2; {seconds:.0f} s, with another job beside it")
for SOAK_RUN in (SOAK, SOAK_AMX):
    add(MEMORY_MD, SOAK_RUN, "| batches per round (9 method settings, 4 buckets) | {batches_per_round:d} |")
    add(MEMORY_MD, SOAK_RUN, "| compilations in round 1 / (method, bucket, batch shape) combinations | "
                         "{compiles_first_round:d} / {compile_combinations:d} |")
    add(MEMORY_MD, SOAK_RUN, "| compilations in rounds 2 and 3 | **{compiles_later_rounds:d}** |")
    add(MEMORY_MD, SOAK_RUN, "| host RSS at the end of round 1 / at the end | "
                         "{=v('end_of_round_1') / 1e6:,.0f} MB / {=v('end') / 1e6:,.0f} MB "
                         "(+{=v('change_after_round_1') / 1e6:.1f} MB over "
                         "{=2 * w(" + repr(SOAK_RUN) + ", 'batches_per_round'):d} batches) |",
        at="growth_after_round_1.rss")
    add(MEMORY_MD, SOAK_RUN, "| live device arrays, end of round 1 / end | {live_arrays.end_of_round_1:d} / "
                         "{live_arrays.end:d} ({=v('live_bytes.end_of_round_1') / 1e3:.0f} kB / "
                         "{=v('live_bytes.end') / 1e3:.0f} kB) |", at="growth_after_round_1")
    add(MEMORY_MD, SOAK_RUN, "| NaN outputs / malformed outputs | {nan_outputs:d} / {malformed_outputs:d} |")
add(MEMORY_MD, SOAK, "(`vm.max_map_count`) after its {compiles_total:d} programs")


# docs/results/precision.md -------------------------------------------------------------------
def dtype_tables(runs: str, speed: str) -> None:
    """The two tables of a host's section: ``dsbd host``'s passes per dtype (lowest-highest of
    the runs of ``runs``), and the decoders' tokens/s in both dtypes (``speed``)."""
    for label, model in [("1.5B target", TARGET), ("0.5B draft", DRAFT)]:
        m, r_ = repr(model), repr(runs)
        add(PRECISION_MD, runs,
            f"| {label} | {{=span(r['float32'][0] for r in probe({m}, {r_})):.1f}} / "
            f"{{=span(r['float32'][1] for r in probe({m}, {r_})):.1f}} | "
            f"{{=span(r['bfloat16'][0] for r in probe({m}, {r_})):.1f}} / "
            f"{{=span(r['bfloat16'][1] for r in probe({m}, {r_})):.1f}} | "
            f"{{=span(sum(r['bfloat16']) / sum(r['float32']) for r in probe({m}, {r_})):.2f}} |")
    for i, label in enumerate(["sampling", "beam sampling W=4", "speculative, gamma 4",
                               "DSBD g2 / W_S 4 / t 0.7 / W_min 2"]):
        j = i + 4  # the bfloat16 row of the same decoder
        method = load(speed)["rows"][i]["method"]
        add(PRECISION_MD, speed,
            f"| {label} | {{rows.{i}.tokens_per_s:.2f}} ({{rows.{i}.decode_tokens_per_s:.2f}}) | "
            f"{{rows.{j}.tokens_per_s:.2f}} ({{rows.{j}.decode_tokens_per_s:.2f}}) | "
            f"{{ratios.tokens_per_s: {method}: ours bfloat16 / ours float32:.2f}}x "
            f"({{ratios.decode_tokens_per_s: {method}: ours bfloat16 / ours float32:.2f}}x) |")


_DSBD_VS_BEAM = (
    "In bfloat16 DSBD ran at {ratios.bfloat16: tokens_per_s: dsbd_g2_WS4_t0.7_Wmin2 / "
    "beam_sample_W4 (ours):.2f}x beam sampling W=4 end to end %s "
    "({ratios.bfloat16: decode_tokens_per_s: dsbd_g2_WS4_t0.7_Wmin2 / beam_sample_W4 (ours):.2f}x "
    "decode), in float32 at {ratios.float32: tokens_per_s: dsbd_g2_WS4_t0.7_Wmin2 / "
    "beam_sample_W4 (ours):.2f}x ({ratios.float32: decode_tokens_per_s: dsbd_g2_WS4_t0.7_Wmin2 / "
    "beam_sample_W4 (ours):.2f}x decode)")
dtype_tables(DTYPE_RUNS, DTYPES)
add(PRECISION_MD, DTYPE_RUNS,
    "bfloat16 runs the forest {=span(faster(TARGET, False) + faster(DRAFT, False)):.0f} % faster "
    "here and the one-token pass at float32's speed, "
    "{=span(faster(TARGET, True) + faster(DRAFT, True)):.0f} % faster over both",
    "about {=sum(r['wall_s'] for r in v('runs')) / len(v('runs')) / 60:.0f} minute per run")
add(PRECISION_MD, DTYPES,
    _DSBD_VS_BEAM % "here",
    "--out results/speed_dtypes_host.json`, {=v('wall_s') / 60:.0f} minutes)",
    "({prompt_lengths.0:d} and {prompt_lengths.1:d} tokens, one 256-token bucket)",
    "the KV cache of DSBD g2 / W_S 4 / t 0.7 / W_min 2 takes {=v('rows.3.kv_cache_bytes') / 1e6:.1f}"
    " MB in float32 and {=v('rows.7.kv_cache_bytes') / 1e6:.1f} MB in bfloat16")
# the AVX512-BF16 host (AMD EPYC)
dtype_tables(DTYPE_RUNS_EPYC, DTYPES_EPYC)
add(PRECISION_MD, DTYPES_EPYC, _DSBD_VS_BEAM % "on this host")
add(PRECISION_MD, DTYPE_RUNS_EPYC,
    "bfloat16 runs the forest {=span(faster(TARGET, False, DTYPE_RUNS_EPYC) + faster(DRAFT, False, "
    "DTYPE_RUNS_EPYC)):.0f} % faster here",
    "--runs 5 --out results/dtype_runs_epyc.json`, {=sum(r['wall_s'] for r in v('runs')) / 60:.0f} "
    "minutes)")
DISTILL = "results/distill_qwen_fkl_training.json"   # dsbd distill configs/distill_qwen_fkl.yaml
add(DRAFT_MD, DISTILL,
    "went from {=heldout(0):.3f} at step 0 to {=heldout(20):.3f} at step\n20, {=heldout(40):.3f} "
    "at step 40 and {=heldout(60):.3f} at step 60. The run took {wall_s:.0f} minutes".replace(
        "{wall_s:.0f}", "{=v('wall_s') / 60:.0f}"),
    "then 60 steps in {=v('log')[-1]['elapsed_s'] / 60:.0f} minutes) with a peak of "
    "{=v('peak_rss_kb') / 1e6:.1f} GB")


def heldout(step: int) -> float:
    """The distillation run's held-out acceptance at ``step`` (its log's evaluation record)."""
    log = load(DISTILL)["log"]
    return [r["heldout_acceptance"] for r in log
            if r["step"] == step and "heldout_acceptance" in r][-1]


HELPERS.update(heldout=heldout)
VSUMS = "results/verify_sums_avx512bf16_epyc.json"   # the verification's sums, side by side
add("docs/performance.md", VSUMS,
    "DSBD took {ratios.dsbd_g2_WS4_t0.7_Wmin2: fewer_sums / former_sums, seconds:.2f}x the\n"
    "former form's seconds and speculative sampling g4 "
    "{ratios.speculative_g4: fewer_sums / former_sums, seconds:.2f}x",
    "(DSBD {=sum(v('runs.1.decoders.dsbd_g2_WS4_t0.7_Wmin2.seconds')):.2f}\nagainst "
    "{=sum(v('runs.0.decoders.dsbd_g2_WS4_t0.7_Wmin2.seconds')):.2f} s in the first, "
    "{=sum(v('runs.3.decoders.dsbd_g2_WS4_t0.7_Wmin2.seconds')):.2f} against "
    "{=sum(v('runs.2.decoders.dsbd_g2_WS4_t0.7_Wmin2.seconds')):.2f} s in the second)")
COUNTS_AMX = "results/iteration_counts_amx_xeon.json"   # what an iteration executes (counts)
COUNTS_BEFORE = "results/iteration_counts_avx512bf16_epyc_before.json"
COUNTS_LOOPS = "results/iteration_counts_avx512bf16_epyc_loops_cut.json"   # loops cut
COUNTS_EPYC = "results/iteration_counts_avx512bf16_epyc.json"   # and fewer sums: the current code
add("docs/performance.md", COUNTS_AMX,
    "(862 thunks\noutside the passes and 23 trips for DSBD, 117 for beam sampling".replace(
        "862", "{runs.1.per_iteration_counts.thunks_outside_passes:.0f}").replace(
        "23 trips", "{runs.1.per_iteration_counts.loop_trips:.0f} trips").replace(
        "117", "{runs.0.per_iteration_counts.thunks_outside_passes:.0f}"))
add("docs/performance.md", COUNTS_BEFORE,
    "| thunks outside the forward passes | {runs.0.per_iteration_counts.thunks_outside_passes:.0f}"
    " | {runs.1.per_iteration_counts.thunks_outside_passes:.0f} | ",
    "| trips of loops inside the iteration | {runs.0.per_iteration_counts.loop_trips:.0f} | "
    "{runs.1.per_iteration_counts.loop_trips:.0f} | ",
    "| vocabulary-axis thunks outside the passes | "
    "{runs.0.per_iteration_counts.vocab_thunks_outside_passes:.1f} | "
    "{runs.1.per_iteration_counts.vocab_thunks_outside_passes:.1f} | ",
    "| the target's thunks per pass per layer | "
    "{runs.0.per_iteration_counts.target_thunks_per_pass_per_layer:.1f} | "
    "{runs.1.per_iteration_counts.target_thunks_per_pass_per_layer:.1f} | ",
    "Before, DSBD's iteration executed {counts_against.0.thunks_outside_passes:.2f}x beam "
    "sampling's thunks outside the passes and {runs.1.per_iteration_counts.loop_trips:.0f} loop\n"
    "trips (verification {runs.1.per_iteration_counts.loop_trips_by_phase.verify:.0f}:",
    "width {runs.1.per_iteration_counts.loop_trips_by_phase.width:.0f}:",
    "draws {runs.1.per_iteration_counts.loop_trips_by_phase.random:.0f}:")
add("docs/performance.md", COUNTS_LOOPS,
    " | {runs.1.per_iteration_counts.thunks_outside_passes:.0f} | ",
    "With the loops cut, {counts_against.0.thunks_outside_passes:.2f}x beam sampling's thunks "
    "outside the passes (warp {runs.1.per_iteration_counts.thunks.warp:.0f}, verification "
    "{runs.1.per_iteration_counts.thunks.verify:.0f},\nthe draws "
    "{runs.1.per_iteration_counts.thunks.random:.0f}, the width "
    "{runs.1.per_iteration_counts.thunks.width:.0f}, other bookkeeping "
    "{runs.1.per_iteration_counts.thunks.other:.0f}) and "
    "{runs.1.per_iteration_counts.loop_trips:.0f} trips")
add("docs/performance.md", COUNTS_EPYC,
    " | {=w(COUNTS_LOOPS, 'runs.1.per_iteration_counts.thunks_outside_passes'):.0f} | "
    "{runs.1.per_iteration_counts.thunks_outside_passes:.0f} | "
    "{runs.2.per_iteration_counts.thunks_outside_passes:.0f} | "
    "{runs.3.per_iteration_counts.thunks_outside_passes:.0f} |",
    " | {=w(COUNTS_LOOPS, 'runs.1.per_iteration_counts.loop_trips'):.0f} | "
    "{runs.1.per_iteration_counts.loop_trips:.0f} | {runs.2.per_iteration_counts.loop_trips:.0f}"
    " | {runs.3.per_iteration_counts.loop_trips:.0f} |",
    " | {=w(COUNTS_LOOPS, 'runs.1.per_iteration_counts.vocab_thunks_outside_passes'):.1f} | "
    "{runs.1.per_iteration_counts.vocab_thunks_outside_passes:.1f} | "
    "{runs.2.per_iteration_counts.vocab_thunks_outside_passes:.1f} | "
    "{runs.3.per_iteration_counts.vocab_thunks_outside_passes:.1f} |",
    " | {=w(COUNTS_LOOPS, 'runs.1.per_iteration_counts.target_thunks_per_pass_per_layer'):.1f} | "
    "{runs.1.per_iteration_counts.target_thunks_per_pass_per_layer:.1f} | "
    "{runs.2.per_iteration_counts.target_thunks_per_pass_per_layer:.1f} | "
    "{runs.3.per_iteration_counts.target_thunks_per_pass_per_layer:.1f} |",
    "DSBD's iteration now executes {runs.1.per_iteration_counts.thunks_outside_passes:.0f} "
    "thunks outside the passes, {counts_against.0.thunks_outside_passes:.2f}x beam\nsampling's "
    "(verification {runs.1.per_iteration_counts.thunks.verify:.0f}, from "
    "{=w(COUNTS_LOOPS, 'runs.1.per_iteration_counts.thunks.verify'):.0f})")
COUNTS_ROWS = "results/iteration_counts_amx_xeon_rows.json"   # the code before the tops
COUNTS_TOPS = "results/iteration_counts_amx_xeon_tops.json"   # DSBD on the tops of each row


def outside_rest(path: str, run: int) -> float:
    """A profile run's thunks outside the passes but the warp, verification, draws and width."""
    c = load(path)["runs"][run]["per_iteration_counts"]
    return c["thunks_outside_passes"] - sum(c["thunks"][p] for p in ("warp", "verify", "random",
                                                                      "width"))


HELPERS.update(COUNTS_ROWS=COUNTS_ROWS, outside_rest=outside_rest)
_PI = "per_iteration_counts"
add("docs/performance.md", COUNTS_TOPS,
    f"| thunks outside the forward passes | {{runs.0.{_PI}.thunks_outside_passes:.0f}} | "
    f"{{=w(COUNTS_ROWS, 'runs.1.{_PI}.thunks_outside_passes'):.0f}} "
    f"({{=w(COUNTS_ROWS, 'counts_against.0.thunks_outside_passes'):.2f}}x) | "
    f"**{{runs.1.{_PI}.thunks_outside_passes:.0f}} "
    f"({{counts_against.0.thunks_outside_passes:.2f}}x)** |",
    *[f"| {label} | {{runs.0.{_PI}.thunks.{ph}:.0f}} | "
      f"{{=w(COUNTS_ROWS, 'runs.1.{_PI}.thunks.{ph}'):.0f}} | {{runs.1.{_PI}.thunks.{ph}:.0f}} |"
      for label, ph in (("of them: warp", "warp"), ("verification", "verify"),
                        ("draws", "random"), ("width", "width"))],
    "| everything else | {=outside_rest(COUNTS_TOPS, 0):.0f} | "
    "{=outside_rest(COUNTS_ROWS, 1):.0f} | {=outside_rest(COUNTS_TOPS, 1):.0f} |",
    f"| trips of loops inside the iteration | {{runs.0.{_PI}.loop_trips:.0f}} | "
    f"{{=w(COUNTS_ROWS, 'runs.1.{_PI}.loop_trips'):.0f}} | {{runs.1.{_PI}.loop_trips:.0f}} |",
    f"| vocabulary-axis thunks outside the passes | "
    f"{{runs.0.{_PI}.vocab_thunks_outside_passes:.0f}} | "
    f"{{=w(COUNTS_ROWS, 'runs.1.{_PI}.vocab_thunks_outside_passes'):.0f}} | "
    f"{{runs.1.{_PI}.vocab_thunks_outside_passes:.0f}} |",
    "is met\n({counts_against.0.thunks_outside_passes:.2f}x; both runs made the same "
    "{=v('runs.1.iterations') if v('runs.1.iterations') == w(COUNTS_ROWS, 'runs.1.iterations') "
    "else -1:d} iterations for the prompt's {runs.1.generated_tokens:d} tokens)")
HELPERS.update(COUNTS_TOPS=COUNTS_TOPS)
add("docs/results/accelerators.md", COUNTS_TOPS,
    "on the CPU {counts_against.0.thunks_outside_passes:.2f}x beam sampling's\nthunks outside "
    "the passes per iteration, from "
    "{=w(COUNTS_ROWS, 'counts_against.0.thunks_outside_passes'):.2f}x")
VTOPS = "results/verify_tops_amx_xeon.json"   # the tops against whole rows, side by side
_DS = "decoders.dsbd_g2_WS4_t0.7_Wmin2"
add("docs/performance.md", VTOPS,
    "DSBD took {ratios.dsbd_g2_WS4_t0.7_Wmin2: tops / full_rows, seconds:.2f}x the whole-rows "
    "form's seconds ({=sum(v('runs.1." + _DS + ".seconds')):.2f} against "
    "{=sum(v('runs.0." + _DS + ".seconds')):.2f} s in the first\nround, "
    "{=sum(v('runs.3." + _DS + ".seconds')):.2f} against "
    "{=sum(v('runs.2." + _DS + ".seconds')):.2f} s in the second; the draws differ, and one "
    "prompt took {=max(v('runs.1." + _DS + ".iterations')):d} iterations\ninstead of "
    "{=max(v('runs.0." + _DS + ".iterations')):d}), beam sampling W=4, the same program in "
    "both, {ratios.beam_sample_W4: tops / full_rows, seconds:.2f}x. Compiling DSBD took "
    "{runs.1." + _DS + ".compile_s:.1f} and\n{runs.3." + _DS + ".compile_s:.1f} s against "
    "{runs.0." + _DS + ".compile_s:.1f} and {runs.2." + _DS + ".compile_s:.1f} s")
GAMMA_INT8 = "results/speed_int8_draft_avx512bf16_epyc.json"   # --gamma's default, int8 draft
def grid_rows(labels: dict, bold: int = 5) -> list:
    """The speed page's templates of an int8-draft grid run (``benchmarks/speed.py`` with
    ``--dsbd 2,3,0.9,1 3,3,0.9,1 4,3,0.9,1 2,4,0.7,2 3,4,0.7,2``): one table row per DSBD
    setting, labelled ``labels[i]`` (``i``: its index in the JSON's rows), the ratio over beam
    sampling W=4 (row 2) in bold for row ``bold``."""
    out = ["| beam sampling W=2 | {rows.1.tokens_per_s:.2f} |  | "
           "{rows.1.target_calls_per_token:.3f} | {rows.1.loglik_per_token:.3f} |"]
    for i in (2, 4, 5, 6, 7, 8):
        ratio = f"{{=v('rows.{i}.tokens_per_s') / v('rows.2.tokens_per_s'):.2f}}x"
        out.append(f"| {labels[i]} | {{rows.{i}.tokens_per_s:.2f}} | "
                   + (f"**{ratio}**" if i == bold else ratio)
                   + f" | {{rows.{i}.target_calls_per_token:.3f}} | "
                   f"{{rows.{i}.loglik_per_token:.3f}} |")
    return out


_GRID = {2: "beam sampling W=4", 4: "DSBD g2 W_S 3 t 0.9 W_min 1", 5: "DSBD g3 W_S 3 t 0.9 "
         "W_min 1 (the default)", 6: "DSBD g4 W_S 3 t 0.9 W_min 1", 7: "DSBD g2 W_S 4 t 0.7 "
         "W_min 2 (the beam-W4 point)", 8: "DSBD g3 W_S 4 t 0.7 W_min 2"}
add("docs/results/speed.md", GAMMA_INT8,
    *grid_rows({**_GRID, 4: _GRID[4] + " (the old default)"}),
    "| speculative sampling g4 / our sampling | {rows.3.tokens_per_s:.2f} / "
    "{rows.0.tokens_per_s:.2f} | {=v('rows.3.tokens_per_s') / v('rows.0.tokens_per_s'):.2f}x |",
    "here**, {=v('rows.5.tokens_per_s') / v('rows.4.tokens_per_s'):.2f}x the speed of gamma 2",
    "measured again with the current code on\n2026-12-05, {=v('wall_s') / 60:.0f} minutes",
    "1.5x on this host ({=v('rows.7.tokens_per_s') / v('rows.2.tokens_per_s'):.2f}x end to end, "
    "{=v('rows.7.decode_tokens_per_s') / v('rows.2.decode_tokens_per_s'):.2f}x in\n  decode)")
SPEED_AMX = "results/speed_int8_draft_amx_xeon.json"   # the same grid on an AMX host
add("docs/results/speed.md", SPEED_AMX,
    "`results/speed_int8_draft_amx_xeon.json`, measured again with the current code on "
    "2026-12-05, {=v('wall_s') / 60:.0f} minutes)",
    *grid_rows(_GRID),
    "| speculative sampling g4 / our sampling | {rows.3.tokens_per_s:.2f} / "
    "{rows.0.tokens_per_s:.2f} | {=v('rows.3.tokens_per_s') / v('rows.0.tokens_per_s'):.2f}x |",
    "At W_S 3 gamma 3 ran at {=v('rows.5.tokens_per_s') / v('rows.4.tokens_per_s'):.2f}x the speed "
    "of gamma 2, and gamma 4 at\n{=v('rows.6.tokens_per_s') / v('rows.5.tokens_per_s'):.2f}x "
    "gamma 3's",
    "1.5x here ({=v('rows.7.tokens_per_s') / v('rows.2.tokens_per_s'):.2f}x; "
    "{=v('rows.7.decode_tokens_per_s') / v('rows.2.decode_tokens_per_s'):.2f}x in decode; "
    "{=w(GAMMA_INT8, 'rows.7.tokens_per_s') / w(GAMMA_INT8, 'rows.2.tokens_per_s'):.2f}x on the "
    "AMD\n  EPYC, above)")
add("README.md", SPEED_AMX,
    "the command line's default (gamma 3, W_S 3) ran at **{=v('rows.5.tokens_per_s') / "
    "v('rows.2.tokens_per_s'):.2f}x** our beam sampling W=4 and at the\nbeam-W4 point at "
    "{=v('rows.7.tokens_per_s') / v('rows.2.tokens_per_s'):.2f}x; speculative sampling at "
    "{=v('rows.3.tokens_per_s') / v('rows.0.tokens_per_s'):.2f}x our sampling")
FUSED = "results/fused_projections_amx_xeon.json"   # q|k|v and gate|up fused, side by side


FUSED_H200 = "results/gpu/NVIDIA_H200_fused_projections.json"   # the same probe on one H200


def fused_row(kind: str, rows: int, path: str = FUSED) -> dict:
    """The fused-projections probe's row of ``kind`` at ``rows`` rows (of the run ``path``)."""
    return next(r for r in load(path)["rows"] if r["kind"] == kind and r["rows"] == rows)


def fused_span(key: str = "fused_over_separate", rows=(2, 12)) -> list:
    """``key`` over every kind at the rows the page's table leaves out."""
    return [r[key] for r in load(FUSED)["rows"] if r["rows"] in rows]


HELPERS.update(fused_row=fused_row, fused_span=fused_span, FUSED_H200=FUSED_H200)
add("docs/performance.md", FUSED,
    *[f"| {k} | {m} | {{=fused_row('{k}', {m})['separate_ms']:.2f}} | "
      f"{{=fused_row('{k}', {m})['fused_ms']:.2f}} | "
      f"{{=fused_row('{k}', {m})['fused_over_separate']:.2f}}x |"
      for k in ("float32", "bfloat16", "int8") for m in (1, 4, 16)],
    "(The JSON holds 2 and 12 rows too: {=min(fused_span()):.2f}x to {=max(fused_span()):.2f}x.)")
add("docs/performance.md", FUSED_H200,
    *[f"| {k} | {m} | {{=fused_row('{k}', {m}, FUSED_H200)['separate_ms']:.2f}} | "
      f"{{=fused_row('{k}', {m}, FUSED_H200)['fused_ms']:.2f}} | "
      f"{{=fused_row('{k}', {m}, FUSED_H200)['fused_over_separate']:.2f}}x |"
      for k in ("float32", "bfloat16", "int8") for m in (1, 16)],
    "There fused was faster at every row count and kind ({=min(r['fused_over_separate'] for r in "
    "v('rows')):.2f}x to {=max(r['fused_over_separate'] for r in v('rows')):.2f}x; 4 rows in the "
    "JSON)")
LOWERED = "results/lowered_counts.json"   # the programs lowered for cuda and cpu, no GPU
LOWERED_ROWS = "results/lowered_counts_rows.json"   # the same before the tops of each row
HELPERS.update(LOWERED_ROWS=LOWERED_ROWS)
add("docs/performance.md", LOWERED,
    "| operations outside the passes, `cuda` | {runs.0.ops_outside_passes:d} | "
    "{runs.1.ops_outside_passes:d} ({runs.1.against_beam4.ops_outside_passes:.2f}x beam "
    "sampling's) | {runs.2.ops_outside_passes:d} | {runs.3.ops_outside_passes:d} |",
    "| the same, each conditional's first branch only, `cuda` | "
    "{runs.0.ops_outside_passes_first_branches:d} | {runs.1.ops_outside_passes_first_branches:d}"
    " (**{runs.1.against_beam4.ops_outside_passes_first_branches:.2f}x**) | "
    "{runs.2.ops_outside_passes_first_branches:d} | {runs.3.ops_outside_passes_first_branches:d} |",
    "| the same, `cpu` (all branches) | {runs.4.ops_outside_passes:d} | "
    "{runs.5.ops_outside_passes:d} ({runs.5.against_beam4.ops_outside_passes:.2f}x) | "
    "{runs.6.ops_outside_passes:d} | {runs.7.ops_outside_passes:d} |",
    "verification's layers ({runs.1.loops.1.trips:d}; once in each branch), the forest's draft "
    "layers ({runs.1.loops.0.trips:d})",
    "the draft passes ({runs.3.loops.0.trips:d}) |",
    "DSBD's program holds {runs.1.against_beam4.ops_outside_passes_first_branches:.2f}x beam "
    "sampling's operations outside the passes ({=w(LOWERED_ROWS, 'runs.1.ops_outside_passes'):d}, "
    "{=w(LOWERED_ROWS, 'runs.1.against_beam4.ops_outside_passes'):.2f}x, before\nthe tops), "
    "against {=w(COUNTS_TOPS, 'counts_against.0.thunks_outside_passes'):.2f}x its executed "
    "thunks on the CPU")
add("docs/performance.md", FLOOR_EPYC,
    "the target's passes take {=span(floor_ratios('target', 'float32')):.2f}x their floor in "
    "float32 and {=span(floor_ratios('target', 'bfloat16')):.2f}x in bfloat16, the 0.5B draft's "
    "{=span(floor_ratios('draft', 'float32')):.2f}x and "
    "{=span(floor_ratios('draft', 'bfloat16')):.2f}x",
    "Without their attention the same passes take {=span(sum((floor_ratios(m, dt, "
    "'no_attention_over_floor') for m in ('target', 'draft') for dt in ('float32', "
    "'bfloat16')), [])):.2f}x their floor",
    "in bfloat16 at {=floor_row('draft', 'bfloat16', 64, 'pass_over_floor', "
    "rel='results/pass_floor_epyc_earlier.json'):.2f}x ({=floor_row('draft', 'bfloat16', 64, "
    "'pass_over_floor'):.2f}x here), and its ratios differ from this run's by up to "
    "{=floor_gap(FLOOR_EPYC, 'results/pass_floor_epyc_earlier.json'):.2f}.",
    "The target's one-token pass takes {=floor_row('target', 'bfloat16', 1, 'pass_ms'):.0f} ms in "
    "bfloat16 against {=floor_row('target', 'float32', 1, 'pass_ms'):.0f} ms in float32, a "
    "12-token forest {=floor_row('target', 'bfloat16', 12, 'pass_ms'):.0f} against "
    "{=floor_row('target', 'float32', 12, 'pass_ms'):.0f} ms",
    "the attention's two products are {=100 * floor_row('target', 'bfloat16', 64, "
    "'attention_flop_share'):.1f} % of the floor's work for the target and {=100 * floor_row("
    "'draft', 'bfloat16', 64, 'attention_flop_share'):.1f} % for the draft. In place they run at "
    "{=span(floor_row(m, dt, 64, 'attention_gflop_per_s') for m in ('target', 'draft') for dt in "
    "('float32', 'bfloat16')):.0f} GFLOP/s, in float32, while the floor's products run at "
    "{=span(floor_row(m, dt, 64, 'floor_gflop_per_s') for m in ('target', 'draft') for dt in "
    "('float32', 'bfloat16')):.0f} GFLOP/s",
    "So the draft's attention costs {=(floor_row('draft', 'bfloat16', 64, 'pass_ms') - "
    "floor_row('draft', 'bfloat16', 64, 'no_attention_ms')) / floor_row('draft', 'bfloat16', 64, "
    "'floor_ms'):.2f} of its floor at 64 tokens in bfloat16")
add("docs/performance.md", FLOOR_EPYC_SOFTMAX,
    "passes took up to {=max(floor_ratios('draft', 'bfloat16', rel=FLOOR_EPYC_SOFTMAX)):.2f}x "
    "their floor for the draft in bfloat16 and {=max(floor_ratios('target', 'bfloat16', "
    "rel=FLOOR_EPYC_SOFTMAX)):.2f}x for the target")
add(INDEX_MD, ATTENTION_EPYC,
    "takes {=min(v('ratios').values()):.3f}-{=max(v('ratios').values()):.3f}x its time end to end")
add("docs/performance.md", ATTENTION_EPYC,
    "normalised_after_values --out results/attention_form_epyc.json`, "
    "{=v('wall_s') / 60:.0f} minutes;",
    "the then current form took {=v('ratios.dsbd_g2_WS4_t0.7_Wmin2: normalised_after_values / "
    "softmax_then_values, seconds'):.3f}x the former's time for DSBD, {=v('ratios.speculative_g4: "
    "normalised_after_values / softmax_then_values, seconds'):.3f}x for speculative sampling, "
    "{=v('ratios.beam_sample_W4: normalised_after_values / softmax_then_values, seconds'):.3f}x "
    "for beam sampling W=4 and {=v('ratios.sample: normalised_after_values / "
    "softmax_then_values, seconds'):.3f}x for sampling")


def _form(decoder: str) -> str:
    """An attention_form.py run's figure: ``decoder``'s seconds, current form over former."""
    return (f"{{=v('ratios.{decoder}: parts_in_cache_dtype / normalised_after_values, "
            f"seconds'):.3f}}")


def _dsbd_over_beam(form: str) -> str:
    """An attention_form.py run's figure: DSBD's speed over beam sampling W=4's under ``form``."""
    return f"{{=v('ratios.dsbd_g2_WS4_t0.7_Wmin2 / beam_sample_W4 under {form}, speed'):.2f}}"


add("docs/performance.md", ATTENTION_AMX,
    "results/attention_parts_amx_xeon.json`, {=v('wall_s') / 60:.0f} minutes, quiet;",
    f"the current form takes {_form('dsbd_g2_WS4_t0.7_Wmin2')}x the former's time for DSBD, "
    f"{_form('speculative_g4')}x for speculative sampling, {_form('beam_sample_W4')}x for beam "
    f"sampling W=4 and {_form('sample')}x for sampling",
    f"beam-W4 point runs at {_dsbd_over_beam('parts_in_cache_dtype')}x beam sampling W=4 "
    f"({_dsbd_over_beam('normalised_after_values')}x under the former form")
ATTENTION_PARTS_EPYC = "results/attention_parts_avx512bf16_epyc.json"   # the same, AVX512-BF16
add("docs/performance.md", ATTENTION_PARTS_EPYC,
    "`results/attention_parts_avx512bf16_epyc.json`, {=v('wall_s') / 60:.0f} minutes, quiet, "
    "2026-12-05)",
    f"the current form took {_form('dsbd_g2_WS4_t0.7_Wmin2')}x the former's time for DSBD, "
    f"{_form('speculative_g4')}x for\nspeculative sampling, {_form('beam_sample_W4')}x for beam "
    f"sampling W=4 and {_form('sample')}x for sampling",
    f"beam-W4 point ran at {_dsbd_over_beam('parts_in_cache_dtype')}x beam sampling W=4 "
    f"({_dsbd_over_beam('normalised_after_values')}x under the former form)")
add(README, DTYPES_EPYC,
    "DSBD ran at {ratios.bfloat16: tokens_per_s: dsbd_g2_WS4_t0.7_Wmin2 / beam_sample_W4 (ours)"
    ":.2f}x our beam sampling W=4 (two prompts of 32 new tokens")
add(INDEX_MD, DTYPES_EPYC, "| AMD EPYC | \"AMD EPYC\", AVX512F, VNNI and AVX512-BF16, no AMX "
    "| {machine.cpu_count:d} |")
add(PRECISION_MD, H100,
    "On one H100 a 12-node forest costs {=forest12(H100):.2f}x a one-token pass of the target in "
    "bfloat16",
    "on one H100 a 12-node forest costs {=forest12(H100):.2f}x a one-token pass")

# docs/results/accelerators.md ----------------------------------------------------------------
_FWD = "runs.0.forward."
_DEC = "runs.0.decoders.1."
add(ACCEL_MD, H100,
    "a forest of 12 nodes costs {=forest12(H100):.2f}x a one-token pass of the target at 512 "
    "cache slots",
    "the 0.5B draft's pass {=v(_FWD + 'draft 1 token @512.ms') / v(_FWD + 'target 1 token @512.ms')"
    ":.2f}x the target's. DSBD at g2 / W_S 4 / t 0.7 / W_min 2 costs "
    "{runs.0.decoders.1.dsbd_g2_WS4_t0.7_Wmin2.ms_per_iteration:.2f} ms per iteration against "
    "beam sampling W=4's {runs.0.decoders.1.beam_sample_W4.ms_per_iteration:.2f}",
    "it runs at {=w(TERMS, 'batches.b1.drafts.base.dsbd_beamW4_point.tokens_per_iteration') / "
    "v(_DEC + 'dsbd_g2_WS4_t0.7_Wmin2.ms_per_iteration') * "
    "v(_DEC + 'beam_sample_W4.ms_per_iteration'):.2f}x beam sampling W=4 at batch 1",
    "Forward passes at 512 slots: the target's one-token pass {runs.0.forward.target 1 token @512."
    "ms:.2f} ms, a 12-node forest {runs.0.forward.target forest 12 @512.ms:.2f} ms "
    "({=forest12(H100):.2f}x), the 0.5B draft's one-token pass {runs.0.forward.draft 1 token @512."
    "ms:.2f} ms ({=v(_FWD + 'draft 1 token @512.ms') / v(_FWD + 'target 1 token @512.ms'):.2f}x "
    "the target's)",
    "sampling {runs.0.decoders.1.sample.ms_per_iteration:.2f}, beam sampling W=4 "
    "{runs.0.decoders.1.beam_sample_W4.ms_per_iteration:.2f}, speculative gamma 4 "
    "{runs.0.decoders.1.speculative_g4.ms_per_iteration:.2f}, tree (2, 2) "
    "{runs.0.decoders.1.tree_g2_w2.ms_per_iteration:.2f}, DSBD g2 / W_S 4 / t 0.7 / W_min 2 "
    "{runs.0.decoders.1.dsbd_g2_WS4_t0.7_Wmin2.ms_per_iteration:.2f}.",
    "with the {=w(TERMS, 'batches.b1.drafts.base.dsbd_beamW4_point.tokens_per_iteration'):.2f} "
    "tokens per DSBD iteration of the 0.5B draft measured on the CPU",
    "would run at {=w(TERMS, 'batches.b1.drafts.base.dsbd_beamW4_point.tokens_per_iteration'):.2f}"
    " / {runs.0.decoders.1.dsbd_g2_WS4_t0.7_Wmin2.ms_per_iteration:.2f} = "
    "{=w(TERMS, 'batches.b1.drafts.base.dsbd_beamW4_point.tokens_per_iteration') / "
    "v(_DEC + 'dsbd_g2_WS4_t0.7_Wmin2.ms_per_iteration'):.2f} tokens per ms against beam "
    "sampling's 1 / {runs.0.decoders.1.beam_sample_W4.ms_per_iteration:.2f} = "
    "{=1 / v(_DEC + 'beam_sample_W4.ms_per_iteration'):.2f}: "
    "{=w(TERMS, 'batches.b1.drafts.base.dsbd_beamW4_point.tokens_per_iteration') / "
    "v(_DEC + 'dsbd_g2_WS4_t0.7_Wmin2.ms_per_iteration') * "
    "v(_DEC + 'beam_sample_W4.ms_per_iteration'):.2f}x.",
    "Two 0.5B draft passes are {=2 * v(_FWD + 'draft 1 token @512.ms'):.1f} of DSBD's "
    "{runs.0.decoders.1.dsbd_g2_WS4_t0.7_Wmin2.ms_per_iteration:.2f} ms; the rest besides the "
    "forest pass is about {=v(_DEC + 'dsbd_g2_WS4_t0.7_Wmin2.ms_per_iteration') - "
    "2 * v(_FWD + 'draft 1 token @512.ms') - v(_FWD + 'target forest 12 @512.ms'):.1f} ms.")
add(ACCEL_MD, H100_DSBD,
    "cuts DSBD's iteration there from {runs.0.decoders.1.dsbd_g2_WS4_t0.7_Wmin2.ms_per_iteration"
    ":.1f} to {runs.0.decoders.1.dsbd_g2_WS4_t0.7_Wmin2_head.ms_per_iteration:.1f} ms, against beam"
    " sampling W=4's {runs.0.decoders.1.beam_sample_W4.ms_per_iteration:.1f} ms: the work outside "
    "the passes ({=v(_DEC + 'dsbd_g2_WS4_t0.7_Wmin2_head.ms_per_iteration') - "
    "v(_DEC + 'dsbd_g2_WS4_t0.7_Wmin2_head.forward_ms_per_iteration'):.1f} ms)",
    "{=v('runs.0.param_bytes.head') / 1e6:.0f} MB in bfloat16 against the target's "
    "{=v('runs.0.param_bytes.target') / 1e9:.2f} GB and the draft's "
    "{=v('runs.0.param_bytes.draft') / 1e9:.2f} GB",
    "The head's one-token pass costs **{=span(w(f, 'runs.0.head_vs_target.head') for f in "
    "(H100_HEAD, H100_DSBD)):.2f}x** the target's",
    "one block and a 32,768-row product move {=v('runs.0.param_bytes.head') / 1e6:.0f} MB, "
    "{=v('runs.0.param_bytes.head') / 3e12 * 1e3:.2f} ms at the card's 3 TB/s",
    # the passes besides the target's forest in each DSBD's forward passes: the drafts'
    "The head takes the draft's two passes, {=v(_DEC + 'dsbd_g2_WS4_t0.7_Wmin2.forward_ms_per_iteration')"
    " - v(_FWD + 'target forest 12 @512.ms'):.1f} ms of DSBD's forward passes besides the target's "
    "forest, down to about "
    "{=v(_DEC + 'dsbd_g2_WS4_t0.7_Wmin2_head.forward_ms_per_iteration') - "
    "v(_FWD + 'target forest 12 @512.ms'):.1f} ms; what remains is the target's forest pass "
    "({runs.0.forward.target forest 12 @512.ms:.1f} ms) and "
    "{=v(_DEC + 'dsbd_g2_WS4_t0.7_Wmin2_head.ms_per_iteration') - "
    "v(_DEC + 'dsbd_g2_WS4_t0.7_Wmin2_head.forward_ms_per_iteration'):.1f} ms of work outside the "
    "passes",
    "at {runs.0.decoders.1.dsbd_g2_WS4_t0.7_Wmin2_head.ms_per_iteration:.2f} / "
    "{runs.0.decoders.1.beam_sample_W4.ms_per_iteration:.2f} = "
    "{=v(_DEC + 'dsbd_g2_WS4_t0.7_Wmin2_head.ms_per_iteration') / "
    "v(_DEC + 'beam_sample_W4.ms_per_iteration'):.2f} tokens per iteration",
    "the JSON's own projection read {runs.0.projection.tokens_per_iteration.dsbd_g2_WS4_t0.7_Wmin2"
    ":.2f} from an earlier CPU run",
    "({runs.0.projection.tokens_per_iteration.dsbd_g2_WS4_t0.7_Wmin2_head:.2f} tokens per "
    "iteration, `results/draft_terms_head.json`;",
    "`results/draft_terms_head_rollouts.json`) and gives {runs.0.projection.batch 1."
    "dsbd_g2_WS4_t0.7_Wmin2_head.projected_ratio_to_beam_W4:.2f}x")
add(ACCEL_MD, TERMS2, "the current one reaches {batches.b1.drafts.head.dsbd_beamW4_point."
    "tokens_per_iteration:.2f}, `results/draft_terms_head_rollouts.json`")
add(ACCEL_MD, SPEED, "({rows.3.tokens_per_target_call:.2f} per target pass, "
    "`results/speed_float32_host.json`")
add(ACCEL_MD, TERMS,
    "(`head_vs_target`; on the 2-core CPU {batches.b1.draft_pass_vs_target.head:.3f}x",
    "At these shapes a better head alone does not reach {targets.dsbd_w4_vs_beam_w4:.1f}x")
_PASSES = [("1 token", "1 token"), ("4 rows", "4 rows"), ("forest 12", "forest 12"),
           ("forest 16", "forest 16")]
for label, key in _PASSES:
    cells = " | ".join(
        f"{{=w(H100_HEAD, 'runs.0.forward.{m} {key} @512.ms'):.2f}} / "
        f"{{=w(H100_DSBD, 'runs.0.forward.{m} {key} @512.ms'):.2f}}"
        for m in ("target", "draft", "head"))
    add(ACCEL_MD, H100_DSBD, f"| {label} | {cells} |")
for label, method in [("beam sampling W=4", "beam_sample_W4"),
                      ("DSBD g2 / W_S 4 / t 0.7 / W_min 2, 0.5B draft", "dsbd_g2_WS4_t0.7_Wmin2"),
                      ("the same DSBD, the head as its draft", "dsbd_g2_WS4_t0.7_Wmin2_head")]:
    bold = "**" if method.endswith("_head") else ""
    add(ACCEL_MD, H100_DSBD, f"| {label} | {{ms_per_iteration:.2f}} | "
        f"{{forward_ms_per_iteration:.2f}} | {bold}{{=100 * v('overhead_share'):.0f}} %{bold} |",
        at=f"runs.0.decoders.1.{method}")

# the H200 runs (docs/results/accelerators.md) ------------------------------------------------
_K = "programs."
_DS, _DH, _BW = "dsbd_g2_WS4_t0.7_Wmin2", "dsbd_g2_WS4_t0.7_Wmin2_head", "beam_sample_W4"
_H200_BW = 4.8e12   # the H200's HBM3e bandwidth by its data sheet (not measured)


def kern(method: str, key: str):
    """A figure of one decoder program in the H200 kernel counts."""
    return resolve(load(H200_KERNELS), f"programs.{method}.{key}")


HELPERS.update(kern=kern, _H200_BW=_H200_BW)
add(ACCEL_MD, H200,
    "**GPU (one NVIDIA H200, jax 0.11.2, the same shapes and settings):** DSBD costs "
    "{runs.0.decoders.1.dsbd_g2_WS4_t0.7_Wmin2.ms_per_iteration:.2f} ms per iteration against beam "
    "sampling W=4's {runs.0.decoders.1.beam_sample_W4.ms_per_iteration:.2f}, and launches "
    "{=kern(_DS, 'launches_per_iteration'):d} kernels per iteration against "
    "{=kern(_BW, 'launches_per_iteration'):d}",
    "the target's one-token pass is {=v(_FWD + 'target 1 token @512.ms') / "
    "(v('runs.0.param_bytes.target') / _H200_BW * 1e3):.1f}x its bandwidth floor",
    "one-token pass of the target is {=span(w(f, _FWD + 'target 1 token @512.ms') for f in "
    "H200_RUNS):.2f} ms in the three runs. Its {=v('runs.0.param_bytes.target') / 1e9:.2f} GB "
    "stream in {=v('runs.0.param_bytes.target') / _H200_BW * 1e3:.2f} ms at the card's 4.8 TB/s",
    "{=w(H200_KERNELS, 'programs.beam_sample_W4.by_phase.target forward'):d} kernels a pass "
    "({=w(H200_KERNELS, 'programs.beam_sample_W4.by_phase.target forward') / 28:.1f} per layer)",
    "{=v(_DEC + 'beam_sample_W4.ms_per_iteration') / kern(_BW, 'launches_per_iteration') * 1e3"
    ":.1f} µs per kernel for beam sampling, "
    "{=v(_DEC + 'dsbd_g2_WS4_t0.7_Wmin2.ms_per_iteration') / kern(_DS, 'launches_per_iteration') "
    "* 1e3:.1f} µs for DSBD",
    "DSBD's two passes of the 0.5B draft launch {=w(H200_KERNELS, 'programs.' + _DS + "
    "'.by_phase.draft forward'):d} kernels, more than the target's forest pass "
    "({=w(H200_KERNELS, 'programs.' + _DS + '.by_phase.target forward'):d}), and its one-token pass "
    "costs {runs.0.head_vs_target.draft:.2f}x the target's",
    "Outside the passes DSBD launches {=kern(_DS, 'outside_passes'):d} kernels, "
    "{=kern(_DS, 'outside_vs_beam_sample'):.1f}x beam sampling's "
    "{=kern(_BW, 'outside_passes'):d}; {=kern(_DS, 'single_block_outside_passes'):d} of them run "
    "one block of threads",
    "{=kern(_DS, 'command_buffers_per_iteration'):d} command buffers per DSBD iteration",
    "the loops in command buffers too (`--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL`) "
    "DSBD took {=w(H200_RUNS[2], _DEC + 'dsbd_g2_WS4_t0.7_Wmin2.ms_per_iteration'):.2f} ms per "
    "iteration against {=w(H200_RUNS[1], _DEC + 'dsbd_g2_WS4_t0.7_Wmin2.ms_per_iteration'):.2f} "
    "in the run before it with the default flags, beam sampling W=4 "
    "{=w(H200_RUNS[2], _DEC + 'beam_sample_W4.ms_per_iteration'):.2f} against "
    "{=w(H200_RUNS[1], _DEC + 'beam_sample_W4.ms_per_iteration'):.2f}",
    "DSBD with the 0.5B draft would run at {runs.0.projection.batch 1.dsbd_g2_WS4_t0.7_Wmin2."
    "projected_ratio_to_beam_W4:.2f}x beam sampling W=4 ({runs.0.projection.tokens_per_iteration."
    "dsbd_g2_WS4_t0.7_Wmin2:.2f} tokens per iteration",
    "with the head {runs.0.projection.batch 1.dsbd_g2_WS4_t0.7_Wmin2_head."
    "projected_ratio_to_beam_W4:.2f}x ({runs.0.projection.tokens_per_iteration."
    "dsbd_g2_WS4_t0.7_Wmin2_head:.2f}), or "
    "{=w(TERMS2, 'batches.b1.drafts.head.dsbd_beamW4_point.tokens_per_iteration') * "
    "v(_DEC + 'beam_sample_W4.ms_per_iteration') / v(_DEC + 'dsbd_g2_WS4_t0.7_Wmin2_head."
    "ms_per_iteration'):.2f}x with the current head's "
    "{=w(TERMS2, 'batches.b1.drafts.head.dsbd_beamW4_point.tokens_per_iteration'):.2f}",
    "the work outside the passes is {=100 * v(_DEC + 'dsbd_g2_WS4_t0.7_Wmin2.overhead_share'):.0f} "
    "% of DSBD's iteration (target at most 15 %)",
    "the target's one-token pass is {=v(_FWD + 'target 1 token @512.ms') / "
    "(v('runs.0.param_bytes.target') / _H200_BW * 1e3):.1f}x its bandwidth floor (target",
    "the projection is {runs.0.projection.batch 1.dsbd_g2_WS4_t0.7_Wmin2."
    "projected_ratio_to_beam_W4:.2f}x beam sampling W=4 (target",
    "DSBD breaks even with beam sampling W=4 at "
    "{=v(_DEC + 'dsbd_g2_WS4_t0.7_Wmin2.ms_per_iteration') / "
    "v(_DEC + 'beam_sample_W4.ms_per_iteration'):.2f} tokens per iteration with the 0.5B draft and "
    "{=v(_DEC + 'dsbd_g2_WS4_t0.7_Wmin2_head.ms_per_iteration') / "
    "v(_DEC + 'beam_sample_W4.ms_per_iteration'):.2f} with the head")
for label, method in [("beam sampling W=4", "beam_sample_W4"),
                      ("DSBD, 0.5B draft", "dsbd_g2_WS4_t0.7_Wmin2"),
                      ("DSBD, the head as its draft", "dsbd_g2_WS4_t0.7_Wmin2_head")]:
    add(ACCEL_MD, H200, f"| {label} | {{ms_per_iteration:.2f}} | {{forward_ms_per_iteration:.2f}} "
        f"| {{=100 * v('overhead_share'):.0f}} % | {{=kern('{method}', 'launches_per_iteration'):d}}"
        f" | {{=kern('{method}', 'in_passes'):d}} | {{=kern('{method}', 'outside_passes'):d}} | "
        f"{{=kern('{method}', 'single_block_outside_passes'):d}} |",
        at=f"runs.0.decoders.1.{method}")

H200_AGAIN = "results/gpu/NVIDIA_H200_again.json"   # the benchmark again, the fused change's code
H200_AGAIN_KERNELS = "results/gpu/NVIDIA_H200_again_kernels.json"
for label, method, prog in [("beam sampling W=4", _BW, "beam_sample"),
                            ("DSBD, 0.5B draft", _DS, "dsbd (forward_L24_d896)"),
                            ("DSBD, the head as its draft", _DH, "dsbd (draft_head_d1536)")]:
    add(ACCEL_MD, H200_AGAIN, f"| {label} | {{ms_per_iteration:.2f}} | "
        f"{{forward_ms_per_iteration:.2f}} | {{=100 * v('overhead_share'):.0f}} % | "
        f"{{=w(H200_AGAIN_KERNELS, 'programs.{prog}.launches_per_iteration'):d}} |",
        at=f"runs.0.decoders.1.{method}")
add(ACCEL_MD, H200_AGAIN,
    "the times moved by {=100 * min(abs(v(_DEC + m + '.ms_per_iteration') / w(H200, _DEC + m + "
    "'.ms_per_iteration') - 1) for m in (_BW, _DS, _DH)):.0f}-{=100 * max(abs(v(_DEC + m + "
    "'.ms_per_iteration') / w(H200, _DEC + m + '.ms_per_iteration') - 1) for m in (_BW, _DS, _DH))"
    ":.0f} % (the target's one-token pass {=v(_FWD + 'target 1 token @512.ms'):.2f} ms)",
    "The projection with the CPU's {runs.0.projection.tokens_per_iteration.dsbd_g2_WS4_t0.7_Wmin2"
    ":.2f} tokens per iteration is {runs.0.projection.batch 1.dsbd_g2_WS4_t0.7_Wmin2."
    "projected_ratio_to_beam_W4:.2f}x beam sampling W=4",
    "ran {=min(r['fused_over_separate'] for r in w(FUSED_H200, 'rows')):.2f}x to "
    "{=max(r['fused_over_separate'] for r in w(FUSED_H200, 'rows')):.2f}x the separate products'")
add(ACCEL_MD, FUSED_H200,
    "fused q/k/v and gate/up products ran\n  {=min(r['fused_over_separate'] for r in v('rows')):.2f}-"
    "{=max(r['fused_over_separate'] for r in v('rows')):.2f}x the separate ones' time there")
add(ACCEL_MD, H200_AGAIN, "the same kernel counts and times within "
    "{=100 * max(abs(v(_DEC + m + '.ms_per_iteration') / w(H200, _DEC + m + "
    "'.ms_per_iteration') - 1) for m in (_BW, _DS, _DH)):.0f} %")
HELPERS.update(H200=H200, H200_AGAIN_KERNELS=H200_AGAIN_KERNELS)

# docs/results/draft.md -----------------------------------------------------------------------
_B = "batches.b1.drafts.base."
_H = "batches.b1.drafts.head."
_T = "batches.b1.drafts.base.targets."
add(DRAFT_MD, TERMS,
    "speculative / sampling {targets.speculative_vs_sample:.1f}x, single-beam DSBD / speculative "
    "{targets.single_beam_vs_speculative:.2f}x, DSBD at the beam-W4 point / beam W=4 "
    "{targets.dsbd_w4_vs_beam_w4:.1f}x",
    "| speculative / sampling ({targets.speculative_vs_sample:.1f}x) | speculative_g4 | "
    "{=v(_T + 'speculative_vs_sample.speculative_g4.end_to_end'):.2f}x | "
    "{=v(_T + 'speculative_vs_sample.speculative_g4.decode'):.2f}x | "
    "free_draft {=v(_T + 'speculative_vs_sample.speculative_g4.free_draft'):.2f}x, "
    "one_row_target {=v(_T + 'speculative_vs_sample.speculative_g4.one_row_target'):.2f}x, "
    "all_accepted {=v(_T + 'speculative_vs_sample.speculative_g4.all_accepted'):.2f}x | "
    "free_draft, one_row_target, all_accepted |",
    "| DSBD at the beam-W4 point / beam W = 4 ({targets.dsbd_w4_vs_beam_w4:.1f}x) | "
    "dsbd_beamW4_point | {=v(_T + 'dsbd_w4_vs_beam_w4.dsbd_beamW4_point.end_to_end'):.2f}x | "
    "{=v(_T + 'dsbd_w4_vs_beam_w4.dsbd_beamW4_point.decode'):.2f}x | "
    "free_draft {=v(_T + 'dsbd_w4_vs_beam_w4.dsbd_beamW4_point.free_draft'):.2f}x, "
    "one_row_target {=v(_T + 'dsbd_w4_vs_beam_w4.dsbd_beamW4_point.one_row_target'):.2f}x, "
    "all_accepted {=v(_T + 'dsbd_w4_vs_beam_w4.dsbd_beamW4_point.all_accepted'):.2f}x | "
    "none alone |",
    "| single-beam DSBD / speculative ({targets.single_beam_vs_speculative:.2f}x) | speculative_g4 "
    "| {=v(_T + 'single_beam_vs_speculative.speculative_g4.end_to_end'):.2f}x | "
    "{=v(_T + 'single_beam_vs_speculative.speculative_g4.decode'):.2f}x | "
    "same_tokens {=v(_T + 'single_beam_vs_speculative.speculative_g4.same_tokens'):.2f}x, "
    "same_target_pass {=v(_T + 'single_beam_vs_speculative.speculative_g4.same_target_pass'):.2f}x"
    ", same_draft {=v(_T + 'single_beam_vs_speculative.speculative_g4.same_draft'):.2f}x, "
    "same_rest {=v(_T + 'single_beam_vs_speculative.speculative_g4.same_rest'):.2f}x | "
    "none alone |",
    "**Speculative / sampling**: draft passes {=v(_B + 'speculative_g4.draft_passes_ms'):.0f} ms "
    "and the target's 5-row pass {=v(_B + 'speculative_g4.target_passes_ms'):.0f} ms for "
    "{=v(_B + 'speculative_g4.tokens_per_iteration'):.2f} tokens; a free draft, a target pass at "
    "the one-row price or every draft accepted would each alone reach "
    "{targets.speculative_vs_sample:.1f}x.",
    "the 12-node forest pass ({=v(_B + 'dsbd_beamW4_point.target_passes_ms'):.0f} ms, against beam "
    "sampling's {batches.b1.references.beam_sample_W4.target_passes_ms:.0f} ms step) and the "
    "draft's two passes ({=v(_B + 'dsbd_beamW4_point.draft_passes_ms'):.0f} ms) together.",
    "its 10-node forest pass costs {=v(_B + 'dsbd_single_beam.target_passes_ms'):.0f} ms against "
    "speculative sampling's {=v(_B + 'speculative_g4.target_passes_ms'):.0f}.")
# the draft heads section
add(DRAFT_MD, TRAINING,
    "a head of {=v('num_params_own') / 1e6:.1f}M parameters of its own",
    "{=v('log.0.heldout_acceptance_1'):.3f} at the start, {=v('log.6.heldout_acceptance_1'):.3f} "
    "for a first draft token and {=v('log.6.heldout_acceptance_2'):.3f} for a second after "
    "{log.6.step:d} steps ({=v('log.3.heldout_acceptance_1'):.3f} and "
    "{=v('log.3.heldout_acceptance_2'):.3f} at step {log.3.step:d}), still rising "
    "({=v('log.5.heldout_acceptance_1'):.3f} at step {log.5.step:d})",
    "The run took {=v('wall_s') / 60:.0f} minutes at a peak of "
    "{=v('peak_rss_kb') / 1e6:.1f} GB, in two parts: {=v('parts.0.wall_s') / 60:.1f} minutes "
    "for loading the target and its rollouts",
    "then {=v('parts.1.wall_s') / 60:.1f} for loading again, the evaluations and the "
    "{log.6.step:d} steps")
add(DRAFT_MD, TRAINING_EPYC,
    "as a fresh machine does): {=v('wall_s') / 60:.0f} "
    "minutes in one run, at a peak of {=v('peak_rss_kb') / 1e6:.1f} GB, the steps at "
    "{=v('log.6.seconds') / v('log.6.step'):.1f} s each.",
    "the Intel Xeon's within {=heldout_gap(TRAINING_EPYC, TRAINING):.4f} "
    "({=v('log.6.heldout_acceptance_1'):.3f} and "
    "{=v('log.6.heldout_acceptance_2'):.3f} after {log.6.step:d} steps; there "
    "{=w(TRAINING, 'log.6.heldout_acceptance_1'):.3f} and "
    "{=w(TRAINING, 'log.6.heldout_acceptance_2'):.3f})")
_AV = "variants."
add(DRAFT_MD, ABLATION,
    "each for the first {variants.recipe.steps:d} of the recipe's {recipe.train.steps:d} steps",
    "counts each on the same {data.heldout_texts:d} held-out continuations ({data.counted_positions:d}"
    " positions)",
    "the recipe's own data file (the {data.train_texts:d} training",
    "two unrolled steps | {variants.recipe.acceptance_1:.3f} | {variants.recipe.acceptance_2:.3f} | "
    "{variants.recipe.kl_1:.2f} |",
    "(`init: random`) | {variants.random_init.acceptance_1:.3f} | "
    "{variants.random_init.acceptance_2:.3f} | {variants.random_init.kl_1:.2f} |",
    "(`feature_weight: 0`) | {variants.no_feature_loss.acceptance_1:.3f} | "
    "{variants.no_feature_loss.acceptance_2:.3f} | {variants.no_feature_loss.kl_1:.2f} |",
    "(`unroll: 1`) | {variants.one_step.acceptance_1:.3f} | {variants.one_step.acceptance_2:.3f} | "
    "{variants.one_step.kl_1:.2f} |",
    "without it the second token is accepted at {variants.one_step.acceptance_2:.3f}, with it at "
    "{variants.recipe.acceptance_2:.3f}, for {=v(_AV + 'one_step.acceptance_1') - "
    "v(_AV + 'recipe.acceptance_1'):.3f} less on the first.",
    "gives the first token {=v(_AV + 'recipe.acceptance_1') - v(_AV + 'random_init.acceptance_1')"
    ":.3f} more and a lower KL; a random block does better on the second token "
    "({variants.random_init.acceptance_2:.3f}),",
    "first + first x second, gives {=v(_AV + 'recipe.acceptance_1') * (1 + v(_AV + "
    "'recipe.acceptance_2')):.3f} for the recipe and {=v(_AV + 'random_init.acceptance_1') * "
    "(1 + v(_AV + 'random_init.acceptance_2')):.3f} for the random block.",
    "moves each token's acceptance by {=max(abs(v(_AV + 'no_feature_loss.acceptance_1') - "
    "v(_AV + 'recipe.acceptance_1')), abs(v(_AV + 'no_feature_loss.acceptance_2') - "
    "v(_AV + 'recipe.acceptance_2'))):.3f} at most")
add(DRAFT_MD, HELDOUT,
    "| this recipe (`head_qwen`) | {heads.head_qwen.acceptance_1:.3f} | "
    "{heads.head_qwen.acceptance_2:.3f} | {heads.head_qwen.kl_1:.2f} |",
    "| own passes, 122 prompts, 160 steps, former unroll (`head_qwen_own`) | "
    "{heads.head_qwen_own.acceptance_1:.3f} | {heads.head_qwen_own.acceptance_2:.3f} | "
    "{heads.head_qwen_own.kl_1:.2f} |",
    "| rescored, 122 prompts, 160 steps, former unroll (`head_qwen_rescore`) | "
    "{heads.head_qwen_rescore.acceptance_1:.3f} | {heads.head_qwen_rescore.acceptance_2:.3f} | "
    "{heads.head_qwen_rescore.kl_1:.2f} |")
add(DRAFT_MD, ACCEPT,
    "| draft head | **{summary.head.continuation:.3f}** | {summary.head.prompt:.3f} | "
    "{summary.decoded_head:.3f} |",
    "| 0.5B draft model | {summary.draft.continuation:.3f} | {summary.draft.prompt:.3f} | |",
    "The decoder's own count differs from the teacher-forced figure by {=abs(v('summary."
    "decoded_head') - v('summary.head.continuation')):.3f}",
    "The head guesses the GSM8K answers ({prompts.2.head.continuation:.3f} and "
    "{prompts.3.head.continuation:.3f} on the two prompts) better than the HumanEval code "
    "({prompts.0.head.continuation:.3f} and {prompts.1.head.continuation:.3f})")
_H2 = "batches.b1.drafts.head."
_R2 = "batches.b1.references."
add(DRAFT_MD, TERMS2,
    "| target (1.5B) | {batches.b1.one_token_pass_ms.target:.1f} | "
    "{=v('batches.b1.one_token_pass_ms.target') / v('batches.b1.one_token_pass_ms.target'):.0f} |",
    "vocabulary head) | {batches.b1.one_token_pass_ms.head:.1f} | "
    "**{batches.b1.draft_pass_vs_target.head:.3f}** |",
    "| (none) | sampling | {=v(_R2 + 'sample.tokens_per_s'):.2f} | "
    "{=v(_R2 + 'sample.tokens_per_iteration'):.0f} | "
    "{=v(_R2 + 'sample.decode_ms_per_token'):.0f} per token |",
    "| (none) | beam sampling W=4 | {=v(_R2 + 'beam_sample_W4.tokens_per_s'):.2f} | "
    "{=v(_R2 + 'beam_sample_W4.tokens_per_iteration'):.0f} | "
    "{=v(_R2 + 'beam_sample_W4.decode_ms_per_token'):.0f} per token |",
    "four of them take {=v(_H2 + 'speculative_g4.draft_passes_ms'):.0f} ms, less than half of one "
    "target pass",
    "What holds it back is its proposals: {=v(_H2 + 'speculative_g4.tokens_per_iteration'):.2f} "
    "tokens per speculative iteration, {=v(_H2 + 'dsbd_beamW4_point.tokens_per_iteration'):.2f} "
    "per DSBD iteration at the beam-W4 point.",
    "speculative / sampling {=v(_H2 + 'targets.speculative_vs_sample.speculative_g4.end_to_end')"
    ":.2f}x, DSBD / beam sampling W=4 {=v(_H2 + 'targets.dsbd_w4_vs_beam_w4.dsbd_beamW4_point."
    "end_to_end'):.2f}x, single-beam DSBD / speculative {=v(_H2 + 'targets."
    "single_beam_vs_speculative.speculative_g4.end_to_end'):.2f}x.",
    "speculative sampling would decode at {=v(_H2 + 'targets.speculative_vs_sample."
    "speculative_g4.all_accepted'):.2f}x our sampling and DSBD at {=v(_H2 + 'targets."
    "dsbd_w4_vs_beam_w4.dsbd_beamW4_point.all_accepted'):.2f}x beam sampling W=4; free draft "
    "passes alone give {=v(_H2 + 'targets.speculative_vs_sample.speculative_g4.free_draft'):.2f}x "
    "and {=v(_H2 + 'targets.dsbd_w4_vs_beam_w4.dsbd_beamW4_point.free_draft'):.2f}x.",
    "costs {=v(_H2 + 'dsbd_beamW4_point.target_passes_ms') / v('batches.b1.target_one_row_pass_ms')"
    ":.1f}x its one-token pass in float32 "
    "({=span(v(_H2 + m + '.target_passes_ms') for m in ('dsbd_single_beam', "
    "'dsbd_beamW4_point')):.0f} ms against {batches.b1.target_one_row_pass_ms:.0f}; beam "
    "sampling's four rows: {batches.b1.references.beam_sample_W4.target_passes_ms:.0f})")
def _drafted_rows(rel: str, drafts, batch: str = "b1") -> None:
    """The rows ``| draft | method | tok/s | tokens / iteration | draft + target + rest |`` of
    ``benchmarks/draft_terms.py``'s run ``rel`` at ``batch`` for each ``(draft key, label)`` of
    ``drafts``."""
    for draft, label in drafts:
        for name, method in [("speculative, gamma 4", "speculative_g4"),
                             ("single-beam DSBD", "dsbd_single_beam"),
                             ("DSBD at the beam-W4 point", "dsbd_beamW4_point")]:
            rest = load(rel)["batches"][batch]["drafts"][draft][method]["rest_ms"]
            rest_cell = ("+ {rest_ms:.0f}" if rest >= 0 else "- {=-v('rest_ms'):.0f}")
            add(DRAFT_MD, rel, f"| {label} | {name} | {{tokens_per_s:.2f}} | "
                f"{{tokens_per_iteration:.2f}} | {{draft_passes_ms:.0f}} + "
                f"{{target_passes_ms:.0f}} {rest_cell} |",
                at=f"batches.{batch}.drafts.{draft}.{method}")


_drafted_rows(TERMS2, [("head", "head")])

# the head against the 0.5B draft on the AVX512-BF16 host (one run, batch 1 and 4)
_B1 = "batches.b1."
_B4 = "batches.b4."
_TD = "targets.dsbd_w4_vs_beam_w4.dsbd_beamW4_point."
_TS = "targets.speculative_vs_sample.speculative_g4."
add(DRAFT_MD, TERMS_EPYC,
    "| target (1.5B) | {batches.b1.one_token_pass_ms.target:.1f} | "
    "{=v(_B1 + 'one_token_pass_ms.target') / v(_B1 + 'one_token_pass_ms.target'):.0f} |",
    "| 0.5B draft model | {batches.b1.one_token_pass_ms.base:.1f} | "
    "{batches.b1.draft_pass_vs_target.base:.3f} |",
    "| draft head | {batches.b1.one_token_pass_ms.head:.1f} | "
    "**{batches.b1.draft_pass_vs_target.head:.3f}** |",
    "With the head, end to end: speculative / sampling {=v(_B1 + 'drafts.head.' + _TS + "
    "'end_to_end'):.2f}x, DSBD at the beam-W4 point / beam sampling W=4 {=v(_B1 + 'drafts.head.' "
    "+ _TD + 'end_to_end'):.2f}x, single-beam DSBD / speculative {=v(_B1 + 'drafts.head.targets."
    "single_beam_vs_speculative.speculative_g4.end_to_end'):.2f}x; with the 0.5B draft in the "
    "same run {=v(_B1 + 'drafts.base.' + _TS + 'end_to_end'):.2f}x, {=v(_B1 + 'drafts.base.' + _TD "
    "+ 'end_to_end'):.2f}x and {=v(_B1 + 'drafts.base.targets.single_beam_vs_speculative."
    "speculative_g4.end_to_end'):.2f}x.",
    "({=v(_B1 + 'drafts.head.dsbd_beamW4_point.draft_passes_ms'):.0f} ms of a "
    "{=v(_B1 + 'drafts.head.dsbd_beamW4_point.decode_ms_per_iteration'):.0f} ms DSBD iteration, "
    "against the 0.5B draft's {=v(_B1 + 'drafts.base.dsbd_beamW4_point.draft_passes_ms'):.0f} "
    "of {=v(_B1 + 'drafts.base.dsbd_beamW4_point.decode_ms_per_iteration'):.0f})",
    "it proposes {=v(_B1 + 'drafts.head.dsbd_beamW4_point.tokens_per_iteration'):.2f} tokens "
    "per DSBD iteration where the 0.5B draft proposes "
    "{=v(_B1 + 'drafts.base.dsbd_beamW4_point.tokens_per_iteration'):.2f}.",
    "DSBD with the head would decode at {=v(_B1 + 'drafts.head.' + _TD + 'all_accepted'):.2f}x "
    "beam sampling W=4 and speculative sampling at {=v(_B1 + 'drafts.head.' + _TS + "
    "'all_accepted'):.2f}x our sampling; free draft passes alone give {=v(_B1 + 'drafts.head.' + "
    "_TD + 'free_draft'):.2f}x and {=v(_B1 + 'drafts.head.' + _TS + 'free_draft'):.2f}x.",
    "12-node forest pass of the target costs {=v(_B1 + 'drafts.head.dsbd_beamW4_point."
    "target_passes_ms') / v(_B1 + 'target_one_row_pass_ms'):.2f}x its one-token pass here "
    "({=v(_B1 + 'drafts.head.dsbd_beamW4_point.target_passes_ms'):.0f} ms against "
    "{batches.b1.target_one_row_pass_ms:.0f}, with the 0.5B draft's forest "
    "{=v(_B1 + 'drafts.base.dsbd_beamW4_point.target_passes_ms'):.0f} ms)",
    "it gives {=v(_B1 + 'drafts.head.' + _TD + 'end_to_end'):.2f}x here.",
    "with the head, speculative / sampling {=v(_B4 + 'drafts.head.' + _TS + 'end_to_end'):.2f}x "
    "and DSBD / beam sampling W=4 {=v(_B4 + 'drafts.head.' + _TD + 'end_to_end'):.2f}x; with the "
    "0.5B draft {=v(_B4 + 'drafts.base.' + _TS + 'end_to_end'):.2f}x and {=v(_B4 + 'drafts.base.'"
    " + _TD + 'end_to_end'):.2f}x.",
    "free draft passes alone give DSBD with the head {=v(_B4 + 'drafts.head.' + _TD + "
    "'free_draft'):.2f}x beam sampling W=4 (decode). The target's pass over four 12-node forests "
    "takes {=v(_B4 + 'drafts.head.dsbd_beamW4_point.target_passes_ms'):.0f} ms, "
    "{=v(_B4 + 'drafts.head.dsbd_beamW4_point.target_passes_ms') / v(_B4 + "
    "'target_one_row_pass_ms'):.2f}x its pass over four rows of one token "
    "({batches.b4.target_one_row_pass_ms:.0f} ms), and beam sampling's own pass over its 16 rows "
    "takes {batches.b4.references.beam_sample_W4.target_passes_ms:.0f} ms",
    "with every draft accepted DSBD with the head would still decode at only "
    "{=v(_B4 + 'drafts.head.' + _TD + 'all_accepted'):.2f}x.")
for _b in ("b1", "b4"):
    for _name, _method in (("sampling", "sample"), ("beam sampling W=4", "beam_sample_W4")):
        add(DRAFT_MD, TERMS_EPYC, f"| (none) | {_name} | {{tokens_per_s:.2f}} | "
            "{tokens_per_iteration:.0f} | {decode_ms_per_token:.0f} per token |",
            at=f"batches.{_b}.references.{_method}")
    _drafted_rows(TERMS_EPYC, [("base", "0.5B draft"), ("head", "head")], _b)

# docs/draft_tools.md -------------------------------------------------------------------------
add(DRAFT_TOOLS_MD, TERMS,
    "the 0.5B draft's one-token pass costs {batches.b1.draft_pass_vs_target.base:.2f}x the 1.5B "
    "target's on two CPU cores")

add(DRAFT_MD, HEAD_DATA,
    "(`own_passes`) takes {own_passes_over_rescore:.2f}x the time",
    "results/head_data_speed.json`, same host, quiet: {seconds.own_passes.second_run_s:.0f} s "
    "against {seconds.rescore.second_run_s:.0f} s)")
add(DRAFT_TOOLS_MD, HEAD_DATA,
    "and `own_passes` takes {own_passes_over_rescore:.2f}x the time of `rescore`")

# docs/cli.md ---------------------------------------------------------------------------------
add(CLI_MD, CLI,
    "in seconds: {seconds.refusal_generate:.1f} s\nfor `generate` and "
    "{seconds.refusal_bench:.1f} s for `bench`",
    "ends after {seconds.first_token_warm:.1f} s on the 2-core Intel Xeon above")
add(CLI_MD, SPEED,
    "our sampling and beam sampling W=4 run at {ratios.tokens_per_s: sample: dsbd_jax / "
    "transformers:.2f}x and {ratios.tokens_per_s: beam_sample_W4: dsbd_jax / transformers:.2f}x "
    "transformers' speed end to end, and DSBD (g2, W_S 4, t 0.7, W_min 2) at "
    "{ratios.tokens_per_s: dsbd_g2_WS4_t0.7_Wmin2 / beam_sample_W4 (ours):.2f}x our beam sampling "
    "W=4")

# --- what the completeness check finds that is not a measurement of the current code --------
# (page or "*" for every page, the exact text that holds the figures, why; "table:" before the
# text: the whole table that holds it)
ALLOWED = [
    ("docs/results/speed.md", "the issue's 1.5x", "the int8 issue's target for DSBD, a setting"),
    ("docs/results/speed.md", "the int8 target at 0.5x llama.cpp's", "the int8 issue's "
     "moonshot, a setting"),
    ("docs/results/speed.md", "the int8 issue asks 1.4x and 2x", "the int8 issue's targets for "
     "an int8 target, settings"),
    ("docs/results/precision.md", "far from the issue's 1.5x", "the int8 issue's target, a setting"),
    ("docs/results/precision.md", "have reached 1.5x in decode", "the same target, a setting"),
    ("docs/results/draft.md", "the 1.3x of the hosts where the head issue asks DSBD with a head "
     "for 1.5x", "the head issue's host condition and target, settings"),
    ("*", "1.5-1.9x", "the paper's published speed-up (Qin et al., AAAI 2025)"),
    ("docs/results/quality.md", "1.36x / 1.70x", "the paper's published figures (its Table 1)"),
    ("docs/results/quality.md", "table:| paper, SQuAD EM | 74 | 75 | 86 | 0.98x |",
     "the paper's Table 2, copied"),
    ("docs/results/quality.md", "table:| paper, Llama-2-13B, L40 |", "the paper's Table 1, copied"),
    ("docs/results/quality.md", "8-190x smaller", "the paper's model sizes, a size ratio"),
    ("README.md", "drafts 10-200x smaller", "the paper's model sizes, a size ratio"),
    ("docs/results/quality.md", "a 3x size ratio", "parameter counts of the pair, a size ratio"),
    ("docs/loading.md", "(~8x)", "parameter counts of a model pair, a size ratio"),
    ("docs/loading.md", "(~3x)", "parameter counts of a model pair, a size ratio"),
    ("docs/loading.md", "(~13x)", "parameter counts of a model pair, a size ratio"),
    ("docs/loading.md", "(~3.7x)", "parameter counts of a model pair, a size ratio"),
    ("docs/results/draft.md", "0.78x the full draft's pass is the floor if time were bytes",
     "a bound computed from parameter counts, not a timing"),
    ("docs/dsbd.md", "1.3x", "the node budget's rule (forest_budget.FREE), a setting"),
    ("docs/performance.md", "1.3x", "the node budget's rule (forest_budget.FREE), a setting"),
    ("docs/performance.md", "at most 3x", "the accelerator issue's target for the counts, a setting"),
    ("docs/results/accelerators.md", "(target at most 1.6x)",
     "the accelerator issue's target for the pass, a setting"),
    ("docs/results/accelerators.md", "(target at least 1.5x)",
     "the accelerator issue's target for the projection, a setting"),
    ("docs/results/speed.md", "1.3x", "the node budget's rule (forest_budget.FREE), a setting"),
    ("docs/results/accelerators.md", "table:| tests/decoding | 95 |",
     "test counts of one run of the suite under jax 0.11.2 (scripts/jax011_check.sh), not a "
     "timing"),
]

# decoder settings in table cells (gamma 4, W_S 4, t 0.7, W_min 2, W=4, tree (2, 2)): settings,
# not measurements
SETTING = re.compile(r"\b(?:gamma|W_S|W_min|W =|W=|t) ?\d+(?:\.\d+)?|\(\d+, \d+\)")

# the data size and the fused layers, all 120 steps (docs/results/draft.md)
add(DRAFT_MD, ABLATION2,
    "| the recipe | {variants.recipe.train_texts:d} ({variants.recipe.train_positions:d}) | "
    "{variants.recipe.acceptance_1:.3f} | {variants.recipe.acceptance_2:.3f} | "
    "{variants.recipe.kl_1:.2f} |",
    "| every second text (`half_data`) | {variants.half_data.train_texts:d} "
    "({variants.half_data.train_positions:d}) | {variants.half_data.acceptance_1:.3f} | "
    "{variants.half_data.acceptance_2:.3f} | {variants.half_data.kl_1:.2f} |",
    "| layers {=v(_AV + 'fused_layers.feature_layers')[0]:d}, "
    "{=v(_AV + 'fused_layers.feature_layers')[1]:d} and "
    "{=v(_AV + 'fused_layers.feature_layers')[2]:d} fused, not the final hidden state "
    "(`fused_layers`) | {variants.fused_layers.train_texts:d} "
    "({variants.fused_layers.train_positions:d}) | {variants.fused_layers.acceptance_1:.3f} | "
    "{variants.fused_layers.acceptance_2:.3f} | {variants.fused_layers.kl_1:.2f} |",
    "Twice the data gives the first draft token {=v(_AV + 'recipe.acceptance_1') - "
    "v(_AV + 'half_data.acceptance_1'):.3f} and the second {=v(_AV + 'recipe.acceptance_2') - "
    "v(_AV + 'half_data.acceptance_2'):.3f};",
    "(training acceptance {=v(_AV + 'half_data.log')[-1]['acceptance_1']:.3f} against "
    "{=v(_AV + 'recipe.log')[-1]['acceptance_1']:.3f})",
    "is {=v(_AV + 'recipe.acceptance_1') - v(_AV + 'fused_layers.acceptance_1'):.3f} below the "
    "recipe at {variants.recipe.steps:d} steps")
add(DRAFT_MD, ABLATION3,
    "| five times the steps (`longer`) | {variants.longer.train_texts:d} "
    "({variants.longer.train_positions:d}) | {variants.longer.steps:d} | "
    "{variants.longer.acceptance_1:.3f} | {variants.longer.acceptance_2:.3f} | "
    "{variants.longer.kl_1:.2f} |",
    "| and 400 worked answers (`more_text`) | {variants.more_text.train_texts:d} "
    "({variants.more_text.train_positions:d}) | {variants.more_text.steps:d} | "
    "{variants.more_text.acceptance_1:.3f} | {variants.more_text.acceptance_2:.3f} | "
    "{variants.more_text.kl_1:.2f} |",
    "(training acceptance {=v(_AV + 'longer.log')[-1]['acceptance_1']:.3f}",
    "`longer`'s 600 steps took {=v(_AV + 'longer.log')[-1]['seconds'] / 60:.0f} minutes",
    "{=v(_AV + 'more_text.train_positions') / v(_AV + 'longer.train_positions'):.1f} times the "
    "counted positions",
    "gives the first draft token {=v(_AV + 'longer.acceptance_1') - _recipe120('acceptance_1')"
    ":.3f} and the second {=v(_AV + 'longer.acceptance_2') - _recipe120('acceptance_2'):.3f},",
    "give the first token another {=v(_AV + 'more_text.acceptance_1') - "
    "v(_AV + 'longer.acceptance_1'):.3f} and the second {=v(_AV + 'longer.acceptance_2') - "
    "v(_AV + 'more_text.acceptance_2'):.3f} less.")
add(DRAFT_MD, ABLATION2,
    "| the recipe (the table above) | {variants.recipe.train_texts:d} "
    "({variants.recipe.train_positions:d}) | {variants.recipe.steps:d} | "
    "{variants.recipe.acceptance_1:.3f} | {variants.recipe.acceptance_2:.3f} | "
    "{variants.recipe.kl_1:.2f} |")
add(DRAFT_MD, TERMS_MORE,
    "Its pass costs {batches.b1.draft_pass_vs_target.head:.3f}x the target's one-token pass. It "
    "proposes {=v(_B1 + 'drafts.head.dsbd_beamW4_point.tokens_per_iteration'):.2f} tokens per "
    "DSBD iteration at the beam-W4 point and "
    "{=v(_B1 + 'drafts.head.speculative_g4.tokens_per_iteration'):.2f} per speculative "
    "iteration.",
    "beam-W4 point / beam sampling W=4 {=v(_B1 + 'drafts.head.' + _TD + 'end_to_end'):.2f}x, "
    "speculative / sampling {=v(_B1 + 'drafts.head.' + _TS + 'end_to_end'):.2f}x, single-beam "
    "DSBD / speculative {=v(_B1 + 'drafts.head.targets.single_beam_vs_speculative."
    "speculative_g4.end_to_end'):.2f}x; with every draft accepted, "
    "{=v(_B1 + 'drafts.head.' + _TD + 'all_accepted'):.2f}x and "
    "{=v(_B1 + 'drafts.head.' + _TS + 'all_accepted'):.2f}x.")
add(DRAFT_MD, TERMS_EPYC,
    "The recipe's head measured {=v(_B1 + 'drafts.head.' + _TD + 'end_to_end'):.2f}x, "
    "{=v(_B1 + 'drafts.head.' + _TS + 'end_to_end'):.2f}x and {=v(_B1 + 'drafts.head.targets."
    "single_beam_vs_speculative.speculative_g4.end_to_end'):.2f}x in its own run below")
add(README, ABLATION3,
    "held-out acceptance from {=_recipe120('acceptance_1'):.3f} to "
    "{variants.more_text.acceptance_1:.3f}")
add(README, TERMS_MORE,
    "to {=v(_B1 + 'drafts.head.' + _TD + 'end_to_end'):.2f}x beam sampling W=4 at batch 1")
add(SPEED_MD, GATHER_EPYC,
    "--rounds 1 --out results/embed_gather_epyc.json`, {=v('wall_s') / 60:.0f} minutes), gathering "
    "the rows as bits takes {=v('ratios.dsbd_g2_WS4_t0.7_Wmin2: rows_as_bits / plain_lookup, "
    "seconds'):.3f}x the time of the plain lookup for DSBD and {=v('ratios.speculative_g4: "
    "rows_as_bits / plain_lookup, seconds'):.3f}x for speculative sampling")

GATHER_BARRIER = "results/embed_gather_barrier_avx512bf16_epyc.json"
add(SPEED_MD, GATHER_BARRIER,
    "results/embed_gather_barrier_avx512bf16_epyc.json`, {=v('wall_s') / 60:.0f} minutes, the AMD "
    "EPYC host with AVX512-BF16), the barrier takes {=v('ratios.dsbd_g2_WS4_t0.7_Wmin2: "
    "rows_as_bits / bits_hoisted, seconds'):.3f}x the time of the hoisted bits for DSBD g2 / W_S 4 "
    "/ t 0.7 / W_min 2 and {=v('ratios.speculative_g4: rows_as_bits / bits_hoisted, seconds'):.3f}x "
    "for speculative sampling g4, prompt passes included; the programs with the barrier hold no "
    "whole-table copy, those without it {=len(v('runs.0.decoders.dsbd_g2_WS4_t0.7_Wmin2."
    "table_copies')):d} each.")

# the node budget (docs/results/speed.md, docs/performance.md) --------------------------------
_NODES = ("12", "16", "24", "32", "48", "64")
add(SPEED_MD, FOREST_EPYC,
    "results/forest_budget_epyc.json`, {=v('wall_s') / 60:.0f} minutes)",
    *[f"| {dt} | " + " | ".join(f"{{curve.{dt}.over_one_token.{n}:.2f}}x" for n in _NODES) + " |"
      for dt in ("float32", "bfloat16")],
    "| bfloat16, the probe (4 of 28 blocks) | "
    + " | ".join(f"{{probe.bfloat16.over_one_token.{n}:.2f}}x" for n in _NODES) + " |",
    "is within {=100 * probe_gap(FOREST_EPYC) + 0.5:.0f} % of the whole pass's",
    "a 16-node pass costs less than a 12-node one on this host ({curve.float32.ms.16:.0f} against "
    "{curve.float32.ms.12:.0f} ms)",
    "(beam sampling W=4: {decoders.beam_W4.loglik_per_token:.3f}.)")
for _src, _budgets in ((FOREST_EPYC, ("off", "16", "24", "48")),
                       (FOREST_EPYC_DM, ("off", "24", "48"))):
    for _b in _budgets:
        _k = f"decoders.dsbd_w4_budget_{_b}"
        add(SPEED_MD, _src,
            f"| {'none (12 nodes)' if _b == 'off' else _b} | {{{_k}.layer_width:d}} | "
            f"{{{_k}.vs_beam_W4:.3f}}x | {{{_k}.tokens_per_target_call:.2f}} | "
            f"{{{_k}.loglik_per_token:.3f}} |")
add(SPEED_MD, FOREST_EPYC_NR,
    "DSBD with the head took {decoders.dsbd_w4_budget_off.tokens_per_target_call:.2f} tokens per "
    "target pass with 12 nodes and {decoders.dsbd_w4_budget_24.tokens_per_target_call:.2f} with "
    "24, at {decoders.dsbd_w4_budget_off.vs_beam_W4:.3f}x and {decoders.dsbd_w4_budget_24."
    "vs_beam_W4:.3f}x beam sampling")
add("docs/performance.md", FOREST_EPYC,
    "a 12-node forest of the 1.5B target costs {curve.bfloat16.over_one_token.12:.2f}x a token in "
    "bfloat16 and {curve.float32.over_one_token.12:.2f}x in float32")

# docs/results/cpu.md -------------------------------------------------------------------------
_BLOCKS_ROW = ("| {label} | {{runs.sample.plain.tokens_per_s:.2f}} / {{runs.sample.blocked."
               "tokens_per_s:.2f}} ({{runs.sample.blocked_vs_plain:.2f}}x) | {{runs.beam_sample_W4"
               ".plain.tokens_per_s:.2f}} / {{runs.beam_sample_W4.blocked.tokens_per_s:.2f}} "
               "({{runs.beam_sample_W4.blocked_vs_plain:.2f}}x) |")
for _rel, _label in (("results/kernel_blocks_64_epyc.json", "64 columns | bfloat16"),
                     ("results/kernel_blocks_halves_epyc.json", "halves | bfloat16"),
                     ("results/kernel_blocks_64_float32_epyc.json", "64 columns | float32")):
    add("docs/results/cpu.md", _rel, _BLOCKS_ROW.format(label=_label))


# eight-bit products and drafts on the AVX2-only AMD EPYC host --------------------------------
def int8_over(rel: str, rows, key: str):
    """``ms.int8`` over ``ms.<key>`` at the row indices ``rows`` of ``int8_products.py``'s run."""
    res = load(rel)["results"]
    return [res[i]["ms"]["int8"] / res[i]["ms"][key] for i in rows]


HELPERS.update(int8_over=int8_over, range=range)
_KINDS8 = ("float32 plain", "float32 transposed", "bfloat16 rows")
for _i, _rel in ((i, rel) for rel in (INT8P, INT8P_VNNI) for i in range(6)):  # both hosts
    add(PRECISION_MD, _rel,
        "| {rows:d} | " + " | ".join(f"{{ms.{k}:.1f}}" for k in _KINDS8)
        + " | **{ms.int8:.1f}** | {ms.int8 one-row:.1f} | {ms.int8 eigen_dot:.1f} | "
        "{over_float32.int8:.2f}x / {=v('ms.int8') / v('ms.float32 transposed'):.2f}x / "
        "{over_bfloat16.int8:.2f}x | {rel_rms_vs_float32.int8:.3f} |", at=f"results.{_i}")
add(PRECISION_MD, INT8P,
    "at 2 to 16 rows the int8 products took {=span(int8_over(INT8P, range(1, 5), "
    "'float32 plain')):.2f}x float32's `[in, out]` time and {=span(int8_over(INT8P, range(1, 5), "
    "'bfloat16 rows')):.2f}x bfloat16's; against the transposed float32 kernels this host loads, "
    "{=span(int8_over(INT8P, range(1, 5), 'float32 transposed')):.2f}x.",
    "One row takes a slow path ({results.0.ms.int8 one-row:.0f} ms, "
    "{=v('results.0.ms.int8 one-row') / v('results.0.ms.int8'):.0f}x the padded product).",
    "which made one row {=int8_over(INT8P, [0], 'float32 transposed')[0]:.2f}x the host's "
    "float32 one-row product.",
    "Under `eigen_dot` the same products ran {=span(1 / r for r in int8_over(INT8P, range(5), "
    "'int8 eigen_dot')):.0f}x slower at 1-16 rows")
add(PRECISION_MD, INT8P_VNNI,
    "at 2 to 16 rows it took {=span(int8_over(INT8P_VNNI, range(1, 5), 'float32 plain')):.2f}x "
    "float32's `[in, out]` time and {=span(int8_over(INT8P_VNNI, range(1, 5), "
    "'bfloat16 rows')):.2f}x bfloat16's",
    "One row, padded to two, took {=int8_over(INT8P_VNNI, [0], 'bfloat16 rows')[0]:.2f}x the "
    "bfloat16 product",
    "the int8 chain's 110 MB in {results.0.ms.int8:.1f} ms, the bfloat16 chain's 220 MB in "
    "{results.0.ms.bfloat16 rows:.1f} ms")
add(INDEX_MD, INT8P, "| AMD EPYC (AVX2) | \"AMD EPYC\", AVX2 and FMA only: no AVX512F, no VNNI, "
    "no AVX512-BF16, no AMX | {machine.cpu_count:d} |")
add(README, INT8P,
    "the int8 products took {=span(int8_over(INT8P, range(1, 5), 'float32 plain')):.2f}x float32's "
    "`[in, out]` time and {=span(int8_over(INT8P, range(1, 5), 'bfloat16 rows')):.2f}x bfloat16's "
    "at 2-16 rows")
_I8 = "batches.b1.drafts."
add(README, TERMS_INT8,
    "the int8 draft made speculative sampling {=v(_I8 + 'int8.' + _TS + 'end_to_end'):.2f}x our "
    "sampling ({=v(_I8 + 'base.' + _TS + 'end_to_end'):.2f}x with the float draft) and DSBD at "
    "the beam-W4 point {=v(_I8 + 'int8.' + _TD + 'end_to_end'):.2f}x our beam sampling W=4 "
    "({=v(_I8 + 'base.' + _TD + 'end_to_end'):.2f}x)",
    "The int8 draft's one-token pass still costs {batches.b1.draft_pass_vs_target.int8:.2f}x the "
    "target's (the float draft's {batches.b1.draft_pass_vs_target.base:.2f}x)")
_I8T = "int8_trunc_32768_prompt."
add(README, TERMS_INT8_VNNI,
    "at batch 1 the int8 draft's one-token pass cost {batches.b1.draft_pass_vs_target.int8:.2f}x "
    "the target's (the float draft's {batches.b1.draft_pass_vs_target.base:.2f}x), speculative "
    "sampling ran at **{=v(_I8 + 'int8.' + _TS + 'end_to_end'):.2f}x** our sampling "
    "({=v(_I8 + 'base.' + _TS + 'end_to_end'):.2f}x with the float draft) and DSBD at the "
    "beam-W4 point at **{=v(_I8 + 'int8.' + _TD + 'end_to_end'):.2f}x** our beam sampling W=4 "
    "({=v(_I8 + 'base.' + _TD + 'end_to_end'):.2f}x)",
    "32,768 most frequent tokens and the prompt's, {=v(_I8 + _I8T + _TS + 'end_to_end'):.2f}x "
    "and {=v(_I8 + _I8T + _TD + 'end_to_end'):.2f}x.",
    "At batch 4, DSBD with the int8 draft ran at "
    "{=v('batches.b4.drafts.int8.' + _TD + 'end_to_end'):.2f}x beam sampling W=4 "
    "({=v('batches.b4.drafts.base.' + _TD + 'end_to_end'):.2f}x with the float draft)")
TERMS_INT8_VNNI_EARLIER = "results/draft_terms_int8_avx512bf16_epyc_earlier.json"  # 2026-12-02
_P = _B1 + "drafts.int8.dsbd_beamW4_point."


def _terms_row(label: str) -> str:
    """The speed page's row of one draft_terms run (the int8 draft, batch 1)."""
    return (f"| {label} | {{{_B1}references.sample.tokens_per_s:.2f}} | "
            f"{{{_B1}references.beam_sample_W4.tokens_per_s:.2f}} | {{{_P}tokens_per_s:.2f}} | "
            f"{{=v('{_B1}drafts.int8.{_TD}end_to_end'):.2f}}x | "
            f"{{{_B1}one_token_pass_ms.target:.0f}} / {{{_P}passes_alone_ms.pass2_target_1x12:.0f}}"
            f" / {{{_P}passes_alone_ms.prefill_target:.0f}} ms | {{{_P}draft_passes_ms:.0f}} + "
            f"{{{_P}target_passes_ms:.0f}} + {{{_P}rest_ms:.0f}} ms |")


add("docs/results/speed.md", TERMS_INT8_VNNI_EARLIER, _terms_row("earlier"))
add("docs/results/speed.md", TERMS_INT8_VNNI, _terms_row("now"),
    "passes timed alone ({=v(_P + 'passes_alone_ms.pass2_target_1x12') / w(TERMS_INT8_VNNI_EARLIER, "
    "_P + 'passes_alone_ms.pass2_target_1x12'):.2f}x and {=v(_P + 'passes_alone_ms.prefill_target')"
    " / w(TERMS_INT8_VNNI_EARLIER, _P + 'passes_alone_ms.prefill_target'):.2f}x the earlier times)",
    "the target's 12-node forest cost {=v(_P + 'passes_alone_ms.pass2_target_1x12') / "
    "v(_B1 + 'one_token_pass_ms.target'):.2f}x its one-token pass where the\n  earlier run's cost "
    "{=w(TERMS_INT8_VNNI_EARLIER, _P + 'passes_alone_ms.pass2_target_1x12') / "
    "w(TERMS_INT8_VNNI_EARLIER, _B1 + 'one_token_pass_ms.target'):.2f}x")
TERMS_CODE_NOW = "results/draft_terms_int8_epyc_code_current.json"    # one host, one day:
TERMS_CODE_OLD = "results/draft_terms_int8_epyc_code_20261202.json"   # the code of 97385ee
_DSBD_TPS = _P + "tokens_per_s"
_W4_E2E = _B1 + "drafts.int8." + _TD + "end_to_end"   # DSBD / beam sampling W=4, end to end
add("docs/results/speed.md", TERMS_CODE_NOW, _terms_row("a day later, current code"),
    "at the same speed (within {=abs(1 - w(TERMS_CODE_OLD, _DSBD_TPS) / v(_DSBD_TPS)) * 100 + 0.5"
    ":.0f}%), and at\n  {=w(TERMS_CODE_OLD, _W4_E2E):.2f}x and "
    "{=v(_W4_E2E):.2f}x beam sampling W=4. The same host's run a "
    "day before had given {=w(TERMS_INT8_VNNI, _W4_E2E):.2f}x, "
    "and its\n  one-token target pass timed alone moved from "
    "{=w(TERMS_INT8_VNNI, _B1 + 'one_token_pass_ms.target'):.0f} to "
    "{=v(_B1 + 'one_token_pass_ms.target'):.0f} ms between the two days")
add("docs/results/speed.md", TERMS_CODE_OLD, _terms_row("a day later, code of 2026-12-02"))
FLOOR_INT8 = "results/pass_floor_int8_avx512bf16_epyc.json"   # int8 passes, the VNNI host
_F8 = "results.{m}.{d}.{f}.rows.{n}.{k}"


def _f8(m, d, f, n, k="pass_ms"):
    return "v('" + _F8.format(m=m, d=d, f=f, n=n, k=k) + "')"


add("docs/performance.md", FLOOR_INT8,
    "the 0.5B draft's one-token pass took {" + "=" + _f8("draft", "bfloat16", "int8", 1)
    + ":.1f} ms in int8 against {=" + _f8("draft", "bfloat16", "transposed", 1) + ":.1f} ms in "
    "bfloat16, {=" + _f8("draft", "bfloat16", "int8", 1, "pass_over_floor") + ":.2f}x its int8 "
    "products floor of {=" + _f8("draft", "bfloat16", "int8", 1, "floor_ms") + ":.1f} ms",
    "The target's one-token pass took {=" + _f8("target", "bfloat16", "transposed", 1)
    + ":.1f} ms in bfloat16 ({=" + _f8("target", "bfloat16", "int8", 1) + ":.1f} ms in int8), "
    "so the int8 draft's pass is {=" + _f8("draft", "bfloat16", "int8", 1) + " / "
    + _f8("target", "bfloat16", "transposed", 1) + ":.2f}x the bfloat16 target's",
    "An int8 target's one-token pass took {=" + _f8("target", "bfloat16", "int8", 1) + " / "
    + _f8("target", "bfloat16", "transposed", 1) + ":.2f}x the bfloat16 one's, {="
    + _f8("target", "bfloat16", "int8", 4) + " / " + _f8("target", "bfloat16", "transposed", 4)
    + ":.2f}x at four rows and {=" + _f8("target", "bfloat16", "int8", 12) + " / "
    + _f8("target", "bfloat16", "transposed", 12) + ":.2f}x at a 12-token forest")
INT8P_QWIX = "results/int8_products_qwix_avx512bf16_epyc.json"   # qwix beside the kind


def qwix_over(kind: str, rows):
    """qwix's ``kind`` over the int8 kind at the row indices ``rows`` of the qwix run."""
    res = load(INT8P_QWIX)["results"]
    return [res[i]["ms"][kind] / res[i]["ms"]["int8"] for i in rows]


HELPERS.update(qwix_over=qwix_over)
add(PRECISION_MD, INT8P_QWIX,
    "With the weights stored `[out, in]` it took {=span(qwix_over('qwix int8 [out, in]', "
    "range(1, 5))):.2f}x our kind's time at 2-16 rows, with Flax's `[in, out]` kernels "
    "{=span(qwix_over('qwix int8 [in, out]', range(1, 5))):.2f}x; one row, which qwix does not "
    "pad, {=qwix_over('qwix int8 [out, in]', [0])[0]:.0f}x",
    "took {=span(qwix_over('qwix weight-only', range(1, 5))):.1f}x at 2-16 rows")
CHUNKS = "results/progress_chunks_avx512bf16_epyc.json"   # progress in host-driven chunks
_PC = "methods.{m}.forms.{f}.{k}"
add("docs/cli.md", CHUNKS,
    "DSBD at the beam-W4 point took {" + _PC.format(m="dsbd", f="every_1", k="over_one_program")
    + ":.2f}x the one program's time at `every=1` ({" + _PC.format(m="dsbd", f="every_1",
                                                                    k="ms_per_chunk")
    + ":.0f} ms per chunk) and {" + _PC.format(m="dsbd", f="every_4", k="over_one_program")
    + ":.2f}x at `every=4`; beam sampling W=4 {" + _PC.format(m="beam_sample", f="every_1",
                                                              k="over_one_program")
    + ":.2f}x and {" + _PC.format(m="beam_sample", f="every_4", k="over_one_program")
    + ":.2f}x; the in-loop callback {" + _PC.format(m="dsbd", f="callback", k="over_one_program")
    + ":.2f}x and {" + _PC.format(m="beam_sample", f="callback", k="over_one_program") + ":.2f}x")

# the Intel Xeon host with AMX: int8 products, whole passes, dsbd host ---------------------------
INT8P_AMX = "results/int8_products_amx_xeon.json"
FLOOR_AMX = "results/pass_floor_int8_amx_xeon.json"
DTYPE_RUNS_AMX = "results/dtype_runs_amx_xeon.json"


def host_output(rel: str, pattern: str, model: str = TARGET):
    """The numbers of ``pattern`` (a regular expression with groups) in the first line of
    ``dsbd host``'s recorded output (``dtype_runs.py``'s ``output``) after ``model``'s line."""
    lines = load(rel)["runs"][0]["output"]
    start = next(i for i, ln in enumerate(lines) if ln.startswith(model + " "))
    for ln in lines[start:]:
        m = re.search(pattern, ln)
        if m:
            return [float(g) for g in m.groups()]
    raise KeyError(pattern)


def mlp_ratios(rel: str):
    """int8 over float MLP products at each M, for both models, from ``dsbd host``'s lines."""
    out = []
    for model in (TARGET, DRAFT):
        got = host_output(rel, r"M=1: float ([\d.]+) / int8 ([\d.]+) ms, M=4: float ([\d.]+) / "
                               r"int8 ([\d.]+) ms, M=16: float ([\d.]+) / int8 ([\d.]+) ms", model)
        out += [got[i + 1] / got[i] for i in (0, 2, 4)]
    return out


HELPERS.update(host_output=host_output, mlp_ratios=mlp_ratios, INT8P_AMX=INT8P_AMX,
               FLOOR_AMX=FLOOR_AMX, DTYPE_RUNS_AMX=DTYPE_RUNS_AMX)
for _i in range(6):
    add(PRECISION_MD, INT8P_AMX,
        "| {rows:d} | " + " | ".join(f"{{ms.{k}:.1f}}" for k in _KINDS8)
        + " | **{ms.int8:.1f}** | {ms.int8 one-row:.1f} | {ms.int8 eigen_dot:.1f} | "
        "{over_float32.int8:.2f}x / {=v('ms.int8') / v('ms.float32 transposed'):.2f}x / "
        "{over_bfloat16.int8:.2f}x | {rel_rms_vs_float32.int8:.3f} |", at=f"results.{_i}")
_BF = "results.{}.ms.bfloat16 rows"
_FT = "results.{}.ms.float32 transposed"
add(PRECISION_MD, INT8P_AMX,
    "{results.0.ms.bfloat16 rows:.1f} ms for one row, {results.3.ms.bfloat16 rows:.1f} ms for 12, "
    "  {results.5.ms.bfloat16 rows:.1f} ms for 64 ({=v('" + _BF.format(5) + "') / v('"
    + _BF.format(0) + "'):.1f}x the one-row time for 64 times the rows), where float32's "
    "transposed kernels took {=v('" + _FT.format(3) + "') / v('" + _FT.format(0)
    + "'):.1f}x at 12 rows and {=v('" + _FT.format(5) + "') / v('" + _FT.format(0)
    + "'):.1f}x at 64.",
    "The int8 product keeps {=span(int8_over(INT8P_AMX, range(6), 'bfloat16 rows')):.2f}x "
    "bfloat16's time at every row count",
    "One row still takes the slow path unpadded ({results.0.ms.int8 one-row:.0f} ms)")
_PA = "results.{m}.{d}.{f}.rows.{n}.pass_ms"


def _pa(m, d, f, n):
    return "v('" + _PA.format(m=m, d=d, f=f, n=n) + "')"


for _label, _m, _d, _f in (("1.5B target, bfloat16", "target", "bfloat16", "transposed"),
                           ("1.5B target, float32", "target", "float32", "transposed"),
                           ("1.5B target, int8", "target", "bfloat16", "int8"),
                           ("0.5B draft, bfloat16", "draft", "bfloat16", "transposed"),
                           ("0.5B draft, int8", "draft", "bfloat16", "int8")):
    add(PRECISION_MD, FLOOR_AMX,
        f"| {_label} | " + " | ".join("{=" + _pa(_m, _d, _f, n) + ":.1f}" for n in (1, 4, 12))
        + " | {=" + _pa(_m, _d, _f, 12) + " / " + _pa(_m, _d, _f, 1) + ":.2f}x |")
add(PRECISION_MD, FLOOR_AMX,
    "12-token forest still costs {=" + _pa("target", "bfloat16", "transposed", 12) + " / "
    + _pa("target", "bfloat16", "transposed", 1) + ":.2f}x its token, as on the EPYC.",
    "The int8 draft's one-token pass is {=" + _pa("draft", "bfloat16", "int8", 1) + " / "
    + _pa("target", "bfloat16", "transposed", 1) + ":.2f}x the bfloat16 target's, and an int8 "
    "target's token {=" + _pa("target", "bfloat16", "int8", 1) + " / "
    + _pa("target", "bfloat16", "transposed", 1) + ":.2f}x the bfloat16 one's.")
add(PRECISION_MD, DTYPE_RUNS_AMX,
    "the target's 12-token forest {=probe(TARGET, DTYPE_RUNS_AMX)[0]['bfloat16'][1]:.1f} ms in "
    "bfloat16 against {=probe(TARGET, DTYPE_RUNS_AMX)[0]['float32'][1]:.1f} ms in float32, its "
    "token {=probe(TARGET, DTYPE_RUNS_AMX)[0]['bfloat16'][0]:.1f} against "
    "{=probe(TARGET, DTYPE_RUNS_AMX)[0]['float32'][0]:.1f} ms)",
    "(MLP products {=span(mlp_ratios(DTYPE_RUNS_AMX)):.2f}x the float ones)",
    "a DSBD node budget of {=host_output(DTYPE_RUNS_AMX, r'as a DSBD target: node budget "
    r"(\d+)')[0]:.0f} for the bfloat16 target: forests of 12 / 16 / 24 / 32 nodes cost "
    "{=host_output(DTYPE_RUNS_AMX, r'nodes cost ([\\d.]+) / ([\\d.]+) / ([\\d.]+) / ([\\d.]+) /')[0]"
    ":.2f} / {=host_output(DTYPE_RUNS_AMX, r'nodes cost ([\\d.]+) / ([\\d.]+) / ([\\d.]+) / "
    "([\\d.]+) /')[1]:.2f} / {=host_output(DTYPE_RUNS_AMX, r'nodes cost ([\\d.]+) / ([\\d.]+) / "
    "([\\d.]+) / ([\\d.]+) /')[2]:.2f} / {=host_output(DTYPE_RUNS_AMX, r'nodes cost ([\\d.]+) / "
    "([\\d.]+) / ([\\d.]+) / ([\\d.]+) /')[3]:.2f}x a token in the probe.")
add(INDEX_MD, INT8P_AMX, "| Intel Xeon (AMX) | \"Intel(R) Xeon(R) Processor\", AVX512F, VNNI, "
    "AVX512-BF16, AVX512-FP16 and AMX (tile, BF16, INT8) | {machine.cpu_count:d} |")

# the same host: the drafted decoders end to end, two runs of one command (they disagree)
TERMS_AMX = "results/draft_terms_int8_amx_xeon.json"
TERMS_AMX_EARLIER = "results/draft_terms_int8_amx_xeon_earlier.json"
HELPERS.update(TERMS_AMX_EARLIER=TERMS_AMX_EARLIER)


def terms_row(label: str, batch: str, pass_ms: bool) -> str:
    """A precision-page row of a draft_terms run of the base and int8 drafts at ``batch``
    (``"b1"``): sampling, beam sampling, speculative and DSBD with each draft, DSBD's ratio,
    (the target's one-token pass,) the drafts' passes against the target's."""
    b, dr = f"batches.{batch}.", f"batches.{batch}.drafts.{{d}}."
    return ("| " + label + " | {" + b + "references.sample.tokens_per_s:.2f} | {" + b
            + "references.beam_sample_W4.tokens_per_s:.2f} | "
            + " | ".join(" / ".join("{" + dr.format(d=d) + m + ".tokens_per_s:.2f}"
                                    for d in ("base", "int8"))
                         for m in ("speculative_g4", "dsbd_beamW4_point"))
            + " | " + " / ".join("{" + dr.format(d=d) + "targets.dsbd_w4_vs_beam_w4."
                                 "dsbd_beamW4_point.end_to_end:.2f}x" for d in ("base", "int8"))
            + (" | {" + b + "one_token_pass_ms.target:.1f} ms" if pass_ms else "")
            + " | {" + b + "draft_pass_vs_target.base:.2f}x / {" + b
            + "draft_pass_vs_target.int8:.2f}x |")


for _label, _rel in (("earlier", TERMS_AMX_EARLIER), ("later", TERMS_AMX)):
    add(PRECISION_MD, _rel, terms_row(_label, "b1", True))
TERMS_AMX_B4 = "results/draft_terms_int8_batch4_amx_xeon.json"   # the same host, batch 4
_D4 = _B4 + "drafts.{d}."
add(PRECISION_MD, TERMS_AMX_B4,
    "with the target's one-token pass of the 4 rows ({" + _B4 + "one_token_pass_ms.target:.1f} "
    "ms) timed alone in the run",
    terms_row("4", "b4", False),
    "With the int8 draft speculative sampling ran at {" + _D4.format(d="int8")
    + "targets.speculative_vs_sample.speculative_g4.end_to_end:.2f}x sampling there, and DSBD at "
    "the beam-W4\n  point at {" + _D4.format(d="int8") + "targets.dsbd_w4_vs_beam_w4."
    "dsbd_beamW4_point.end_to_end:.2f}x beam sampling W=4",
    "DSBD's iteration was {" + _D4.format(d="int8") + "dsbd_beamW4_point.decode_ms_per_iteration:.0f}"
    " ms: the\n  draft's passes {" + _D4.format(d="int8") + "dsbd_beamW4_point.draft_passes_ms:.0f},"
    " the target's forest pass over 4 x 12 nodes {" + _D4.format(d="int8")
    + "dsbd_beamW4_point.target_passes_ms:.0f} ({=v('" + _D4.format(d="int8")
    + "dsbd_beamW4_point.target_passes_ms') / v('" + _B4 + "one_token_pass_ms.target'):.1f}x the "
    "4-row token,\n  where beam sampling's 16-row pass cost {" + _B4
    + "references.beam_sample_W4.target_passes_ms:.0f}), and {" + _D4.format(d="int8")
    + "dsbd_beamW4_point.rest_ms:.0f} ms of the rest",
    "(the benchmark's `free_draft` term, {" + _D4.format(d="int8") + "targets.dsbd_w4_vs_beam_w4."
    "dsbd_beamW4_point.free_draft:.2f}x); a target forest\n  priced like beam sampling's own step "
    "would give {" + _D4.format(d="int8") + "targets.dsbd_w4_vs_beam_w4.dsbd_beamW4_point."
    "one_row_target:.2f}x")
add(PRECISION_MD, TERMS_AMX, "the target's one-token pass, timed alone inside each run, took "
    "{=w(TERMS_AMX_EARLIER, 'batches.b1.one_token_pass_ms.target'):.0f} and "
    "{batches.b1.one_token_pass_ms.target:.0f} ms")
SPEED_INT8_TARGET = "results/speed_int8_target_amx_xeon.json"   # float and int8 targets, float32
_TGT = "ours float32 int8 target / ours float32 float target"
_DQ = "dsbd_g2_WS4_t0.7_Wmin2 / beam_sample_W4 (ours)"
_TARGET_ROWS = [  # the table of a --target-weights float int8 run (4 methods, 2 kinds)
    f"| {label} | {{rows.{i}.tokens_per_s:.2f}} ({{rows.{i}.decode_tokens_per_s:.2f}}) | "
    f"{{rows.{i + 4}.tokens_per_s:.2f}} ({{rows.{i + 4}.decode_tokens_per_s:.2f}}) | "
    f"{{ratios.tokens_per_s: {m}: {_TGT}:.2f}}x "
    f"({{ratios.decode_tokens_per_s: {m}: {_TGT}:.2f}}x) |"
    for i, (label, m) in enumerate([
        ("sampling", "sample"), ("beam sampling W=4", "beam_sample_W4"),
        ("speculative sampling g4", "speculative_g4"),
        ("DSBD g2 W_S 4 t 0.7 W_min 2 (the beam-W4 point)", "dsbd_g2_WS4_t0.7_Wmin2")])]
add("docs/results/speed.md", SPEED_INT8_TARGET,
    "(`results/speed_int8_target_amx_xeon.json`, {=v('wall_s') / 60:.0f} minutes, the int8 "
    "target converted before,",
    *_TARGET_ROWS,
    "The int8 target ran sampling at {ratios.tokens_per_s: sample: " + _TGT + ":.2f}x and beam "
    "sampling W=4 at {ratios.tokens_per_s: beam_sample_W4: " + _TGT + ":.2f}x the float32 "
    "target's\nspeed",
    "On the int8 target DSBD ran at {ratios.float32, int8 target: tokens_per_s: " + _DQ + ":.2f}x"
    " its beam sampling W=4 ({ratios.float32, int8 target: decode_tokens_per_s: " + _DQ + ":.2f}x"
    " decode)",
    "speculative sampling at {ratios.float32, int8 target: tokens_per_s: speculative_g4 / "
    "sample:.2f}x its sampling ({ratios.float32, int8 target: decode_tokens_per_s: "
    "speculative_g4 / sample:.2f}x decode)",
    "DSBD ran at {ratios.float32: tokens_per_s: " + _DQ + ":.2f}x beam sampling W=4 "
    "({ratios.float32: decode_tokens_per_s: " + _DQ + ":.2f}x\ndecode) and speculative sampling at {ratios.float32: "
    "tokens_per_s: speculative_g4 / sample:.2f}x sampling ({ratios.float32: decode_tokens_per_s: "
    "speculative_g4 / sample:.2f}x decode)")
add("docs/results/speed.md", SPEED_INT8_TARGET,
    "The prompt pass gains most: {rows.4.prefill_s_per_prompt:.2f} s against "
    "{rows.0.prefill_s_per_prompt:.2f} s\nper prompt")
TARGET_EPYC = "results/speed_int8_target_avx512bf16_epyc.json"   # the same, VNNI and no AMX
add("docs/results/speed.md", TARGET_EPYC,
    "(`results/speed_int8_target_avx512bf16_epyc.json`, {=v('wall_s') / 60:.0f} minutes, both "
    "models converted in the run,",
    *_TARGET_ROWS,
    "Here the int8 target ran sampling at {ratios.tokens_per_s: sample: " + _TGT + ":.2f}x and "
    "beam sampling W=4 at\n  {ratios.tokens_per_s: beam_sample_W4: " + _TGT + ":.2f}x the "
    "float32 target's speed",
    "The int8 target's prompt pass took {rows.4.prefill_s_per_prompt:.2f} s against "
    "{rows.0.prefill_s_per_prompt:.2f} s per prompt, where the\n  AMX host's took "
    "{=w(SPEED_INT8_TARGET, 'rows.4.prefill_s_per_prompt'):.2f} against "
    "{=w(SPEED_INT8_TARGET, 'rows.0.prefill_s_per_prompt'):.2f} s",
    "On the int8 target DSBD ran at {ratios.float32, int8 target: tokens_per_s: " + _DQ + ":.2f}x"
    " its beam sampling W=4 ({ratios.float32, int8 target: decode_tokens_per_s: " + _DQ + ":.2f}x"
    "\n  decode) and speculative sampling at {ratios.float32, int8 target: tokens_per_s: "
    "speculative_g4 / sample:.2f}x its sampling ({ratios.float32, int8 target: "
    "decode_tokens_per_s: speculative_g4 / sample:.2f}x decode); with the float32\n  target, "
    "DSBD at {ratios.float32: tokens_per_s: " + _DQ + ":.2f}x ({ratios.float32: "
    "decode_tokens_per_s: " + _DQ + ":.2f}x) and speculative sampling at {ratios.float32: "
    "tokens_per_s: speculative_g4 / sample:.2f}x\n  ({ratios.float32: decode_tokens_per_s: "
    "speculative_g4 / sample:.2f}x)")
add(README, GAMMA_INT8,
    "command line's default (gamma 3, W_S 3) ran at {=v('rows.5.tokens_per_s') / "
    "v('rows.2.tokens_per_s'):.2f}x our beam sampling W=4 and the beam-W4\npoint at "
    "{=v('rows.7.tokens_per_s') / v('rows.2.tokens_per_s'):.2f}x")
add(README, TARGET_EPYC,
    "in float32 the int8 target ran sampling at {ratios.tokens_per_s: sample: " + _TGT + ":.2f}x "
    "and beam sampling W=4 at {ratios.tokens_per_s: beam_sample_W4: " + _TGT + ":.2f}x\nthe "
    "float32 target's speed")
add(README, SPEED_INT8_TARGET,
    "sampling at {ratios.tokens_per_s: sample: " + _TGT + ":.2f}x and beam sampling W=4 at "
    "{ratios.tokens_per_s: beam_sample_W4: " + _TGT + ":.2f}x the float32 target's speed")
LLAMA_CPP = "results/llama_cpp_amx_xeon.json"   # sampling: ours against llama.cpp, same file
add("docs/results/speed.md", LLAMA_CPP,
    "(Q4_K and Q6_K blocks, {=v('rows.2.gguf_bytes') / 1e9:.1f} GB) with llama.cpp",
    "one after the other in one run (`results/llama_cpp_amx_xeon.json`, quiet, {wall_s:.0f} s in all,",
    *[f"| {label} | {{rows.{i}.prefill_s.0:.2f}} / {{rows.{i}.prefill_s.1:.2f}} | "
      f"{{rows.{i}.tokens_per_s:.2f}} | {{rows.{i}.decode_tokens_per_s:.2f}} | " + (
          f"{bold[0]}{{ratios.tokens_per_s: ours bfloat16 {w} weights / llama.cpp:.2f}}x"
          f"{bold[1]} ({{ratios.decode_tokens_per_s: ours bfloat16 {w} weights / "
          f"llama.cpp:.2f}}x) |" if w else "|")
      for i, (label, w, bold) in enumerate([
          ("ours, float target, bfloat16", "float", ("", "")),
          ("ours, int8 target, bfloat16", "int8", ("**", "**")),
          ("llama.cpp, the GGUF as stored", None, None)])],
    "on\n  the same file and host): {ratios.tokens_per_s: ours bfloat16 int8 weights / "
    "llama.cpp:.2f}x end to end, {ratios.decode_tokens_per_s: ours bfloat16 int8 weights / "
    "llama.cpp:.2f}x in decode")
add(README, LLAMA_CPP,
    "in bfloat16 it sampled at {ratios.tokens_per_s: ours bfloat16 int8 weights / llama.cpp:.2f}x "
    "llama.cpp's speed\non the same GGUF file ({ratios.decode_tokens_per_s: ours bfloat16 int8 "
    "weights / llama.cpp:.2f}x in decode;")
DEMO_F32_AGAIN = "results/demo_memory_float32_amx_xeon_again.json"   # the current code, again
add("docs/getting_started.md", DEMO_F32_AGAIN,
    "first\n  run {runs.0.wall_s:.0f} s, second **{runs.1.wall_s:.0f} s**, with "
    "{=v('runs.1.cache_resident_before_bytes') / 1e9:.2f} of the cache's "
    "{=sum(v('runs.0.cache_bytes').values()) / 1e9:.2f} GB in the page cache before it")

# docs/results/quality.md: the quality run with the int8 draft beside the float32 target --------
QUALITY_INT8 = "results/quality_cpu_int8/report.json"
QUALITY_MD = "docs/results/quality.md"


QUALITY_INT8_TARGET = "results/quality_cpu_int8_target/report.json"   # both models in int8


def qrow(label: str, key: str, run: str = QUALITY_INT8):
    """A figure of a quality run's summary row ``label`` (the report's method labels)."""
    rows = load(run)["summary"]["rows"]
    return resolve(next(r for r in rows if r["label"] == label), key)


def qdiff(a: str, baseline: str, figure: str, key: str, run: str = QUALITY_INT8):
    """A paired difference of a quality run (``a`` minus ``baseline`` on the same problems):
    DSBD's against its baselines, or the yardstick's beam sampling against sampling."""
    doc = load(run)
    return next(d[key] for d in doc["summary"]["quality_differences"] + doc["yardstick"]
                if (d["dsbd"], d["baseline"], d["figure"]) == (a, baseline, figure))


def qagainst(label: str, figure: str, key: str, run: str = QUALITY_INT8_TARGET):
    """A difference of the report's ``--against`` table: setting ``label`` of ``run`` minus the
    same setting of the other run, on the same problems."""
    return next(d[key] for d in load(run)["against"]["differences"]
                if (d["dsbd"], d["figure"]) == (label, figure))


HELPERS.update(qrow=qrow, qdiff=qdiff, qagainst=qagainst)


def _q_interval(call: str, pct: bool, sign: str = "") -> str:
    """``mean [lo, hi]`` of one quality figure: ``call`` is a ``qrow``/``qdiff``/``qagainst``
    call with ``{k}`` where the interval's key goes; ``pct`` prints a fraction in points."""
    scale, fmt = (" * 100", sign + ".1f") if pct else ("", sign + ".3f")
    mean, lo, hi = (f"{{={call.format(k=k)}{scale}:{fmt}}}" for k in ("mean", "lo", "hi"))
    return f"{mean} [{lo}, {hi}]"


def _q_table_row(name: str, label: str, run: str = QUALITY_INT8) -> str:
    """A row of a quality table: task metrics (%) and log-likelihoods with their intervals,
    and target calls per token."""
    def iv(path: str, pct: bool) -> str:
        return _q_interval(f"qrow('{label}', '{path}.{{k}}', '{run}')", pct)
    return (f"| {name} | {iv('task_intervals.humaneval/pass@1', True)} | "
            f"{iv('task_intervals.gsm8k/exact_match', True)} | "
            f"{iv('loglik_by_task.humaneval', False)} | {iv('loglik_by_task.gsm8k', False)} | "
            f"{iv('loglik_by_task.mtbench', False)} | "
            f"{{=qrow('{label}', 'target_calls_per_token', '{run}'):.2f}} |")


def _q_diff(a: str, baseline: str, figure: str, pct: bool, run: str = QUALITY_INT8) -> str:
    """A paired difference with its interval, signed."""
    return _q_interval(f"qdiff('{a}', '{baseline}', '{figure}', '{{k}}', '{run}')", pct,
                       sign="+")


_Q4 = "dsbd g=2 WS=4 t=0.7 Wmin=2"           # the beam-W4 point
_Q3 = "dsbd g=3 WS=3 t=0.9 Wmin=1"           # the cheaper point
_Q1 = "dsbd g=3 WS=3 t=0.9 Wmin=1 single-beam"
Q_ROWS = (("sampling", "sample"), ("beam sampling W=2", "beam W=2"),
          ("beam sampling W=4", "beam W=4"), ("speculative sampling (gamma 4)", "spec g=4"),
          ("**DSBD, the beam-W4 point** (g 2, W_S 4, t 0.7, W_min 2)", _Q4),
          ("DSBD, g 3, W_S 3, t 0.9, W_min 1", _Q3), ("the same, single-beam", _Q1))
Q_DIFFS = [("DSBD beam-W4 point minus beam sampling W=4", _Q4, "beam W=4"),
           ("DSBD beam-W4 point minus sampling", _Q4, "sample"),
           ("DSBD g 3 / W_S 3 minus beam sampling W=4", _Q3, "beam W=4"),
           ("DSBD single-beam minus speculative sampling", _Q1, "spec g=4"),
           ("DSBD single-beam minus sampling", _Q1, "sample"),
           ("the yardstick: beam sampling W=4 minus sampling", "beam W=4", "sample")]
add(QUALITY_MD, QUALITY_INT8,
    *[_q_table_row(name, label) for name, label in Q_ROWS],
    *[f"| {name} | {_q_diff(a, b, 'pooled/task_metric', True)} | "
      f"{_q_diff(a, b, 'humaneval/loglik_per_token', False)} | "
      f"{_q_diff(a, b, 'gsm8k/loglik_per_token', False)} | "
      f"{_q_diff(a, b, 'mtbench/loglik_per_token', False)} |" for name, a, b in Q_DIFFS],
    "({=qrow('sample', 'prompts'):d} prompts per method setting:",
    "DSBD's {=qrow(_Q4, 'target_calls_per_token'):.2f} target calls per token at the beam-W4 "
    "point")
_QT = QUALITY_INT8_TARGET


def _q_against(label: str, figure: str) -> str:
    """The int8 target's run minus the float target's, one setting and task metric, in points."""
    return _q_interval(f"qagainst('{label}', '{figure}', '{{k}}')", True, sign="+")


# the least and the largest pooled difference, int8 target minus float target, over the settings
_QA_RANGE = " to ".join(f"{{={m}(qagainst(l, 'pooled/task_metric', 'mean') for _, l in Q_ROWS) "
                        f"* 100:+.1f}}" for m in ("min", "max"))
add(QUALITY_MD, QUALITY_INT8_TARGET,
    *[_q_table_row(name, label, _QT) for name, label in Q_ROWS],
    *[f"| {name} | {_q_against(label, 'humaneval/pass@1')} | "
      f"{_q_against(label, 'gsm8k/exact_match')} | {_q_against(label, 'pooled/task_metric')} |"
      for name, label in Q_ROWS],
    "from " + _QA_RANGE + " points",
    "(DSBD g 3 / W_S 3, {=qagainst(_Q3, 'pooled/task_metric', 'mean') * 100:+.1f}) favours",
    "DSBD reproduces, moves by " + _q_against("beam W=4", "pooled/task_metric") + " points",
    "beam-W4 point minus beam sampling W=4, paired, is "
    + _q_diff(_Q4, "beam W=4", "humaneval/loglik_per_token", False, _QT) + " on HumanEval and "
    + _q_diff(_Q4, "beam W=4", "gsm8k/loglik_per_token", False, _QT) + " on GSM8K, where\nbeam "
    f"sampling W=4 gains {{=qdiff('beam W=4', 'sample', 'humaneval/loglik_per_token', 'mean', "
    f"'{_QT}'):+.3f}} and {{=qdiff('beam W=4', 'sample', 'gsm8k/loglik_per_token', 'mean', "
    f"'{_QT}'):+.3f}} over sampling; on MT-Bench the beam-W4 point again lands below W=4 ("
    + _q_diff(_Q4, "beam W=4", "mtbench/loglik_per_token", False, _QT) + ")")
add(README, QUALITY_INT8_TARGET,
    "target's, moved by " + _QA_RANGE + " points")
add(README, QUALITY_INT8,
    "log-likelihood per token, paired on the same problems: "
    + _q_diff(_Q4, "beam W=4", "humaneval/loglik_per_token", False) + " on HumanEval and\n"
    + _q_diff(_Q4, "beam W=4", "gsm8k/loglik_per_token", False) + " on GSM8K, where beam "
    "sampling W=4 gains {=qdiff('beam W=4', 'sample', 'humaneval/loglik_per_token', 'mean'):+.3f} "
    "and {=qdiff('beam W=4', 'sample', 'gsm8k/loglik_per_token', 'mean'):+.3f} over sampling")


# --- what benchmarks/render.py renders is not this list's ------------------------------------
# A rendered block (<!-- render:NAME --> ... <!-- /render -->) is made from its JSON by
# `python -m benchmarks.render` and checked by tests/test_rendered_pages.py; the README holds no
# figure outside its rendered blocks. This list keeps the hand-written passages' figures only,
# until the pages' tables are all rendered and it goes.
_RENDERED = re.compile(r"<!-- render:[\w.-]+ -->\n.*?<!-- /render -->", re.S)


def hand_written(text: str) -> str:
    """``text`` with each rendered block blanked (its line breaks kept, so offsets hold)."""
    return _RENDERED.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), text)


def _rendered(entry) -> bool:
    """A table row of a JSON that benchmarks/render.py renders, no longer hand-written."""
    page, source, text, _ = entry
    head = text.split("{", 1)[0].strip()
    full = (ROOT / page).read_text()
    renderer = (ROOT / "benchmarks" / "render.py").read_text()
    return (head.startswith("|") and _RENDERED.search(full) is not None
            and f'"{source}"' in renderer and head not in hand_written(full))


# pages whose every measured figure is rendered (or gone)
_RENDERED_PAGES = (README, SPEED_MD, QUALITY_MD, MEMORY_MD, INDEX_MD, "docs/getting_started.md",
                   "docs/results/cpu.md", ACCEL_MD, DRAFT_MD, PRECISION_MD,
                   "docs/performance.md")
# superseded runs, deleted once no page cited them (git keeps them)
_GONE = ("results/draft_terms_int8_avx512bf16_epyc_earlier.json",
         "results/draft_terms_int8_epyc_code_20261202.json",
         "results/draft_terms_int8_epyc_code_current.json",
         "results/profile_bfloat16_epyc_before_embed_rows.json",
         "results/demo_memory_float32_amx_xeon_again.json",
         "results/pass_floor_epyc_earlier.json",
         "results/embed_gather_epyc.json", "results/profile_float32_host.json")
_GONE_NAMES = [k for k, v in dict(globals()).items() if isinstance(v, str) and v in _GONE]


def _gone(entry) -> bool:
    _, source, text, _ = entry
    return source in _GONE or any(g in text for g in _GONE) or any(
        re.search(rf"\b{n}\b", text) for n in _GONE_NAMES)


FIGURES[:] = [e for e in FIGURES
              if e[0] not in _RENDERED_PAGES and not _rendered(e) and not _gone(e)]
ALLOWED[:] = [a for a in ALLOWED if a[0] == "*" or " ".join(a[1].replace("table:", "").split())
              in " ".join((ROOT / a[0]).read_text().split())]
