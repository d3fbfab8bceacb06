"""Exact output distributions of the decoders on toy models, by enumeration (numpy, float64).

What the statistical tests compare against. Semantics follow docs/algorithm.md:

* ``exact_sample_dist``: multinomial sampling; each token is drawn from the warped next-token
  distribution of its own row (warping per row).
* ``exact_beam_sample_dist``: beam sampling. Step 1 starts from the prompt as the single input
  beam. At each step the joint over (current beams x V) has log-weights ``s_i + log p(v | x^i)``
  (``s_i`` = the UNWARPED cumulative target log-likelihood of beam i); the flattened joint is
  warped with :func:`dsbd_jax.decoding.warping.warp_logits` (top-k = 10 keeps 10 (beam, token) pairs in
  total) and the step's ``W`` beams are W i.i.d. draws (``replacement=True``) or W successive draws
  without replacement (``replacement=False``). Beams that emitted EOS are absorbing: they extend
  with ``pad_id`` at log-probability 0 while other beams are running; once every (live) beam
  has finished, the row stops (its beam set is final; only pad is appended).
  Without replacement, if the warped joint has fewer than W entries of positive probability, all
  of them are taken and the other beams are *dead* (log-likelihood ``-inf``; a decoder returns
  them with ``log_likelihoods == -inf``). Dead beams never come back (their joint weight is 0),
  exactly like the W - 1 empty copies of the prompt at step 1.

Outcomes are keyed as in a decoder's output: a sampled sequence is the tuple of its new tokens
(pad after EOS); a beam set is the *sorted* tuple of its live beams' new-token tuples (a multiset:
duplicates kept; decoders may order beams differently). :func:`beam_key` builds that key from
one row of a decoder's ``GenerateOutput``.

The warping is the library's own ``warp_logits`` applied to float32 log-weights (so boundary
decisions of top-k/top-p are the decoders'); everything else is float64. ``tests/decoding/test_warping.py``
checks ``warp_logits`` itself against Hugging Face.

Sizes: enumeration is exponential; keep V <= 8, W <= 3, n <= 3 (and prefer top-k or small V for
W = 3, n = 3 with replacement).
"""

from __future__ import annotations

import collections
import functools
import itertools
import math
from typing import Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple

import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats

from dsbd_jax.models import llama as dmodel
from dsbd_jax.models.config import ModelConfig
from dsbd_jax.decoding.warping import warp_logits

Seq = Tuple[int, ...]


# ---------------------------------------------------------------------------------------------
# toy models
def toy_model(vocab: int = 6, seed: int = 0, scale: float = 2.0, layers: int = 1, hidden: int = 16,
              heads: int = 2, kv_heads: int = 1, head_dim: int = 8, intermediate: int = 32,
              dtype: str = "float32", **config_kwargs) -> Tuple[ModelConfig, dict]:
    """A tiny Llama whose next-token distributions are far from uniform and depend on context.

    ``init_params`` draws every weight from normal(0.02), which after the RMS norms gives
    near-uniform next-token distributions that depend mostly on the last token. Here all weights
    are redrawn (from ``seed``) at O(1) scale instead: embeddings ~ N(0, 1), every dense kernel
    ~ N(0, 1 / fan_in) (attention and MLP outputs as large as the embeddings, so earlier tokens
    matter), norms 1, and ``lm_head`` ~ N(0, scale^2 / hidden) so that the logits have standard
    deviation about ``scale`` (scale 2, V = 6: top-token probabilities mostly 0.3-0.9, and the
    same last token after different contexts gives distributions 0.1-0.45 apart in total
    variation).
    ``config_kwargs`` go to ``ModelConfig`` (e.g. ``eos_token_id``).
    """
    config = ModelConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate,
                         num_layers=layers, num_heads=heads, num_kv_heads=kv_heads,
                         head_dim=head_dim, dtype=dtype, **config_kwargs)
    shapes = jax.eval_shape(lambda: dmodel.init_params(config, jax.random.PRNGKey(0)))
    leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
    rng = np.random.default_rng(seed)
    new = []
    for path, leaf in leaves:
        names = [getattr(p, "key", str(p)) for p in path]
        if names[-1] == "weight":  # RMSNorm
            value = np.ones(leaf.shape)
        elif names[-1] == "embedding":
            value = rng.standard_normal(leaf.shape)
        elif names[-1] == "bias":
            value = 0.1 * rng.standard_normal(leaf.shape)
        else:  # kernel [..., in, out]
            std = 1.0 / math.sqrt(leaf.shape[-2])
            if "lm_head" in names:
                std *= scale
            value = std * rng.standard_normal(leaf.shape)
        new.append(jnp.asarray(value, leaf.dtype))
    return config, jax.tree_util.tree_unflatten(treedef, new)


