"""The program store (``dsbd_jax.decoding._jit.programs``): a decoder core's compiled program is kept
beside JAX's compilation cache and a later process runs it without tracing or lowering it;
every setting, shape and the library's own code are part of its key; a program with host
callbacks is never stored; an unreadable entry is compiled again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from dsbd_jax.decoding._jit import programs

ROOT = Path(__file__).resolve().parents[2]

# one process: load the tiny pair (load_model turns the compilation cache on under
# $DSBD_JAX_CACHE), run DSBD twice with the settings of argv, report what JAX traced and what
# the store read, and the outputs
CHILD = r"""
import json, sys
import jax, jax.numpy as jnp, numpy as np
from jax import monitoring
events = {"traced": 0, "read": 0}
def on_duration(name, duration, **kw):
    if name == "/jax/core/compile/jaxpr_trace_duration" and "_dsbd_core" in str(kw.get("fun_name")):
        events["traced"] += 1
    if name == "/dsbd_jax/program_store/read_duration":
        events["read"] += 1
monitoring.register_event_duration_secs_listener(on_duration)
from dsbd_jax import load_model
from dsbd_jax.decoding import DSBDConfig, dsbd_generate
from dsbd_jax.decoding._jit import programs
t, d, n, progress = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1"
target, draft = load_model(t, progress=False), load_model(d, progress=False)
cfg = DSBDConfig(target=target.config, draft=draft.config, max_new_tokens=n, gamma=2,
                 draft_width=2, threshold=0.5, top_k=10, progress=progress)
params = {"target": target.params, "draft": draft.params}
ids = jnp.array([[5, 9, 3, 7], [2, 4, 6, 0]], jnp.int32)
if sys.argv[5] == "1":   # the program made ahead of time, as `dsbd bench` with warmup: 0 does
    dsbd_generate.prepare(params, ids, jax.random.key(3), cfg,
                          prompt_lengths=jnp.array([4, 3])).prepared()
    events["ahead"] = dict(events)
outs = [dsbd_generate(params, ids, jax.random.key(3), cfg, prompt_lengths=jnp.array([4, 3]))
        for _ in range(2)]
folder = programs.store_folder()
print(json.dumps({**events,
    "seqs": [np.asarray(o.sequences).tolist() for o in outs],
    "ll": [np.asarray(o.log_likelihoods).tolist() for o in outs],
    "stored": sorted(p.name for p in folder.iterdir()) if folder and folder.exists() else []}))
