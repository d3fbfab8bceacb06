"""Continuations sampled from a model, a fixed number of prompts at a time: what distillation
(:func:`dsbd_jax.training.distill.make_rollouts`) and head training
(:func:`dsbd_jax.training.head_data.target_rollouts`) both train on."""

from __future__ import annotations

from typing import Iterator, List, Sequence, Tuple

import jax
import numpy as np

from dsbd_jax.decoding.common import pad_prompts
from dsbd_jax.decoding.configs import SampleConfig
from dsbd_jax.decoding.sampling import sample


def sampled_batches(params, prompts: Sequence[Sequence[int]], dc: SampleConfig, key,
                    batch: int, length: int
                    ) -> Iterator[Tuple[int, int, List[List[int]], np.ndarray, np.ndarray,
                                        np.ndarray]]:
    """Sample one continuation of each prompt, ``batch`` prompts per call (the last batch
    filled up with copies of its last prompt, so every call runs one compiled program), the
    prompts padded to ``length``; batch ``b`` starting at prompt ``i`` uses
    ``fold_in(key, i)``. Yields ``(i, n, chunk, lens, seqs, clen)``: the first ``n`` rows of
    ``chunk`` are real; ``lens [batch]`` prompt lengths, ``seqs [batch, T]`` the continuations,
    ``clen [batch]`` their lengths."""
    for i in range(0, len(prompts), batch):
        chunk = [list(p) for p in prompts[i:i + batch]]
        n = len(chunk)
        chunk += [chunk[-1]] * (batch - n)
        ids, lens = pad_prompts(chunk, pad_id=0, length=length)
        res = sample(params, ids, jax.random.fold_in(key, i), dc, prompt_lengths=lens)
        yield i, n, chunk, lens, np.asarray(res.sequences[:, 0]), np.asarray(res.lengths[:, 0])
