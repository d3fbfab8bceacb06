"""The attention's form, side by side in one process: two of its forms (``--forms``) on
sampling, beam sampling W=4, DSBD g2 / W_S 4 / t 0.7 / W_min 2 and speculative sampling g4 with
the offline Qwen2.5-Coder 1.5B / 0.5B pair in bfloat16 (the draft in ``--draft-weights``; the
benchmark prompts, batch 1, EOS off, top-k 10 / top-p 0.8). The forms:

* ``softmax_then_values``: ``jax.nn.softmax`` over the scores, then the values product, the
  queries first (to 2026-11-29);
* ``normalised_after_values``: the keys as the products' first operand, the weights normalised
  after the values product, the cache converted to float32 and joined with the new tokens
  first (to 2026-12-05);
* ``parts_in_cache_dtype``: ``llama.attend`` as it is: the same, the cache and the new tokens
  as two parts, each product's operands in the cache's dtype, float32 accumulation.

Per decoder both forms are compiled (a form other than the current one traced with it patched
in, jax's caches cleared around it), then every prompt runs under each form in turn,
``--repeats`` rounds; the median per prompt counts. Each compiled program's ``dot`` and fusion
instructions are counted, and both forms' output lengths recorded. ``ratios`` holds each
decoder's second form over its first, and per form DSBD over beam sampling W=4 and speculative
over plain sampling (seconds, prefill included).

Run in one process, interleaved: the same comparison run as separate processes
(``benchmarks/variant_processes.py``) differed by up to 8 % between two processes of the same
form on this host.

    .venv/bin/python benchmarks/probes/attention_form.py --forms softmax_then_values \
        normalised_after_values --out results/attention_form_epyc.json  # ~8 min, the former pair
    .venv/bin/python benchmarks/probes/attention_form.py --draft-weights int8 \
        --out results/attention_parts_amx_xeon.json
    .venv/bin/python benchmarks/probes/attention_form.py --small --out /tmp/attention_form.json
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import statistics
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)

from benchmarks import variant_processes  # noqa: E402

FORMS = ("softmax_then_values", "normalised_after_values", "parts_in_cache_dtype")
CURRENT = "parts_in_cache_dtype"
DECODERS = variant_processes.UNDRAFTED + variant_processes.DRAFTED


def softmax_then_values(q, keys, values, mask, scale, cap=None):
    """The ``llama.attend`` before 2026-11-29: the same scores in float32 (the cache converted
    and joined), ``jax.nn.softmax``, then the values product, the queries the products' first
    operand."""
    import jax
    import jax.numpy as jnp

    from dsbd_jax.models import llama
    keys, values = _joined(keys), _joined(values)
    scores = jnp.einsum("btkgd,bskd->bkgts", q, keys, preferred_element_type=jnp.float32) * scale
    scores = llama.softcap(scores, cap)
    scores = jnp.where(mask[:, None, None, :, :], scores, llama._NEG)
    probs = jax.nn.softmax(scores, axis=-1)
    return jnp.einsum("bkgts,bskd->btkgd", probs, values)


def normalised_after_values(q, keys, values, mask, scale, cap=None):
    """The former ``llama.attend`` (to 2026-12-05): the cache converted to float32 and joined
    with the new tokens, float32 products, the weights normalised after the values product."""
    import jax
    import jax.numpy as jnp

    from dsbd_jax.models import llama
    keys, values = _joined(keys), _joined(values)
    scores = jnp.einsum("bskd,btkgd->bkgts", keys, q, preferred_element_type=jnp.float32) * scale
    scores = llama.softcap(scores, cap)
    scores = jnp.where(mask[:, None, None, :, :], scores, llama._NEG)
    weights_ = jnp.exp(scores - jax.lax.stop_gradient(scores.max(-1, keepdims=True)))
    total = jnp.moveaxis(weights_.sum(-1), 3, 1)[..., None]
    return jnp.einsum("bskd,bkgts->btkgd", values, weights_) / total


def _joined(parts):
    """Keys or values given as parts along the keys (``llama.attend_cache``): joined, in float32
    (what ``llama.attend_cache`` did to 2026-12-05)."""
    import jax.numpy as jnp
    if not isinstance(parts, tuple):
        return parts.astype(jnp.float32)
    return jnp.concatenate(parts, axis=1).astype(jnp.float32)


_FUNCTIONS = {"softmax_then_values": softmax_then_values,
              "normalised_after_values": normalised_after_values}


@contextlib.contextmanager
def attention_as(attend):
    """Inside, ``llama.attend`` is ``attend`` (``None``: left as it is); jax's caches are cleared
    on the way in and out (the layers' inner ``jit`` would otherwise reuse a trace made under
    the other form). ``benchmarks/pass_floor.py`` traces its pass without attention with it."""
    import jax

    from dsbd_jax.models import llama
    current = llama.attend
    jax.clear_caches()
    if attend is not None:
        llama.attend = attend
    try:
        yield
    finally:
        llama.attend = current
        jax.clear_caches()


def form(name: str):
    """:func:`attention_as` the form ``name`` (one of :data:`FORMS`)."""
    return attention_as(_FUNCTIONS.get(name))


_OPS = re.compile(r"=\s*\S+\s+(fusion|dot)\(")


def instructions(hlo: str) -> dict:
    """How many ``fusion`` and ``dot`` instructions a compiled program's text holds (every
    computation: the decode loop's body is its own)."""
    counts = {"fusion": 0, "dot": 0}
    for line in hlo.splitlines():
        m = _OPS.search(line)
        if m:
            counts[m.group(1)] += 1
    return counts


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3, help="rounds of every prompt and form")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--decoders", nargs="+", default=list(DECODERS), choices=list(DECODERS))
    ap.add_argument("--forms", nargs=2, default=["normalised_after_values", CURRENT],
                    choices=list(FORMS), help="the two forms compared (the second over the first)")
    ap.add_argument("--draft-weights", choices=("float", "int8"), default="float",
                    help="the draft's weights (the target's are bfloat16)")
    ap.add_argument("--small", action="store_true", help="a tiny random bfloat16 pair (seconds)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import jax
    import numpy as np

    from dsbd_jax.decoding import common
    from dsbd_jax.decoding.common import pad_prompts
    from dsbd_jax.eval.timing import machine_info, portable_settings, write_json
    t0 = time.perf_counter()
    forms = tuple(args.forms)
    if forms[0] == forms[1]:
        ap.error("--forms: two different forms")
    tc, tp, dc, dp, prompts = variant_processes.models(args.small, args.draft_weights)
    P = common.bucket_length(max(len(p) for p in prompts))
    res = {"machine": machine_info(), "settings": portable_settings(vars(args), _ROOT),
           "models": "tiny random pair" if args.small else {
               "target": variant_processes.TARGET, "draft": variant_processes.DRAFT},
           "dtypes": {"target": tc.dtype, "draft": dc.dtype},
           "draft_weights": args.draft_weights, "forms": list(forms), "decoders": {},
           "ratios": {}}
    for name, fn, cfg, drafted in variant_processes.decoder_runs(tc, dc, args.max_new_tokens,
                                                                 args.decoders):
        params = {"target": tp, "draft": dp} if drafted else tp
        runs, rec = {}, {}
        for f in forms:
            with form(f):
                calls = []
                for i, p in enumerate(prompts):
                    ids, lens = pad_prompts([p], length=P)
                    calls.append(fn.prepare(params, ids, jax.random.PRNGKey(i), cfg,
                                            prompt_lengths=lens))
                program = calls[0].compile()   # one bucket: one program for every prompt
            outs = [jax.block_until_ready(program(*c.args)) for c in calls]  # warm-up
            runs[f] = [(program, c.args) for c in calls]
            rec[f] = {"instructions": instructions(program.as_text()),
                      "lengths": [np.asarray(o.lengths).tolist() for o in outs], "seconds": []}
        for _ in range(args.repeats):
            for i in range(len(prompts)):
                for f in forms:
                    program, a = runs[f][i]
                    s = time.perf_counter()
                    jax.block_until_ready(program(*a))
                    rec[f]["seconds"].append((i, time.perf_counter() - s))
        for f in forms:
            rec[f]["median_s"] = [statistics.median(s for j, s in rec[f]["seconds"] if j == i)
                                  for i in range(len(prompts))]
        ratio = sum(rec[forms[1]]["median_s"]) / sum(rec[forms[0]]["median_s"])
        res["decoders"][name] = rec
        res["ratios"][f"{name}: {forms[1]} / {forms[0]}, seconds"] = ratio
        res["ratios"].update(between_decoders(res["decoders"], forms))
        print(f"{name}: " + ", ".join(f"{f} {sum(rec[f]['median_s']):.2f} s" for f in forms)
              + f"; {ratio:.3f}", flush=True)
        write_json(args.out, res)
    res["wall_s"] = time.perf_counter() - t0
    write_json(args.out, res)
    return res


PAIRS = (("dsbd_g2_WS4_t0.7_Wmin2", "beam_sample_W4"), ("speculative_g4", "sample"))


def between_decoders(decoders: dict, forms) -> dict:
    """Per form, a drafted decoder's speed over its undrafted peer's (:data:`PAIRS`; the peer's
    seconds over the drafted one's, so above 1 is faster), for the pairs both of which ran."""
    out = {}
    for fast, peer in PAIRS:
        if fast in decoders and peer in decoders:
            for f in forms:
                out[f"{fast} / {peer} under {f}, speed"] = (
                    sum(decoders[peer][f]["median_s"]) / sum(decoders[fast][f]["median_s"]))
    return out


if __name__ == "__main__":
    main()
