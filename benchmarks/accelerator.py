"""Costs on an accelerator (or the CPU) with random weights, and a PROJECTION of tokens/s.

One process, JSON out. For each model pair (``qwen``: the default Qwen2.5-Coder 1.5B / 0.5B pair;
``llama``: Llama-3.1-8B / Llama-3.2-1B shapes), dtype (bfloat16 for both, float32 for the small
pair) and weight layout (``per_layer``, the default on CPU and GPU, then ``stacked``), with random
weights:

1. **forward** of the target and the draft: 1 token, 4 and 16 rows of 1 token, forests of 12 and
   16 nodes, at 512 and 4096 cache slots; compile time reported apart. The target also over
   forests of 24, 32, 48 and 64 nodes at the first slot count: ``forest_curve`` (each as a
   multiple of the one-token pass) and ``node_budget``, the forest DSBD's ``--node-budget auto``
   would grow to (:func:`dsbd_jax.host.forest_budget.pick_budget`).
2. **decoders**: every method (sample, beam sampling W=4, speculative gamma 4, tree, DSBD
   g2 / W_S 4 / t 0.7 / W_min 2) at batch 1 and 8, EOS off: the cost of one iteration inside its
   compiled loop = (run time - prefill time) / iterations (``None`` where the difference is at or
   below zero: under the timer's resolution), and its **overhead share** = 1 - (the forward
   passes one iteration runs, timed alone at the same shapes) / (cost per iteration).
3. **memory**: parameter bytes, KV-cache bytes of each decoder, the compiled program's temporary
   bytes (``memory_analysis``) and the device's peak (``memory_stats``, where the backend has it).
4. **projection** (labelled so everywhere): tokens/s = tokens per iteration measured on the CPU
   with the real pair (``--tokens-per-iteration``, default ``results/speed_float32_host.json``: it depends on
   the models, not the hardware) / the cost per iteration measured here; and each method's
   ratio to beam sampling W=4.
5. **a draft head** (``--head-rows``, default 32,768; 0: none): a random feature-level head of
   the target (:mod:`dsbd_jax.models.head`: one block, a truncated vocabulary head of that many
   rows) timed as a draft: its passes at the forward shapes beside the target's and the draft
   model's (``head_vs_target``: its one-token pass over the target's), and speculative
   sampling and DSBD drafting with it (methods ``..._head``), projected with the tokens per
   iteration that ``benchmarks/draft_terms.py --head`` measured on the CPU with the trained
   head (``--head-tokens-per-iteration``, default ``results/draft_terms_head.json``).

6. **variants** of the same weights, each recorded in its run: ``--projections separate fused``
   runs the first layout once more with q/k/v and gate/up fused (:mod:`dsbd_jax.models.fused`;
   the target's and the draft model's, its passes and decoders), and ``--draft-weights int8``
   gives the draft model int8 projections and head (as ``load_model(weights="int8")``).

Accelerator hygiene: decoders run with ``progress=False`` (no host callback in the loop), the
whole decode is one ``lax.while_loop`` (no host round trip per iteration), float64 is off
(checked), random keys and prompts are made on the device once. Work is done in order of value
and stops at ``--budget-s`` (default 420 s; the rest is listed under ``skipped``).

Usage: python -m benchmarks.accelerator [--out results/gpu/DEVICE.json] [--budget-s 420]
       [--pairs qwen llama] [--dtypes bfloat16 float32] [--layouts per_layer stacked]
       [--methods ...] [--batches 1 8] [--slots 512 4096] [--max-new-tokens 32]
       [--projections separate fused] [--draft-weights int8]
       python -m benchmarks.accelerator --small   (tiny shapes on the CPU, batch 1, 32 new
       tokens, bfloat16 per_layer + float32 stacked: a check of every code path; --methods to
       run fewer)
A GPU machine runs ``scripts/gpu_bench.sh OUTDIR``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from dsbd_jax.decoding import common, methods  # noqa: E402
from dsbd_jax.decoding.dsbd.state import num_slots  # noqa: E402
from dsbd_jax.eval.timing import machine_info, write_json  # noqa: E402
from dsbd_jax.host import forest_budget
from dsbd_jax.models import fused, kinds  # noqa: E402
from dsbd_jax.models import head as mhead  # noqa: E402
from dsbd_jax.models import llama  # noqa: E402
from dsbd_jax.models.cache import KVCache  # noqa: E402
from dsbd_jax.models.config import ModelConfig  # noqa: E402
from dsbd_jax.host.cpu_options import compiler_options  # noqa: E402

QWEN = dict(vocab_size=151936, num_kv_heads=2, rope_theta=1e6, attention_bias=True,
            architecture="qwen2", max_position_embeddings=32768)
LLAMA = dict(vocab_size=128256, num_kv_heads=8, rope_theta=5e5, max_position_embeddings=32768)
PAIRS = {  # name: (target, draft)
    "qwen": (dict(QWEN, hidden_size=1536, intermediate_size=8960, num_layers=28, num_heads=12,
                  head_dim=128),
             dict(QWEN, hidden_size=896, intermediate_size=4864, num_layers=24, num_heads=14,
                  head_dim=64, tie_word_embeddings=True)),
    "llama": (dict(LLAMA, hidden_size=4096, intermediate_size=14336, num_layers=32, num_heads=32,
                   head_dim=128),
              dict(LLAMA, hidden_size=2048, intermediate_size=8192, num_layers=16, num_heads=32,
                   head_dim=64, tie_word_embeddings=True)),
}
SMALL = dict(vocab_size=512, num_kv_heads=2, max_position_embeddings=8192)
SMALL_PAIRS = {"tiny": (dict(SMALL, hidden_size=64, intermediate_size=128, num_layers=2,
                             num_heads=4, head_dim=16),
                        dict(SMALL, hidden_size=32, intermediate_size=64, num_layers=1,
                             num_heads=4, head_dim=8))}
BUDGET_FORESTS = (24, 32, 48, 64)   # with 12 and 16: the node budget's curve (target only)
FORWARD_SHAPES = {"1 token": (1, 1), "4 rows": (4, 1), "16 rows": (16, 1), "forest 12": (1, 12),
                  "forest 16": (1, 16)}
GAMMA, WIDTH = 4, 4
DSBD = dict(gamma=2, draft_width=4, threshold=0.7, min_width=2, max_width=4)
METHODS = {  # name in a speed.py JSON: (method, settings)
    "sample": ("sample", {}),
    "beam_sample_W4": ("beam", dict(num_beams=WIDTH)),
    f"speculative_g{GAMMA}": ("spec", dict(gamma=GAMMA)),
    "tree_g2_w2": ("tree", dict(gamma=2, tree_widths=(2, 2))),
    "dsbd_g2_WS4_t0.7_Wmin2": ("dsbd", DSBD),
}
HEAD_METHODS = {f"speculative_g{GAMMA}_head": f"speculative_g{GAMMA}",  # -> the model's name
                "dsbd_g2_WS4_t0.7_Wmin2_head": "dsbd_g2_WS4_t0.7_Wmin2"}
# draft_terms.py's names of the same settings (its tokens per iteration feed the projection)
DRAFT_TERMS_NAMES = {f"speculative_g{GAMMA}_head": f"speculative_g{GAMMA}",
                     "dsbd_g2_WS4_t0.7_Wmin2_head": "dsbd_beamW4_point"}
PROMPT_LEN = 64


class Budget:
    def __init__(self, seconds):
        self.end, self.skipped = time.perf_counter() + seconds, []

    def ok(self, what):
        if time.perf_counter() < self.end:
            return True
        self.skipped.append(what)
        return False


def timed_min(fn, repeats):
    jax.block_until_ready(fn())
    best = np.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        best = min(best, time.perf_counter() - t0)
    return best


def tree_bytes(tree):
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(tree)))


def peak_bytes():
    stats = getattr(jax.devices()[0], "memory_stats", lambda: None)()
    return None if not stats else stats.get("peak_bytes_in_use")


class ForwardTimer:
    """Times ``llama.forward`` at (rows, tokens, cache slots), cached by shape."""

    def __init__(self, cfg, params, repeats):
        self.cfg, self.params, self.repeats, self.done = cfg, params, repeats, {}
        self.fn = jax.jit(lambda p, t, q, m, c: llama.forward(cfg, p, t, q, m, c),
                          compiler_options=compiler_options())

    def __call__(self, B, T, slots):
        if (B, T, slots) in self.done:
            return self.done[B, T, slots]
        cfg = self.cfg
        kv = jnp.zeros((cfg.num_layers, B, slots, cfg.num_kv_heads, cfg.head_dim), cfg.jnp_dtype)
        cache = KVCache(kv, kv)
        filled = slots // 2
        tokens = jnp.ones((B, T), jnp.int32)
        positions = filled + jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
        mask = jnp.concatenate([jnp.broadcast_to(jnp.arange(slots) < filled, (B, T, slots)),
                                jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (B, T, T))], -1)
        t0 = time.perf_counter()
        compiled = self.fn.lower(self.params, tokens, positions, mask, cache).compile()
        compile_s = time.perf_counter() - t0
        run = timed_min(lambda: compiled(self.params, tokens, positions, mask, cache),
                        self.repeats)
        self.done[B, T, slots] = {"ms": 1e3 * run, "compile_s": compile_s}
        return self.done[B, T, slots]


class HeadTimer(ForwardTimer):
    """Times a draft head's forward (:func:`dsbd_jax.models.head.forward`) at (rows, tokens,
    cache slots) with the target's parameters it reads (embedding, vocabulary head)."""

    def __init__(self, hc, head_params, target_params, repeats):
        self.cfg, self.repeats, self.done = hc, repeats, {}
        self.params = {"head": head_params, "target": target_params}
        self.fn = jax.jit(lambda p, t, q, m, c: mhead.forward(
            hc, p["head"], p["target"], t, jnp.full(t.shape + (hc.hidden_size,), 0.1,
                                                    llama.ACT), q, m, c),
            compiler_options=compiler_options())


