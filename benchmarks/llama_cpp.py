"""Sampling from the target's own GGUF file: ours against llama.cpp, side by side in one run.

Ours: sampling (batch 1, EOS off, top-k 10, top-p 0.8, temperature 1) with the float target in
the host's dtype (``load_model(dtype="auto")``) and with the int8 target
(``load_model(weights="int8")``, another model than the float one), each prompt padded to its
bucket as the library runs it; on the int8 pair (int8 target and draft) also beam sampling W=4
and DSBD at ``--dsbd`` (the beam-W4 point): beam-sampling quality against llama.cpp's
sampling. llama.cpp: the same GGUF file (Q4_K / Q6_K blocks, run as stored),
the same prompt token ids, warping (``min_p=0``, no repetition penalty) and number of new
tokens, through llama-cpp-python with one thread per core.

    .venv/bin/python -m benchmarks.llama_cpp --llama-python /tmp/llama/bin/python \\
        --out results/llama_cpp_amx_xeon.json

llama-cpp-python is a peer, not a dependency (as transformers is to ``speed.py``): install it in
any Python 3 (``python3 -m venv /tmp/llama && /tmp/llama/bin/pip install llama-cpp-python``, a
build from source of some minutes) and name that interpreter. It runs in a subprocess after our
part, so the two never hold a model at once. End to end (prompt pass included) and decode
tokens/s for each, the prompt pass timed alone and subtracted; the ratios ours / llama.cpp.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from benchmarks.speed import run_peer  # noqa: E402

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"

LLAMA_SCRIPT = r"""
import json, sys, time
import llama_cpp
from llama_cpp import Llama
a = json.loads(sys.argv[1])
llm = Llama(model_path=a["gguf"], n_ctx=a["n_ctx"], n_batch=512, n_threads=a["threads"],
            n_threads_batch=a["threads"], seed=a["seed"], verbose=False)
warp = dict(top_k=a["top_k"], top_p=a["top_p"], temp=1.0, min_p=0.0, typical_p=1.0,
            repeat_penalty=1.0, reset=True)

def run(ids, n):
    llm.reset()
    out = []
    for tok in llm.generate(ids, **warp):
        out.append(tok)
        if len(out) == n:
            break
    return out

run(a["prompts"][0], 2)        # warm-up: buffers, threads
per = []
for i, p in enumerate(a["prompts"]):
    pre = []
    for _ in range(2):         # the prompt pass alone
        llm.reset()
        t0 = time.perf_counter(); llm.eval(p); pre.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    out = run(p, a["n"])
    t = time.perf_counter() - t0
    per.append({"seconds": t, "tokens": len(out), "prefill_s": sorted(pre)[0]})
    print(f"  llama.cpp sample prompt {i}: {len(out)} tokens in {t:.2f} s", flush=True)
