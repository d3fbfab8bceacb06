"""How this host runs a model: one answer for the dtype, the kernel form and the compiler options.

:func:`plan` answers three per-host choices for a config (:class:`HostPlan`), each measured once
per host and shape and cached under the host's key in ``$DSBD_JAX_CACHE/host_plan.json``: the
dtype (:func:`choose_dtype`), the kernel form (:func:`dsbd_jax.host.forms.choose_form`) and the
compiler options (:func:`dsbd_jax.host.cpu_options.choice`). ``dtype="auto"`` starts from the
CPU's flags (:func:`prior_dtype`) and is chosen per role and decoder (:func:`passes_of`): the
other dtype wins only when it is ``DECISIVE`` faster on the passes of every decoder that will
run, on every repeat (:func:`pick_for`); repeats that disagree are measured again, and a choice
made noisy or on a busy host is not cached as final (:func:`measure_repeatably`). Off the CPU it
is bfloat16, tiny models stay float32, ``$DSBD_JAX_DTYPE`` forces one. ``dsbd host`` prints it.
More: ``docs/results/design_notes.md``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import time
from typing import Callable, Dict, Mapping, Optional

import jax
import jax.numpy as jnp

from dsbd_jax.host import cpu_options, forms
from dsbd_jax.host import pass_probe
from dsbd_jax.host.cpu_options import choice, options_name
from dsbd_jax.models.products import TRANSPOSED

logger = logging.getLogger("dsbd_jax")

ENV = "DSBD_JAX_DTYPE"
AUTO = "auto"
DTYPES = ("float32", "bfloat16")
PROBE_ROWS = pass_probe.PROBE_ROWS        # new tokens per timed pass: a decode step, a forest
PROBE_LAYERS = pass_probe.PROBE_LAYERS    # blocks of the cut model (its head cut alike)
PROBE_REPEATS = 5
DECISIVE = 0.20  # the dtype the flags do not suggest must be 20% faster over the passes


@dataclasses.dataclass(frozen=True)
class HostPlan:
    """How this host runs a model of one shape (:func:`plan`).

    ``dtype``: ``"float32"`` or ``"bfloat16"``; ``form``: ``"plain"`` or ``"transposed"``
    projection kernels; ``options``: the name (in :data:`dsbd_jax.host.cpu_options.CANDIDATES`)
    of the compiler options the model's programs compile under
    (:func:`dsbd_jax.host.cpu_options.options_name`); ``head_transposed``: the vocabulary head
    stored as ``[V, d]`` rows; ``why``: how the dtype was decided."""
    dtype: str
    form: str
    options: str
    head_transposed: bool
    why: str


def prior_dtype(flags=None) -> tuple:
    """``(dtype, why)`` the CPU's flags suggest (``cpu_options.cpu_flags``): bfloat16 with
    AMX-BF16 (16-bit tile products: a forest costs about a token) or AVX512-BF16 (bfloat16 dot
    products: the host's probe and its decoders run faster in bfloat16 end to end, see the
    precision results page), else float32 (without either the 16-bit products are emulated)."""
    flags = cpu_options.cpu_flags() if flags is None else flags
    if "amx_bf16" in flags:
        return "bfloat16", "the CPU has AMX-BF16"
    if "avx512_bf16" in flags:
        return "bfloat16", "the CPU has AVX512-BF16"
    return "float32", "the CPU has neither AMX-BF16 nor AVX512-BF16"


# the passes each decoder runs, as rows of new tokens per pass (the probe's rows): sampling
# and beam sampling run one-token passes over 1-4 rows (prompts, beams), speculative sampling
# a chain of a few tokens, DSBD and tree sampling a forest besides their one-token passes; a
# draft runs one row at a time
PASSES = {"sample": (1, 4), "beam": (1, 4), "beam_search": (1, 4), "spec": (1, 4),
          "dsbd": (1, 12), "tree": (1, 12)}
DRAFT_PASSES = (1,)
ROLES = ("target", "draft")
NOISE = 0.10     # repeats of a pass that disagree by more than this are measured again
TRIES = 3        # measurements at most, while they disagree
BUSY = 0.75      # others' load per core above which a choice is not cached as final


def passes_of(methods=None, role: str = "target") -> tuple:
    """The passes (``PASSES``'s tuples of rows) whose speed decides a model's dtype in ``role``
    for the decoders ``methods`` (a name or names of ``PASSES``; ``None``: any decoder, as a
    plain ``load_model`` does not know which will run): one tuple per decoder, the dtype must
    suit each."""
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    if role == "draft":
        return (DRAFT_PASSES,)
    methods = tuple(PASSES) if methods is None else (
        (methods,) if isinstance(methods, str) else tuple(methods))
    unknown = [m for m in methods if m not in PASSES]
    if unknown:
        raise ValueError(f"unknown decoder(s) {unknown}; known: {sorted(PASSES)}")
    return tuple(dict.fromkeys(PASSES[m] for m in methods))


def measure_dtypes(config, rows=PROBE_ROWS, layers=PROBE_LAYERS,
                   repeats=PROBE_REPEATS) -> Dict[str, Dict[int, float]]:
    """``{dtype: {tokens: min seconds}}`` of the forward passes of ``config`` cut to ``layers``
    blocks (and its head cut alike; :func:`dsbd_jax.host.pass_probe.cut_config`) over
    ``[1, tokens]`` new tokens for each of ``rows``, in float32 and in bfloat16, each dtype in
    the kernel form ``load_model`` gives it on this host and compiled under that form's
    options, interleaved round by round."""
    by_dtype = {dt: forms.choose_form(config.replace(dtype=dt), dt) for dt in DTYPES}
    return pass_probe.time_passes(config, DTYPES, by_dtype, rows=rows, layers=layers,
                                  repeats=repeats)


def pick_dtype(times: Mapping[str, Mapping[int, float]], prior: str, rows=None,
               worst: Optional[Mapping[str, Mapping[int, float]]] = None) -> str:
    """``prior``, unless the other dtype's passes ``rows`` (default: every pass of ``times``)
    take ``DECISIVE`` less time in total. ``worst``: the slowest of the repeated measurements
    (``times`` the fastest): the other dtype must then win with its slowest figures against the
    prior's fastest, so a choice that one repeat would not make is not made."""
    other = "float32" if prior == "bfloat16" else "bfloat16"
    rows = tuple(times[prior]) if rows is None else tuple(rows)
    slow = times if worst is None else worst
    total = lambda t, dt: sum(float(t[dt][r]) for r in rows)  # noqa: E731
    return other if total(slow, other) < (1 - DECISIVE) * total(times, prior) else prior


def pick_for(times, prior: str, passes, worst=None) -> str:
    """The dtype for models that run each of ``passes`` (:func:`passes_of`): the other dtype
    than ``prior`` only where it wins (:func:`pick_dtype`) for every one of them, so no decoder
    runs in a dtype that makes its own passes slower than the prior's."""
    picks = {pick_dtype(times, prior, rows, worst) for rows in passes}
    return picks.pop() if len(picks) == 1 else prior


def _shape(config) -> tuple:
    return (config.hidden_size, config.intermediate_size, config.num_layers, config.num_heads,
            config.num_kv_heads, config.head_dim, config.vocab_size,
            bool(config.tie_word_embeddings))


def dtype_key(config) -> str:
    """The entry of a model shape's dtype figures in the host's plan cache
    (:func:`dsbd_jax.host.cpu_options.cached_choice`): the probe's rows, each form's options,
    the shape."""
    return (f"dtype by passes {'/'.join(str(r) for r in PROBE_ROWS)} | options plain "
            f"{choice('plain')}, transposed {choice(TRANSPOSED)} | "
            + "x".join(str(int(v)) for v in _shape(config)))


def cpu_seconds() -> Optional[tuple]:
    """``(busy, own, wall, cpus)`` now: every CPU's busy seconds from ``/proc/stat``, this
    process's CPU seconds, a monotonic clock and the CPUs ``/proc/stat`` counts; ``None``
    where there is no ``/proc/stat``."""
    try:
        with open("/proc/stat") as f:
            lines = f.read().splitlines()
        ticks = [int(v) for v in lines[0].split()[1:]]
        cpus = sum(1 for line in lines if line.startswith("cpu") and line[3:4].isdigit())
        hz = os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None
    idle = ticks[3] + (ticks[4] if len(ticks) > 4 else 0)          # idle and iowait
    busy = sum(ticks[:8]) - idle     # user, nice, system, irq, softirq, steal (guest is in user)
    t = os.times()
    return busy / hz, t.user + t.system, time.monotonic(), max(cpus, 1)


def others_per_core(before: tuple, after: tuple) -> float:
    """The CPU time other processes used between two :func:`cpu_seconds` readings, per CPU and
    second: this process's own work (a probe's passes) left out, so it reads 0 on a quiet
    host however hard the probe works, and about 1 with another job on every core."""
    busy, own, wall = (after[i] - before[i] for i in range(3))
    if wall <= 0:
        return 0.0
    return max(busy - own, 0.0) / (wall * after[3])


def load_per_core(since: Optional[tuple] = None) -> float:
    """How busy other work kept this host: with ``since`` (a :func:`cpu_seconds` reading) the
    others' CPU time since then (:func:`others_per_core`); else, or without ``/proc/stat``, the
    one-minute load average per core (0 where the OS does not say), which also counts this
    process's own recent work."""
    now = cpu_seconds() if since is not None else None
    if now is not None:
        return others_per_core(since, now)
    try:
        return os.getloadavg()[0] / max(os.cpu_count() or 1, 1)
    except (OSError, AttributeError):
        return 0.0


def spread(a: Mapping, b: Mapping) -> float:
    """The largest relative disagreement of two measurements ``{dtype: {rows: s}}``."""
    return max(abs(a[d][r] - b[d][r]) / max(min(a[d][r], b[d][r]), 1e-12)
               for d in a for r in a[d])


def measure_repeatably(measure: Callable[[], Mapping], tries: int = TRIES,
                       noise: float = NOISE) -> tuple:
    """``(fastest, slowest, spread, tries)``: ``measure()`` (``{dtype: {rows: s}}``) run twice,
    and again (up to ``tries`` runs) while the runs disagree by more than ``noise`` at any pass
    (:func:`spread`); the fastest and slowest figure of each pass over the runs."""
    runs = [measure(), measure()]
    while spread(runs[-2], runs[-1]) > noise and len(runs) < tries:
        runs.append(measure())
    last = spread(runs[-2], runs[-1])
    fast = {d: {r: min(x[d][r] for x in runs) for r in runs[0][d]} for d in runs[0]}
    slow = {d: {r: max(x[d][r] for x in runs) for r in runs[0][d]} for d in runs[0]}
    return fast, slow, last, len(runs)


def _figures(times: Mapping, config, rows) -> str:
    n = pass_probe.cut_config(config).num_layers
    ms = {d: " / ".join(f"{float(times[d][str(r)]):.2f}" for r in rows) for d in DTYPES}
    return (f"passes of {n} of {config.num_layers} blocks over "
            f"{' / '.join(str(r) for r in rows)} new tokens: float32 "
            f"{ms['float32']} ms, bfloat16 {ms['bfloat16']} ms")


@functools.lru_cache(maxsize=None)
def _measured(config) -> dict:
    """This host's dtype figures for a model shape (:func:`dtype_key`): the cached entry when
    it is final, else measured (:func:`measure_repeatably`) and written, as final only when the
    repeats agreed within ``NOISE`` and other work kept the host under ``BUSY`` per core
    (:func:`load_per_core`, the probe's own work left out). Returns
    the entry (``min_ms``, ``worst_ms``, ``spread``, ``load``, ``final``) and where it came
    from (``how``)."""
    path = cpu_options.cache_file()
    got = cpu_options.host_entries(path).get(dtype_key(config), {})
    rows = {str(r) for r in PROBE_ROWS}
    if (isinstance(got, dict) and got.get("final") is True and all(
            set(got.get(k, {}).get(d, {})) == rows for k in ("min_ms", "worst_ms")
            for d in DTYPES)):
        return {**got, "how": f"cached in {path}"}
    redo = " (the cached figures were not final: measured again)" if got else ""
    since = cpu_seconds()
    fast, slow, noise, tries = measure_repeatably(lambda: measure_dtypes(config))
    load = load_per_core(since)      # others' work beside the probe, not the probe's own
    final = noise <= NOISE and load <= BUSY
    extra = {"worst_ms": cpu_options._ms(slow), "spread": round(noise, 3),
             "load": round(load, 2), "tries": tries, "final": final}
    error = cpu_options.write_cache(path, dtype_key(config), None, fast, extra)
    how = (f"measured {tries} times, spread {noise:.0%}, load {load:.2f} per core, "
           + (f"written to {path}" if error is None else f"not cached ({error})")
           + ("" if final else "; not final: measured again next run") + redo)
    return {"min_ms": cpu_options._ms(fast), **extra, "how": how}


@functools.lru_cache(maxsize=None)
def _choose_dtype(config, passes=None) -> tuple:
    """``(dtype, how)`` for a model shape on this CPU host and the decoders' ``passes``
    (:func:`passes_of`; ``None``: every decoder's)."""
    prior, why = prior_dtype()
    passes = passes_of() if passes is None else passes
    got = _measured(config)
    times = {d: {int(r): v for r, v in got["min_ms"][d].items()} for d in DTYPES}
    worst = {d: {int(r): v for r, v in got["worst_ms"][d].items()} for d in DTYPES}
    dt = pick_for(times, prior, passes, worst)
    rows = sorted({r for p in passes for r in p})
    verdict = (f"{dt} beats the flags' {prior} by {DECISIVE:.0%} on every run of these passes"
               if dt != prior else f"{'bfloat16' if prior == 'float32' else 'float32'} not "
               f"{DECISIVE:.0%} faster on every run of these passes, so the flags' choice "
               f"stands")
    return dt, (f"{why}; {_figures(got['min_ms'], config, rows)}: {verdict} "
                f"({got['how']})")


def choose_dtype(config, methods=None, role: str = "target") -> str:
    """``"float32"`` or ``"bfloat16"`` for ``config``'s shape on this host, for the decoders
    ``methods`` in ``role`` (module docstring; :func:`passes_of`). Logged once per shape and
    passes, with the figures."""
    return dtype_choice(config, methods, role)[0]


def dtype_choice(config, methods=None, role: str = "target") -> tuple:
    """``(dtype name, how it was decided)`` for ``config``'s shape, run by the decoders
    ``methods`` (names of ``PASSES``; ``None``: any) as ``role`` (``"target"`` or ``"draft"``):
    the flags' prior unless the other dtype runs every one of those decoders' passes
    ``DECISIVE`` faster on every repeat (:func:`pick_for`)."""
    passes = passes_of(methods, role)
    forced = os.environ.get(ENV, AUTO).strip() or AUTO
    if forced not in (AUTO,) + DTYPES:
        raise ValueError(f"${ENV} must be 'auto', 'float32' or 'bfloat16', got {forced!r}")
    if forced != AUTO:
        return forced, f"${ENV}={forced}"
    if jax.default_backend() != "cpu":
        return "bfloat16", f"{jax.default_backend()} backend"
    if config.hidden_size * config.intermediate_size < forms.MIN_ELEMENTS:
        return "float32", "a small model (not bound by memory; exact float32 logits)"
    return _logged(config.replace(dtype="float32"), passes, _label(methods, role))


def _label(methods, role) -> str:
    if role == "draft":
        return "a draft (one row per pass)"
    if methods is None:
        return "any decoder"
    return ", ".join((methods,) if isinstance(methods, str) else methods)


@functools.lru_cache(maxsize=None)
def _logged(config, passes, label) -> tuple:
    t0 = time.perf_counter()
    dt, how = _choose_dtype(config, passes)
    note = "" if dt == "bfloat16" else (
        "; models load in float32 (dtype='bfloat16' or $DSBD_JAX_DTYPE=bfloat16 forces half "
        "the memory)")
    logger.info("dtype for %dx%d models run by %s on this host: %s (%s, %.1f s)%s",
                config.hidden_size, config.intermediate_size, label, dt, how,
                time.perf_counter() - t0, note)
    return dt, how


def resolve_dtype(dtype, config, methods=None, role: str = "target") -> str:
    """The dtype name a load uses: ``dtype`` itself (a name or a jnp dtype), or for ``"auto"``
    (or ``None``) :func:`choose_dtype` of ``config`` for ``methods`` in ``role``."""
    return (choose_dtype(config, methods, role) if _is_auto(dtype)
            else jnp.dtype(dtype).name)


def _is_auto(dtype) -> bool:
    return dtype is None or (isinstance(dtype, str) and dtype == AUTO)


def plan(config, dtype=AUTO, form: Optional[str] = None, methods=None,
         role: str = "target") -> HostPlan:
    """How this host runs a model of ``config``'s shape: the dtype (``"auto"``: measured for the
    decoders ``methods`` in ``role``, see :func:`dtype_choice`; or forced), the kernel form for
    that dtype (``form`` forces one), the compiler options of that form and whether the head is
    stored as rows."""
    name, why = (dtype_choice(config, methods, role) if _is_auto(dtype)
                 else (jnp.dtype(dtype).name, "given"))
    if form is None:
        form = forms.choose_form(config.replace(dtype=name), name)
    head_t = form == TRANSPOSED and jnp.dtype(name).itemsize == 2
    row_head = head_t or bool(config.tie_word_embeddings)
    options = options_name(form, name, row_head) if jax.default_backend() == "cpu" else "default"
    return HostPlan(name, form, options, head_t, why)