def random_head(target_cfg, target_params, rows, key):
    """``(HeadConfig, params)``: a random head of the target, its vocabulary head truncated to
    ``rows`` rows (the cost of the trained head's shape; which rows does not matter)."""
    hc = mhead.HeadConfig(target_cfg)
    hp = mhead.init_params(hc, key)
    if rows and rows < target_cfg.vocab_size:
        hp = mhead.truncate(hc, hp, target_params, np.arange(rows))
    return hc, hp


def iteration_passes(method, settings, B, S):
    """The forward passes of one loop iteration: ``[(model, rows, tokens, slots), ...]``."""
    if method == "sample":
        return [("target", B, 1, S)]
    if method == "beam":
        return [("target", B * settings["num_beams"], 1, S)]
    if method in ("spec", "tree"):
        g = settings["gamma"]
        widths = settings.get("tree_widths") or (1,) * g
        nodes = int(np.sum(np.cumprod(widths)))
        return [("draft", B, w, S) for w in np.cumprod(widths)] + [("target", B, 1 + nodes, S)]
    g, c, wc = settings["gamma"], settings["draft_width"], settings["max_width"]
    td = 2 * wc + (g - 1) * c
    return ([("draft", B, 2 * wc, wc * S + td)] + [("draft", B, c, wc * S + td)] * (g - 1)
            + [("target", B, wc + g * c, wc * S)])