# ---------------------------------------------------------------------------------------------
# next-token log-probabilities
class LogProbFn:
    """``lp_fn(prefix) -> np.float64 [V]``: log p(next token | prefix), cached by prefix.

    ``prefix`` is the whole token tuple (prompt + generated). ``prefetch(prefixes)`` evaluates
    many uncached prefixes in batched forward passes, which is much faster than one call each.
    """

    def __init__(self, config: ModelConfig, params, chunk: int = 256):
        self.chunk = chunk
        self.config = config
        self.params = params
        self.cache: Dict[Seq, np.ndarray] = {}
        self.calls = 0

    def prefetch(self, prefixes: Iterable[Sequence[int]]) -> None:
        todo = sorted(set(tuple(int(t) for t in p) for p in prefixes) - set(self.cache))
        if not todo:
            return
        # The model is causal, so right padding does not change the logits at position len - 1:
        # every prefix goes through one fixed [chunk, length] shape (one compilation).
        length = max(16, 1 << (max(len(p) for p in todo) - 1).bit_length())
        for i in range(0, len(todo), self.chunk):
            part = todo[i:i + self.chunk]
            ids = np.zeros((self.chunk, length), np.int32)
            for r, p in enumerate(part):
                ids[r, :len(p)] = p
            out = np.asarray(dmodel.logits(self.config, self.params, ids), np.float64)
            self.calls += 1
            last = out[np.arange(len(part)), [len(p) - 1 for p in part]]
            last = last - np.logaddexp.reduce(last, axis=-1, keepdims=True)
            for p, row in zip(part, last):
                self.cache[p] = row

    def __call__(self, prefix: Sequence[int]) -> np.ndarray:
        prefix = tuple(int(t) for t in prefix)
        if prefix not in self.cache:
            self.prefetch([prefix])
        return self.cache[prefix]



def kernel_model(layout: str = "per_layer") -> Tuple[ModelConfig, dict]:
    """The two-layer toy model (vocabulary 12, seed 3) that the projection-kernel tests share
    (blocked, transposed, the choice of form), converted to ``layout``."""
    config, params = toy_model(vocab=12, seed=3, layers=2, hidden=16, intermediate=32)
    return config, dmodel.convert_layout(params, layout)

def assert_same_forward(config: ModelConfig, params, trees, shapes, slots: int = 8) -> None:
    """Every tree of ``trees`` (the same model as ``params`` with its projection kernels in
    another form) gives ``params``' logits and keys, to float rounding, for each pass shape
    ``(batch, tokens)`` of ``shapes`` over an empty cache of ``slots`` slots."""
    from dsbd_jax.models.cache import empty_cache
    cache = empty_cache(config, max(b for b, _ in shapes), slots)
    for B, T in shapes:
        c = jax.tree.map(lambda a: a[:, :B], cache)
        tok = jnp.asarray(np.random.default_rng(T).integers(0, config.vocab_size, (B, T)),
                          jnp.int32)
        pos = jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T))
        mask = jnp.concatenate([jnp.zeros((B, T, slots), bool),
                                jnp.tril(jnp.ones((T, T), bool))[None].repeat(B, 0)], -1)
        want, kv = dmodel.forward(config, params, tok, pos, mask, c)
        for tree in trees:
            got, kv2 = dmodel.forward(config, tree, tok, pos, mask, c)
            np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-5, atol=1e-5)
            np.testing.assert_allclose(np.asarray(kv2.k), np.asarray(kv.k), rtol=1e-5, atol=1e-5)