print("JSON" + json.dumps({"version": llama_cpp.__version__, "prompts": per}))
"""


def ours(args, prompts_of):
    """Sampling with the float target (the host's dtype) and the int8 target, one row each;
    on the int8 pair also beam sampling W=4 and DSBD at ``args.dsbd``."""
    import gc

    import jax

    from dsbd_jax import eval as bench
    from dsbd_jax.decoding import common
    from dsbd_jax.decoding.beam import beam_sample
    from dsbd_jax.decoding.configs import BeamSampleConfig, SampleConfig
    from dsbd_jax.decoding.dsbd import DSBDConfig, dsbd_generate
    from dsbd_jax.decoding.sampling import sample
    from dsbd_jax.eval.run import prefill_seconds
    from dsbd_jax.loading.load import load_model
    rows, prompts = [], None
    for weights in ("float", "int8"):
        m = load_model(TARGET, "auto", weights=weights)
        if prompts is None:         # one tokenizer for both kinds
            prompts = prompts_of(m.tokenizer)[1]
        P = common.bucket_length(max(len(p) for p in prompts))
        warp = dict(temperature=1.0, top_k=args.top_k, top_p=args.top_p, eos_token_id=(),
                    max_new_tokens=args.max_new_tokens)

        def pre_of(model):
            return [prefill_seconds(model, P, *common.pad_prompts([p], length=P), 3)
                    for p in prompts]
        pre = pre_of(m)
        runs = [("sample", sample, m.params, SampleConfig(target=m.config, **warp), pre)]
        draft = None
        if weights == "int8" and args.dsbd != "none":
            draft = load_model(DRAFT, "auto", weights="int8")
            g, ws, t, wmin = args.dsbd.split(",")
            runs.append(("beam_sample_W4", beam_sample, m.params,
                         BeamSampleConfig(target=m.config, num_beams=4, **warp), pre))
            runs.append((f"dsbd_g{g}_WS{ws}_t{t}_Wmin{wmin}", dsbd_generate,
                         {"target": m.params, "draft": draft.params},
                         DSBDConfig(target=m.config, draft=draft.config, gamma=int(g),
                                    draft_width=int(ws), threshold=float(t),
                                    min_width=int(wmin), **warp),
                         [a + b for a, b in zip(pre, pre_of(draft))]))
        for method, fn, params, cfg, prefill in runs:
            r = bench.run_over_prompts(fn, params, cfg, prompts, P, seed=args.seed,
                                       label=f"ours ({m.info['dtype']}, {weights} weights) "
                                             f"{method}")
            sec = sum(p["seconds"] for p in r["prompts"])
            tok = sum(p["tokens"] for p in r["prompts"])
            rows.append({"impl": "dsbd_jax", "method": method, "weights": weights,
                         "dtype": m.info["dtype"], "bucket": P, "prefill_s": prefill,
                         "tokens_per_s": tok / sec,
                         "decode_tokens_per_s": tok / (sec - sum(prefill)),
                         "loglik_per_token": float(np.mean(
                             [p["loglik_per_token"] for p in r["prompts"]])),
                         "compile_s": r["compile_s"], "prompts": r["prompts"]})
        del m, draft
        jax.clear_caches()
        gc.collect()
    return prompts, rows


def ratios(rows) -> dict:
    """Each of our rows over llama.cpp's sampling (the last row), end to end and in decode."""
    peer = rows[-1]
    return {f"{key}: ours {r.get('method', 'sample')} {r['dtype']} {r['weights']} weights / "
            f"llama.cpp sampling": r[key] / peer[key]
            for r in rows[:-1] for key in ("tokens_per_s", "decode_tokens_per_s")}


def theirs(args, prompts):
    from dsbd_jax.loading.presets import ensure_gguf
    path = ensure_gguf(TARGET)
    payload = dict(gguf=str(path), prompts=prompts, n=args.max_new_tokens, top_k=args.top_k,
                   top_p=args.top_p, threads=os.cpu_count(), seed=args.seed,
                   n_ctx=max(len(p) for p in prompts) + args.max_new_tokens + 8)
    got = run_peer(args.llama_python, LLAMA_SCRIPT, payload, "llama.cpp")
    per = got["prompts"]
    sec = sum(p["seconds"] for p in per)
    tok = sum(p["tokens"] for p in per)
    return {"impl": "llama.cpp", "version": got["version"], "gguf": path.name,
            "gguf_bytes": path.stat().st_size, "threads": os.cpu_count(),
            "prefill_s": [p["prefill_s"] for p in per], "tokens_per_s": tok / sec,
            "decode_tokens_per_s": tok / (sec - sum(p["prefill_s"] for p in per)),
            "prompts": per}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llama-python", required=True,
                    help="a Python interpreter with llama-cpp-python installed")
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--top-p", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dsbd", default="2,4,0.7,2",
                    help="DSBD's gamma,W_S,t,W_min on the int8 pair, beside beam sampling W=4 "
                         "(default: the beam-W4 point); none skips both")
    ap.add_argument("--out", default="/tmp/dsbd_llama_cpp.json")
    args = ap.parse_args(argv)
    if args.dsbd != "none":          # before any model loads
        parts = args.dsbd.split(",")
        try:
            ok = len(parts) == 4 and int(parts[0]) >= 1 and 0 <= float(parts[2]) <= 1
        except ValueError:
            ok = False
        if not ok:
            raise SystemExit(f"--dsbd {args.dsbd}: give gamma,W_S,t,W_min (e.g. 2,4,0.7,2) "
                             f"or none")
    check = subprocess.run([args.llama_python, "-c", "import llama_cpp"], capture_output=True,
                           text=True)
    if check.returncode != 0:       # before our part: minutes of work otherwise
        raise SystemExit(f"--llama-python {args.llama_python}: cannot import llama_cpp "
                         f"({check.stderr.strip().splitlines()[-1] if check.stderr else 'no Python'}"
                         f"); install it there: {args.llama_python} -m pip install "
                         f"llama-cpp-python")
    from dsbd_jax import eval as bench
    from dsbd_jax.eval.datasets import benchmark_prompts
    from dsbd_jax.eval.timing import portable_settings
    t0 = time.perf_counter()
    prompts, rows = ours(args, lambda tok: benchmark_prompts(tok, args.prompts))
    rows.append(theirs(args, prompts))
    got = ratios(rows)
    for k, v in got.items():
        print(f"ratio {k}: {v:.2f}x")
    settings = portable_settings(vars(args), _ROOT)
    settings["llama_python"] = "(a Python with llama-cpp-python)"
    res = {"machine": bench.machine_info(), "settings": settings,
           "prompt_lengths": [len(p) for p in prompts], "rows": rows, "ratios": got,
           "wall_s": time.perf_counter() - t0}
    bench.write_json(args.out, res)
    print(f"wrote {args.out}")
    return res


if __name__ == "__main__":
    main()
