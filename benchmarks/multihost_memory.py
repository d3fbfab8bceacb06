"""Peak host memory per process when each process loads a model straight onto its shards
(``load_model(place=ShardedDecoder.placer(...))``), against one process loading it whole.

    python benchmarks/multihost_memory.py DIR --out results/multihost_memory.json

Writes a random Llama checkpoint to ``DIR`` (once; ``dsbd_jax.testing.make_tiny_pair`` with
``--hidden`` 1024 and ``--layers`` 8 by default: 290 MiB of float32), then runs, each in fresh
processes with one CPU device per process: ``whole``: one process, ``load_model`` without
placement; ``placed``: 2 processes (JAX's multi-controller runtime, gloo), mesh ``data=1,
model=2`` (the model axis spans both processes), ``load_model(place=...)``. (Virtual devices
would not do: on CPU each device's buffers are host memory, so a process with 4 devices holds 4
copies of whatever they replicate.) Each reports its peak RSS (``VmHWM``), its RSS after
importing JAX and joining (before the load), the bytes of the model, of its own shards and of
the largest tensor, and the JSON the measuring processes' host (``machine``) and dtype.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path


def rss_mb() -> float:
    """Current resident set size (``/proc/self/statm``), MiB."""
    pages = int(open("/proc/self/statm").read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2 ** 20


def peak_mb() -> float:
    """Peak resident set size of this process's memory since its exec (``VmHWM``; not
    ``ru_maxrss``, which Linux carries over from the parent across fork and exec), MiB."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def measure(directory: str, mode: str, port: int, pid: int) -> dict:
    """One process's figures (run in a subprocess)."""
    import numpy as np
    if mode == "placed":
        from dsbd_jax.parallel import distributed
        distributed.initialize(f"127.0.0.1:{port}", 2, pid)
    import jax
    from dsbd_jax import load_model, sample
    from dsbd_jax.decoding.configs import SampleConfig
    from dsbd_jax.eval.timing import machine_info
    from dsbd_jax.loading.load import read_config
    from dsbd_jax.parallel import ShardedDecoder, make_mesh
    jax.devices()
    before = rss_mb()
    path = os.path.join(directory, "target")
    place = None
    if mode == "placed":
        dec = ShardedDecoder(sample, SampleConfig(read_config(path)), make_mesh(1, 2))
        place = dec.placer("target")
    model = load_model(path, tokenizer=False, progress=False, layout="stacked", place=place)
    leaves = jax.tree.leaves(model.params)
    total = sum(x.size * x.dtype.itemsize for x in leaves) / 2 ** 20
    own = sum(s.data.size * s.data.dtype.itemsize for x in leaves for s in x.addressable_shards)
    largest = max(x.size * x.dtype.itemsize for x in leaves) / 2 ** 20
    return dict(mode=mode, process=pid, rss_before_load_mb=round(before, 1),
                peak_rss_mb=round(peak_mb(), 1), rss_after_load_mb=round(rss_mb(), 1),
                model_mb=round(total, 1), own_shards_mb=round(own / 2 ** 20, 1),
                largest_tensor_mb=round(largest, 1), dtype=model.info["dtype"],
                machine=machine_info(),
                finite=bool(all(np.isfinite(np.asarray(s.data)).all()
                                for x in leaves for s in x.addressable_shards)))


def run(directory: str, mode: str, count: int) -> list:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=1",
               JAX_PLATFORMS="cpu", TOKENIZERS_PARALLELISM="false")
    procs = [subprocess.Popen([sys.executable, __file__, "--measure", mode, directory, str(port),
                               str(i)], env=env, stdout=subprocess.PIPE, text=True)
             for i in range(count)]
    outs = [p.communicate(timeout=600)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    return [json.loads(o.strip().splitlines()[-1]) for o in outs]


def main() -> None:
    if sys.argv[1] == "--measure":
        _, _, mode, directory, port, pid = sys.argv
        print(json.dumps(measure(directory, mode, int(port), int(pid))), flush=True)
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not (Path(args.dir) / "target").exists():
        from dsbd_jax.testing import make_tiny_pair
        make_tiny_pair(args.dir, hidden_size=args.hidden, num_layers=args.layers)
    rows = run(args.dir, "whole", 1) + run(args.dir, "placed", 2)
    machine = rows[0]["machine"]  # the measuring processes' host (one CPU device each)
    for r in rows:
        r.pop("machine")
        print(json.dumps(r))
    if args.out:
        Path(args.out).write_text(json.dumps({"machine": machine, "dtype": rows[0]["dtype"],
                                              "hidden": args.hidden, "layers": args.layers,
                                              "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
