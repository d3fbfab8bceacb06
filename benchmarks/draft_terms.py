"""Which term holds each speed target back, every term timed alone in the same run.

For each draft (``base``, ``trunc_<N>_prompt``, ``distilled``, ``both_<N>_prompt``; the names of
``_drafts.py``) and batch size, on the same prompts (EOS off, top-k 10 / top-p 0.8):

* the decoders end to end (``run_batched``: compiled first, untimed): sampling, beam sampling
  W = 4, speculative sampling at each ``--gammas``, single-beam DSBD (g3 / W_S 3 / t 0.9 /
  W_min 1), DSBD at the beam-W4 log-likelihood point (g2 / W_S 4 / t 0.7 / W_min 2);
* the prompt passes alone (``common.prefill`` of the target and of each draft, the decoders'
  bucket and cache size) and every forward pass an iteration runs, alone (``pass_call``: the
  host's XLA:CPU options, the decoder's shapes from ``_drafts.forward_shapes``);
* from these, per drafted method: decode ms per iteration (end to end minus the prompt passes;
  ``--halves`` also differences a run at N / 2 tokens, which needs no prefill estimate), split
  into draft passes, the target pass and the rest (loop, warps, verification, commits); tokens
  per iteration (summed over the batch's rows, as the baselines' ms per token are); the issue's
  ratio end to end and decode only; and the same decode ratio with one term changed at a time,
  each from measured figures: ``free_draft`` (the draft passes cost nothing),
  ``one_row_target`` (the target's pass costs what the baseline's own step does: one row per
  prompt for sampling, the 4 beams for beam sampling), ``all_accepted`` (every draft or layer
  accepted: ``gamma + 1`` tokens per prompt and iteration, same cost); for single-beam DSBD
  against speculative sampling, each of its terms set to speculative sampling's
  (``same_tokens``, ``same_target_pass``, ``same_draft``, ``same_rest``). A target that a change
  reaches names the term that holds it back; one that no single change reaches is held back by
  more than one.

Ratios (the issue's targets): speculative / sampling (1.6x), single-beam DSBD / speculative with
the same draft (0.95x, against speculative gamma 4 and against the best gamma), DSBD beam-W4
point / beam sampling W = 4 (1.5x). The baselines' decode figure is their own loop's ms per
token, measured in the same run.

    .venv/bin/python -m benchmarks.draft_terms --out results/draft_terms.json   # ~95 min
    .venv/bin/python -m benchmarks.draft_terms --report results/draft_terms.json  # the tables
    # + --distilled runs/distill_qwen_fkl/model: also the distilled drafts
    # a sweep of single-beam forests against speculative sampling (~25 min; results/
    # single_beam_sweep.json): --drafts trunc_32768_prompt --batches 1 --gammas 4 6
    #   --single-beam-settings 3,2,0.9 4,2,0.9 2,2,0.9 2,3,0.9 --methods speculative_g4
    #   speculative_g6 dsbd_single_beam dsbd_single_beam_g3w2t0.9 ... (each variant's name)
    .venv/bin/python -m benchmarks.draft_terms --small --out /tmp/draft_terms.json  # tiny pair
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from pathlib import Path

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TARGETS = {"speculative_vs_sample": 1.6, "single_beam_vs_speculative": 0.95,
           "dsbd_w4_vs_beam_w4": 1.5}
from benchmarks._drafts import SETTINGS  # noqa: E402  (the profile's method settings)

DSBD_SB = SETTINGS["dsbd_sb"][1]
DSBD_W4 = SETTINGS["dsbd_w4"][1]


def prefill_call(config, params, B, P, slots, prompt_len):
    """A zero-argument call of the decoders' prompt pass (``common.prefill``) over ``[B, P]``
    tokens into a cache of ``slots``; a head with prompt rows gets its prompt columns first."""
    import jax.numpy as jnp
    from dsbd_jax.decoding.common import prefill
    from dsbd_jax.models import vocab as mv
    from dsbd_jax.host.cpu_options import tuned_jit
    if mv.has_prompt_rows(params):
        params = mv.with_prompt_rows(params, jnp.ones((B, prompt_len), jnp.int32))
    f = tuned_jit(lambda p, t, n: prefill(config, p, t, n, slots))
    tok = jnp.ones((B, P), jnp.int32)
    lens = jnp.full((B,), prompt_len, jnp.int32)
    return lambda: f(params, tok, lens)


def decode_split(run, prefill_ms, passes_ms):
    """Per-iteration figures of one decoder run: decode ms (end to end minus ``prefill_ms`` per
    call), tokens per iteration, and the split ``passes_ms`` (``{"draft": ms, "target": ms}``
    per iteration) / rest."""
    decode_ms = (1000 * run["seconds"] - run["calls"] * prefill_ms) / run["iterations"]
    out = {"decode_ms_per_iteration": decode_ms,
           "tokens_per_iteration": run["tokens"] / run["iterations"],
           "decode_ms_per_token": decode_ms * run["iterations"] / run["tokens"],
           "prefill_ms_per_call": prefill_ms}
    out.update({f"{k}_passes_ms": v for k, v in passes_ms.items()})
    out["rest_ms"] = decode_ms - sum(passes_ms.values())
    return out


def by_halves(full, half):
    """The decode cost without any prefill estimate: two runs of one decoder on the same prompts
    and keys, ``max_new_tokens`` N and N / 2 (the first N / 2 tokens and their iterations are the
    same in both), differenced: ms per iteration of the second half, and the prompt passes' ms
    per call that this implies for the full run."""
    d_iter = full["iterations"] - half["iterations"]
    ms = 1000 * (full["seconds"] - half["seconds"]) / d_iter
    return {"decode_ms_per_iteration": ms, "iterations_second_half": d_iter,
            "tokens_per_iteration_second_half": (full["tokens"] - half["tokens"]) / d_iter,
            "implied_prefill_ms_per_call":
                (1000 * full["seconds"] - ms * full["iterations"]) / full["calls"]}


def what_if(split, ref_ms_per_token, one_row_target_ms=None, all_tokens=None):
    """Decode ratio against a baseline's ms per token, as measured and with one term changed."""
    tpi, ms = split["tokens_per_iteration"], split["decode_ms_per_iteration"]
    ratio = lambda t, m: t * ref_ms_per_token / m  # noqa: E731
    out = {"decode": ratio(tpi, ms),
           "free_draft": ratio(tpi, ms - split["draft_passes_ms"])}
    if one_row_target_ms is not None:
        out["one_row_target"] = ratio(tpi, ms - split["target_passes_ms"] + one_row_target_ms)
    if all_tokens is not None:
        out["all_accepted"] = ratio(all_tokens, ms)
    return out