"""


def child(cache, pair, n=4, progress=False, ahead=False, **env):
    # XLA's backend optimisation level 0: the same optimised programs in less compile time,
    # which is most of each child's (docs/development.md)
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0"
    # forced options: a fresh cache would first measure XLA:CPU's (15-20 s), not this test's subject
    e = {**os.environ, "DSBD_JAX_CACHE": str(cache), "DSBD_JAX_COMPILATION_CACHE": "1",
         "JAX_PLATFORMS": "cpu", "XLA_FLAGS": flags.strip(), "DSBD_JAX_CPU_OPTIONS": "default",
         **env}
    e.pop("JAX_COMPILATION_CACHE_DIR", None)
    out = subprocess.run([sys.executable, "-c", CHILD, str(pair[0]), str(pair[1]), str(n),
                          "1" if progress else "0", "1" if ahead else "0"], cwd=ROOT, env=e, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    res["stderr"] = out.stderr
    return res


@pytest.fixture(scope="module")
def first(bench_pair, tmp_path_factory):
    """The first child on a fresh cache: ``(its cache folder, its report)`` (shared: each child
    costs about a minute of compiling, most of this file's time)."""
    cache = tmp_path_factory.mktemp("store")
    return cache, child(cache, bench_pair[:2])


def test_a_second_process_runs_the_stored_program_without_tracing(bench_pair, first):
    pair = bench_pair[:2]
    tmp_path, first = first
    assert first["traced"] == 1 and first["read"] == 0, first      # traced once, two calls
    assert len(first["stored"]) == 1 and first["stored"][0].endswith(".pkl"), first
    assert first["seqs"][0] == first["seqs"][1]
    second = child(tmp_path, pair)
    assert second["traced"] == 0 and second["read"] == 1, second    # read once, two calls
    assert second["stored"] == first["stored"]
    # the same program: the same outputs, to the last bit
    assert second["seqs"] == first["seqs"] and second["ll"] == first["ll"]

    # another setting is another program (and another entry); the first stays
    longer = child(tmp_path, pair, n=5)
    assert longer["traced"] == 1 and longer["read"] == 0
    assert len(longer["stored"]) == 2 and set(first["stored"]) < set(longer["stored"])

    # an unreadable entry: a warning, the program compiled again, the same outputs, and the
    # entry written anew by the run that compiled it (the second child above read such an entry)
    entries = [tmp_path / "xla" / programs.FOLDER / name for name in first["stored"]]
    for e in entries:
        e.write_bytes(b"not a program")
    broken = child(tmp_path, pair)
    assert "could not read the stored program" in broken["stderr"]
    assert broken["traced"] == 1 and broken["seqs"] == first["seqs"]
    assert all(e.read_bytes() != b"not a program" and e.stat().st_size > 1000 for e in entries)


def test_a_program_made_ahead_is_the_one_the_calls_run(bench_pair, tmp_path):
    """``CoreCall.prepared`` (``Decoder.compiled``, the bench's ``warmup: 0``) readies the
    store's program, which the calls then run: traced once in all. A jit's own
    ``lower().compile()`` is not what a call through the store runs: the calls traced and
    compiled it again (twice in all), and the bench timed every first batch twice."""
    res = child(tmp_path, bench_pair[:2], ahead=True)
    assert res["ahead"]["traced"] == 1 and res["traced"] == 1, res
    assert len(res["stored"]) == 1 and res["seqs"][0] == res["seqs"][1]


def test_a_program_with_host_callbacks_is_not_stored(bench_pair, first, tmp_path):
    res = child(tmp_path, bench_pair[:2], progress=True)
    assert res["stored"] == [] and res["traced"] == 1
    assert res["seqs"] == first[1]["seqs"]           # progress changes nothing in the output


def test_off_without_the_compilation_cache(bench_pair, tmp_path):
    res = child(tmp_path, bench_pair[:2], DSBD_JAX_COMPILATION_CACHE="0")
    assert res["stored"] == [] and res["traced"] == 1 and res["read"] == 0
    assert not (tmp_path / "xla").exists()


def test_static_split_follows_names_and_positions():
    def f(params, ids, lengths, keys, config=None):
        return params

    st, a, k = programs.static_split(f, {"static_argnames": ("config",)},
                                     (1, 2, 3, 4), {"config": "c"})
    assert st == ([], [("config", "c")]) and a == (1, 2, 3, 4) and k == {}
    st, a, k = programs.static_split(f, {"static_argnames": ("config",)}, (1, 2, 3, 4, "c"), {})
    assert st == ([(4, "c")], []) and a == (1, 2, 3, 4) and k == {}
    st, a, k = programs.static_split(f, {"static_argnums": 1}, (1, 2), {"lengths": 3})
    assert st == ([(1, 2)], []) and a == (1,) and k == {"lengths": 3}


def test_the_key_names_every_shape_dtype_and_setting():
    base = dict(name="d", jit_kwargs={"static_argnames": ("config",)}, options={},
                static=([], [("config", "c1")]))
    x = jnp.zeros((2, 3), jnp.float32)

    def key(x, **kw):
        args = {**base, **kw}
        return programs.program_key(args["name"], args["jit_kwargs"], args["options"],
                                    args["static"], ({"w": x},), {})

    k = key(x)
    assert k == key(jnp.ones((2, 3), jnp.float32))              # values are not part of it
    assert len({k, key(jnp.zeros((2, 4))), key(x.astype(jnp.bfloat16)),
                key(x, static=([], [("config", "c2")])), key(x, name="e"),
                key(x, options={"xla_cpu_multi_thread_eigen": False})}) == 6
    assert programs.program_key("d", {}, {}, ([], [("config", object())]), (x,), {}) is None


def test_clear_caches_drops_the_loaded_programs():
    loaded = programs.LoadedPrograms()
    loaded.put("k", object())
    assert len(loaded) == 1
    jax.clear_caches()
    assert len(loaded) == 0
