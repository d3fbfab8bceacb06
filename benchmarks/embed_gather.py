"""The embedding lookup of a 16-bit model, side by side: the decoders as they are (the rows
gathered as their bits and cast, ``llama.embed_rows``) against a plain ``nn.Embed`` lookup (the
rows gathered as 16-bit floats, which XLA:CPU runs in float32 after converting the whole
``[V, d]`` table). DSBD g2 / W_S 4 / t 0.7 / W_min 2 and speculative sampling g4 on the offline
Qwen2.5-Coder 1.5B / 0.5B pair in bfloat16, end to end (the benchmark prompts, batch 1, EOS off,
top-k 10 / top-p 0.8, each prompt timed after a warm-up call), every variant in its own process,
alternating (``--rounds`` pairs); each compiled program's whole-table conversions are counted.

    .venv/bin/python benchmarks/embed_gather.py --out results/embed_gather_epyc.json   # ~7 min
    .venv/bin/python benchmarks/embed_gather.py --small --rounds 1 --out /tmp/embed_gather.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)

VARIANTS = ("plain_lookup", "rows_as_bits")
TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"


def table_converts(hlo: str, vocab: int) -> list:
    """The instructions of a compiled program that produce a whole float32 ``[vocab, d]``
    table from a parameter (a conversion of an embedding table)."""
    return [line.strip()[:160] for line in hlo.splitlines()
            if re.search(rf"= f32\[{vocab},\d+\]\S* (convert|fusion)\(", line)]


def _models(small: bool):
    """``(target config, target params, draft config, draft params, prompts)``."""
    if small:
        import jax
        import numpy as np

        from dsbd_jax.models import llama
        from dsbd_jax.models.config import ModelConfig
        cfg = ModelConfig(vocab_size=512, hidden_size=32, intermediate_size=64, num_layers=2,
                          num_heads=2, num_kv_heads=1, head_dim=16, dtype="bfloat16",
                          tie_word_embeddings=False)
        rng = np.random.default_rng(0)
        prompts = [list(rng.integers(1, 512, n)) for n in (11, 7)]
        return (cfg, llama.init_params(cfg, jax.random.PRNGKey(0)), cfg,
                llama.init_params(cfg, jax.random.PRNGKey(1)), prompts)
    from dsbd_jax.eval.datasets import benchmark_prompts
    from dsbd_jax.models.loading import load_model
    t = load_model(TARGET, "bfloat16", progress=False)
    d = load_model(DRAFT, "bfloat16", tokenizer=False, progress=False)
    _, prompts = benchmark_prompts(t.tokenizer, 2)
    return t.config, t.params, d.config, d.params, prompts


def child(variant: str, small: bool, new_tokens: int) -> dict:
    """One variant in this process: compile, count the conversions, time each prompt."""
    import jax

    from dsbd_jax.models import llama
    if variant == "plain_lookup":
        llama.embed_rows = lambda embed, tokens: embed(tokens).astype(llama.ACT)
    from dsbd_jax.decoding import common
    from dsbd_jax.decoding.common import pad_prompts
    from dsbd_jax.decoding.configs import SpeculativeConfig
    from dsbd_jax.decoding.dsbd import DSBDConfig, dsbd_generate
    from dsbd_jax.decoding.speculative import speculative_sample
    from dsbd_jax.eval.timing import run_over_prompts
    tc, tp, dc, dp, prompts = _models(small)
    P = common.bucket_length(max(len(p) for p in prompts))
    warp = dict(top_k=10, top_p=0.8, eos_token_id=(), max_new_tokens=new_tokens)
    params = {"target": tp, "draft": dp}
    out = {"variant": variant, "dtypes": {"target": tc.dtype, "draft": dc.dtype}, "decoders": {}}
    for name, fn, cfg in [
            ("dsbd_g2_WS4_t0.7_Wmin2", dsbd_generate,
             DSBDConfig(target=tc, draft=dc, gamma=2, draft_width=4, threshold=0.7, min_width=2,
                        **warp)),
            ("speculative_g4", speculative_sample,
             SpeculativeConfig(target=tc, draft=dc, gamma=4, **warp))]:
        ids, lens = pad_prompts([prompts[0]], length=P)
        hlo = fn.prepare(params, ids, jax.random.PRNGKey(0), cfg,
                         prompt_lengths=lens).compile().as_text()
        r = run_over_prompts(fn, params, cfg, prompts, P, label=f"{variant} {name}",
                             log=lambda m: print(m, file=sys.stderr, flush=True))
        out["decoders"][name] = {
            "seconds": [p["seconds"] for p in r["prompts"]],
            "tokens": [p["tokens"] for p in r["prompts"]],
            "iterations": [p["iterations"] for p in r["prompts"]],
            "table_converts": table_converts(hlo, tc.vocab_size)}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2, help="pairs of processes (each variant once)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--small", action="store_true", help="a tiny random bfloat16 pair (seconds)")
    ap.add_argument("--child", choices=VARIANTS, help=argparse.SUPPRESS)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.small, args.max_new_tokens)))
        return None
    from dsbd_jax.eval.timing import machine_info, portable_settings, write_json
    env = dict(os.environ, DSBD_JAX_COMPILATION_CACHE="0")   # every process compiles afresh
    runs = []
    t0 = time.perf_counter()
    for r in range(args.rounds):
        for variant in VARIANTS:
            cmd = [sys.executable, os.path.abspath(__file__), "--child", variant,
                   "--max-new-tokens", str(args.max_new_tokens), "--out", "-"]
            cmd += ["--small"] if args.small else []
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=_ROOT)
            if proc.returncode != 0:
                raise SystemExit(f"{variant}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
            runs.append({"round": r, **json.loads(proc.stdout.strip().splitlines()[-1])})
            print(f"round {r} {variant}: " + ", ".join(
                f"{k} {sum(v['seconds']):.2f} s" for k, v in runs[-1]["decoders"].items()),
                flush=True)
    ratios = {}
    for name in runs[0]["decoders"]:
        total = {v: sum(sum(x["decoders"][name]["seconds"]) for x in runs if x["variant"] == v)
                 for v in VARIANTS}
        ratios[f"{name}: rows_as_bits / plain_lookup, seconds"] = (
            total["rows_as_bits"] / total["plain_lookup"])
    res = {"machine": machine_info(), "settings": portable_settings(vars(args), _ROOT),
           "models": "tiny random pair" if args.small else {"target": TARGET, "draft": DRAFT},
           "runs": runs, "ratios": ratios, "wall_s": time.perf_counter() - t0}
    for k, v in ratios.items():
        print(f"{k}: {v:.3f}")
    write_json(args.out, res)
    return res


if __name__ == "__main__":
    main()
