"""docs/results/draft.md: draft terms, head training and heads as drafts."""

from __future__ import annotations

import json  # noqa: F401
import re  # noqa: F401

from benchmarks._pages.common import (BEAM_W4_POINT, DEFAULT, MODEL_NAMES, Results,  # noqa: F401
                                      host_class, host_line, method_label, span, span_of,
                                      speed_row, table, x)


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


BLOCKS = {
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
}