def make_lp_fn(config: ModelConfig, params) -> LogProbFn:
    """Cached ``prefix (tuple of ids) -> np.float64 log-probs [V]`` of the next token."""
    return LogProbFn(config, params)


# ---------------------------------------------------------------------------------------------
# warping of many rows at once (one compiled call per shape)
@functools.lru_cache(maxsize=None)
def _warp_jit(temperature, top_k, top_p):
    return jax.jit(lambda x: warp_logits(x, temperature, top_k, top_p))


def warp_rows(logweights: np.ndarray, temperature: float, top_k: Optional[int], top_p: float
              ) -> np.ndarray:
    """Warped probabilities (float64, rows sum to 1) of float64 log-weights ``[R, N]``.

    Uses ``dsbd_jax.decoding.warping.warp_logits`` on float32, then renormalises in float64.
    """
    x = np.asarray(logweights, np.float64)
    R, chunk = x.shape[0], 512  # fixed row chunks: one compilation per (settings, width)
    f = _warp_jit(float(temperature), top_k, float(top_p))
    parts = []
    for i in range(0, R, chunk):
        buf = np.zeros((chunk, x.shape[1]), np.float32)
        buf[:min(chunk, R - i)] = x[i:i + chunk]
        parts.append(np.asarray(f(jnp.asarray(buf)), np.float64))
    lw = np.concatenate(parts)[:R]
    with np.errstate(invalid="ignore"):
        p = np.where(np.isfinite(lw), np.exp(lw), 0.0)
    return p / p.sum(axis=-1, keepdims=True)


def _absorbed(V: int, pad_id: int) -> np.ndarray:
    row = np.full(V, -np.inf)
    row[pad_id] = 0.0
    return row


# ---------------------------------------------------------------------------------------------
def exact_sample_dist(lp_fn, prompt: Sequence[int], n: int, temperature: float = 1.0,
                      top_k: Optional[int] = None, top_p: float = 1.0,
                      eos_ids: Sequence[int] = (), pad_id: int = 0) -> Dict[Seq, float]:
    """``{new tokens (n-tuple): probability}`` of multinomial sampling with per-row warping.

    After an EOS token the row emits ``pad_id`` with probability 1.
    """
    prompt = tuple(int(t) for t in prompt)
    eos = set(int(e) for e in eos_ids)
    V = len(lp_fn(prompt))
    layer: Dict[Seq, float] = {(): 1.0}
    for _ in range(n):
        live = [s for s in layer if not (set(s) & eos)]
        if hasattr(lp_fn, "prefetch"):
            lp_fn.prefetch([prompt + s for s in live])
        seqs = list(layer)
        lps = np.stack([_absorbed(V, pad_id) if (set(s) & eos) else lp_fn(prompt + s)
                        for s in seqs])
        probs = warp_rows(lps, temperature, top_k, top_p)
        nxt: Dict[Seq, float] = collections.defaultdict(float)
        for s, row in zip(seqs, probs):
            for v in np.flatnonzero(row > 0):
                nxt[s + (int(v),)] += layer[s] * row[v]
        layer = dict(nxt)
    return layer


def _multiset_probs_with_replacement(children: Dict[Seq, float], W: int):
    """Distribution of the sorted multiset of W i.i.d. draws from ``children`` (probabilities)."""
    items = sorted(children.items())
    out = {}
    for combo in itertools.combinations_with_replacement(range(len(items)), W):
        counts = collections.Counter(combo)
        prob = math.factorial(W)
        for i, c in counts.items():
            prob *= items[i][1] ** c / math.factorial(c)
        if prob > 0:
            out[tuple(items[i][0] for i in combo)] = prob
    return out