def _gamma(method: str) -> int:
    return int(method[len("speculative_g"):])


def single_beam_what_if(sb, spec):
    """Single-beam DSBD against speculative sampling with the same draft, as measured and with
    one of its terms set to speculative sampling's: ``same_tokens`` (its tokens per iteration),
    ``same_target_pass`` (its target pass), ``same_draft`` (its draft passes), ``same_rest``."""
    def ratio(tpi, ms):
        return (tpi / ms) / (spec["tokens_per_iteration"] / spec["decode_ms_per_iteration"])
    tpi, ms = sb["tokens_per_iteration"], sb["decode_ms_per_iteration"]
    return {"end_to_end": sb["tokens_per_s"] / spec["tokens_per_s"], "decode": ratio(tpi, ms),
            "same_tokens": ratio(spec["tokens_per_iteration"], ms),
            "same_target_pass": ratio(tpi, ms - sb["target_passes_ms"] + spec["target_passes_ms"]),
            "same_draft": ratio(tpi, ms - sb["draft_passes_ms"] + spec["draft_passes_ms"]),
            "same_rest": ratio(tpi, ms - sb["rest_ms"] + spec["rest_ms"])}


def single_beam_name(g, w, t, m=1) -> str:
    """The method name of single-beam DSBD with gamma ``g``, draft width ``w``, threshold ``t``
    and minimum width ``m`` (``dsbd_single_beam`` for the default setting, ``DSBD_SB``)."""
    if (g, w, t, m) == (DSBD_SB["gamma"], DSBD_SB["draft_width"], DSBD_SB["threshold"],
                        DSBD_SB["min_width"]):
        return "dsbd_single_beam"
    return f"dsbd_single_beam_g{g}w{w}t{t:g}" + (f"m{m}" if m != 1 else "")


