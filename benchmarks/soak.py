"""Soak run: many prompts through every decoder in one process; does anything creep?

On the tiny random pair (``dsbd_jax.testing.make_tiny_pair``: a 2-layer, hidden-64 Llama target
and its noisy copy as the draft; no real model, so the figures say nothing about speed or
quality) it sends ``--prompts`` prompts of mixed lengths (1 to ``--max-len`` tokens, i.e. several
length buckets) through every decoder: the method settings of the quality config
(``configs/quality_cpu.yaml``, with its warping, EOS and batch size) plus ``beam_search`` and
``tree`` so that all six decoders run. Prompts are grouped by bucket and cut into batches of the
config's batch size (a bucket's last batch may be smaller: another batch shape). The whole set
is repeated for ``--rounds`` rounds. It records

* compiles: ``compile_count`` after the first round vs the number of (method, bucket, batch
  shape) combinations (they must be equal), and compiles in later rounds (must be 0);
* host RSS (``/proc/self/statm``) and live device buffers (``jax.live_arrays()``: count and
  bytes) after every batch, and their least-squares slope per batch over the rounds after the
  first (with the change from the end of round 1 to the end of the run);
* NaNs and malformed outputs (shapes, token ids in the vocabulary, lengths in [0, N], pad after
  the length, a finite log-likelihood for the best beam, ``invalid`` all False).

JSON goes to ``--out`` (default ``/tmp/dsbd_soak_<host>.json``) with the CPU model. ``--small`` is a quick check of the
script itself (8 prompts, 2 rounds, sampling and beam sampling W=2, 4 new tokens).

Usage: python benchmarks/soak.py [--small] [--prompts 200] [--rounds 3] [--new 16]
                                 [--config configs/quality_cpu.yaml] [--out PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)

import jax  # noqa: E402
import numpy as np  # noqa: E402
import yaml  # noqa: E402

import dsbd_jax
from dsbd_jax import load_model  # noqa: E402
from dsbd_jax.decoding import common  # noqa: E402
from dsbd_jax.decoding.methods import build, label, model_params  # noqa: E402
from dsbd_jax.eval.plan import expand_methods  # noqa: E402
from dsbd_jax.eval.timing import machine_info, write_json  # noqa: E402
from dsbd_jax.host.cpu_options import cpu_model  # noqa: E402
from dsbd_jax.testing import make_tiny_pair  # noqa: E402

EXTRA = [{"method": "beam_search", "num_beams": 2}, {"method": "tree", "gamma": 2}]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def live_buffers():
    arrays = jax.live_arrays()
    return len(arrays), int(sum(a.nbytes for a in arrays))


def slope(ys) -> float:
    """Least-squares slope per step of ``ys`` (0 for fewer than 2 points)."""
    if len(ys) < 2:
        return 0.0
    x = np.arange(len(ys), dtype=float)
    return float(np.polyfit(x, np.asarray(ys, float), 1)[0])


def problems(out, config, vocab: int) -> list:
    """What is wrong with one output (empty if it is well-formed)."""
    seqs, lens = np.asarray(out.sequences), np.asarray(out.lengths)
    ll, best = np.asarray(out.log_likelihoods), np.asarray(out.best)
    B, W, N = seqs.shape
    bad = []
    if np.isnan(ll).any():
        bad.append("NaN log-likelihood")
    if lens.shape != (B, W) or ll.shape != (B, W) or best.shape != (B,) or N != config.max_new_tokens:
        bad.append("shapes")
    if seqs.min() < 0 or seqs.max() >= vocab:
        bad.append("token id outside the vocabulary")
    if lens.min() < 0 or lens.max() > N:
        bad.append("length outside [0, N]")
    past = np.arange(N)[None, None, :] >= lens[..., None]
    if np.any(seqs[past] != config.pad_id):
        bad.append("not pad after the length")
    if not np.all(np.isfinite(ll[np.arange(B), best])) or np.any(lens[np.arange(B), best] < 1):
        bad.append("best beam empty or not finite")
    if out.invalid is None or np.asarray(out.invalid).any():
        bad.append("invalid flag set")
    return bad


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--small", action="store_true", help="a quick check of the script")
    ap.add_argument("--prompts", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new", type=int, default=16, help="max new tokens")
    ap.add_argument("--max-len", type=int, default=100, help="longest prompt (tokens)")
    ap.add_argument("--config", default=os.path.join(_ROOT, "configs", "quality_cpu.yaml"))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="default /tmp/dsbd_soak_<host>.json")
    a = ap.parse_args(argv)
    with open(a.config) as f:
        qcfg = yaml.safe_load(f)
    entries = list(qcfg["methods"]) + EXTRA
    if a.small:
        a.prompts, a.rounds, a.new, a.max_len = 8, 2, 4, 16
        entries = [{"method": "sample"}, {"method": "beam", "num_beams": 2}]
    if a.rounds < 2:
        ap.error("--rounds must be >= 2 (growth is measured after the first round)")
    batch_size = int(qcfg.get("batch_size", 4))
    warping = dict(qcfg.get("warping", {}))
    runs = expand_methods(entries)

    t_start = time.perf_counter()
    tiny = tempfile.mkdtemp(prefix="dsbd_soak_")
    tdir, ddir = make_tiny_pair(tiny, seed=0, noise=0.1)
    target = load_model(tdir, tokenizer=False, progress=False)
    draft = load_model(ddir, tokenizer=False, progress=False)
    V = target.config.vocab_size
    eos = {} if qcfg.get("eos", True) else {"eos_token_id": ()}
    decoders = [(label(m, s), build(m, target.config, draft.config, max_new_tokens=a.new,
                                    **warping, **eos, **s)) for m, s in runs]

    rng = np.random.default_rng(a.seed)
    lengths = rng.integers(1, a.max_len + 1, size=a.prompts)
    prompts = [rng.integers(0, V, size=int(n)).tolist() for n in lengths]
    cap = min(common.max_prompt_length(d.config) for _, d in decoders)
    by_bucket = {}
    for i, p in enumerate(prompts):
        by_bucket.setdefault(common.bucket_length(len(p), maximum=cap), []).append(i)
    batches = [(bucket, idx[j:j + batch_size]) for bucket, idx in sorted(by_bucket.items())
               for j in range(0, len(idx), batch_size)]
    combos = {(name, bucket, len(idx)) for name, _ in decoders for bucket, idx in batches}

    samples, bad, nan_outputs = [], [], 0
    # every program compiles in round 1 even where this process compiled the same shapes before
    # (a test run imports the script beside other tests): the count below must see them all
    jax.clear_caches()
    compiles_before = sum(dsbd_jax.compile_count().values())
    compiles_per_round = []
    for r in range(a.rounds):
        c0 = sum(dsbd_jax.compile_count().values())
        for name, dec in decoders:
            params = model_params(dec, target.params, draft.params)
            for k, (bucket, idx) in enumerate(batches):
                ids, lens = common.pad_prompts([prompts[i] for i in idx], pad_id=0, length=bucket)
                key = jax.random.fold_in(jax.random.key(a.seed), r * 100003 + k)
                out = dec(params, ids, key, lens)
                jax.block_until_ready(out)
                wrong = problems(out, dec.config, V)
                nan_outputs += int("NaN log-likelihood" in wrong)
                if wrong:
                    bad.append({"round": r, "method": name, "bucket": bucket, "prompts": idx,
                                "problems": wrong})
                del out
                n, nbytes = live_buffers()
                samples.append({"round": r, "rss": rss_bytes(), "live_arrays": n,
                                "live_bytes": nbytes})
        compiles_per_round.append(sum(dsbd_jax.compile_count().values()) - c0)

    later = [s for s in samples if s["round"] > 0]
    end1 = [s for s in samples if s["round"] == 0][-1]
    growth = {k: {"slope_per_batch": slope([s[k] for s in later]),
                  "end_of_round_1": end1[k], "end": samples[-1][k],
                  "change_after_round_1": samples[-1][k] - end1[k]}
              for k in ("rss", "live_arrays", "live_bytes")}
    res = {
        "what": "soak run on the tiny random pair (dsbd_jax.testing.make_tiny_pair), "
                "benchmarks/soak.py" + (" --small" if a.small else ""),
        "host": socket.gethostname(), "cpu_model": cpu_model(), "machine": machine_info(),
        "prompts": a.prompts, "rounds": a.rounds, "max_new_tokens": a.new,
        "prompt_lengths": [int(lengths.min()), int(lengths.max())], "batch_size": batch_size,
        "warping": warping, "eos": bool(qcfg.get("eos", True)),
        "methods": [name for name, _ in decoders],
        "buckets": {str(b): len(v) for b, v in sorted(by_bucket.items())},
        "batches_per_round": len(batches) * len(decoders),
        "compile_combinations": len(combos),
        "compiles_first_round": compiles_per_round[0],
        "compiles_later_rounds": sum(compiles_per_round[1:]),
        "compiles_total": sum(dsbd_jax.compile_count().values()) - compiles_before,
        "compiles_ok": compiles_per_round[0] == len(combos) and sum(compiles_per_round[1:]) == 0,
        "growth_after_round_1": growth,
        "nan_outputs": nan_outputs, "malformed_outputs": len(bad), "malformed": bad[:20],
        "seconds": time.perf_counter() - t_start,
    }
    out_path = a.out or f"/tmp/dsbd_soak_{socket.gethostname()}.json"
    write_json(out_path, res)
    print(json.dumps({k: res[k] for k in ("compile_combinations", "compiles_first_round",
                                          "compiles_later_rounds", "nan_outputs",
                                          "malformed_outputs", "seconds")}))
    print("growth after round 1 (per batch): "
          + ", ".join(f"{k} {v['slope_per_batch']:.3g}" for k, v in growth.items()))
    print(f"wrote {out_path}")
    return res


if __name__ == "__main__":
    main()