def _set_probs_without_replacement(entries: List[Tuple[Seq, float]], W: int):
    """Distribution of the sorted set of W successive draws without replacement.

    ``entries``: (outcome, probability) with distinct outcomes and positive probabilities. If
    there are at most W of them, all are taken (probability 1).
    """
    if len(entries) <= W:
        return {tuple(sorted(o for o, _ in entries)): 1.0}
    out: Dict[Seq, float] = collections.defaultdict(float)

    def rec(start_taken, taken_mass, prob):
        if len(start_taken) == W:
            out[tuple(sorted(entries[i][0] for i in start_taken))] += prob
            return
        rest = 1.0 - taken_mass
        for i, (_, p) in enumerate(entries):
            if i in start_taken:
                continue
            rec(start_taken + (i,), taken_mass + p, prob * p / rest)

    rec((), 0.0, 1.0)
    return dict(out)


def exact_beam_sample_dist(lp_fn, prompt: Sequence[int], widths: Sequence[int],
                           temperature: float = 1.0, top_k: Optional[int] = None,
                           top_p: float = 1.0, replacement: bool = True,
                           eos_ids: Sequence[int] = (), pad_id: int = 0
                           ) -> Dict[Tuple[Seq, ...], float]:
    """``{sorted tuple of the live beams' new-token tuples: probability}`` after ``len(widths)``
    steps of beam sampling; step t draws ``widths[t]`` beams (fixed width W: ``[W] * n``).

    See the module docstring for the semantics. The state after each step is the multiset of
    beams (the next joint depends only on it); states are merged, so the enumeration is exact
    dynamic programming over multisets.
    """
    prompt = tuple(int(t) for t in prompt)
    eos = set(int(e) for e in eos_ids)
    V = len(lp_fn(prompt))
    layer: Dict[Tuple[Seq, ...], float] = {((),): 1.0}  # the prompt as the single input beam
    score: Dict[Seq, float] = {(): 0.0}  # unwarped log p(new tokens | prompt)

    def token_lp(s: Seq) -> np.ndarray:
        return _absorbed(V, pad_id) if (set(s) & eos) else lp_fn(prompt + s)

    for W in widths:
        states = list(layer)
        if hasattr(lp_fn, "prefetch"):
            lp_fn.prefetch([prompt + s for st in states for s in set(st) if not (set(s) & eos)])
        width_in = max(len(st) for st in states)
        joint = np.full((len(states), width_in * V), -np.inf)
        for r, st in enumerate(states):
            for i, s in enumerate(st):
                joint[r, i * V:(i + 1) * V] = score[s] + token_lp(s)
        probs = warp_rows(joint, temperature, top_k, top_p)
        nxt: Dict[Tuple[Seq, ...], float] = collections.defaultdict(float)
        for r, st in enumerate(states):
            if all(set(s) & eos for s in st):  # every beam finished: the row has stopped
                for s in st:
                    score[s + (pad_id,)] = score[s]
                nxt[tuple(sorted(s + (pad_id,) for s in st))] += layer[st]
                continue
            row = probs[r]
            flat = np.flatnonzero(row > 0)
            if replacement:
                children: Dict[Seq, float] = collections.defaultdict(float)
                for f in flat:
                    i, v = divmod(int(f), V)
                    children[st[i] + (v,)] += row[f]
                dist = _multiset_probs_with_replacement(children, W)
            else:  # beams are distinct here, so every flat entry is a distinct child
                entries = []
                for f in flat:
                    i, v = divmod(int(f), V)
                    entries.append((st[i] + (v,), row[f]))
                dist = _set_probs_without_replacement(entries, W)
            for f in flat:
                i, v = divmod(int(f), V)
                child = st[i] + (v,)
                if child not in score:
                    score[child] = score[st[i]] + token_lp(st[i])[v]
            for key, p in dist.items():
                nxt[key] += layer[st] * p
        layer = dict(nxt)
    return layer


