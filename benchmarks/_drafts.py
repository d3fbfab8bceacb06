"""Helpers the draft benchmarks share (not an entry point): the offline pair's names, one forward
pass as a timed call, medians of calls timed round by round, the truncated drafts, the options of a
pair, and the forward passes one decoder iteration runs. From the retired
``benchmarks/draft_levers.py`` and ``benchmarks/phase_profile.py`` (``git show 90d572c:PATH``)."""

from __future__ import annotations

import statistics
import time

TARGET = "qwen2.5-coder-1.5b-instruct"
DRAFT = "qwen2.5-coder-0.5b-instruct"


def pass_call(config, params, B, slots, prompt_len, T=1):
    """A zero-argument call of one forward over ``[B, T]`` new tokens (``T = 1``: a decode step;
    more: a speculative chain or a DSBD forest, logits at every new token as the decoders ask)
    over ``slots`` cached slots, compiled under the host's XLA:CPU options
    (``cpu_options.tuned_jit``, as the decoders are). A head with prompt rows gets its
    ``B * prompt_len`` prompt columns first, as a decoder's program adds them."""
    import jax.numpy as jnp
    from dsbd_jax.models import vocab as mv
    from dsbd_jax.models.cache import empty_cache
    from dsbd_jax.host.cpu_options import tuned_jit
    from dsbd_jax.models.llama import forward
    if mv.has_prompt_rows(params):
        params = mv.with_prompt_rows(params, jnp.ones((B, prompt_len), jnp.int32))
    positions = jnp.broadcast_to(slots - T + jnp.arange(T, dtype=jnp.int32), (B, T))
    f = tuned_jit(lambda p, c, t: forward(config, p, t, positions,
                                          jnp.ones((B, T, slots + T), bool), c)[0])
    cache = empty_cache(config, B, slots)
    tok = jnp.ones((B, T), jnp.int32)
    return lambda: f(params, cache, tok)


def head_pass_call(head_config, head_params, target_params, B, slots, T=1):
    """A zero-argument call of a draft head's forward (:func:`dsbd_jax.models.head.forward`)
    over ``[B, T]`` new tokens and their features, logits at every new token, over ``slots``
    cached slots of its one-layer cache (``slots = 0``: the prompt pass, no cache, logits at
    the first token only, as ``drafting.prefill_pair`` runs it); compiled as :func:`pass_call`."""
    import jax.numpy as jnp
    from dsbd_jax.models import head as mhead
    from dsbd_jax.models.cache import empty_cache
    from dsbd_jax.host.cpu_options import tuned_jit
    from dsbd_jax.models.llama import ACT
    positions = jnp.broadcast_to(slots + jnp.arange(T, dtype=jnp.int32), (B, T))
    if slots:
        mask, at = jnp.ones((B, T, slots + T), bool), None
    else:
        mask = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (B, T, T))
        at = jnp.zeros((B, 1), jnp.int32)
    f = tuned_jit(lambda hp, tp, c, t, x: mhead.forward(head_config, hp, tp, t, x, positions,
                                                        mask, c, logits_at=at)[0])
    cache = empty_cache(head_config, B, slots) if slots else None
    tok = jnp.ones((B, T), jnp.int32)
    feats = jnp.full((B, T, head_config.hidden_size), 0.1, ACT)
    return lambda: f(head_params, target_params, cache, tok, feats)


def interleaved_medians(calls, repeats):
    """``{key: median ms}`` of zero-argument calls, one warm-up each, then timed round by round
    (every call once per round, so that drift on the host hits them alike)."""
    import jax
    for f in calls.values():
        jax.block_until_ready(f())
    times = {k: [] for k in calls}
    for _ in range(repeats):
        for k, f in calls.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f())
            times[k].append(1000 * (time.perf_counter() - t0))
    return {k: statistics.median(v) for k, v in times.items()}


def pass_ms(config, params, B, slots, repeats, prompt_len=1):
    """Median ms of one decode-step forward (:func:`pass_call`)."""
    return interleaved_medians({0: pass_call(config, params, B, slots, prompt_len)}, repeats)[0]


