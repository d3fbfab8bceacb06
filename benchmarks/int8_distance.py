"""How far the int8 kind moves a model: next-token distributions on held-out texts, float vs int8.

Teacher-forced on held-out texts (GSM8K worked answers 1300-1315 and HumanEval solutions
100-107, none of them a benchmark, rollout or training prompt; at most ``--max-tokens`` tokens
each), over every answer position, for the target and the draft of the offline pair:

* ``kl_float_int8``: mean KL(p_float || p_int8) per token (nats), unwarped;
* ``top1_agree``: how often both put their largest mass on the same token;
* ``loglik_loss``: ``E_{v~p_int8}[log p_float(v)] - E_{v~p_float}[log p_float(v)]`` per token:
  what a token drawn from the int8 model scores under the float model, against a token drawn
  from the float model (both from the same context; negative: the int8 model's tokens are less
  likely under the float one);
* for the draft, ``acceptance``: the expected acceptance of one drafted token by the float
  target, ``sum_v min(p_target(v), q(v))`` with both warped as the benchmarks decode (top-k 10,
  top-p 0.8), for the float draft and the int8 draft: speculative sampling's per-token rate.

Each figure has a 95 % bootstrap interval over the texts. ``--activations`` compares the
activation quantisation of the int8 product: ``row`` (the kind's: one scale per row) and
``block<n>`` (one scale per ``n`` entries of the contracted axis, a variant patched in for the
measurement: a batched integer product over the blocks).

Usage: python benchmarks/int8_distance.py [--max-tokens 256] [--activations row block128]
       [--out results/int8_distance.json]
       python benchmarks/int8_distance.py --small   (the tiny pair: a check)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from dsbd_jax.eval.timing import machine_info, portable_settings, write_json  # noqa: E402
from dsbd_jax.models import llama, products, weights
from dsbd_jax.models import kinds

TARGET, DRAFT = "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct"
TEXTS = [{"task": "gsm8k", "start": 1300, "stop": 1316},
         {"task": "humaneval", "start": 100, "stop": 108}]
WARP = dict(temperature=1.0, top_k=10, top_p=0.8)


def blocked_product(block: int):
    """An int8 product whose activations take one scale per ``block`` entries of the contracted
    axis (the variant ``block<n>``): a batched ``s8 x s8 -> s32`` product over the blocks, each
    block's sums scaled by its own activation scale, then summed."""
    def product(self, x):
        lead, din = x.shape[:-1], x.shape[-1]
        if din % block:
            return products.int8_rows(x, self.codes, self.scales)
        nb = din // block
        xm = x.reshape(-1, nb, block).astype(jnp.float32)
        xq, xs = products.quantize_rows(xm)                            # [m, nb, blk], [m, nb]
        w = self.codes.reshape(self.codes.shape[0], nb, block)         # [out, nb, blk]
        y = jax.lax.dot_general(xq, w, (((2,), (2,)), ((1,), (1,))),
                                preferred_element_type=jnp.int32)      # [nb, m, out]
        y = jnp.einsum("bmo,mb->mo", y.astype(jnp.float32), xs) * self.scales
        return y.reshape(*lead, self.codes.shape[0])
    return product


@contextlib.contextmanager
def activations(kind: str):
    """Int8 products with the activation quantisation ``kind`` (``row`` or ``block<n>``)."""
    if kind == "row":
        yield
        return
    orig = weights.Int8.product
    weights.Int8.product = blocked_product(int(kind[len("block"):]))
    llama._logits.clear_cache()      # the programs traced with the kind's product: not reused
    try:
        yield
    finally:
        weights.Int8.product = orig
        llama._logits.clear_cache()


def all_logits(config, params, ids, length: int):
    """float64 logits of every position of ``ids``, run right-padded to ``length`` tokens (one
    compiled program for every text: the model is causal, padding changes no earlier row)."""
    padded = np.zeros((1, length), np.int32)
    padded[0, :len(ids)] = ids
    return np.asarray(llama.logits(config, params, padded)[0, :len(ids)], np.float64)


def log_softmax(x):
    return x - np.logaddexp.reduce(x, axis=-1, keepdims=True)


def warped(x):
    from dsbd_jax.decoding.warping import warp_logits
    return np.exp(np.asarray(warp_logits(jnp.asarray(x, jnp.float32), **WARP), np.float64))


def sparse(p):
    """A warped distribution's nonzero entries per row: ``(row, token, probability)``."""
    rows, cols = np.nonzero(p)
    return rows, cols, p[rows, cols]


