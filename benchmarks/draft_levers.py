"""The two draft levers measured on the offline pair, in one run.

Drafts: ``base`` (the 0.5B draft), ``trunc_<N>`` (head truncated to N rows of the frequency
table, default N in 16384 / 32768 / 65536; with ``--prompt-rows`` also ``trunc_<N>_prompt``, the
same rows plus each call's prompt tokens), ``distilled`` (``--distilled RUN/model``, from
``dsbd distill configs/distill_qwen.yaml``) and ``both`` (distilled + truncated to
``--both-rows``). For every draft, same prompts:

* ``acceptance``: mean over positions of ``sum_x min(p(x), q(x))`` under the decoding's warping,
  on continuations the target sampled once for all drafts (the target's warped top-k stored);
* ``draft_pass_ms`` / ``target_pass_ms``: one decode-step forward (``[B, 1]`` tokens over a
  cache of ``P + max_new_tokens`` slots), median of ``--repeats``; ``draft_pass_ratio`` is the
  draft's time over the base draft's;
* per method at batch 1 and ``--batch`` (the quality config's 4): tok/s, tokens per target call
  (tokens per iteration), the decoders' own acceptance statistics: speculative gamma 4,
  single-beam DSBD (g3 / W_S 3 / t 0.9 / W_min 1), DSBD at the beam-W4 log-likelihood point
  (g2 / W_S 4 / t 0.7 / W_min 2); the draft-free references sampling and beam sampling W = 4
  once.

Passes run under the host's XLA:CPU options (``cpu_options.tuned_jit``, like the decoders;
earlier runs used XLA's defaults); a draft with prompt rows is timed with its prompt
columns. ``--passes-only`` times only the draft passes, every draft interleaved round by round
(median of ``--repeats``). ``--acceptance-only`` stops after the acceptances (minutes; e.g. one run per ``--vocab-table``
to compare frequency tables). ``ratios`` holds the issue's targets per draft. EOS is off (every run makes ``--max-new-tokens``
tokens); compile time is excluded (each configuration runs once untimed first).

    .venv/bin/python benchmarks/draft_levers.py --prompts 4 --max-new-tokens 128 \
        --distilled runs/distill_qwen/model --out results/draft_levers.json
    .venv/bin/python benchmarks/draft_levers.py --small --out /tmp/draft_levers_small.json  # tiny pair, a minute
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"


def pass_call(config, params, B, slots, prompt_len, T=1):
    """A zero-argument call of one forward over ``[B, T]`` new tokens (``T = 1``: a decode step;
    more: a speculative chain or a DSBD forest, logits at every new token as the decoders ask)
    over ``slots`` cached slots, compiled under the host's XLA:CPU options
    (``cpu_options.tuned_jit``, as the decoders are). A head with prompt rows gets its
    ``B * prompt_len`` prompt columns first, as a decoder's program adds them."""
    import jax.numpy as jnp
    from dsbd_jax.models import vocab as mv
    from dsbd_jax.models.cache import empty_cache
    from dsbd_jax.host.cpu_options import tuned_jit
    from dsbd_jax.models.llama import forward
    if mv.has_prompt_rows(params):
        params = mv.with_prompt_rows(params, jnp.ones((B, prompt_len), jnp.int32))
    positions = jnp.broadcast_to(slots - T + jnp.arange(T, dtype=jnp.int32), (B, T))
    f = tuned_jit(lambda p, c, t: forward(config, p, t, positions,
                                          jnp.ones((B, T, slots + T), bool), c)[0])
    cache = empty_cache(config, B, slots)
    tok = jnp.ones((B, T), jnp.int32)
    return lambda: f(params, cache, tok)