def build_drafts(draft, counts, rows, both_rows, prompt_rows, distilled=None):
    """``{name: draft params}``: ``base``; ``trunc_<N>`` for N in ``rows`` (the head truncated to
    the table's N most frequent rows, EOS kept) and with ``prompt_rows`` ``trunc_<N>_prompt``;
    with ``distilled`` (a RUN/model directory) ``distilled``, ``both_<both_rows>`` and
    ``both_<both_rows>_prompt``."""
    from dsbd_jax.models import vocab as mv
    from dsbd_jax.loading.load import load_model
    keep = draft.config.eos_token_id or ()
    drafts = {"base": draft.params}

    def truncated(params, prefix, n):
        drafts[f"{prefix}_{n}"] = mv.truncate_head(params, draft.config,
                                                   mv.top_rows(counts, n, keep))
        if prompt_rows:
            drafts[f"{prefix}_{n}_prompt"] = mv.truncate_head(
                params, draft.config, mv.top_rows(counts, n, keep), prompt_rows=True)
    for n in rows:
        truncated(draft.params, "trunc", n)
    if distilled:
        drafts["distilled"] = load_model(distilled, progress=False).params
        truncated(drafts["distilled"], "both", both_rows)
    return drafts


def run_batched(fn, params, cfg, prompts, B, seed):
    """tok/s of ``fn`` over ``prompts`` in batches of ``B`` (compiled first, untimed), tokens per
    target call, the number of timed calls and of loop iterations (summed over the calls) and the
    mean of the scalar statistics."""
    import jax
    import numpy as np
    from dsbd_jax.decoding.common import pad_prompts
    groups = [prompts[i:i + B] for i in range(0, len(prompts), B)]
    groups = [g + [g[-1]] * (B - len(g)) for g in groups]
    P = max(len(p) for p in prompts)
    from dsbd_jax.decoding.common import bucket_length
    P = bucket_length(P)
    tokens = seconds = calls = iterations = 0
    stats = {}
    for i, g in enumerate(groups):
        ids, lens = pad_prompts(g, length=P)
        key = jax.random.PRNGKey(seed + i)
        if i == 0:
            jax.block_until_ready(fn(params, ids, key, cfg, prompt_lengths=lens))
        t0 = time.perf_counter()
        out = jax.block_until_ready(fn(params, ids, key, cfg, prompt_lengths=lens))
        seconds += time.perf_counter() - t0
        best = np.asarray(out.best)
        tokens += int(np.asarray(out.lengths)[np.arange(B), best].sum())
        calls += int(np.asarray(out.stats["target_calls"])) * B  # every row, every call
        iterations += int(np.asarray(out.stats["iterations"]))
        for k, v in out.stats.items():
            v = np.asarray(v)
            if v.size == 1 and np.issubdtype(v.dtype, np.floating):
                stats.setdefault(k, []).append(float(v.reshape(())))
    return {"tokens_per_s": tokens / seconds, "tokens": tokens, "seconds": seconds,
            "tokens_per_target_call": tokens / max(calls, 1), "calls": len(groups),
            "iterations": iterations,
            **{k: float(np.mean(v)) for k, v in stats.items()}}


def pair_args(ap):
    """The options both draft benchmarks share: ``--small``, ``--target``, ``--draft``,
    ``--distilled``."""
    ap.add_argument("--small", action="store_true",
                    help="the tiny random pair (dsbd make-tiny-pair), tiny sizes: checks the script")
    ap.add_argument("--target", default=TARGET)
    ap.add_argument("--draft", default=DRAFT)
    ap.add_argument("--distilled", default=None, help="a distilled draft (RUN/model)")


SETTINGS = {
    "sample": ("sample", {}),
    "beam2": ("beam", {"num_beams": 2}),
    "beam4": ("beam", {"num_beams": 4}),
    "spec4": ("spec", {"gamma": 4}),
    "tree": ("tree", {"gamma": 3}),
    "dsbd_w4": ("dsbd", {"gamma": 2, "draft_width": 4, "threshold": 0.7, "min_width": 2}),
    "dsbd_g3": ("dsbd", {"gamma": 3, "draft_width": 3, "threshold": 0.9, "min_width": 1}),
    "dsbd_sb": ("dsbd", {"gamma": 3, "draft_width": 3, "threshold": 0.9, "min_width": 1,
                         "single_beam": True}),
}


def forward_shapes(method, s, P, N):
    """The forward passes one iteration runs: ``[(model, rows, new tokens, cache slots)]``."""
    if method in ("sample", "beam"):
        W = s.get("num_beams", 1)
        return [("target", W, 1, P + N)]
    if method == "spec":
        g = s["gamma"]
        S = P + N + g + 1
        return [("draft", 1, 2, S)] + [("draft", 1, 1, S)] * (g - 1) + [("target", 1, g + 1, S)]
    if method == "tree":
        return []
    g, C = s["gamma"], s["draft_width"]
    Wc = 1 if s.get("single_beam") else s.get("max_width", C)
    S = Wc * (P + N + g + 1)
    Td = 2 * Wc + (g - 1) * C
    return ([("draft", 1, 2 * Wc, S + Td)] + [("draft", 1, C, S + Td)] * (g - 1)
            + [("target", 1, Wc + g * C, S)])
