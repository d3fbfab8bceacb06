"""Every decoder across processes (JAX's multi-controller runtime), run by
``tests/parallel/test_multihost.py``: started once per process with 4 virtual CPU devices each
(``XLA_FLAGS=--xla_force_host_platform_device_count=4``), one global mesh ``data=4, model=2``.
Each process decodes its own prompts (process ``p`` of ``N`` takes rows ``SPLITS[N][p]`` of the
batch of 8: unequal counts) and writes what it got back to ``OUT/process<p>.npz``. For ``dsbd``
the weights are placed onto each process's shards as they load (``load_model(place=...)``).

    python multihost_worker.py decode TINY OUT PORT N P [M,..]  # one process of N (P: its id)
    python multihost_worker.py reference TINY OUT [M,..]        # one process, one device
    python multihost_worker.py fault TINY OUT PORT N P          # process 1 dies between two calls

``reference`` runs the same decoders unsharded on the whole batch (``OUT/reference.npz``).
``M,..``: the decoders of ``METHODS`` to run (default all; the output files are named after the
first, ``reference-<M>.npz`` / ``process<p>-<M>.npz``, so two selections can share ``OUT``).
The whole-batch gather and the disagreeing inputs run on ``dsbd`` where it is selected.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

SETTINGS = dict(max_new_tokens=5, top_k=10, top_p=0.8, eos_token_id=())
METHODS = {
    "sample": ("sample", dict()),
    "beam": ("beam", dict(num_beams=2)),
    "beam_search": ("beam_search", dict(num_beams=2)),
    "spec": ("spec", dict(gamma=2)),
    "tree": ("tree", dict(gamma=2, tree_widths=(2, 1))),
    "dsbd": ("dsbd", dict(gamma=2, draft_width=2, threshold=0.9, min_width=1, num_beams=2)),
    "dsbd_single": ("dsbd", dict(gamma=2, draft_width=2, threshold=0.9, min_width=1,
                                 single_beam=True)),
}
SPLITS = {2: [slice(0, 3), slice(3, 8)]}      # process 0: 3 prompts, process 1: 5
MESH = (4, 2)
SEED = 11


def batch():
    """The global batch: ``ids [8, 12]``, ``lengths [8]`` (ragged)."""
    rng = np.random.RandomState(0)
    ids = rng.randint(4, 200, size=(8, 12)).astype(np.int32)
    return ids, np.array([12, 7, 9, 12, 4, 10, 12, 6], np.int32)


def flat(name, out):
    """``{"<method>/<leaf path>": numpy}`` of one decoder output."""
    import jax
    return {name + jax.tree_util.keystr(p): np.asarray(x)
            for p, x in jax.tree_util.tree_flatten_with_path(out)[0]}


def models(tiny, place_target=None, place_draft=None):
    from dsbd_jax import load_model
    return (load_model(os.path.join(tiny, "target"), tokenizer=False, place=place_target),
            load_model(os.path.join(tiny, "draft"), tokenizer=False, place=place_draft))


def reference(tiny, out_dir, methods):
    import jax
    from dsbd_jax.decoding.methods import build, model_params
    target, draft = models(tiny)
    ids, lens = batch()
    res = {}
    for name in methods:
        method, extra = METHODS[name]
        dec = build(method, target.config, draft.config, **SETTINGS, **extra)
        params = model_params(dec, target.params, draft.params)
        res.update(flat(name, dec(params, ids, jax.random.key(SEED), prompt_lengths=lens)))
    np.savez(os.path.join(out_dir, f"reference-{methods[0]}.npz"), **res)


def bad_inputs(sdec, params, ids, lens, pid):
    """Inputs the processes disagree on: every process must get a ValueError (no hang). Returns
    ``{"error/<case>": message}``."""
    import jax
    cases = {
        "width": lambda: sdec(params, ids[:, :10] if pid == 1 else ids, jax.random.key(SEED),
                              prompt_lengths=np.minimum(lens, 10) if pid == 1 else lens),
        "key": lambda: sdec(params, ids, jax.random.key(SEED + pid), prompt_lengths=lens),
        "ids": lambda: sdec(params, ids + (10 ** 6 if pid == 1 else 0), jax.random.key(SEED),
                            prompt_lengths=lens),
    }
    out = {}
    for name, call in cases.items():
        try:
            call()
            out[f"error/{name}"] = np.array("no error")
        except ValueError as e:
            out[f"error/{name}"] = np.array(str(e))
    return out


def decode(tiny, out_dir, port, count, pid, fault=False, methods=tuple(METHODS)):
    t0 = time.time()
    from dsbd_jax.parallel import distributed
    distributed.initialize(f"127.0.0.1:{port}", count, pid)
    import jax
    from dsbd_jax import parallel as sh
    from dsbd_jax.decoding.methods import build, model_params
    assert jax.device_count() == 4 * count and jax.local_device_count() == 4, jax.devices()
    target, draft = models(tiny)
    ids, lens = batch()
    mine = SPLITS[count][pid]
    mesh = sh.make_mesh(*MESH)
    res, times, sdecs, placed = {}, {}, {}, {}
    methods = ["sample"] if fault else list(methods)
    for name in methods:
        t = time.time()
        method, extra = METHODS[name]
        dec = build(method, target.config, draft.config, **SETTINGS, **extra)
        sdec = sdecs[name] = sh.ShardedDecoder.of(dec, mesh)
        pair = (target, draft)
        if name == "dsbd":    # weights placed onto this process's shards as they load
            pair = models(tiny, sdec.placer("target"), sdec.placer("draft"))
        params = placed[name] = sdec.place(model_params(dec, pair[0].params, pair[1].params))
        out = sdec(params, ids[mine], jax.random.key(SEED), prompt_lengths=lens[mine])
        res.update(flat(name, out))
        times[name] = round(time.time() - t, 1)
        print(f"process {pid}: {name} {times[name]} s", flush=True)
        if fault:
            print(f"process {pid}: first call done", flush=True)
            done = os.path.join(out_dir, "fault_first_call_done_0")
            if pid == 0:
                open(done, "w").close()
            else:     # killed between two calls, once process 0 has finished its first call
                deadline = time.time() + 600
                while not os.path.exists(done) and time.time() < deadline:
                    time.sleep(0.05)
                os.kill(os.getpid(), signal.SIGKILL)
            t = time.time()
            try:
                sdec(params, ids[mine], jax.random.key(SEED), prompt_lengths=lens[mine])
            except Exception as e:   # noqa: BLE001 -- reported, then a non-zero exit
                print(f"process {pid}: second call failed after {time.time() - t:.1f} s: "
                      f"{type(e).__name__}: {e}", flush=True)
                sys.exit(3)
            print(f"process {pid}: second call returned after {time.time() - t:.1f} s", flush=True)
            return
    # one compile per decoder, counted before the calls below
    res["compiles"] = np.array([sdecs[n].compiles for n in methods])
    if "dsbd" in sdecs:
        sdec, params = sdecs["dsbd"], placed["dsbd"]
        # gather="all": the whole batch on every process (same compiled program)
        res.update(flat("all/dsbd", sdec(params, ids[mine], jax.random.key(SEED),
                                         prompt_lengths=lens[mine], gather="all")))
        res.update(bad_inputs(sdec, params, ids[mine], lens[mine], pid))
    np.savez(os.path.join(out_dir, f"process{pid}-{methods[0]}.npz"), **res)
    print(f"process {pid}: total {time.time() - t0:.1f} s {times}", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    mode, tiny, out_dir = sys.argv[1:4]
    if mode == "reference":
        reference(tiny, out_dir, sys.argv[4].split(",") if len(sys.argv) > 4 else list(METHODS))
    elif mode == "decode" and len(sys.argv) > 7:
        decode(tiny, out_dir, int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]),
               methods=sys.argv[7].split(","))
    else:
        decode(tiny, out_dir, int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]),
               fault=(mode == "fault"))
