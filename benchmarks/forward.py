"""Forward-pass cost of the two weight layouts against transformers, side by side in one process.

A Qwen2.5-Coder-1.5B-shaped model (28 layers, d 1536, MLP 8960, 12 heads / 2 KV heads, vocabulary
151,936, q/k/v biases) with random weights, float32, a KV cache of ``--slots`` slots of which
``--filled`` hold a prefix. For each pass shape (1 token, a batch of 4 rows, a 12-node forest,
16 new tokens) it times:

* ours, ``layout="stacked"`` (``nn.scan`` over stacked weights) and ``layout="per_layer"``
  (unrolled loop over per-layer arrays), jitted ``model.forward`` (logits of every new token and
  their keys/values), compile time reported apart;
* ours, ``per_layer_transposed`` (``_bf16``): the per-layer tree with transposed projection
  kernels (:func:`dsbd_jax.models.kinds.transpose_params`), in float32 or bfloat16;
* transformers ``Qwen2ForCausalLM`` with the same shapes (``DynamicCache`` of the same prefix,
  cropped back after each call), ``torch.inference_mode``, ``--threads`` threads.

Each figure is the median of ``--repeats`` timed calls after one warm-up call. Writes JSON
(default ``/tmp/dsbd_forward.json``) and prints a table with the ratios.

* ours, ``per_layer@NAME`` for each ``--options NAME``: the per-layer layout compiled with
  that candidate of :data:`dsbd_jax.host.cpu_options.CANDIDATES` (e.g. ``default`` and
  ``eigen_dot``, side by side), and ``per_layer_transposed@NAME`` likewise when
  ``per_layer_transposed`` is among the layouts; the other columns use the options that go with
  their kernels on this host (``options_choice``).

Usage: python benchmarks/forward.py [--repeats 5] [--threads 2] [--out results/forward.json]
       [--layouts stacked per_layer per_layer_transposed] [--options A B]
       [--small]   (a 4-layer model of the same width, for a quick check)
"""

from __future__ import annotations

import argparse
import os
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from dsbd_jax.models import llama as M  # noqa: E402
from dsbd_jax.eval.timing import machine_info, write_json  # noqa: E402
from dsbd_jax.models.cache import KVCache  # noqa: E402
from dsbd_jax.models.config import ModelConfig  # noqa: E402
from dsbd_jax.models import kinds
from dsbd_jax.host.cpu_options import CANDIDATES, candidates, choice, compiler_options  # noqa: E402,E501

SHAPES = {"1 token": (1, 1), "batch 4": (4, 1), "forest 12": (1, 12), "16 tokens": (1, 16)}


def qwen15b_config(layers: int = 28) -> ModelConfig:
    return ModelConfig(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                       num_layers=layers, num_heads=12, num_kv_heads=2, head_dim=128,
                       rms_norm_eps=1e-6, rope_theta=1000000.0, attention_bias=True,
                       max_position_embeddings=32768, architecture="qwen2")


