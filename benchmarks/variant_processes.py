"""Two forms of one piece of library code, end to end side by side, each in its own process: the
machinery of ``benchmarks/probes/embed_gather.py`` (the embedding lookup); its models and decoders are
also ``benchmarks/probes/attention_form.py``'s (which runs both forms in one process).

A comparison names its variants (the first is the library's former form, patched in by the child
process before anything is traced; the last is the library as it is), its decoders and what to
count in each compiled program. :func:`main` runs the variants alternately, ``--rounds`` pairs of
fresh processes (``DSBD_JAX_COMPILATION_CACHE=0``: every process compiles afresh), on the offline
Qwen2.5-Coder 1.5B / 0.5B pair in bfloat16 (``--small``: a tiny random bfloat16 pair), the
benchmark prompts one at a time (batch 1, EOS off, top-k 10 / top-p 0.8, each prompt timed after
a warm-up call), and writes every run and, per decoder, the seconds of each variant over the
first's (``--variants`` runs some of them, in the order given).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import Callable, Dict, Optional, Sequence

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
DRAFTED = ("dsbd_g2_WS4_t0.7_Wmin2", "speculative_g4")
UNDRAFTED = ("sample", "beam_sample_W4")


def models(small: bool, draft_weights: str = "float"):
    """``(target config, target params, draft config, draft params, prompts)``; the draft's
    weights ``"float"`` (bfloat16) or ``"int8"``."""
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
        draft, dcfg = llama.init_params(cfg, jax.random.PRNGKey(1)), cfg
        if draft_weights == "int8":
            from dsbd_jax.models.kinds import int8_params
            draft, dcfg = int8_params(draft, cfg)
        return cfg, llama.init_params(cfg, jax.random.PRNGKey(0)), dcfg, draft, prompts
    from dsbd_jax.eval.datasets import benchmark_prompts
    from dsbd_jax.loading.load import load_model
    t = load_model(TARGET, "bfloat16", progress=False)
    d = load_model(DRAFT, "bfloat16", tokenizer=False, progress=False, weights=draft_weights)
    _, prompts = benchmark_prompts(t.tokenizer, 2)
    return t.config, t.params, d.config, d.params, prompts


def decoder_runs(tc, dc, new_tokens: int, names: Sequence[str]):
    """``[(name, function, config, takes both models)]`` of the decoders named."""
    from dsbd_jax.decoding.beam import beam_sample
    from dsbd_jax.decoding.configs import BeamSampleConfig, SampleConfig, SpeculativeConfig
    from dsbd_jax.decoding.dsbd import DSBDConfig, dsbd_generate
    from dsbd_jax.decoding.sampling import sample
    from dsbd_jax.decoding.speculative import speculative_sample
    warp = dict(top_k=10, top_p=0.8, eos_token_id=(), max_new_tokens=new_tokens)
    every = {
        "dsbd_g2_WS4_t0.7_Wmin2": (dsbd_generate, DSBDConfig(
            target=tc, draft=dc, gamma=2, draft_width=4, threshold=0.7, min_width=2, **warp),
            True),
        "speculative_g4": (speculative_sample,
                           SpeculativeConfig(target=tc, draft=dc, gamma=4, **warp), True),
        "sample": (sample, SampleConfig(target=tc, **warp), False),
        "beam_sample_W4": (beam_sample, BeamSampleConfig(target=tc, num_beams=4, **warp), False),
    }
    return [(n,) + every[n] for n in names]


def child(patch: Optional[Callable[[], None]], small: bool, new_tokens: int,
          decoders: Sequence[str], inspect: Callable[[str, object], object]) -> dict:
    """One variant in this process: ``patch()`` (if any), then per decoder compile (timed:
    ``compile_s``), record ``inspect(program text, target config)`` and time each prompt."""
    import jax
    if patch is not None:
        patch()
    from dsbd_jax.decoding import common
    from dsbd_jax.decoding.common import pad_prompts
    from dsbd_jax.eval.timing import run_over_prompts
    tc, tp, dc, dp, prompts = models(small)
    P = common.bucket_length(max(len(p) for p in prompts))
    out = {"dtypes": {"target": tc.dtype, "draft": dc.dtype}, "decoders": {}}
    for name, fn, cfg, drafted in decoder_runs(tc, dc, new_tokens, decoders):
        params = {"target": tp, "draft": dp} if drafted else tp
        ids, lens = pad_prompts([prompts[0]], length=P)
        t0 = time.perf_counter()
        compiled = fn.prepare(params, ids, jax.random.PRNGKey(0), cfg,
                              prompt_lengths=lens).compile()
        compile_s = time.perf_counter() - t0
        hlo = compiled.as_text()
        r = run_over_prompts(fn, params, cfg, prompts, P, label=name,
                             log=lambda m: print(m, file=sys.stderr, flush=True))
        out["decoders"][name] = {
            "seconds": [p["seconds"] for p in r["prompts"]],
            "tokens": [p["tokens"] for p in r["prompts"]],
            "iterations": [p["iterations"] for p in r["prompts"]],
            "compile_s": compile_s, **inspect(hlo, tc)}
    return out


def main(script: str, description: str, variants: Dict[str, Optional[Callable[[], None]]],
         decoders: Sequence[str], inspect: Callable[[str, object], dict], argv=None,
         rounds: int = 2):
    """The command line of a comparison (module doc): ``script`` is its file (the children run
    it with ``--child VARIANT``), ``variants`` ``{name: patch or None}`` in order, former form
    first."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--rounds", type=int, default=rounds,
                    help="pairs of processes (each variant once)")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--small", action="store_true", help="a tiny random bfloat16 pair (seconds)")
    ap.add_argument("--child", choices=list(variants), help=argparse.SUPPRESS)
    ap.add_argument("--variants", nargs="+", choices=list(variants), default=list(variants),
                    help="the variants to run, in this order (default: all; the first is the "
                         "ratios' base)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if args.child:
        res = child(variants[args.child], args.small, args.max_new_tokens, decoders, inspect)
        print(json.dumps({"variant": args.child, **res}))
        return None
    from dsbd_jax.eval.timing import machine_info, portable_settings, write_json
    env = dict(os.environ, DSBD_JAX_COMPILATION_CACHE="0")   # every process compiles afresh
    runs = []
    t0 = time.perf_counter()
    for r in range(args.rounds):
        for variant in args.variants:
            cmd = [sys.executable, os.path.abspath(script), "--child", variant,
                   "--max-new-tokens", str(args.max_new_tokens), "--out", "-"]
            cmd += ["--small"] if args.small else []
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=_ROOT)
            if proc.returncode != 0:
                raise SystemExit(f"{variant}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
            runs.append({"round": r, **json.loads(proc.stdout.strip().splitlines()[-1])})
            print(f"round {r} {variant}: " + ", ".join(
                f"{k} {sum(v['seconds']):.2f} s" for k, v in runs[-1]["decoders"].items()),
                flush=True)
    first, ratios = args.variants[0], {}
    for name in runs[0]["decoders"]:
        total = {v: sum(sum(x["decoders"][name]["seconds"]) for x in runs if x["variant"] == v)
                 for v in args.variants}
        for v in args.variants[1:]:
            ratios[f"{name}: {v} / {first}, seconds"] = total[v] / total[first]
    res = {"machine": machine_info(), "settings": portable_settings(vars(args), _ROOT),
           "models": "tiny random pair" if args.small else {"target": TARGET, "draft": DRAFT},
           "runs": runs, "ratios": ratios, "wall_s": time.perf_counter() - t0}
    for k, v in ratios.items():
        print(f"{k}: {v:.3f}")
    write_json(args.out, res)
    return res
