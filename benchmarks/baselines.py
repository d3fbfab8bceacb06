"""Baselines on the offline pair, side by side in one run: our beam_sample (W = 2, 4) against
transformers' beam sampling (``do_sample=True, num_beams=W``) on the same weights and prompts,
and our speculative_sample against our sample (tokens/s, mean accepted tokens per target call).

    .venv/bin/python benchmarks/baselines.py --prompts 4 --max-new-tokens 32 \
        --out results/baselines.json

The JAX part runs in this process; the transformers part runs afterwards in a subprocess, so the
two copies of the 1.5B model are never in memory at once. Every prompt is padded to one length
bucket (one compile per method); compile time is reported apart and excluded from speeds.
EOS is disabled on both sides (ours: ``eos_token_id=()``; transformers: ``min_new_tokens``), so
every run generates exactly ``--max-new-tokens`` tokens per prompt.
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


def jax_part(args):
    from dsbd_jax import bench, common
    from dsbd_jax.datasets import benchmark_prompts
    from dsbd_jax.beam import beam_sample
    from dsbd_jax.loading import load_model
    from dsbd_jax.sampling import sample
    from dsbd_jax.speculative import speculative_sample

    target = load_model(TARGET)
    draft = load_model(DRAFT)
    texts, prompts = benchmark_prompts(target.tokenizer, args.prompts)
    P = common.bucket_length(max(len(p) for p in prompts))
    warp = dict(temperature=1.0, top_k=args.top_k, top_p=args.top_p, eos_token_id=(),
                max_new_tokens=args.max_new_tokens)
    methods = [("sample", sample, common.DecodeConfig(target=target.config, **warp), False)]
    for W in args.widths:
        methods.append((f"beam_sample_W{W}", beam_sample,
                        common.DecodeConfig(target=target.config, num_beams=W, **warp), False))
    methods.append((f"speculative_g{args.gamma}", speculative_sample,
                    common.DecodeConfig(target=target.config, draft=draft.config,
                                        gamma=args.gamma, **warp), True))
    rows = []
    for name, fn, cfg, spec in methods:
        params = {"target": target.params, "draft": draft.params} if spec else target.params
        r = bench.run_over_prompts(fn, params, cfg, prompts, P, seed=args.seed, label=name)
        rows.append({"impl": "dsbd_jax", "method": name, **r})
    return texts, prompts, rows


HF_SCRIPT = r"""
import json, sys, time, torch
from transformers import AutoModelForCausalLM
args = json.loads(sys.argv[1])
torch.set_num_threads(args["threads"])
model = AutoModelForCausalLM.from_pretrained(args["dir"], gguf_file=args["file"], dtype=torch.float32)
model.eval()
rows = []
for W in args["widths"]:
    per = []
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
        per.append({"seconds": t, "tokens": int(n)})
        print(f"  transformers beam_sample_W{W} prompt {i}: {n} tokens in {t:.2f} s", flush=True)
    tok = sum(r["tokens"] for r in per); sec = sum(r["seconds"] for r in per)
    rows.append({"impl": "transformers", "method": f"beam_sample_W{W}", "tokens_per_s": tok / sec, "prompts": per})
print("JSON" + json.dumps(rows))
"""


def hf_part(args, prompts):
    from dsbd_jax.presets import ensure_gguf
    path = ensure_gguf(TARGET)
    payload = dict(dir=str(path.parent), file=path.name, widths=list(args.widths), prompts=prompts,
                   n=args.max_new_tokens, top_k=args.top_k, top_p=args.top_p,
                   threads=os.cpu_count())
    proc = subprocess.run([sys.executable, "-c", HF_SCRIPT, json.dumps(payload)],
                          capture_output=True, text=True)
    sys.stdout.write("\n".join(l for l in proc.stdout.splitlines() if not l.startswith("JSON")) + "\n")
    if proc.returncode != 0:
        raise RuntimeError("transformers part failed:\n" + proc.stderr[-3000:])
    line = [l for l in proc.stdout.splitlines() if l.startswith("JSON")][-1]
    return json.loads(line[4:])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--widths", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--gamma", type=int, default=4)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--top-p", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--out", default="results/baselines.json")
    args = ap.parse_args()
    from dsbd_jax import bench

    t0 = time.perf_counter()
    texts, prompts, rows = jax_part(args)
    if not args.skip_hf:
        import gc
        import jax
        jax.clear_caches()
        gc.collect()
        rows += hf_part(args, prompts)
    ours = {r["method"]: r for r in rows if r["impl"] == "dsbd_jax"}
    theirs = {r["method"]: r for r in rows if r["impl"] == "transformers"}
    ratios = {}
    for m, r in theirs.items():
        if m in ours:
            ratios[f"{m}: dsbd_jax / transformers"] = ours[m]["tokens_per_s"] / r["tokens_per_s"]
    spec = [m for m in ours if m.startswith("speculative")]
    if spec:
        ratios[f"{spec[0]} / sample"] = ours[spec[0]]["tokens_per_s"] / ours["sample"]["tokens_per_s"]
    print()
    bench.print_table(rows, ["impl", "method", "tokens_per_s", "compile_s", "target_calls_per_token",
                             "tokens_per_target_call", "loglik_per_token"])
    for k, v in ratios.items():
        print(f"ratio {k}: {v:.2f}x")
    bench.write_json(args.out, {"machine": bench.machine_info(), "settings": vars(args),
                                "prompt_lengths": [len(p) for p in prompts], "rows": rows,
                                "ratios": ratios, "wall_s": time.perf_counter() - t0})
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
