"""End-to-end speed on the offline pair, ours and transformers side by side in one run.

Ours: sample, beam sampling W = 2 and 4, speculative sampling (gamma 4) and DSBD settings
(default: gamma 2 / W_S 4 / t 0.7 / W_min 2, the beam-W4-quality point; gamma 3 / W_S 3 / t 0.9 /
W_min 1; the same in single-beam mode). Transformers: sampling and beam sampling
(``do_sample=True, num_beams=W``) on the same weights, prompts and warping (top-k 10, top-p 0.8).

    .venv/bin/python -m benchmarks.speed --prompts 4 --max-new-tokens 64 --dsbd 2,4,0.7,2 \
        3,2,0.9,1,sb --widths 4 --dtypes float32 --out results/speed_float32_host.json

``--draft-weights int8`` loads the draft with eight-bit kernels (speculative sampling and DSBD
draft with it; every row records ``draft_weights``).

``--target-weights float int8`` runs the table once per target kind, one after the other in the
same run: the float target and the int8 target (``load_model(weights="int8")``, a different model
from the float one; its drafted decoders draft with ``--draft-weights``). Every row records
``weights``; the ratios are per kind, plus ours int8 target against ours float target per method
and dtype.

``--dtypes float32 bfloat16`` runs the whole table once per dtype, ours (``load_model(dtype=)``:
bfloat16 weights and cache, mixed-precision products) and transformers (the model in that torch
dtype) alike, one dtype after the other in the same run; every row records its ``dtype`` and the
ratios are per dtype (plus ours bfloat16 against ours float32).

For every method: end-to-end tokens/s (prefill included) and decode tokens/s (after the prefill:
the prompt passes of the models the method runs are timed alone, same bucket, and subtracted),
target calls per token, the best beam's log-likelihood per token, KV-cache bytes. Ratios of the
issue's targets are printed and written (``ratios``). The JAX part runs in this process; the
transformers part runs afterwards in a subprocess (the two copies of the 1.5B model are never in
memory at once). Every prompt is padded to one bucket (one compile per method); compile time is
reported apart and excluded from speeds. EOS is disabled on both sides (ours:
``eos_token_id=()``; transformers: ``min_new_tokens``), so every run generates exactly
``--max-new-tokens`` tokens per prompt.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"


def jax_part(args, dtype="float32", weights="float"):
    from dsbd_jax import eval as bench
    from dsbd_jax.decoding import common
    from dsbd_jax.eval.datasets import benchmark_prompts
    from dsbd_jax.decoding.beam import beam_sample
    from dsbd_jax.loading.load import load_model
    from dsbd_jax.decoding.sampling import sample
    from dsbd_jax.decoding.speculative import speculative_sample
    from dsbd_jax.decoding.dsbd import DSBDConfig, dsbd_generate
    from dsbd_jax.decoding.configs import BeamSampleConfig, SampleConfig, SpeculativeConfig

    target = load_model(TARGET, dtype, weights=weights)
    draft = load_model(DRAFT, dtype, weights=args.draft_weights)
    texts, prompts = benchmark_prompts(target.tokenizer, args.prompts)
    P = common.bucket_length(max(len(p) for p in prompts))
    warp = dict(temperature=1.0, top_k=args.top_k, top_p=args.top_p, eos_token_id=(),
                max_new_tokens=args.max_new_tokens)
    methods = [("sample", sample, SampleConfig(target=target.config, **warp), False)]
    for W in args.widths:
        methods.append((f"beam_sample_W{W}", beam_sample,
                        BeamSampleConfig(target=target.config, num_beams=W, **warp), False))
    methods.append((f"speculative_g{args.gamma}", speculative_sample,
                    SpeculativeConfig(target=target.config, draft=draft.config,
                                      gamma=args.gamma, **warp), True))
    for spec_s in args.dsbd:
        g, ws, t, wmin, *sb = spec_s.split(",")
        single = bool(sb and sb[0] == "sb")
        cfg = DSBDConfig(target=target.config, draft=draft.config, gamma=int(g),
                         draft_width=int(ws), threshold=float(t), min_width=int(wmin),
                         single_beam=single, **warp)
        name = f"dsbd_g{g}_WS{ws}_t{t}_Wmin{wmin}" + ("_single" if single else "")
        methods.append((name, dsbd_generate, cfg, True))
    prefill_s = prefill_seconds(target, draft, prompts, P)
    rows = []
    for name, fn, cfg, spec in methods:
        params = {"target": target.params, "draft": draft.params} if spec else target.params
        r = bench.run_over_prompts(fn, params, cfg, prompts, P, seed=args.seed, label=name)
        pre = prefill_s["target"] + (prefill_s["draft"] if spec else 0.0)
        tok = sum(p["tokens"] for p in r["prompts"])
        sec = sum(p["seconds"] for p in r["prompts"])
        from dsbd_jax.eval.run import kv_cache_bytes
        from dsbd_jax.decoding.methods import Decoder
        r.update(prefill_s_per_prompt=pre, decode_tokens_per_s=tok / (sec - pre * len(prompts)),
                 kv_cache_bytes=kv_cache_bytes(
                     Decoder("dsbd" if fn is dsbd_generate else
                             "spec" if fn is speculative_sample else
                             "beam" if fn is beam_sample else "sample", fn, cfg), P))
        rows.append({"impl": "dsbd_jax", "method": name, "dtype": dtype, "weights": weights,
                     "draft_weights": args.draft_weights if spec else None, **r})
    del target, draft
    return texts, prompts, rows


def prefill_seconds(target, draft, prompts, P, repeats=3):
    """Median seconds of one prompt pass (``common.prefill``) of each model at bucket ``P``."""
    from dsbd_jax.decoding import common
    from dsbd_jax.eval.run import prefill_seconds as time_prefill
    ids, lens = common.pad_prompts([prompts[0]], length=P)
    out = {}
    for name, m in (("target", target), ("draft", draft)):
        out[name] = time_prefill(m, P, ids, lens, repeats)
        print(f"  prefill {name} ({P} tokens): {out[name]:.2f} s")
    return out


HF_SCRIPT = r"""
import json, sys, time, torch
from transformers import AutoModelForCausalLM
args = json.loads(sys.argv[1])
torch.set_num_threads(args["threads"])
model = AutoModelForCausalLM.from_pretrained(args["dir"], gguf_file=args["file"], dtype=getattr(torch, args["dtype"]))
model.eval()
rows = []
prefill = []
for p in args["prompts"]:
    ids = torch.tensor([p])
    with torch.no_grad():
        model(ids)
        t0 = time.perf_counter(); model(ids); prefill.append(time.perf_counter() - t0)