def single_beam_setting(text: str):
    """``"G,W,T"`` or ``"G,W,T,M"`` -> ``(G, W, T, M)`` (``--single-beam-settings``; M, the
    minimum width, defaults to 1)."""
    try:
        parts = text.split(",")
        if len(parts) not in (3, 4):
            raise ValueError
        g, w, t = int(parts[0]), int(parts[1]), float(parts[2])
        m = int(parts[3]) if len(parts) == 4 else 1
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected G,W,T[,M] (e.g. 3,2,0.9), got {text!r}") \
            from None
    if g < 1 or w < 1 or not 0.0 <= t <= 1.0 or not 1 <= m <= w:
        raise argparse.ArgumentTypeError(f"need G >= 1, W >= 1, 0 <= T <= 1 and 1 <= M <= W, "
                                         f"got {text!r}")
    return g, w, t, m


def small_or_trained_head(args, target):
    """``(HeadConfig, params, meta)`` of the draft ``head``: ``--head`` loaded (bound to the
    target), or with ``--small`` and no ``--head`` one made from the tiny target's last layer."""
    if args.head:
        from dsbd_jax.training.head import load_head
        return load_head(args.head, target.config)
    import jax
    from dsbd_jax.models import head as mhead
    hc = mhead.HeadConfig(target.config)
    return hc, mhead.init_params(hc, jax.random.PRNGKey(0), target.params), {}


def int8_drafts(draft, counts, rows):
    """``{name: (config, params)}`` of the eight-bit drafts (:class:`dsbd_jax.models.weights.Int8`
    projections and head, :func:`dsbd_jax.models.kinds.int8_params`): ``int8`` (the full head,
    untied) and ``int8_trunc_<rows>_prompt`` (the head truncated to the table's ``rows`` most
    frequent tokens with prompt rows, then quantised)."""
    from dsbd_jax.models import vocab as mv
    from dsbd_jax.models import kinds
    full, full_config = kinds.int8_params(draft.params, draft.config)
    keep = draft.config.eos_token_id or ()
    untied, cfg = mv.untie_head(draft.params, draft.config)
    trunc = mv.truncate_head(untied, cfg, mv.top_rows(counts, rows, keep), prompt_rows=True)
    trunc, trunc_config = kinds.int8_params(trunc, cfg)
    return {"int8": (full_config, full), f"int8_trunc_{rows}_prompt": (trunc_config, trunc)}


def summarize(out):
    """Add each draft's ``targets`` (per batch) to a run's record: every target's ratio end to
    end, decode only, and with one term changed (:func:`what_if`, :func:`single_beam_what_if`);
    ``reached_by`` lists the single changes that reach the target (empty: none does alone).
    Speculative sampling counts at gamma 4 and at its best gamma (end to end) in the run."""
    for bname, rec in out["batches"].items():
        B = int(bname[1:])  # tokens per iteration count every row of the batch
        refs = rec["references"]
        s_ms = refs["sample"]["decode_ms_per_token"]
        b_ms = refs["beam_sample_W4"]["decode_ms_per_token"]
        e2e = lambda r, ref: r["tokens_per_s"] / refs[ref]["tokens_per_s"]  # noqa: E731
        for drec in rec["drafts"].values():
            runs = {k: v for k, v in drec.items() if k not in ("best_speculative", "targets")}
            spec = {k: v for k, v in runs.items() if k.startswith("speculative_g")}
            # a run of DSBD alone (--methods dsbd_beamW4_point) has no speculative sampling
            best = max(spec, key=lambda k: spec[k]["tokens_per_s"]) if spec else None
            ks = sorted({best, "speculative_g4"} & set(spec), key=_gamma)
            t = {"speculative_vs_sample": {
                     k: dict(what_if(spec[k], s_ms, rec["target_one_row_pass_ms"],
                                     B * (_gamma(k) + 1)), end_to_end=e2e(spec[k], "sample"))
                     for k in ks}}
            if "dsbd_beamW4_point" in runs:
                w4 = runs["dsbd_beamW4_point"]
                t["dsbd_w4_vs_beam_w4"] = {"dsbd_beamW4_point": dict(
                    what_if(w4, b_ms, refs["beam_sample_W4"]["target_passes_ms"],
                            B * (DSBD_W4["gamma"] + 1)), end_to_end=e2e(w4, "beam_sample_W4"))}
            # the default single-beam setting under the speculative gamma's name; the others
            # (--single-beam-settings) under "<their name> vs <gamma>"
            sbs = sorted(k for k in runs if k.startswith("dsbd_single_beam"))
            t["single_beam_vs_speculative"] = {
                (k if sbn == "dsbd_single_beam" else f"{sbn} vs {k}"):
                single_beam_what_if(runs[sbn], spec[k]) for sbn in sbs for k in ks}
            for name, per in t.items():
                for r in per.values():
                    r["reached_by"] = [c for c, v in r.items()
                                       if c not in ("decode", "end_to_end")
                                       and v >= TARGETS[name]]
            drec["best_speculative"] = best
            drec["targets"] = t
    return out


