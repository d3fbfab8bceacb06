"""Per-device memory, communication and step time of sharded DSBD for several meshes.

    python benchmarks/sharding.py                      # 8 virtual CPU devices (set here)
    python benchmarks/sharding.py --meshes 1x1,8x1,2x4 --out results/sharding/cpu8.json

For each ``data x model`` mesh it places a random pair in real HF format
(``dsbd_jax.testing.make_tiny_pair``, larger than the test pair) with
``dsbd_jax.parallel.ShardedDecoder`` and reports, per device: parameter bytes (from the placed
arrays' shards), KV-cache bytes (the per-device shapes the compiled decode loop carries), the
compiled program's temporary bytes (``memory_analysis``), the bytes of every collective per
loop iteration (read from the compiled HLO), and the wall time per iteration.

On virtual CPU devices (``--xla_force_host_platform_device_count``) all "devices" share the same
cores and the collectives are memory copies: the step times say nothing about speed on real
accelerators (they only show the program runs). The memory and communication figures are
properties of the compiled program and hold on any backend with the same mesh. When a GPU is
present (``jax.devices()[0].platform == "gpu"``) the same script runs on it unchanged.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

if "--xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import jax  # noqa: E402
import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from dsbd_jax import DSBDConfig, dsbd_generate, load_model  # noqa: E402
from dsbd_jax import parallel as sh  # noqa: E402
from dsbd_jax.eval import hlo  # noqa: E402
from dsbd_jax.eval.timing import compile_and_run  # noqa: E402
from dsbd_jax.testing import make_tiny_pair  # noqa: E402


def measure(mesh_shape, target, draft, cfg, ids, lens, repeats):
    mesh = sh.make_mesh(*mesh_shape)
    dec = sh.ShardedDecoder(dsbd_generate, cfg, mesh)
    params = dec.place({"target": target.params, "draft": draft.params})
    key = jax.random.key(0)
    r = compile_and_run(dec, params, ids, key, prompt_lengths=lens, repeats=repeats)
    first, times, iters = r["first_call_s"], r["runs_s"], int(r["output"].stats["iterations"])
    compiled = dec.compiled(params, ids, key, prompt_lengths=lens)
    rep = hlo.loop_collectives(compiled.as_text())
    mem = compiled.memory_analysis()
    per_dev = dec.param_bytes_per_device(params)
    kv = sum(int(np.prod(d)) * hlo.DTYPE_BYTES[t] for t, d in rep["loop_state_shapes"]
             if len(d) == 5)
    by_op = {}
    for o in rep["ops"]:
        by_op[o["op"]] = by_op.get(o["op"], 0) + o["bytes"] * o["count"]
    return dict(
        mesh=dict(data=mesh_shape[0], model=mesh_shape[1]), notes=dec.rules.notes,
        kv_repeat=dec.kv_repeat,
        param_bytes_per_device=max(per_dev.values()),
        kv_cache_bytes_per_device=kv,
        temp_bytes_per_device=getattr(mem, "temp_size_in_bytes", None),
        argument_bytes_per_device=getattr(mem, "argument_size_in_bytes", None),
        comm_bytes_per_iteration=rep["bytes_per_iteration"], comm_by_op=by_op,
        comm_ops=[dict(op=o["op"], result=[list(d) for _, d in o["result_shapes"]],
                       bytes=o["bytes"], times=o["count"]) for o in rep["ops"]],
        iterations=iters, first_call_s=round(first, 2),
        ms_per_iteration=round(1e3 * float(np.median(times)) / max(iters, 1), 2))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--meshes", default="1x1,8x1,4x2,2x4,1x8")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", default="/tmp/dsbd_sharding_cpu8.json")
    ap.add_argument("--models", default="/tmp/dsbd_sharding_models")
    args = ap.parse_args(argv)
    meshes = [tuple(int(x) for x in m.split("x")) for m in args.meshes.split(",")]
    tdir, ddir = make_tiny_pair(args.models, hidden_size=args.hidden, num_layers=args.layers)
    target, draft = load_model(tdir), load_model(ddir, tokenizer=False)
    cfg = DSBDConfig(target=target.config, draft=draft.config, max_new_tokens=args.max_new_tokens,
                     gamma=3, draft_width=3, threshold=0.9, min_width=1, top_k=10, top_p=0.8,
                     eos_token_id=())
    rng = np.random.RandomState(0)
    ids = rng.randint(4, 200, size=(args.batch, 32)).astype(np.int32)
    lens = rng.randint(8, 33, size=args.batch).astype(np.int32)
    rows = []
    for shape in meshes:
        r = measure(shape, target, draft, cfg, ids, lens, args.repeats)
        rows.append(r)
        print(f"mesh data={shape[0]} model={shape[1]}: params {r['param_bytes_per_device']/1e6:.2f} MB, "
              f"KV {r['kv_cache_bytes_per_device']/1e6:.2f} MB, temp "
              f"{(r['temp_bytes_per_device'] or 0)/1e6:.2f} MB per device; "
              f"{r['comm_bytes_per_iteration']/1e3:.1f} kB communicated per iteration; "
              f"{r['ms_per_iteration']} ms/iteration", flush=True)
    from dsbd_jax.eval.timing import machine_info
    dev = jax.devices()[0]
    report = dict(
        machine=machine_info(), dtype=target.info["dtype"],
        backend=dev.platform, device_kind=dev.device_kind, devices=jax.device_count(),
        note=("virtual CPU devices share the host's cores; step times do not predict speed on "
              "accelerators. Memory and communication figures are properties of the compiled "
              "program. No GPU was available for this run." if dev.platform == "cpu" else ""),
        model=dict(target=str(target.config), batch=args.batch, prompt_bucket=32,
                   max_new_tokens=args.max_new_tokens, gamma=3, draft_width=3),
        rows=rows)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