for W in [1] + args["widths"]:
    per = []
    name = "sample" if W == 1 else f"beam_sample_W{W}"
    for i, p in enumerate(args["prompts"]):
        ids = torch.tensor([p])
        torch.manual_seed(i)
        kw = dict(do_sample=True, num_beams=W, top_k=args["top_k"], top_p=args["top_p"], temperature=1.0,
                  max_new_tokens=args["n"], min_new_tokens=args["n"], num_return_sequences=1,
                  pad_token_id=0)
        if i == 0:
            with torch.no_grad():
                model.generate(ids, **dict(kw, max_new_tokens=2, min_new_tokens=2))  # warm-up
        t0 = time.perf_counter()
        with torch.no_grad():
            out = model.generate(ids, **kw)
        t = time.perf_counter() - t0
        n = out.shape[1] - ids.shape[1]
        per.append({"seconds": t, "tokens": int(n), "prefill_s": prefill[i]})
        print(f"  transformers {name} prompt {i}: {n} tokens in {t:.2f} s", flush=True)
    tok = sum(r["tokens"] for r in per); sec = sum(r["seconds"] for r in per)
    rows.append({"impl": "transformers", "method": name, "dtype": args["dtype"], "tokens_per_s": tok / sec,
                 "decode_tokens_per_s": tok / (sec - sum(prefill)), "prompts": per})