def median_time(fn, repeats: int) -> float:
    jax.block_until_ready(fn())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def ours(cfg, layout, slots, filled, repeats, options=None, transposed=False, dtype="float32"):
    """Times of every pass shape; ``options``: a name of ``cpu_options.CANDIDATES`` (default:
    this host's choice for the kernels' form); ``transposed``: every projection kernel transposed
    (``kinds.transpose_params``); ``dtype="bfloat16"``: the weights and cache in bfloat16, the
    products in mixed precision (and, transposed, the head as ``[V, d]`` rows), as
    ``load_model(dtype=bfloat16)`` runs them."""
    opts = (compiler_options("transposed" if transposed else "plain") if options is None
            else dict(CANDIDATES[options]))
    params = M.init_params(cfg, jax.random.PRNGKey(0), layout)
    if dtype != "float32":
        cfg = cfg.replace(dtype=dtype)
        params = jax.tree.map(lambda x: x.astype(dtype), params)
    if transposed:
        params = kinds.transpose_params(params, kinds.transposed_widths(cfg))
        if dtype != "float32":
            params = kinds.transpose_head(params)
    shape = (cfg.num_layers, 1, slots, cfg.num_kv_heads, cfg.head_dim)
    rng = np.random.default_rng(0)
    out = {}
    for name, (B, T) in SHAPES.items():
        k = jnp.asarray(rng.standard_normal(shape[:1] + (B,) + shape[2:]), cfg.jnp_dtype)
        cache = KVCache(k, k)
        tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (B, T)), jnp.int32)
        positions = filled + jnp.broadcast_to(jnp.arange(T), (B, T)).astype(jnp.int32)
        seen = jnp.arange(slots)[None, None, :] < filled
        causal = jnp.tril(jnp.ones((T, T), bool))[None]
        mask = jnp.concatenate([jnp.broadcast_to(seen, (B, T, slots)),
                                jnp.broadcast_to(causal, (B, T, T))], axis=-1)
        f = jax.jit(lambda p, t, q, m, c: M.forward(cfg, p, t, q, m, c),
                    compiler_options=opts)
        t0 = time.perf_counter()
        compiled = f.lower(params, tokens, positions, mask, cache).compile()
        compile_s = time.perf_counter() - t0
        run = median_time(lambda: compiled(params, tokens, positions, mask, cache), repeats)
        out[name] = {"ms": run * 1e3, "compile_s": compile_s}
        print(f"  ours {layout:9s} {options or '':12s} {name:10s} {run * 1e3:8.1f} ms  (compile {compile_s:.1f} s)",
              flush=True)
    del params
    return out