def head_pass_call(head_config, head_params, target_params, B, slots, T=1):
    """A zero-argument call of a draft head's forward (:func:`dsbd_jax.models.head.forward`)
    over ``[B, T]`` new tokens and their features, logits at every new token, over ``slots``
    cached slots of its one-layer cache (``slots = 0``: the prompt pass, no cache, logits at
    the first token only, as ``drafting.prefill_pair`` runs it); compiled as :func:`pass_call`."""
    import jax.numpy as jnp
    from dsbd_jax.models import head as mhead
    from dsbd_jax.models.cache import empty_cache
    from dsbd_jax.host.cpu_options import tuned_jit
    from dsbd_jax.models.llama import ACT
    positions = jnp.broadcast_to(slots + jnp.arange(T, dtype=jnp.int32), (B, T))
    if slots:
        mask, at = jnp.ones((B, T, slots + T), bool), None
    else:
        mask = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (B, T, T))
        at = jnp.zeros((B, 1), jnp.int32)
    f = tuned_jit(lambda hp, tp, c, t, x: mhead.forward(head_config, hp, tp, t, x, positions,
                                                        mask, c, logits_at=at)[0])
    cache = empty_cache(head_config, B, slots) if slots else None
    tok = jnp.ones((B, T), jnp.int32)
    feats = jnp.full((B, T, head_config.hidden_size), 0.1, ACT)
    return lambda: f(head_params, target_params, cache, tok, feats)


def interleaved_medians(calls, repeats):
    """``{key: median ms}`` of zero-argument calls, one warm-up each, then timed round by round
    (every call once per round, so that drift on the host hits them alike)."""
    import jax
    for f in calls.values():
        jax.block_until_ready(f())
    times = {k: [] for k in calls}
    for _ in range(repeats):
        for k, f in calls.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f())
            times[k].append(1000 * (time.perf_counter() - t0))
    return {k: statistics.median(v) for k, v in times.items()}


def pass_ms(config, params, B, slots, repeats, prompt_len=1):
    """Median ms of one decode-step forward (:func:`pass_call`)."""
    return interleaved_medians({0: pass_call(config, params, B, slots, prompt_len)}, repeats)[0]


def build_drafts(draft, counts, rows, both_rows, prompt_rows, distilled=None):
    """``{name: draft params}``: ``base``; ``trunc_<N>`` for N in ``rows`` (the head truncated to
    the table's N most frequent rows, EOS kept) and with ``prompt_rows`` ``trunc_<N>_prompt``;
    with ``distilled`` (a RUN/model directory) ``distilled``, ``both_<both_rows>`` and
    ``both_<both_rows>_prompt``."""
    from dsbd_jax.models import vocab as mv
    from dsbd_jax.loading.load import load_model
    keep = draft.config.eos_token_id or ()
    drafts = {"base": draft.params}

    def truncated(params, prefix, n):
        drafts[f"{prefix}_{n}"] = mv.truncate_head(params, draft.config,
                                                   mv.top_rows(counts, n, keep))
        if prompt_rows:
            drafts[f"{prefix}_{n}_prompt"] = mv.truncate_head(
                params, draft.config, mv.top_rows(counts, n, keep), prompt_rows=True)
    for n in rows:
        truncated(draft.params, "trunc", n)
    if distilled:
        drafts["distilled"] = load_model(distilled, progress=False).params
        truncated(drafts["distilled"], "both", both_rows)
    return drafts


def run_batched(fn, params, cfg, prompts, B, seed):
    """tok/s of ``fn`` over ``prompts`` in batches of ``B`` (compiled first, untimed), tokens per
    target call, the number of timed calls and of loop iterations (summed over the calls) and the
    mean of the scalar statistics."""
    import jax
    import numpy as np
    from dsbd_jax.decoding.common import pad_prompts
    groups = [prompts[i:i + B] for i in range(0, len(prompts), B)]
    groups = [g + [g[-1]] * (B - len(g)) for g in groups]
    P = max(len(p) for p in prompts)
    from dsbd_jax.decoding.common import bucket_length
    P = bucket_length(P)
    tokens = seconds = calls = iterations = 0
    stats = {}
    for i, g in enumerate(groups):
        ids, lens = pad_prompts(g, length=P)
        key = jax.random.PRNGKey(seed + i)
        if i == 0:
            jax.block_until_ready(fn(params, ids, key, cfg, prompt_lengths=lens))
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(params, ids, key, cfg, prompt_lengths=lens))
        seconds += time.perf_counter() - t0
        best = np.asarray(out.best)
        tokens += int(np.asarray(out.lengths)[np.arange(B), best].sum())
        calls += int(np.asarray(out.stats["target_calls"])) * B  # every row, every call
        iterations += int(np.asarray(out.stats["iterations"]))
        for k, v in out.stats.items():
            v = np.asarray(v)
            if v.size == 1 and np.issubdtype(v.dtype, np.floating):
                stats.setdefault(k, []).append(float(v.reshape(())))
    return {"tokens_per_s": tokens / seconds, "tokens": tokens, "seconds": seconds,
            "tokens_per_target_call": tokens / max(calls, 1), "calls": len(groups),
            "iterations": iterations,
            **{k: float(np.mean(v)) for k, v in stats.items()}}