def beam_key(sequences_row, log_likelihoods_row=None) -> Tuple[Seq, ...]:
    """Key of one decoder output row for :func:`exact_beam_sample_dist`: the sorted tuple of the
    live beams' token tuples (beams with log-likelihood ``-inf`` are dead and left out).

    ``sequences_row``: ``[W, N]``; ``log_likelihoods_row``: ``[W]`` or None.
    """
    seqs = np.asarray(sequences_row)
    live = (np.ones(len(seqs), bool) if log_likelihoods_row is None
            else np.isfinite(np.asarray(log_likelihoods_row)))
    return tuple(sorted(tuple(int(t) for t in s) for s, ok in zip(seqs, live) if ok))


# ---------------------------------------------------------------------------------------------
class ChiSquare(NamedTuple):
    pvalue: float
    statistic: float
    dof: int
    bins: int
    outside: int  # samples outside the exact support (any makes the p-value 0)


def chi_square_test(samples, exact: Dict, min_expected: float = 5.0) -> ChiSquare:
    """Pearson chi-square goodness of fit of ``samples`` (an iterable of outcomes, or a
    ``Counter``) to the exact distribution ``exact`` ({outcome: probability}).

    Categories with expected count < ``min_expected`` are pooled into one bin (enlarged with the
    next-smallest categories until it reaches ``min_expected``). A sample outside the support of
    ``exact`` gives p-value 0.
    """
    counts = samples if isinstance(samples, collections.Counter) else collections.Counter(samples)
    total = sum(counts.values())
    support = {k: p for k, p in exact.items() if p > 0}
    mass = sum(support.values())
    outside = sum(c for k, c in counts.items() if k not in support)
    if outside:
        return ChiSquare(0.0, math.inf, 0, 0, outside)
    items = sorted(((p / mass * total, counts.get(k, 0)) for k, p in support.items()))
    bins: List[Tuple[float, float]] = []
    pool_e, pool_o, i = 0.0, 0.0, 0
    while i < len(items) and (items[i][0] < min_expected or 0 < pool_e < min_expected):
        pool_e += items[i][0]
        pool_o += items[i][1]
        i += 1
    if pool_e > 0:
        bins.append((pool_e, pool_o))
    bins.extend(items[i:])
    if len(bins) < 2:
        return ChiSquare(1.0, 0.0, 0, len(bins), 0)
    e = np.array([b[0] for b in bins])
    o = np.array([b[1] for b in bins])
    stat = float(np.sum((o - e) ** 2 / e))
    dof = len(bins) - 1
    return ChiSquare(float(scipy.stats.chi2.sf(stat, dof)), stat, dof, len(bins), 0)


def chi_square_pvalue(samples, exact: Dict, min_expected: float = 5.0) -> float:
    """p-value of :func:`chi_square_test` (0 if any sample is outside the exact support)."""
    return chi_square_test(samples, exact, min_expected).pvalue


# ---------------------------------------------------------------------------------------------
# peer model (PyTorch / transformers)
def hf_tiny_llama(directory, seed: int = 0, vocab: int = 48, hidden: int = 32, layers: int = 2,
                  heads: int = 4, kv_heads: int = 2, init_std: float = 0.25):
    """A tiny random ``transformers`` Llama (GQA), saved with ``save_pretrained(directory)``.

    ``init_std`` (HF's ``initializer_range``) is large, so next-token distributions are peaked
    and greedy/beam decisions have clear margins (float32 rounding cannot flip them). EOS and BOS
    are disabled in the saved generation config. Returns the torch model (eval mode).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    # Tiny models: torch's default thread pool only adds overhead (on 2 shared cores one HF
    # beam search took 3 s instead of 0.05 s).
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv_heads, head_dim=hidden // heads,
                      max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000.0,
                      initializer_range=init_std, tie_word_embeddings=False,
                      bos_token_id=None, eos_token_id=None, pad_token_id=0)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # norms away from 1 too, so they are tested
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    model.generation_config.pad_token_id = 0
    model.save_pretrained(directory)
    return model