def transformers_side(cfg, slots, filled, repeats, threads, dtype="float32"):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    from transformers.cache_utils import DynamicCache

    torch.set_num_threads(threads)
    hf_cfg = Qwen2Config(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                         intermediate_size=cfg.intermediate_size,
                         num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads,
                         num_key_value_heads=cfg.num_kv_heads, max_position_embeddings=32768,
                         rope_theta=cfg.rope_theta, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(hf_cfg).to(getattr(torch, dtype)).eval()
    rng = np.random.default_rng(0)
    out = {}
    with torch.inference_mode():
        for name, (B, T) in SHAPES.items():
            prefix = torch.tensor(rng.integers(0, cfg.vocab_size, (B, filled)))
            cache = DynamicCache(config=hf_cfg)
            model(prefix, past_key_values=cache, use_cache=True)
            tokens = torch.tensor(rng.integers(0, cfg.vocab_size, (B, T)))

            def call():
                model(tokens, past_key_values=cache, use_cache=True)
                cache.crop(-T)
            t = median_time(call, repeats)
            out[name] = {"ms": t * 1e3}
            print(f"  transformers {dtype} {name:10s} {t * 1e3:8.1f} ms", flush=True)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--slots", type=int, default=512)
    ap.add_argument("--filled", type=int, default=256)
    ap.add_argument("--small", action="store_true", help="4 layers instead of 28")
    ap.add_argument("--no-transformers", action="store_true")
    ap.add_argument("--layouts", nargs="+", default=["stacked", "per_layer",
                                                     "per_layer_transposed"],
                    choices=["stacked", "per_layer", "per_layer_transposed",
                             "per_layer_transposed_bf16"])
    ap.add_argument("--transformers-dtypes", nargs="+", default=["float32"],
                    choices=["float32", "bfloat16"],
                    help="transformers' columns: the model in each of these dtypes")
    ap.add_argument("--options", nargs="*", default=[], choices=sorted(CANDIDATES),
                    help="also time the per-layer layout (and per_layer_transposed, if asked "
                         "for) compiled with these XLA:CPU options (columns per_layer@NAME); "
                         "the other columns use this host's choice")
    ap.add_argument("--out", default="/tmp/dsbd_forward.json")
    args = ap.parse_args(argv)
    missing = [o for o in args.options if o not in candidates()]
    if missing:
        ap.error(f"this XLA rejects the options of {missing}; supported: {sorted(candidates())}")
    cfg = qwen15b_config(4 if args.small else 28)
    res = {"machine": machine_info(),
           "model": "Qwen2.5-1.5B-shaped, random weights, float32 (columns *_bf16 / "
                    "transformers_bfloat16: bfloat16)",
           "layers": cfg.num_layers, "slots": args.slots, "filled": args.filled,
           "repeats": args.repeats, "threads": args.threads, "options_choice": choice(),
           "options_choice_transposed": choice("transposed")}
    for layout in args.layouts:
        if layout in ("per_layer_transposed", "per_layer_transposed_bf16"):
            res["transposed_widths"] = kinds.transposed_widths(cfg)
            res[layout] = ours(cfg, "per_layer", args.slots, args.filled, args.repeats,
                               transposed=True,
                               dtype="bfloat16" if layout.endswith("bf16") else "float32")
        else:
            res[layout] = ours(cfg, layout, args.slots, args.filled, args.repeats)
    for name in args.options:
        res[f"per_layer@{name}"] = ours(cfg, "per_layer", args.slots, args.filled, args.repeats,
                                        options=name)
        if "per_layer_transposed" in args.layouts:
            res[f"per_layer_transposed@{name}"] = ours(cfg, "per_layer", args.slots, args.filled,
                                                       args.repeats, options=name,
                                                       transposed=True)
    ours_cols = [c for c in res if c in ("stacked", "per_layer", "per_layer_transposed",
                                         "per_layer_transposed_bf16")
                 or c.startswith("per_layer@") or c.startswith("per_layer_transposed@")]
    hf_cols = []
    if not args.no_transformers:
        for dt in args.transformers_dtypes:
            col = "transformers" if dt == "float32" else f"transformers_{dt}"
            res[col] = transformers_side(cfg, args.slots, args.filled, args.repeats,
                                         args.threads, dt)
            hf_cols.append(col)
    ratios = {}
    ref = res.get("transformers", {})
    for name in SHAPES:
        r = {}
        for lay in ours_cols:
            if name in ref:
                r[f"{lay} / transformers"] = res[lay][name]["ms"] / ref[name]["ms"]
            if name in res.get("transformers_bfloat16", {}):
                r[f"{lay} / transformers_bfloat16"] = (
                    res[lay][name]["ms"] / res["transformers_bfloat16"][name]["ms"])
        for col in ours_cols + hf_cols:  # what a pass of several rows costs against one token
            if name != "1 token":
                r[f"{col}: {name} / 1 token"] = res[col][name]["ms"] / res[col]["1 token"]["ms"]
        if "per_layer_transposed_bf16" in res and "per_layer_transposed" in res:
            r["bf16 / float32 (transposed)"] = (res["per_layer_transposed_bf16"][name]["ms"]
                                                / res["per_layer_transposed"][name]["ms"])
        for lay in ours_cols:
            if "per_layer" in res and lay not in ("per_layer", "stacked"):
                r[f"{lay} / per_layer"] = res[lay][name]["ms"] / res["per_layer"][name]["ms"]
        if "per_layer" in res and "stacked" in res:
            r["per_layer / stacked"] = res["per_layer"][name]["ms"] / res["stacked"][name]["ms"]
        ratios[name] = r
    res["ratios"] = ratios
    write_json(args.out, res)
    cols = ours_cols + hf_cols
    print("\n" + f"{'pass':12s} " + " ".join(f"{c:>17s}" for c in cols) + "  ratios")
    for name in SHAPES:
        print(f"{name:12s} " + " ".join(f"{res[c][name]['ms']:17.1f}" for c in cols) + "  "
              + ", ".join(f"{k} {v:.2f}" for k, v in ratios[name].items()))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
