"""Per-executable XLA:CPU compiler options, chosen per host by a short measurement.

XLA:CPU's few-row matrix products (``[M, d] x [d, 4d]`` with ``M`` = 1..16: one token, beams,
forests) are fastest with different settings on different hosts: on a loaded 2-core host the
Eigen thread pool costs more than it gives, on a quiet many-core host it is the other way round.
No single choice wins everywhere, so, as autotuners do, the library measures the candidates
once per host and keeps the winner:

* ``CANDIDATES``: named ``compiler_options`` dicts (``"default"`` is XLA's own, ``{}``).
* ``choice()``: the name in use. ``$DSBD_JAX_CPU_OPTIONS`` forces one (a name of
  ``CANDIDATES``, or ``auto``, the default). With ``auto`` on a CPU backend the winner is read
  from ``$DSBD_JAX_CACHE/cpu_options.json`` (default ``~/.cache/dsbd_jax``) keyed by CPU model,
  core count and jax version, else measured (about a second) and written there. Logged once.
  Off the CPU the choice is always ``"default"``.
* ``tuned_jit(fun, **jit_kwargs)``: ``jax.jit`` whose ``compiler_options`` are the choice's,
  fixed when the function is first called or lowered (one jit object, so no extra compiles).

The options only schedule work (which threads run a product), never change what is computed:
``tests/models/test_cpu_options.py`` checks bit-identical forward outputs and decoder outputs
under every candidate.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from pathlib import Path
from typing import Dict, Mapping

import jax
import jax.numpy as jnp
import numpy as np

logger = logging.getLogger("dsbd_jax")

ENV = "DSBD_JAX_CPU_OPTIONS"
CANDIDATES: Mapping[str, Mapping[str, object]] = {
    "default": {},
    "single_thread_eigen": {"xla_cpu_multi_thread_eigen": False},
}
# the measurement: products [M, PROBE_IN] x [PROBE_IN, PROBE_OUT], PROBE_LAYERS weights per call
PROBE_ROWS = (1, 4, 16)
PROBE_IN, PROBE_OUT, PROBE_LAYERS, PROBE_REPEATS = 1536, 8960, 4, 7
MARGIN = 0.05  # a candidate replaces "default" only if >= 5% faster in total, never 5% slower


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


def host_key() -> str:
    return f"{cpu_model()} | {os.cpu_count()} cpus | jax {jax.__version__}"


def cache_file() -> Path:
    root = os.environ.get("DSBD_JAX_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "dsbd_jax"
    return base / "cpu_options.json"


def measure(rows=PROBE_ROWS, din=PROBE_IN, dout=PROBE_OUT, layers=PROBE_LAYERS,
            repeats=PROBE_REPEATS) -> Dict[str, Dict[int, float]]:
    """``{candidate: {M: min seconds}}`` of ``layers`` products ``[M, din] x [din, dout]``,
    candidates interleaved round by round (load hits them alike), minimum over ``repeats``."""
    rng = np.random.default_rng(0)
    ws = [jnp.asarray(rng.standard_normal((din, dout), np.float32)) for _ in range(layers)]
    body = lambda x, ws: [x @ w for w in ws]  # noqa: E731
    fns = {name: jax.jit(body, compiler_options=dict(opts)) for name, opts in CANDIDATES.items()}
    best: Dict[str, Dict[int, float]] = {name: {} for name in fns}
    for M in rows:
        x = jnp.asarray(rng.standard_normal((M, din), np.float32))
        for f in fns.values():
            jax.block_until_ready(f(x, ws))
        for _ in range(repeats):
            for name, f in fns.items():
                t0 = time.perf_counter()
                jax.block_until_ready(f(x, ws))
                t = time.perf_counter() - t0
                best[name][M] = min(best[name].get(M, np.inf), t)
    return best


def pick(times: Mapping[str, Mapping[int, float]]) -> str:
    """The winner of ``measure``'s figures: the fastest total among the candidates that are
    ``MARGIN`` faster than ``"default"`` in total and never ``MARGIN`` slower at any ``M``."""
    base = times["default"]
    total = {name: sum(t.values()) for name, t in times.items()}
    ok = [name for name, t in times.items() if name != "default"
          and total[name] < (1 - MARGIN) * total["default"]
          and all(t[m] <= (1 + MARGIN) * base[m] for m in base)]
    return min(ok, key=total.get) if ok else "default"


def _read_cache() -> dict:
    try:
        return json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return {}


@functools.lru_cache(maxsize=None)
def choice() -> str:
    """The candidate in use in this process (see the module docstring); decided once."""
    forced = os.environ.get(ENV, "auto").strip() or "auto"
    if forced != "auto" and forced not in CANDIDATES:
        raise ValueError(f"${ENV} must be 'auto' or one of {sorted(CANDIDATES)}, got {forced!r}")
    if jax.default_backend() != "cpu":
        name, how = "default", f"{jax.default_backend()} backend"
    elif forced != "auto":
        name, how = forced, f"${ENV}"
    else:
        key, cached = host_key(), _read_cache()
        if cached.get(key, {}).get("choice") in CANDIDATES:
            name, how = cached[key]["choice"], f"cached in {cache_file()}"
        else:
            times = measure()
            name, how = pick(times), f"measured, written to {cache_file()}"
            cached[key] = {"choice": name, "min_ms": {n: {str(m): 1e3 * s for m, s in t.items()}
                                                     for n, t in times.items()}}
            try:
                cache_file().parent.mkdir(parents=True, exist_ok=True)
                cache_file().write_text(json.dumps(cached, indent=2))
            except OSError as e:  # a read-only home: keep the choice for this process only
                how = f"measured, not cached ({e})"
    logger.info("XLA:CPU compiler options: %s %s (%s)", name, dict(CANDIDATES[name]), how)
    return name


def compiler_options() -> Dict[str, object]:
    """The ``compiler_options`` of the choice in use (``{}`` off the CPU)."""
    return dict(CANDIDATES[choice()])


class tuned_jit:
    """``jax.jit(fun, compiler_options=compiler_options(), **jit_kwargs)``, built on first use
    (call, ``lower``, ``trace``, ...) so that importing the library measures nothing. Use as
    ``@functools.partial(tuned_jit, static_argnames=...)`` where ``jax.jit`` would go."""

    def __init__(self, fun, **jit_kwargs):
        self._fun, self._jit_kwargs = fun, jit_kwargs
        functools.update_wrapper(self, fun)

    @functools.cached_property
    def jitted(self):
        return jax.jit(self._fun, compiler_options=compiler_options(), **self._jit_kwargs)

    def __call__(self, *args, **kwargs):
        return self.jitted(*args, **kwargs)

    def __getattr__(self, name):
        if name.startswith("__") or name in ("_fun", "_jit_kwargs", "jitted"):
            raise AttributeError(name)
        return getattr(self.jitted, name)