print("JSON" + json.dumps(rows))
"""


def hf_part(args, prompts, dtype="float32"):
    from dsbd_jax.loading.presets import ensure_gguf
    path = ensure_gguf(TARGET)
    payload = dict(dir=str(path.parent), file=path.name, widths=list(args.widths), prompts=prompts,
                   n=args.max_new_tokens, top_k=args.top_k, top_p=args.top_p,
                   threads=os.cpu_count(), dtype=dtype)
    return run_peer(sys.executable, HF_SCRIPT, payload, "transformers")


def run_peer(python: str, script: str, payload, what: str):
    """A peer's part: ``script`` run by ``python`` in a subprocess with ``payload`` as its JSON
    argument. Its output is echoed; what it prints after ``JSON`` on its last such line is
    returned. ``what`` names the peer in the error raised when the script fails."""
    proc = subprocess.run([python, "-c", script, json.dumps(payload)], capture_output=True,
                          text=True)
    lines = proc.stdout.splitlines()
    sys.stdout.write("".join(l + "\n" for l in lines if not l.startswith("JSON")))
    if proc.returncode != 0:
        raise RuntimeError(f"the {what} part failed:\n" + proc.stderr[-3000:])
    return json.loads([l for l in lines if l.startswith("JSON")][-1][4:])


def main():
    if "--cli" in sys.argv[1:]:   # the command line's answers, not decoding (module _cli_latency)
        from benchmarks import _cli_latency
        return _cli_latency.main([a for a in sys.argv[1:] if a != "--cli"])
    if "--prefill" in sys.argv[1:]:   # the prompt pass alone, whole bucket vs chunks (_prefill)
        from benchmarks import _prefill
        return _prefill.main([a for a in sys.argv[1:] if a != "--prefill"])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--dsbd", nargs="*", default=["2,4,0.7,2", "3,3,0.9,1", "3,3,0.9,1,sb"],
                    help="DSBD settings gamma,W_S,t,W_min[,sb] (sb: single-beam)")
    ap.add_argument("--widths", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--top-p", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--draft-weights", default="float", choices=("float", "int8"),
                    help="the draft model's kernels (int8: eight-bit products; the outputs keep "
                         "the target's distributions)")
    ap.add_argument("--target-weights", nargs="+", default=["float"], choices=("float", "int8"),
                    help="run our part once per target kind (int8: another model, opt-in)")
    ap.add_argument("--dtypes", nargs="+", default=["float32"], choices=["float32", "bfloat16"],
                    help="run the table in each dtype (ours and transformers alike)")
    ap.add_argument("--out", default="/tmp/dsbd_speed.json")
    ap.add_argument("--cli", action="store_true",
                    help="time the command line instead (help, refusals, a warm first token as "
                         "whole processes; python -m benchmarks.speed --cli --help)")
    ap.add_argument("--prefill", action="store_true",
                    help="time the prompt pass alone instead, the whole bucket against chunks "
                         "(python -m benchmarks.speed --prefill --help)")
    args = ap.parse_args()
    from dsbd_jax import eval as bench
    import gc
    import jax

    t0 = time.perf_counter()
    rows = []
    for dtype in args.dtypes:
        for weights in args.target_weights:
            texts, prompts, part = jax_part(args, dtype, weights)
            rows += part
            jax.clear_caches()
            gc.collect()
        if not args.skip_hf:
            rows += hf_part(args, prompts, dtype)
    ratios = {}
    several = len(args.target_weights) > 1
    for dtype in args.dtypes:
        for weights in args.target_weights:
            label = dtype + (", int8 target" if weights == "int8" else "")
            ratios.update(dtype_ratios(rows, dtype, weights, prefix=""
                                       if len(args.dtypes) == 1 and not several
                                       else f"{label}: "))
    if several:
        ratios.update(target_kind_ratios(rows))
    if len(args.dtypes) > 1:
        ours32 = {r["method"]: r for r in rows if r["impl"] == "dsbd_jax"
                  and r["dtype"] == "float32" and r["weights"] == "float"}
        for r in rows:
            if (r["impl"] == "dsbd_jax" and r["dtype"] != "float32" and r["weights"] == "float"
                    and r["method"] in ours32):
                for key in ("tokens_per_s", "decode_tokens_per_s"):
                    ratios[f"{key}: {r['method']}: ours {r['dtype']} / ours float32"] = (
                        r[key] / ours32[r["method"]][key])
    print()
    bench.print_table(rows, ["impl", "dtype", "weights", "method", "tokens_per_s",
                             "decode_tokens_per_s", "compile_s", "target_calls_per_token",
                             "loglik_per_token", "kv_cache_bytes"])
    for k, v in ratios.items():
        print(f"ratio {k}: {v:.2f}x")
    from dsbd_jax.eval.timing import portable_settings
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    bench.write_json(args.out, {"machine": bench.machine_info(),
                                "settings": portable_settings(vars(args), root),
                                "prompt_lengths": [len(p) for p in prompts], "rows": rows,
                                "ratios": ratios, "wall_s": time.perf_counter() - t0})
    print(f"wrote {args.out}")


def target_kind_ratios(rows):
    """Ours with the int8 target against ours with the float target, per method and dtype."""
    ours_float = {(r["method"], r["dtype"]): r for r in rows
                  if r["impl"] == "dsbd_jax" and r.get("weights", "float") == "float"}
    ratios = {}
    for r in rows:
        peer = ours_float.get((r["method"], r["dtype"]))
        if r["impl"] == "dsbd_jax" and r.get("weights") == "int8" and peer:
            for key in ("tokens_per_s", "decode_tokens_per_s"):
                ratios[f"{key}: {r['method']}: ours {r['dtype']} int8 target / ours "
                       f"{r['dtype']} float target"] = r[key] / peer[key]
    return ratios


def dtype_ratios(rows, dtype, weights="float", prefix=""):
    """The table's ratios among the rows of one dtype and target kind: ours / transformers per
    method (float target only: transformers runs the float weights), speculative / sampling,
    every DSBD setting against beam sampling W=4 (ours and transformers; single-beam DSBD
    against speculative)."""
    ours = {r["method"]: r for r in rows if r["impl"] == "dsbd_jax" and r["dtype"] == dtype
            and r.get("weights", "float") == weights}
    theirs = {r["method"]: r for r in rows if r["impl"] == "transformers"
              and r["dtype"] == dtype} if weights == "float" else {}
    ratios = {}
    for key in ("tokens_per_s", "decode_tokens_per_s"):
        for m, r in theirs.items():
            if m in ours:
                ratios[f"{prefix}{key}: {m}: dsbd_jax / transformers"] = ours[m][key] / r[key]
        spec = [m for m in ours if m.startswith("speculative")]
        base = ours.get("sample")
        if spec and base:
            ratios[f"{prefix}{key}: {spec[0]} / sample"] = ours[spec[0]][key] / base[key]
        for m, r in ours.items():
            if not m.startswith("dsbd"):
                continue
            peers = [("beam_sample_W4", ours), ("beam_sample_W4", theirs)]
            if m.endswith("_single") and spec:
                peers = [(spec[0], ours)]
            for peer, side in peers:
                if peer in side:
                    who = "ours" if side is ours else "transformers"
                    ratios[f"{prefix}{key}: {m} / {peer} ({who})"] = r[key] / side[peer][key]
    return {k: v for k, v in ratios.items()}


if __name__ == "__main__":
    main()