def pair_args(ap):
    """The options both draft benchmarks share: ``--small``, ``--target``, ``--draft``,
    ``--distilled``."""
    ap.add_argument("--small", action="store_true",
                    help="the tiny random pair (dsbd make-tiny-pair), tiny sizes: checks the script")
    ap.add_argument("--target", default=TARGET)
    ap.add_argument("--draft", default=DRAFT)
    ap.add_argument("--distilled", default=None, help="a distilled draft (RUN/model)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    pair_args(ap)
    ap.add_argument("--vocab-table", default=None, help="default: the draft's (find_table)")
    ap.add_argument("--rows", type=int, nargs="+", default=[16384, 32768, 65536])
    ap.add_argument("--both-rows", type=int, default=32768)
    ap.add_argument("--prompt-rows", action="store_true",
                    help="also every truncated draft with prompt rows (trunc_<N>_prompt, "
                         "both_<N>_prompt): the prompt's tokens added to the rows per call")
    ap.add_argument("--decode-drafts", nargs="+", default=None,
                    help="drafts whose decoders are timed at batch 1 (default: all; the others "
                         "get acceptance and pass times only), e.g. base distilled both_32768")
    ap.add_argument("--batch-drafts", nargs="+", default=None,
                    help="drafts whose decoders are also timed at --batch (default: "
                         "--decode-drafts)")
    ap.add_argument("--acceptance-only", action="store_true",
                    help="only every draft's acceptance (no timings): minutes, e.g. to compare "
                         "frequency tables (--vocab-table)")
    ap.add_argument("--passes-only", action="store_true",
                    help="only the draft passes of every draft (batch 1 and --batch), all "
                         "drafts interleaved round by round; no decoding, no acceptance")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch", type=int, default=4, help="the quality config's batch size")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import jax
    import numpy as np
    from dsbd_jax.decoding.beam import beam_sample
    from dsbd_jax.decoding.configs import BeamSampleConfig, SampleConfig, SpeculativeConfig
    from dsbd_jax.decoding.dsbd import DSBDConfig, dsbd_generate
    from dsbd_jax.decoding.sampling import sample
    from dsbd_jax.decoding.speculative import speculative_sample
    from dsbd_jax.eval.datasets import benchmark_prompts, encode_chat
    from dsbd_jax.eval.timing import machine_info, portable_path, portable_settings, write_json
    from dsbd_jax.models import vocab as mv
    from dsbd_jax.loading.load import load_model
    from dsbd_jax.training.distill import DistillConfig, make_acceptance, make_rollouts
    from dsbd_jax.training.distill import heldout_acceptance

    tmp = Path(tempfile.mkdtemp(prefix="draft_levers_"))
    if args.small:
        from dsbd_jax.testing import make_tiny_pair
        args.target, args.draft = (str(p) for p in make_tiny_pair(tmp / "pair", noise=0.3))
        args.prompts, args.max_new_tokens, args.repeats = 2, 8, 2
    target = load_model(args.target, progress=not args.small)
    draft = load_model(args.draft, progress=not args.small)
    V = draft.config.vocab_size
    # the projection kernels' stored form of each model (load_model's per-host choice)
    forms = {"target": target.info.get("kernel_transposed") or "plain",
             "draft": draft.info.get("kernel_transposed") or "plain"}
    if args.small:
        texts = ["def add(a, b):", "What is 12 times 7?"]
        prompts = encode_chat(target.tokenizer, texts, raw=True)
        args.rows = [V // 4, V // 2]
        args.both_rows = V // 2
        table = mv.save_table(tmp / "table.npz", mv.count_tokens(prompts, V))
        from dsbd_jax.training.distill import distill
        distill((target.config, target.params), (draft.config, draft.params), prompts,
                prompts, DistillConfig(steps=3, warmup_steps=1, max_new_tokens=4, batch_size=2,
                                       mode="full"),
                tmp / "distill", tokenizer=target.tokenizer, progress=False)
        args.distilled = str(tmp / "distill" / "model")
    else:
        texts, prompts = benchmark_prompts(target.tokenizer, args.prompts)
        table = args.vocab_table or mv.find_table(args.draft)
    counts, meta = mv.load_table(table)
    # recorded relative to the checkout when it is the bundled table (no path of this machine)
    root = Path(__file__).resolve().parent.parent
    table_name = portable_path(table, root)
    drafts = build_drafts(draft, counts, args.rows, args.both_rows, args.prompt_rows,
                          args.distilled)

    decode = set(drafts if args.decode_drafts is None else args.decode_drafts)
    at_batch = decode if args.batch_drafts is None else set(args.batch_drafts)
    unknown = sorted((decode | at_batch) - set(drafts))
    if unknown or "base" not in decode or "base" not in at_batch:
        raise SystemExit(f"--decode-drafts / --batch-drafts: unknown drafts {unknown} (have "
                         f"{sorted(drafts)}); 'base' must be in both")
    warp = dict(temperature=1.0, top_k=10, top_p=0.8)
    N = args.max_new_tokens
    slots = max(len(p) for p in prompts) + N
    prompt_len = max(len(p) for p in prompts)
    if args.passes_only:
        out = {"machine": machine_info(), "kernel_forms": forms,
               "settings": portable_settings(vars(args), root),
               "table": table_name, "slots": slots, "prompt_len": prompt_len, "drafts": {d: {} for d in drafts}}
        for B in sorted({1, args.batch}):
            ms = interleaved_medians({d: pass_call(draft.config, p, B, slots, prompt_len)
                                      for d, p in drafts.items()}, args.repeats)
            for d, v in ms.items():
                out["drafts"][d][f"draft_pass_ms_b{B}"] = v
                out["drafts"][d][f"draft_pass_vs_base_b{B}"] = v / ms["base"]
                print(f"{d} batch {B}: draft pass {v:.1f} ms ({v / ms['base']:.3f}x base)",
                      flush=True)
        write_json(args.out, out)
        print(f"wrote {args.out}")
        return out
    # acceptance: target-sampled continuations, target's warped top-k stored once
    dc = DistillConfig(policy="target", max_new_tokens=N, store_k=16, steps=2, warmup_steps=0,
                       **warp)
    data = make_rollouts((target.config, target.params), (draft.config, draft.params), prompts, dc,
                         jax.random.key(args.seed), batch=min(args.batch, len(prompts)))
    plain_acc = make_acceptance(dc, draft.config)

    def prompt_acc(params, batch):  # the decoders' prompt rows: the prompt part of each row
        import jax.numpy as jnp
        tokens = batch["tokens"]
        in_prompt = jnp.arange(tokens.shape[1])[None] <= batch["pos"][:, :1]
        ids = jnp.where(in_prompt, tokens, params[mv.VOCAB_HEAD]["rows"][0])
        return plain_acc(mv.with_prompt_rows(params, ids), batch)

    def acceptance(params):
        fn = prompt_acc if mv.has_prompt_rows(params) else plain_acc
        return heldout_acceptance(fn, params, data, min(args.batch, len(prompts)))
    if args.acceptance_only:
        out = {"machine": machine_info(), "kernel_forms": forms,
               "settings": portable_settings(vars(args), root),
               "table": table_name, "table_meta": meta, "drafts": {}}
        for dname, dparams in drafts.items():
            acc = acceptance(dparams)
            out["drafts"][dname] = {"acceptance": acc}
            print(f"{dname}: acceptance {acc:.4f}", flush=True)
        base_acc = out["drafts"]["base"]["acceptance"]
        for rec in out["drafts"].values():
            rec["acceptance_minus_base"] = rec["acceptance"] - base_acc
        write_json(args.out, out)
        print(f"wrote {args.out}")
        return out
    base_cfg = dict(eos_token_id=(), max_new_tokens=N, **warp)
    methods = {
        "speculative_g4": lambda d: (speculative_sample, SpeculativeConfig(
            target=target.config, draft=draft.config, gamma=4, **base_cfg)),
        "dsbd_single_beam": lambda d: (dsbd_generate, DSBDConfig(
            target=target.config, draft=draft.config, gamma=3, draft_width=3, threshold=0.9,
            min_width=1, single_beam=True, **base_cfg)),
        "dsbd_beamW4_point": lambda d: (dsbd_generate, DSBDConfig(
            target=target.config, draft=draft.config, gamma=2, draft_width=4, threshold=0.7,
            min_width=2, **base_cfg)),
    }
    batches = sorted({1, args.batch})
    out = {"machine": machine_info(), "kernel_forms": forms,
           "settings": portable_settings(vars(args), root), "table": table_name,
           "table_meta": meta, "references": {}, "drafts": {}}
    for B in batches:
        for name, fn, cfg in (("sample", sample, SampleConfig(target=target.config, **base_cfg)),
                              ("beam_sample_W4", beam_sample,
                               BeamSampleConfig(target=target.config, num_beams=4, **base_cfg))):
            r = run_batched(fn, target.params, cfg, prompts, B, args.seed)
            out["references"][f"{name}_b{B}"] = r
            print(f"{name} batch {B}: {r['tokens_per_s']:.2f} tok/s", flush=True)
        out.setdefault("target_pass_ms", {})[f"b{B}"] = pass_ms(target.config, target.params, B,
                                                                slots, args.repeats)
    for dname, dparams in drafts.items():
        rec = {"acceptance": acceptance(dparams),
               "rows": int(np.asarray(mv.head_rows(dparams)).size) if mv.head_rows(dparams) is not None else V}
        for B in batches:
            rec[f"draft_pass_ms_b{B}"] = pass_ms(draft.config, dparams, B, slots, args.repeats,
                                                 prompt_len)
            if dname not in (decode if B == 1 else at_batch):
                continue
            for mname, make in methods.items():
                fn, cfg = make(dparams)
                r = run_batched(fn, {"target": target.params, "draft": dparams}, cfg, prompts, B,
                                args.seed)
                rec[f"{mname}_b{B}"] = r
                print(f"{dname} {mname} batch {B}: {r['tokens_per_s']:.2f} tok/s, "
                      f"{r['tokens_per_target_call']:.2f} tok/target call", flush=True)
        out["drafts"][dname] = rec
        print(f"{dname}: acceptance {rec['acceptance']:.4f}, draft pass "
              f"{rec['draft_pass_ms_b1']:.1f} ms (batch 1)", flush=True)
    base = out["drafts"]["base"]
    ref = out["references"]
    for dname, rec in out["drafts"].items():
        rec["ratios"] = {f"b{B}": {
            "draft_pass_vs_base": rec[f"draft_pass_ms_b{B}"] / base[f"draft_pass_ms_b{B}"],
            "acceptance_minus_base": rec["acceptance"] - base["acceptance"],
        } for B in batches}
        for B in batches:
            if f"speculative_g4_b{B}" not in rec:
                continue
            rec["ratios"][f"b{B}"].update({
                "dsbd_beamW4_point_vs_beam_sample_W4":
                    rec[f"dsbd_beamW4_point_b{B}"]["tokens_per_s"]
                    / ref[f"beam_sample_W4_b{B}"]["tokens_per_s"],
                "single_beam_dsbd_vs_speculative":
                    rec[f"dsbd_single_beam_b{B}"]["tokens_per_s"]
                    / rec[f"speculative_g4_b{B}"]["tokens_per_s"],
                "speculative_vs_sample":
                    rec[f"speculative_g4_b{B}"]["tokens_per_s"] / ref[f"sample_b{B}"]["tokens_per_s"],
            })
    write_json(args.out, out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