def report(out) -> str:
    """Markdown tables of a run (:func:`summarize` first): every decoder's terms, then every
    target's ratios."""
    lines = []
    for bname, rec in out["batches"].items():
        refs = rec["references"]
        lines += [f"**{bname}**: sampling {refs['sample']['tokens_per_s']:.2f} tok/s (decode "
                  f"{refs['sample']['decode_ms_per_token']:.0f} ms/token, pass alone "
                  f"{rec['target_one_row_pass_ms']:.0f}), beam W=4 "
                  f"{refs['beam_sample_W4']['tokens_per_s']:.2f} tok/s (decode "
                  f"{refs['beam_sample_W4']['decode_ms_per_token']:.0f} ms/token, pass alone "
                  f"{refs['beam_sample_W4']['target_passes_ms']:.0f}), target prefill "
                  f"{rec['target_prefill_ms']:.0f} ms", "",
                  "| draft | method | tok/s | tok/iter | decode ms/iter | draft passes | "
                  "target pass | rest | prefill ms/call |", "|---|---|---|---|---|---|---|---|---|"]
        for dname, drec in rec["drafts"].items():
            for m, r in drec.items():
                if isinstance(r, dict) and "decode_ms_per_iteration" in r:
                    lines.append(f"| {dname} | {m} | {r['tokens_per_s']:.2f} | "
                                 f"{r['tokens_per_iteration']:.2f} | "
                                 f"{r['decode_ms_per_iteration']:.0f} | "
                                 f"{r['draft_passes_ms']:.0f} | {r['target_passes_ms']:.0f} | "
                                 f"{r['rest_ms']:.0f} | {r['prefill_ms_per_call']:.0f} |")
        lines += ["", "| draft | target (wanted) | against | end to end | decode | with one term "
                  "changed (decode) | reached by |", "|---|---|---|---|---|---|---|"]
        for dname, drec in rec["drafts"].items():
            for name, per in drec["targets"].items():
                for k, r in per.items():
                    changed = ", ".join(f"{c} {v:.2f}x" for c, v in r.items()
                                        if c not in ("decode", "end_to_end", "reached_by"))
                    lines.append(f"| {dname} | {name} ({TARGETS[name]}x) | {k} | "
                                 f"{r['end_to_end']:.2f}x | {r['decode']:.2f}x | {changed} | "
                                 f"{', '.join(r['reached_by']) or 'none alone'} |")
        lines.append("")
    return "\n".join(lines)