def acceptance(w_target, q):
    """Mean over rows of ``sum_v min(p_target(v), q(v))``, the target warped and sparse."""
    rows, cols, p = w_target
    return float(np.sum(np.minimum(p, q[rows, cols])) / q.shape[0])


def per_text(lp_f, lp_q):
    """The unwarped distance figures of one text (rows: its answer positions)."""
    p, q = np.exp(lp_f), np.exp(lp_q)
    return {"kl_float_int8": float(np.mean(np.sum(p * (lp_f - lp_q), -1))),
            "top1_agree": float(np.mean(lp_f.argmax(-1) == lp_q.argmax(-1))),
            "loglik_loss": float(np.mean(np.sum(q * lp_f, -1) - np.sum(p * lp_f, -1)))}


def bootstrap(values, rng, n=2000):
    v = np.asarray(values, np.float64)
    means = v[rng.integers(0, len(v), (n, len(v)))].mean(1)
    return {"mean": float(v.mean()), "ci95": [float(np.quantile(means, 0.025)),
                                              float(np.quantile(means, 0.975))], "texts": len(v)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default=TARGET)
    ap.add_argument("--draft", default=DRAFT)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--activations", nargs="+", default=["row", "block128"])
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    from dsbd_jax.loading.load import load_model
    from dsbd_jax.training.head_data import answer_texts
    if args.small:
        from dsbd_jax.testing import make_tiny_pair
        args.target, args.draft = (str(p) for p in make_tiny_pair(
            Path(tempfile.mkdtemp(prefix="int8_distance_")) / "pair", noise=0.3))
        args.activations = ["row", "block32"]
    target = load_model(args.target, "float32", progress=not args.small)
    specs = [dict(TEXTS[0], stop=TEXTS[0]["start"] + 3)] if args.small else TEXTS
    texts, starts = answer_texts(target.tokenizer, specs)
    texts = [t[:args.max_tokens] for t in texts]
    keep = [i for i, (t, s) in enumerate(zip(texts, starts)) if s < len(t) - 1]
    if not keep:
        raise SystemExit(f"no text has an answer within --max-tokens {args.max_tokens}")
    rng = np.random.default_rng(0)
    out = {"benchmark": "int8_distance", "settings": portable_settings(vars(args), _ROOT),
           "machine": machine_info(), "texts": TEXTS, "warp": WARP, "models": {}}
    # the target's warped next-token distributions, kept sparse (top-k 10: at most 10 tokens a
    # row); every other [positions, V] array lives for one text only (float64: 1.2 MB a row)
    w_target = {}
    for role, source in (("target", args.target), ("draft", args.draft)):
        model = target if role == "target" else load_model(source, "float32",
                                                           progress=not args.small)
        target = None                    # the float target's weights: not needed any more
        q_params, q_config = kinds.int8_params(model.params, model.config)
        rec = out["models"][role] = {"source": portable_settings({"s": source}, _ROOT)["s"]}
        positions, acc_float = 0, []
        for kind in args.activations:
            figs, acc_int8 = [], []
            for i in keep:
                lp_f = log_softmax(all_logits(model.config, model.params, texts[i],
                                              args.max_tokens))[starts[i]:-1]
                if kind == args.activations[0]:
                    positions += len(lp_f)
                    if role == "target":
                        w_target[i] = sparse(warped(lp_f))
                    else:
                        acc_float.append(acceptance(w_target[i], warped(lp_f)))
                with activations(kind):
                    lp_q = log_softmax(all_logits(q_config, q_params, texts[i],
                                                  args.max_tokens))[starts[i]:-1]
                figs.append(per_text(lp_f, lp_q))
                if role == "draft":
                    acc_int8.append(acceptance(w_target[i], warped(lp_q)))
                del lp_f, lp_q
            r = rec[kind] = {k: bootstrap([f[k] for f in figs], rng) for k in figs[0]}
            if role == "draft":
                if "acceptance_float_draft" not in rec:
                    rec["acceptance_float_draft"] = bootstrap(acc_float, rng)
                r["acceptance_int8_draft"] = bootstrap(acc_int8, rng)
                r["acceptance_change"] = bootstrap(
                    [a - b for a, b in zip(acc_int8, acc_float)], rng)
            print(f"{role} {kind}: " + ", ".join(f"{k} {v['mean']:.4f} [{v['ci95'][0]:.4f}, "
                                                  f"{v['ci95'][1]:.4f}]" for k, v in r.items()),
                  flush=True)
        rec["positions"] = int(positions)
        del q_params, model
    if args.out:
        write_json(args.out, out)
        print(f"wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