def decoder_costs(pair, params, timers, batch, new_tokens, repeats, budget, label, names):
    out = {}
    key = jax.random.PRNGKey(0)
    ids = jax.random.randint(key, (batch, PROMPT_LEN), 0, pair["target"].vocab_size)
    lengths = jnp.full((batch,), PROMPT_LEN, jnp.int32)
    prefill = {name: jax.jit(lambda p, i, n, cfg=cfg, S=None: common.prefill(cfg, p, i, n, S),
                             static_argnames=("S",), compiler_options=compiler_options())
               for name, cfg in pair.items() if name != "head"}
    for speed_name in names:
        head = speed_name in HEAD_METHODS  # drafting with the head: passes timed as "head"
        method, settings = METHODS[HEAD_METHODS.get(speed_name, speed_name)]
        if not budget.ok(f"{label} decoder {speed_name} batch {batch}"):
            continue
        draft = "head" if head else "draft"
        dec = methods.build(method, pair["target"], pair[draft], max_new_tokens=new_tokens,
                            top_k=10, top_p=0.8, eos_token_id=(), progress=False, **settings)
        p = methods.model_params(dec, params["target"], params[draft])
        t0 = time.perf_counter()
        compiled = dec.compiled(p, ids, key, lengths)  # the public call below runs this
        compile_s = time.perf_counter() - t0
        run_s = timed_min(lambda: dec(p, ids, key, lengths), repeats)
        res = dec(p, ids, key, lengths)
        iters = int(np.asarray(res.stats["iterations"]))
        S = (num_slots(dec.config, PROMPT_LEN) if method == "dsbd"
             else PROMPT_LEN + new_tokens + (GAMMA + 1 if method in ("spec", "tree") else 0))
        models = ("target", "draft") if method in methods.NEEDS_DRAFT else ("target",)
        if head:  # the target's prompt pass with features, then the head's: prefill_pair
            from dsbd_jax.decoding.drafting import prefill_pair
            pre = jax.jit(lambda pp, i, n, cfg=dec.config, S=S: prefill_pair(cfg, pp, i, n, S, S),
                          compiler_options=compiler_options())
            pre_s = timed_min(lambda: pre(p, ids, lengths), repeats)
        else:
            pre_s = sum(timed_min(lambda m=m: prefill[m](params[m], ids, lengths, S=S), repeats)
                        for m in models)
        # the loop's cost is a difference; one at or below zero is under the timer's resolution
        # (tiny shapes, a busy host) and is recorded as None, never as a figure of 0
        per_iter = (run_s - pre_s) / max(iters, 1) if run_s > pre_s else None
        fwd_ms = sum(timers[draft if m == "draft" else m](b, t, s)["ms"]
                     for m, b, t, s in iteration_passes(method, settings, batch, S))
        mem = compiled.memory_analysis()
        out[speed_name] = {
            "compile_s": compile_s, "run_s": run_s, "prefill_s": pre_s, "iterations": iters,
            "ms_per_iteration": 1e3 * per_iter if per_iter else None,
            "forward_ms_per_iteration": fwd_ms,
            "overhead_share": (1 - fwd_ms / (1e3 * per_iter)) if per_iter else None,
            "temp_bytes": getattr(mem, "temp_size_in_bytes", None),
            "kv_cache_bytes": _kv_bytes({**pair, "draft": pair[draft]}, method, settings,
                                        batch, S)}
        loop = (f"{1e3 * per_iter:8.2f} ms/iteration, overhead "
                f"{out[speed_name]['overhead_share']:.0%}" if per_iter
                else "loop below the timer's resolution")
        print(f"  {label} {speed_name:24s} B={batch}: {loop} (compile {compile_s:.1f} s)",
              flush=True)
    return out


