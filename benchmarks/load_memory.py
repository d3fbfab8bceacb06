"""Peak host RSS of ``load_model`` from a safetensors checkpoint, per dtype.

Steps:
  1. export (once): the model as a Hugging Face ``Qwen2ForCausalLM`` directory in bfloat16
     safetensors (how such checkpoints ship), written tensor by tensor from a preset
     (``--preset``, default the 1.5B target) or, with ``--small``, a tiny random model;
  2. for each ``--dtypes`` entry, a fresh process runs ``load_model(dir, dtype)`` and reports
     its peak RSS (``VmHWM``) before and after the load, the parameters' bytes and the largest
     stacked tensor's bytes. Expected: peak about baseline + parameters + one stacked tensor.

Writes JSON (default ``/tmp/dsbd_load_memory.json``) with the host (``machine``), the exported
checkpoint's name (no path), and prints a table.

Usage:
  python benchmarks/load_memory.py --small                     # minutes: a tiny model
  python benchmarks/load_memory.py --export-dir /tmp/q15 --dtypes float32,bfloat16
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

_MEASURE = r"""
import json, sys, time
import jax, jax.numpy as jnp, numpy as np
from dsbd_jax.loading.load import load_model


def hwm():  # this process's peak RSS in bytes (VmHWM: reset by exec, unlike ru_maxrss,
    for line in open("/proc/self/status"):  # which keeps the forking parent's peak)
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024


jnp.zeros(1).block_until_ready()   # backend up before the baseline
base = hwm()
t0 = time.perf_counter()
m = load_model(sys.argv[1], jnp.dtype(sys.argv[2]), tokenizer=False, progress=False,
               layout=sys.argv[3])
jax.block_until_ready(m.params)
secs = time.perf_counter() - t0
peak = hwm()
leaves = jax.tree.leaves(m.params)
print("RESULT " + json.dumps(dict(baseline_rss=base, peak_rss=peak, load_s=secs,
      param_bytes=int(sum(x.nbytes for x in leaves)),
      largest_stacked_bytes=int(max(x.nbytes for x in leaves)) * (
          m.config.num_layers if sys.argv[3] == "per_layer" else 1))))
"""


def export_checkpoint(model, directory: str) -> None:
    """Write ``model`` (stacked layout) as a HF Qwen2 directory, bfloat16 safetensors."""
    import jax
    import numpy as np
    from safetensors.numpy import save_file

    from dsbd_jax.loading.checkpoint import hf_tensor

    cfg = model.config
    tensors = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(model.params)[0]:
        keys = tuple(k.key for k in path)
        name, transpose = hf_tensor(cfg, keys)
        arr = np.asarray(leaf.astype("bfloat16"))
        for i, part in (enumerate(arr) if keys[0] == "layers" else [(None, arr)]):
            tensors[name.format(i=i)] = np.ascontiguousarray(part.T if transpose else part)
        del arr
    save_file(tensors, os.path.join(directory, "model.safetensors"))
    hf = dict(architectures=["Qwen2ForCausalLM" if cfg.attention_bias else "LlamaForCausalLM"],
              vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
              intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
              num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
              rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
              tie_word_embeddings=cfg.tie_word_embeddings, hidden_act="silu",
              max_position_embeddings=cfg.max_position_embeddings, torch_dtype="bfloat16")
    with open(os.path.join(directory, "config.json"), "w") as f:
        json.dump(hf, f, indent=1)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--small", action="store_true", help="a tiny random model (a quick check)")
    p.add_argument("--preset", default="qwen2.5-coder-1.5b-instruct")
    p.add_argument("--export-dir", default=None, help="reuse / write the exported checkpoint here")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--layout", default="stacked", choices=("stacked", "per_layer"))
    p.add_argument("--out", default="/tmp/dsbd_load_memory.json")
    a = p.parse_args(argv)
    directory = a.export_dir or tempfile.mkdtemp(prefix="load_memory_")
    os.makedirs(directory, exist_ok=True)
    if not os.path.exists(os.path.join(directory, "config.json")):
        import jax

        from dsbd_jax.loading.checkpoint import LoadedModel
        from dsbd_jax.models.config import ModelConfig
        from dsbd_jax.models.llama import init_params
        from dsbd_jax.loading.load import load_model
        if a.small:
            cfg = ModelConfig(vocab_size=4096, hidden_size=256, intermediate_size=512,
                              num_layers=4, num_heads=4, num_kv_heads=2, head_dim=64,
                              attention_bias=True, architecture="qwen2")
            model = LoadedModel(cfg, init_params(cfg, jax.random.PRNGKey(0), "stacked"))
        else:
            import jax.numpy as jnp
            model = load_model(a.preset, jnp.bfloat16, tokenizer=False, cache_params=False,
                               layout="stacked")
        export_checkpoint(model, directory)
        del model
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        x for x in (_ROOT, os.environ.get("PYTHONPATH")) if x))
    rows = []
    for dtype in a.dtypes.split(","):
        proc = subprocess.run([sys.executable, "-c", _MEASURE, directory, dtype, a.layout],
                              capture_output=True, text=True, env=env)
        if proc.returncode:
            raise SystemExit(f"measuring {dtype} failed:\n{proc.stderr[-3000:]}")
        r = json.loads(proc.stdout.split("RESULT ", 1)[1])
        r.update(dtype=dtype, over_baseline=r["peak_rss"] - r["baseline_rss"])
        rows.append(r)
        mib = 1 << 20
        print(f"{dtype:9s} params {r['param_bytes'] / mib:9.1f} MiB  largest stacked "
              f"{r['largest_stacked_bytes'] / mib:8.1f} MiB  peak RSS {r['peak_rss'] / mib:9.1f} "
              f"MiB (baseline {r['baseline_rss'] / mib:7.1f}, +{r['over_baseline'] / mib:8.1f})  "
              f"{r['load_s']:.1f} s")
    from dsbd_jax.eval.timing import machine_info, portable_path
    # the measuring processes' host: this one (they inherit its environment, XLA_FLAGS included)
    out = dict(machine=machine_info(), source="small" if a.small else a.preset, layout=a.layout,
               checkpoint=portable_path(directory, _ROOT), file_bytes=os.path.getsize(
                   os.path.join(directory, "model.safetensors")), rows=rows)
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