def _no_paths(text):
    """``load_model``'s dtype reason with the host's dtype cache named by its file name only (a
    result names no path of the measuring machine; ``benchmarks/dtype_runs.py`` does the same)."""
    from dsbd_jax.host.cpu_options import cache_file
    return None if text is None else text.replace(str(cache_file()), cache_file().name)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from benchmarks._drafts import pair_args
    pair_args(ap)
    ap.add_argument("--rows", type=int, default=32768, help="the truncated drafts' head rows")
    ap.add_argument("--drafts", nargs="+", default=None,
                    help="default: base trunc_<rows>_prompt, and with --distilled also "
                         "distilled both_<rows>_prompt")
    ap.add_argument("--batch-drafts", nargs="+", default=None,
                    help="drafts also timed at the batches after the first (default: base and "
                         "the last of --drafts)")
    ap.add_argument("--gammas", type=int, nargs="+", default=None,
                    help="speculative sampling's gammas (default 4 5 6; --small: 2)")
    ap.add_argument("--batches", type=int, nargs="+", default=None,
                    help="batch sizes (default 1 and the quality config's 4; --small: 1 2)")
    ap.add_argument("--single-beam-settings", type=single_beam_setting, nargs="+", default=[],
                    metavar="G,W,T[,M]", help="also single-beam DSBD with gamma G, draft width W, "
                    "threshold T and minimum width M (default 1), e.g. 3,2,0.9 (named "
                    "dsbd_single_beam_g3w2t0.9) or 3,2,1,2 (fixed width 2: "
                    "dsbd_single_beam_g3w2t1m2)")
    ap.add_argument("--methods", nargs="+", default=None,
                    help="run only these drafted methods (default: all; the baselines always run)")
    ap.add_argument("--head", default=None, metavar="NAME|DIR",
                    help="also the draft 'head': a trained draft head (a name registered by "
                         "dsbd train-head or its directory; --small: a head made from the tiny "
                         "target's last layer)")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--halves", action="store_true",
                    help="also run every decoder at max_new_tokens / 2 and record its decode "
                         "cost by differencing (a check of the prefill subtraction)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="the JSON to write (required unless --report)")
    ap.add_argument("--report", metavar="JSON",
                    help="no run: recompute the targets of a run's JSON, write them back and "
                         "print its tables (markdown)")
    args = ap.parse_args(argv)
    if args.report:
        import json
        from dsbd_jax.eval.timing import write_json
        out = summarize(json.loads(Path(args.report).read_text()))
        write_json(args.report, out)
        print(report(out))
        return out
    if not args.out:
        ap.error("--out is required")

    from benchmarks._drafts import (build_drafts, head_pass_call, interleaved_medians,
                                         pass_call, run_batched)
    from benchmarks._drafts import forward_shapes
    from dsbd_jax.decoding.beam import beam_sample
    from dsbd_jax.decoding.common import bucket_length
    from dsbd_jax.decoding.configs import BeamSampleConfig, SampleConfig, SpeculativeConfig
    from dsbd_jax.decoding.dsbd import DSBDConfig, dsbd_generate
    from dsbd_jax.decoding.dsbd.state import layout
    from dsbd_jax.decoding.sampling import sample
    from dsbd_jax.decoding.speculative import num_slots, speculative_sample
    from dsbd_jax.eval.datasets import benchmark_prompts, encode_chat
    from dsbd_jax.eval.timing import machine_info, portable_settings, write_json
    from dsbd_jax.models import vocab as mv
    from dsbd_jax.loading.load import load_model

    tmp = Path(tempfile.mkdtemp(prefix="draft_terms_"))
    if args.small:
        from dsbd_jax.testing import make_tiny_pair
        args.target, args.draft = (str(p) for p in make_tiny_pair(tmp / "pair", noise=0.3))
        args.prompts, args.max_new_tokens, args.repeats = 2, 8, 2
    args.gammas = args.gammas or ([2] if args.small else [4, 5, 6])
    args.batches = args.batches or ([1, 2] if args.small else [1, 4])
    target = load_model(args.target, progress=not args.small)
    draft = load_model(args.draft, progress=not args.small)
    if args.small:
        prompts = encode_chat(target.tokenizer, ["def add(a, b):", "What is 12 times 7?"],
                              raw=True)
        args.rows = draft.config.vocab_size // 2
        counts = mv.count_tokens(prompts, draft.config.vocab_size)
    else:
        prompts = benchmark_prompts(target.tokenizer, args.prompts)[1]
        counts = mv.load_table(mv.find_table(args.draft))[0]
    if args.small:  # the tiny draft's own directory stands in for a distilled draft
        args.distilled = args.draft
    drafts = build_drafts(draft, counts, [args.rows], args.rows, True, args.distilled)
    # each draft's config: the draft's, but for the int8 drafts (their head untied) and the head
    dconfs = {}
    for name, (config, params) in int8_drafts(draft, counts, args.rows).items():
        drafts[name], dconfs[name] = params, config
    head_config = None  # the draft "head": its own config
    if args.head or (args.small and "head" in (args.drafts or [])):
        head_config, drafts["head"], head_meta = small_or_trained_head(args, target)
    names = args.drafts or (["base", f"trunc_{args.rows}_prompt"]
                            + (["distilled", f"both_{args.rows}_prompt"]
                               if args.distilled else []) + (["head"] if args.head else []))
    at_batch = set(args.batch_drafts or ["base", names[-1]])
    unknown = sorted((set(names) | at_batch) - set(drafts))
    if unknown:
        raise SystemExit(f"unknown drafts {unknown} (have {sorted(drafts)})")

    N = args.max_new_tokens
    P = bucket_length(max(len(p) for p in prompts))
    prompt_len = max(len(p) for p in prompts)
    warp = dict(temperature=1.0, top_k=10, top_p=0.8, eos_token_id=(), max_new_tokens=N)
    tc, dc = target.config, draft.config
    methods = {f"speculative_g{g}": (speculative_sample, SpeculativeConfig(
        target=tc, draft=dc, gamma=g, **warp), ("spec", {"gamma": g})) for g in args.gammas}
    methods["dsbd_single_beam"] = (dsbd_generate, DSBDConfig(target=tc, draft=dc, **DSBD_SB,
                                                             **warp), ("dsbd", DSBD_SB))
    methods["dsbd_beamW4_point"] = (dsbd_generate, DSBDConfig(target=tc, draft=dc, **DSBD_W4,
                                                              **warp), ("dsbd", DSBD_W4))
    for g, w, t, m in args.single_beam_settings:  # more single-beam DSBD forests (a sweep)
        sb = dict(DSBD_SB, gamma=g, draft_width=w, threshold=t, min_width=m)
        methods[single_beam_name(g, w, t, m)] = (
            dsbd_generate, DSBDConfig(target=tc, draft=dc, **sb, **warp), ("dsbd", sb))
    if args.methods:
        unknown = sorted(set(args.methods) - set(methods))
        if unknown:
            raise SystemExit(f"unknown methods {unknown} (have {sorted(methods)})")
        methods = {k: v for k, v in methods.items() if k in args.methods}
    out = {"machine": machine_info(), "settings": portable_settings(vars(args), _ROOT), "bucket": P,
           "kernel_forms": {k: m.info.get("kernel_transposed") or "plain"  # load_model's choice
                            for k, m in (("target", target), ("draft", draft))},
           "dtypes": {k: {"dtype": m.info.get("dtype"),
                          "why": _no_paths(m.info.get("dtype_why"))}
                      for k, m in (("target", target), ("draft", draft))},
           "prompt_len": prompt_len, "targets": TARGETS, "batches": {},
           "int8_drafts": sorted(dconfs)}
    if head_config is not None:
        from dsbd_jax.models import head as mhead
        out["head"] = {"source": args.head and portable_settings({"h": args.head}, _ROOT)["h"],
                       "own_params": mhead.num_params(drafts["head"]),
                       "feature_layers": list(head_config.feature_layers),
                       "intermediate_size": head_config.intermediate_size,
                       "meta": head_meta}

    def timed(fn, params, cfg, B):
        r = run_batched(fn, params, cfg, prompts, B, args.seed)
        if args.halves:
            half = run_batched(fn, params, dataclasses.replace(cfg, max_new_tokens=N // 2),
                               prompts, B, args.seed)
            r["by_halves"] = by_halves(r, half)
        return r

    def log(msg):
        print(msg, flush=True)

    def halves(r):
        h = r.get("by_halves")
        return "" if h is None else (f"; by halves {h['decode_ms_per_iteration']:.1f} ms/iter, "
                                     f"prefill {h['implied_prefill_ms_per_call']:.0f} ms/call")

    for bi, B in enumerate(args.batches):
        rec = out["batches"][f"b{B}"] = {"references": {}, "drafts": {}}
        # the baselines, end to end, and their prompt and decode passes alone
        refs = {"sample": (sample, SampleConfig(target=tc, **warp), 1),
                "beam_sample_W4": (beam_sample, BeamSampleConfig(target=tc, num_beams=4, **warp), 4)}
        ref_ms = interleaved_medians(
            {"prefill": prefill_call(tc, target.params, B, P, P + N, prompt_len),
             **{f"pass_{k}": pass_call(tc, target.params, B * w, P + N, prompt_len)
                for k, (_, _, w) in refs.items()}}, args.repeats)
        for name, (fn, cfg, _) in refs.items():
            r = timed(fn, target.params, cfg, B)
            r.update(decode_split(r, ref_ms["prefill"], {"target": ref_ms[f"pass_{name}"]}))
            rec["references"][name] = r
            log(f"b{B} {name}: {r['tokens_per_s']:.2f} tok/s, decode "
                f"{r['decode_ms_per_token']:.1f} ms/token (pass alone {ref_ms[f'pass_{name}']:.1f})"
                + halves(r))
        rec["target_one_row_pass_ms"] = ref_ms["pass_sample"]
        rec["target_prefill_ms"] = ref_ms["prefill"]
        # every draft's one-token pass beside the target's, in one interleaved round (the
        # decoders' cache size of sampling): the head's cost target is this ratio
        one = interleaved_medians(
            {"target": pass_call(tc, target.params, B, P + N, prompt_len),
             **{d: (head_pass_call(head_config, drafts[d], target.params, B, P + N)
                    if d == "head" else pass_call(dconfs.get(d, draft.config), drafts[d], B,
                                                  P + N, prompt_len))
                for d in names}}, args.repeats)
        rec["one_token_pass_ms"] = one
        rec["draft_pass_vs_target"] = {d: one[d] / one["target"] for d in names}
        log(f"b{B} one-token passes (ms): " + ", ".join(f"{k} {v:.1f}" for k, v in one.items()))
        for dname in names if bi == 0 else [n for n in names if n in at_batch]:
            dc = dconfs.get(dname, draft.config)
            dparams = drafts[dname]
            both = {"target": target.params, "draft": dparams}
            is_head = dname == "head"
            drec = rec["drafts"][dname] = {}
            for mname, (fn, cfg, (kind, s)) in methods.items():
                cfg = dataclasses.replace(cfg, draft=head_config if is_head else dc)
                if kind == "spec":  # prefill and passes over the same cache
                    pre_slots = t_slots = d_slots = num_slots(cfg, P)
                else:  # prefill per beam, then Wc beams (+ the draft's forest scratch) per row
                    lay = layout(cfg, P)
                    pre_slots, t_slots, d_slots = lay.S, lay.Wc * lay.S, lay.Wc * lay.S + lay.Td
                calls = {"prefill_target": prefill_call(tc, target.params, B, P, pre_slots,
                                                        prompt_len),
                         "prefill_draft": (
                             head_pass_call(head_config, dparams, target.params, B, 0, P)
                             if is_head else
                             prefill_call(dc, dparams, B, P, pre_slots, prompt_len))}
                owner = {}  # pass name -> the model it runs
                for i, (model, rows, T, _) in enumerate(forward_shapes(kind, s, P, N)):
                    mc, mp, slots = ((dc, dparams, d_slots) if model == "draft"
                                     else (tc, target.params, t_slots))
                    k = f"pass{i}_{model}_{rows * B}x{T}"
                    owner[k] = model
                    calls[k] = (head_pass_call(head_config, dparams, target.params, B * rows,
                                               slots, T) if is_head and model == "draft"
                                else pass_call(mc, mp, B * rows, slots, prompt_len, T))
                ms = interleaved_medians(calls, args.repeats)
                passes = {m: sum(ms[k] for k, o in owner.items() if o == m)
                          for m in ("draft", "target")}
                r = timed(fn, both, cfg, B)
                r["passes_alone_ms"] = ms
                r.update(decode_split(r, ms["prefill_target"] + ms["prefill_draft"], passes))
                drec[mname] = r
                log(f"b{B} {dname} {mname}: {r['tokens_per_s']:.2f} tok/s, "
                    f"{r['tokens_per_iteration']:.2f} tok/iter, {r['decode_ms_per_iteration']:.0f} "
                    f"ms/iter = draft {passes['draft']:.0f} + target {passes['target']:.0f} + "
                    f"rest {r['rest_ms']:.0f}" + halves(r))
        summarize(out)
        write_json(args.out, out)  # after every batch: a partial run keeps what it measured
    print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