def _kv_bytes(pair, method, settings, B, S):
    def one(cfg, rows, slots):
        return 2 * cfg.num_layers * rows * slots * cfg.num_kv_heads * cfg.head_dim \
            * cfg.jnp_dtype.itemsize
    if method == "beam":
        return one(pair["target"], B * settings["num_beams"], S)
    if method == "dsbd":
        wc, g, c = settings["max_width"], settings["gamma"], settings["draft_width"]
        return one(pair["target"], B, wc * S) + one(pair["draft"], B, wc * S + 2 * wc + (g - 1) * c)
    draft = one(pair["draft"], B, S) if method in methods.NEEDS_DRAFT else 0
    return one(pair["target"], B, S) + draft


def head_tokens_per_iteration(draft_terms_json):
    """``{method_head: tokens per iteration per row}`` of the trained head on the CPU
    (``benchmarks/draft_terms.py --head``'s batch-1 runs), ``{}`` without that JSON."""
    try:
        runs = json.load(open(draft_terms_json))["batches"]["b1"]["drafts"]["head"]
    except (OSError, ValueError, KeyError):
        return {}
    return {m: runs[n]["tokens_per_iteration"] for m, n in DRAFT_TERMS_NAMES.items() if n in runs}


def projection(decoders, speed_json, head_json=None):
    """tokens/s = tokens per iteration (CPU, real pair) / cost per iteration (here). A PROJECTION."""
    try:
        rows = json.load(open(speed_json))["rows"]
    except (OSError, ValueError, KeyError):
        return {"error": f"no tokens per iteration in {speed_json}"}
    tpi = {r["method"]: r["tokens_per_target_call"] for r in rows
           if r.get("impl") == "dsbd_jax" and "tokens_per_target_call" in r}
    head_tpi = head_tokens_per_iteration(head_json) if head_json else {}
    tpi.update(head_tpi)
    # the source as a path in the checkout where it is one (no path of the measuring machine)
    out = {"source": os.path.relpath(os.path.abspath(speed_json), _ROOT),
           "tokens_per_iteration": tpi, "note": "PROJECTION, not measured"}
    if head_tpi:
        out["head_source"] = os.path.relpath(os.path.abspath(head_json), _ROOT)
    for batch, costs in decoders.items():
        proj = {m: 1e3 * int(batch) * tpi[m] / c["ms_per_iteration"] for m, c in costs.items()
                if m in tpi and c["ms_per_iteration"]}
        base = proj.get("beam_sample_W4")
        out[f"batch {batch}"] = {m: {"projected_tokens_per_s": v,
                                     "projected_ratio_to_beam_W4": v / base if base else None}
                                 for m, v in proj.items()}
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true", help="tiny shapes on the CPU (a check)")
    ap.add_argument("--pairs", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    ap.add_argument("--layouts", nargs="+", default=["per_layer", "stacked"],
                    choices=["stacked", "per_layer"],
                    help="the decoders run in the first one (per_layer: the GPU default)")
    ap.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"],
                    choices=["bfloat16", "float32"],
                    help="bfloat16 runs every pair, float32 the first pair only")
    ap.add_argument("--projections", nargs="+", default=["separate"],
                    choices=["separate", "fused"],
                    help="q/k/v and gate/up as separate kernels or fused into one each "
                         "(dsbd_jax.models.fused), one run of the first layout per choice")
    ap.add_argument("--draft-weights", default="float", choices=["float", "int8"],
                    help="the draft model's projections and head: the dtype's, or int8 codes "
                         "(dsbd_jax.models.weights.Int8, as load_model(weights='int8'))")
    ap.add_argument("--slots", type=int, nargs="+", default=[512, 4096])
    ap.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--budget-s", type=float, default=420.0)
    ap.add_argument("--tokens-per-iteration", default=os.path.join(_ROOT, "results/speed_float32_host.json"))
    ap.add_argument("--head-rows", type=int, default=32768,
                    help="a random draft head with this many vocabulary rows, timed as a draft "
                         "(0: no head)")
    ap.add_argument("--head-tokens-per-iteration",
                    default=os.path.join(_ROOT, "results/draft_terms_head.json"))
    ap.add_argument("--out", default=None, help="default /tmp/dsbd_accelerator_<device>.json")
    args = ap.parse_args(argv)
    if jax.config.jax_enable_x64:
        raise SystemExit("float64 is on (JAX_ENABLE_X64): accelerators run float32/bfloat16")
    pairs = SMALL_PAIRS if args.small else {k: PAIRS[k] for k in args.pairs}
    slots = [64] if args.small else args.slots
    batches = [1] if args.small else args.batches
    new_tokens = 32 if args.small else args.max_new_tokens  # small: the loop outweighs the noise
    repeats = 2 if args.small else args.repeats
    device = jax.devices()[0]
    out_path = args.out or (  # commit a run as results/gpu/<device>.json
        f"/tmp/dsbd_accelerator_{getattr(device, 'device_kind', 'device').replace(' ', '_')}.json")
    budget = Budget(args.budget_s)
    runs = []
    plan = [(p, "bfloat16", lay) for p in pairs for lay in args.layouts
            if "bfloat16" in args.dtypes]
    plan += [(next(iter(pairs)), "float32", lay) for lay in args.layouts
             if "float32" in args.dtypes]
    if args.small:  # every code path once: both dtypes, both layouts, decoders in the first
        plan = list(dict.fromkeys([plan[0], plan[-1]]))
    # each projections choice after the first: the first layout again (its decoders too)
    plan = [(p, d, lay, proj) for p, d, lay in plan for proj in args.projections
            if proj == args.projections[0] or lay == args.layouts[0]]
    for i, (pname, dtype, layout, proj) in enumerate(plan):
        label = (f"{pname} {dtype} {layout}" + (" fused" if proj == "fused" else "")
                 + (" int8 draft" if args.draft_weights == "int8" else ""))
        if not budget.ok(label):
            continue
        shapes = SMALL_PAIRS[pname] if args.small else PAIRS[pname]
        pair = {m: ModelConfig(**s, dtype=dtype) for m, s in zip(("target", "draft"), shapes)}
        params = {m: llama.init_params(c, jax.random.PRNGKey(j), layout)
                  for j, (m, c) in enumerate(pair.items())}
        if args.draft_weights == "int8":   # the draft's products in s8 x s8 -> s32
            params["draft"], pair["draft"] = kinds.int8_params(params["draft"], pair["draft"])
        if proj == "fused":   # the same weights, q/k/v and gate/up as one kernel each
            params = {m: fused.fuse_projections(p) for m, p in params.items()}
        timers = {m: ForwardTimer(c, params[m], repeats) for m, c in pair.items()}
        names = list(args.methods)
        if args.head_rows:  # the head as a third model: its passes, and the decoders with it
            # (its one block stays separate, as load_head gives it)
            pair["head"], params["head"] = random_head(
                pair["target"], params["target"], min(args.head_rows, pair["target"].vocab_size),
                jax.random.PRNGKey(7))
            timers["head"] = HeadTimer(pair["head"], params["head"], params["target"], repeats)
            names += [h for h, m in HEAD_METHODS.items() if m in args.methods]
        run = {"pair": pname, "dtype": dtype, "layout": layout, "projections": proj,
               "draft_weights": args.draft_weights,
               "param_bytes": {m: tree_bytes(p) for m, p in params.items()}, "forward": {}}
        if args.head_rows:
            run["head_rows"] = min(args.head_rows, pair["target"].vocab_size)
        for m in pair:
            for s in slots:
                for name, (B, T) in FORWARD_SHAPES.items():
                    if budget.ok(f"{label} forward {m} {name} {s}"):
                        run["forward"][f"{m} {name} @{s}"] = timers[m](B, T, s)
            print(f"  {label} forward {m}: " + ", ".join(
                f"{k.split(' ', 1)[1]} {v['ms']:.2f} ms" for k, v in run["forward"].items()
                if k.startswith(m)), flush=True)
        # DSBD's node budget: the target's forests up to 64 nodes, the rule of --node-budget
        curve = {1: run["forward"].get(f"target 1 token @{slots[0]}"),
                 12: run["forward"].get(f"target forest 12 @{slots[0]}"),
                 16: run["forward"].get(f"target forest 16 @{slots[0]}")}
        for T in BUDGET_FORESTS:
            if budget.ok(f"{label} forward target forest {T} {slots[0]}"):
                curve[T] = run["forward"][f"target forest {T} @{slots[0]}"] = \
                    timers["target"](1, T, slots[0])
        if all(curve.get(T) for T in (1,) + forest_budget.NODES):
            ms = {T: v["ms"] for T, v in curve.items()}
            run["forest_curve"] = {str(T): ms[T] / ms[1] for T in forest_budget.NODES}
            run["node_budget"] = forest_budget.pick_budget(ms)
            print(f"  {label} target forests: " + ", ".join(
                f"{k} {v:.2f}x" for k, v in run["forest_curve"].items())
                + f" a token; node budget {run['node_budget']}", flush=True)
        # decoders once per pair and dtype, in the first layout (their cost follows the forward's)
        if layout == args.layouts[0]:
            run["decoders"] = {str(b): decoder_costs(pair, params, timers, b, new_tokens, repeats,
                                                     budget, label, names)
                               for b in batches}
            run["projection"] = projection(run["decoders"], args.tokens_per_iteration,
                                           args.head_tokens_per_iteration if pname == "qwen"
                                           else None)
        if "head" in pair:
            one = {m: run["forward"].get(f"{m} 1 token @{slots[0]}") for m in pair}
            if all(one.values()):
                run["head_vs_target"] = {m: one[m]["ms"] / one["target"]["ms"]
                                         for m in ("draft", "head")}
        run["peak_bytes"] = peak_bytes()
        runs.append(run)
        del params, timers
    out = {"machine": machine_info(), "small": args.small, "prompt_len": PROMPT_LEN,
           "max_new_tokens": new_tokens, "figure": "minimum of repeats; ms",
           "runs": runs, "skipped": budget.skipped}
    write_json(out_path, out)
    print(f"wrote {out_path}" + (f" ({len(budget.skipped)} items skipped: budget)"
                                 if budget.skipped else ""))
    return out


if __name__ == "__main__":
    main()
