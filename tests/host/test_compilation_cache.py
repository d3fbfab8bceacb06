"""JAX's persistent compilation cache (``dsbd_jax.host.compilation_cache``): a second process reads
back what the first compiled, and ``DSBD_JAX_COMPILATION_CACHE=0`` leaves it off."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# a program that takes over MIN_COMPILE_S to compile is written; the child reports the cache
# folder, the entries in it and jax's own count of cache hits (its monitoring events)
CHILD = r"""
import json, sys
import jax, jax.numpy as jnp
from jax._src import monitoring
hits = []
monitoring.register_event_listener(
    lambda name, **kw: hits.append(name) if name == "/jax/compilation_cache/cache_hits" else None)
from dsbd_jax.host import compilation_cache
compilation_cache.MIN_COMPILE_S = 0.0       # keep even this small program
folder = compilation_cache.enable_compilation_cache()

@jax.jit
def f(x):
    for _ in range(20):
        x = jnp.sin(x) @ x.T
    return x

f(jnp.ones((8, 8))).block_until_ready()
entries = sorted(p.name for p in folder.iterdir()) if folder else []
print(json.dumps({"folder": str(folder) if folder else None, "entries": entries,
                  "hits": len(hits)}))
"""


def run_child(cache, **env):
    # forced options: a fresh cache would first measure XLA:CPU's (15-20 s), not this test's subject
    e = {**os.environ, "DSBD_JAX_CACHE": str(cache), "DSBD_JAX_COMPILATION_CACHE": "1",
         "JAX_PLATFORMS": "cpu", "DSBD_JAX_CPU_OPTIONS": "default", **env}
    e.pop("JAX_COMPILATION_CACHE_DIR", None)
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=ROOT, env=e, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_second_process_reads_the_compiled_program(tmp_path):
    first = run_child(tmp_path)
    assert first["folder"] == str(tmp_path / "xla")
    assert first["hits"] == 0 and any(n.endswith("-cache") or "jit_f" in n
                                      for n in first["entries"]), first
    second = run_child(tmp_path)
    assert second["hits"] >= 1, second                  # read back, not compiled again
    assert second["entries"] == first["entries"]         # nothing new written


def test_the_environment_variable_turns_it_off(tmp_path):
    off = run_child(tmp_path, DSBD_JAX_COMPILATION_CACHE="0")
    assert off["folder"] is None and off["hits"] == 0
    assert not (tmp_path / "xla").exists()
