"""How many forest nodes the target's pass verifies for free on this host: DSBD's node budget.

Where a model's products are flat in rows, a pass over a forest costs about what one token does
and wider draft layers buy accepted tokens for nothing; elsewhere every node costs time.
:func:`node_budget` measures the curve once per host, dtype, kernel form and model shape (the
probe passes of :func:`dsbd_jax.host.pass_probe.time_passes` over one token and each size of
:data:`NODES`): the budget is the largest size, in order, whose pass costs at most :data:`FREE`
times the one-token pass, or ``None``. Cached in ``$DSBD_JAX_CACHE/host_plan.json`` under the
host; ``dsbd host`` prints it. The budget is a setting (:attr:`dsbd_jax.DSBDConfig.node_budget`);
the measurement is only its default on the command line. More: ``docs/results/design_notes.md``.
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Dict, Mapping, Optional, Tuple

import jax
import jax.numpy as jnp

from dsbd_jax.host import plan as host
from dsbd_jax.host import forms
from dsbd_jax.host import pass_probe
from dsbd_jax.host.cpu_options import cached_choice

logger = logging.getLogger("dsbd_jax")

NODES = (12, 16, 24, 32, 48, 64)   # forest sizes measured, smallest first
FREE = 1.3        # a forest is free while its pass costs at most this times a one-token pass
REPEATS = 5


def pick_budget(times: Mapping[int, float], nodes=None, free: float = FREE) -> Optional[int]:
    """The largest of ``nodes`` (default :data:`NODES`), in order, whose pass (``times[n]``
    seconds) stays within ``free`` times the one-token pass ``times[1]``; the first that does
    not stops the growth. ``None`` when the smallest is not free."""
    best = None
    for n in NODES if nodes is None else nodes:
        if times[n] > free * times[1]:
            break
        best = n
    return best


def _device() -> str:
    d = jax.devices()[0]
    return f"{d.platform} {getattr(d, 'device_kind', '')}".strip()


def _dtype(config) -> str:
    return jnp.dtype(config.dtype).name


def budget_key(config, weights: str = "float") -> str:
    """The entry of a shape's node budget in the host's plan cache (module doc)."""
    plan = host.plan(config, _dtype(config))
    kind = " int8" if weights == "int8" else ""
    return (f"forest nodes | {_device()} | {plan.dtype} {plan.form}{kind} options "
            f"{plan.options} | " + "x".join(str(int(v)) for v in host._shape(config)))


def measure(config, nodes=None, repeats: int = REPEATS, weights: str = "float"
            ) -> Dict[int, float]:
    """``{tokens: min seconds}`` of the cut model's passes over 1 token and each of ``nodes``
    (``config``'s dtype, the kernel form a load gives it; ``weights="int8"``: int8 kernels)."""
    dt = _dtype(config)
    form = host.plan(config, dt).form
    nodes = NODES if nodes is None else nodes
    return pass_probe.time_passes(config, (dt,), {dt: form}, rows=(1,) + tuple(nodes),
                                  repeats=repeats, weights=weights)[dt]


def _figures(ms: Mapping[str, float], config, weights: str = "float") -> str:
    """``ms``: ``{tokens (str): ms}`` as the cache stores them."""
    n = pass_probe.cut_config(config).num_layers
    one = float(ms["1"])
    rel = " / ".join(f"{float(v) / one:.2f}" for k, v in ms.items() if k != "1")
    sizes = " / ".join(k for k in ms if k != "1")
    return (f"passes of {n} of {config.num_layers} blocks over {sizes} nodes cost {rel}x a "
            f"token ({one:.2f} ms) in {_dtype(config)}"
            f"{' with int8 weights' if weights == 'int8' else ''}; free up to {FREE}x")


def _answer(nodes: Optional[int]) -> str:
    return (f"node budget {nodes}" if nodes is not None
            else "no forest of 12 or more nodes is free here: the settings' forest")


@functools.lru_cache(maxsize=None)
def _budget(config, weights: str) -> Tuple[Optional[int], str]:
    t0 = time.perf_counter()
    got = cached_choice(budget_key(config, weights), lambda n: True,
                        lambda: {"passes": measure(config, weights=weights)},
                        lambda t: pick_budget(t["passes"]),
                        valid_ms=lambda ms: set(ms.get("passes", {})) == {"1", *map(str, NODES)})
    nodes, ms = got.choice, got.min_ms["passes"]
    if not got.measured:
        return nodes, f"{_answer(nodes)}: {_figures(ms, config, weights)} ({got.where})"
    why = (f"{_answer(nodes)}: {_figures(ms, config, weights)} (measured in "
           f"{time.perf_counter() - t0:.0f} s, {got.where})")
    logger.info("DSBD forest on this host for %dx%d %s models: %s", config.hidden_size,
                config.intermediate_size, _dtype(config), why)
    return nodes, why


def node_budget(config, weights: str = "float") -> Tuple[Optional[int], str]:
    """``(nodes or None, how it was decided)``: the forest size the target ``config`` (in its
    dtype; ``weights``: ``"float"`` or ``"int8"``, the target's kernels) verifies for free on
    this host (module doc). Models whose MLP has under
    :data:`dsbd_jax.host.forms.MIN_ELEMENTS` weights (the tests' tiny models) are not
    measured: ``None``."""
    if weights not in ("float", "int8"):
        raise ValueError(f"weights must be 'float' or 'int8', got {weights!r}")
    if config.hidden_size * config.intermediate_size < forms.MIN_ELEMENTS:
        return None, "a small model: not measured, the settings' forest"
    return _budget(config, weights)
