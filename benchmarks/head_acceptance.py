"""A draft's acceptance on the target's own continuations of held-out prompts, and where it
is lost.

For each benchmark prompt (GSM8K and HumanEval problems 0.., never a head-training text), the
target writes a continuation with speculative sampling (gamma 1, the draft under test; EOS off,
top-k 10 / top-p 0.8); then one teacher-forced pass of the target and of the draft over prompt +
continuation gives, at every position, the acceptance ``sum min(p, q)`` of the warped
distributions (the probability that speculative sampling accepts the draft's token there):

* ``continuation``: the mean over the generated positions (the acceptance that the decoders'
  tokens per iteration follow; the draft-head issue's target);
* ``prompt``: the mean over the prompt's positions (the chat template and the question, the
  kind of text a head trained on datasets' texts has seen);
* ``decoded``: the acceptance rate the decoder itself counted (accepted / verified drafts),
  a check that the teacher-forced figure is what decoding meets.

Drafts: ``--head NAME|DIR`` (a trained draft head) and/or ``--draft MODEL`` (a full draft
model); both are measured on the same continuations when both are given (the target writes
with the first).

    .venv/bin/python benchmarks/head_acceptance.py --head head_qwen \\
        --draft qwen2.5-coder-0.5b-instruct --out results/head_acceptance.json   # ~6 min
    .venv/bin/python benchmarks/head_acceptance.py --small --out /tmp/acc.json    # tiny pair
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)


def acceptance_along(target_config, target_params, draft_config, draft_params, tokens, length,
                     top_k, top_p):
    """``sum min(p, q)`` ``[T]`` at every position of ``tokens [T]`` (the first ``length``
    real), p and q the warped distributions of the next token, both teacher-forced (a head reads
    the target's features of the same pass)."""
    import jax.numpy as jnp
    from dsbd_jax.decoding.warping import warp_logits
    from dsbd_jax.models import head as mh
    from dsbd_jax.models.llama import causal_mask, forward
    T = tokens.shape[0]
    toks = jnp.asarray(tokens)[None]
    pos = jnp.arange(T, dtype=jnp.int32)[None]
    mask = causal_mask(jnp.asarray([length], jnp.int32), T)
    head = mh.is_head(draft_config)
    if head:
        lt, _, feats = forward(target_config, target_params, toks, pos, mask, None,
                               feature_layers=draft_config.feature_layers)
        f = mh.features_of_prompt(mh.target_features(draft_config, draft_params, feats))
        lq, _, _ = mh.forward(draft_config, draft_params, target_params, toks, f, pos, mask)
    else:
        lt, _ = forward(target_config, target_params, toks, pos, mask, None)
        lq, _ = forward(draft_config, draft_params, toks, pos, mask, None)
    p = jnp.exp(warp_logits(lt, 1.0, top_k, top_p))
    q = jnp.exp(warp_logits(lq, 1.0, top_k, top_p))
    return jnp.sum(jnp.minimum(p, q), axis=-1)[0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--small", action="store_true",
                    help="the tiny random pair and a head made from its target's last layer")
    ap.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    ap.add_argument("--head", default=None, metavar="NAME|DIR")
    ap.add_argument("--draft", default=None, metavar="MODEL")
    ap.add_argument("--prompts", type=int, default=4, help="benchmark prompts (half GSM8K, "
                    "half HumanEval)")
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--top-k", type=int, default=10)
    ap.add_argument("--top-p", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)

    import jax
    import numpy as np
    from dsbd_jax.decoding.common import bucket_length, pad_prompts
    from dsbd_jax.decoding.configs import SpeculativeConfig
    from dsbd_jax.decoding.speculative import speculative_sample
    from dsbd_jax.eval.datasets import benchmark_prompts, encode_chat
    from dsbd_jax.eval.timing import machine_info, portable_settings, write_json
    from dsbd_jax.models import head as mh
    from dsbd_jax.loading.load import load_model

    if args.small:
        from dsbd_jax.testing import make_tiny_pair
        tmp = Path(tempfile.mkdtemp(prefix="head_acceptance_"))
        args.target, args.draft = (str(p) for p in make_tiny_pair(tmp / "pair", noise=0.3))
        args.prompts, args.max_new_tokens = 2, 8
    if not (args.head or args.draft or args.small):
        ap.error("give --head and/or --draft")
    target = load_model(args.target, progress=not args.small)
    drafts = {}
    if args.head:
        from dsbd_jax.training.head import load_head
        hc, hp, _ = load_head(args.head, target.config)
        drafts["head"] = (hc, hp)
    elif args.small:
        hc = mh.HeadConfig(target.config)
        drafts["head"] = (hc, mh.init_params(hc, jax.random.PRNGKey(0), target.params))
    if args.draft:
        d = load_model(args.draft, progress=not args.small)
        drafts["draft"] = (d.config, d.params)
    if args.small:
        prompts = encode_chat(target.tokenizer, ["def add(a, b):", "What is 12 times 7?"],
                              raw=True)
    else:
        prompts = benchmark_prompts(target.tokenizer, args.prompts)[1]
    writer = next(iter(drafts))
    wc, wp = drafts[writer]
    cfg = SpeculativeConfig(target=target.config, draft=wc, gamma=1,
                            max_new_tokens=args.max_new_tokens, top_k=args.top_k, top_p=args.top_p, eos_token_id=())
    P = bucket_length(max(len(p) for p in prompts))
    T = bucket_length(P + args.max_new_tokens)
    acc = jax.jit(acceptance_along, static_argnums=(0, 2, 6, 7))
    out = {"machine": machine_info(), "settings": portable_settings(vars(args), _ROOT),
           "written_with": writer, "prompts": [], "summary": {}}
    for i, prompt in enumerate(prompts):
        ids, lens = pad_prompts([prompt], length=P)
        res = speculative_sample({"target": target.params, "draft": wp}, ids,
                                 jax.random.PRNGKey(args.seed + i), cfg, prompt_lengths=lens)
        L, n = int(lens[0]), int(res.lengths[0, 0])
        seq = np.concatenate([np.asarray(ids[0, :L]), np.asarray(res.sequences[0, 0, :n])])
        toks = np.zeros((T,), np.int32)
        toks[:len(seq)] = seq
        st = {k: np.asarray(v) for k, v in res.stats.items()}
        rec = {"prompt_tokens": L, "new_tokens": n,
               "decoded": {writer: float(st["accepted_tokens"].sum()
                                         / max(st["verified_tokens"].sum(), 1))}}
        for name, (dc, dp) in drafts.items():
            a = np.asarray(acc(target.config, target.params, dc, dp, toks, len(seq), args.top_k,
                               args.top_p))
            # position j holds the acceptance of token j + 1
            rec[name] = {"prompt": float(a[:L - 1].mean()),
                         "continuation": float(a[L - 1:len(seq) - 1].mean())}
        out["prompts"].append(rec)
        print(f"prompt {i}: " + ", ".join(f"{k} continuation {rec[k]['continuation']:.3f} "
                                          f"prompt {rec[k]['prompt']:.3f}" for k in drafts)
              + f"; decoded ({writer}) {rec['decoded'][writer]:.3f}", flush=True)
    for name in drafts:
        out["summary"][name] = {
            k: float(np.mean([r[name][k] for r in out["prompts"]]))
            for k in ("prompt", "continuation")}
    out["summary"]["decoded_" + writer] = float(np.mean([r["decoded"][writer]
                                                         for r in out["prompts"]]))
    write_json(args.out, out)
    print(f"summary: {out['summary']}\nwrote {args.out}")
    return out


if __name__ == "__main__":
    main()
