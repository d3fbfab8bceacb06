"""Confidence intervals for the benchmark's quality figures.

* :func:`wilson_interval` -- a 0/1 task metric (pass@1, exact match): the Wilson score interval,
  which keeps its coverage near 95% for small ``n`` and rates near 0 or 1.
* :func:`bootstrap_interval` -- the mean of a continuous figure (log-likelihood per token):
  percentile bootstrap over prompts.
* :func:`paired_difference` -- two methods on the same prompts: the mean of the per-prompt
  differences with a bootstrap interval that resamples prompts, so the variation between
  problems, which both methods share, cancels: the interval that says whether one method wins.

Every bootstrap uses its own fixed-seed generator, so a summary is reproducible to the digit.
"""

from __future__ import annotations

import math
from typing import Dict, Optional, Sequence

import numpy as np

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile
RESAMPLES = 10_000  # bootstrap resamples: the interval's ends move by < 0.005 between seeds at n = 40


def wilson_interval(successes: float, n: int, z: float = Z95) -> Dict[str, Optional[float]]:
    """``{"n", "mean", "lo", "hi"}``: the Wilson score interval of a binomial rate."""
    if n <= 0:
        return {"n": 0, "mean": None, "lo": None, "hi": None}
    p = successes / n
    z2 = z * z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n)
    # the rate lies inside its interval (rounding at p = 0 or 1 could put it a hair outside)
    return {"n": n, "mean": p, "lo": min(max(0.0, centre - half), p),
            "hi": max(min(1.0, centre + half), p)}


def bootstrap_interval(values: Sequence[float], seed: int = 0, resamples: int = RESAMPLES,
                       level: float = 0.95) -> Dict[str, Optional[float]]:
    """``{"n", "mean", "lo", "hi"}``: the mean and its percentile-bootstrap interval."""
    x = np.asarray([v for v in values if v is not None], np.float64)
    if x.size == 0:
        return {"n": 0, "mean": None, "lo": None, "hi": None}
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    a = (1 - level) / 2
    return {"n": int(x.size), "mean": float(x.mean()),
            "lo": float(np.quantile(means, a)), "hi": float(np.quantile(means, 1 - a))}


def paired_difference(a: Dict, b: Dict, seed: int = 0, resamples: int = RESAMPLES,
                      level: float = 0.95) -> Dict[str, Optional[float]]:
    """Mean of ``a[k] - b[k]`` over the keys both hold (prompts both methods ran), with its
    percentile-bootstrap interval; ``p_a_better``: the share of resamples where the mean
    difference is > 0 (a one-sided bootstrap view, not a p-value)."""
    keys = sorted(k for k in a if k in b and a[k] is not None and b[k] is not None)
    if not keys:
        return {"n": 0, "mean": None, "lo": None, "hi": None, "p_a_better": None}
    d = np.asarray([a[k] - b[k] for k in keys], np.float64)
    out = bootstrap_interval(d, seed, resamples, level)
    rng = np.random.default_rng(seed)
    means = d[rng.integers(0, d.size, size=(resamples, d.size))].mean(axis=1)
    out["p_a_better"] = float(np.mean(means > 0))
    return out
