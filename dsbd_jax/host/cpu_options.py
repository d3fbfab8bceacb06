"""Per-executable XLA:CPU compiler options, chosen per host by a short measurement.

XLA:CPU's few-row products run fastest under different options (YNNPACK or Eigen, Eigen's
thread pool) on different hosts and shapes, so, as autotuners do, the library measures the
candidates once per host and keeps the winner. ``CANDIDATES`` names the option sets
(:func:`supported` drops those the installed XLA rejects); :func:`choice` gives the one in use
per kernel form (``$DSBD_JAX_CPU_OPTIONS`` forces one; else read from
``$DSBD_JAX_CACHE/host_plan.json`` under :func:`host_key`, else measured); :func:`tuned_jit` is
``jax.jit`` under the options of the form of the call's kernels. Invariant: a candidate changes
outputs at most by float rounding (``single_thread_eigen`` not at all, ``eigen_dot`` a few ulps),
so decoders draw from the same distributions (``tests/host/test_cpu_options.py``).
More: ``docs/results/design_notes.md``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable, Dict, Hashable, Mapping, NamedTuple, Optional

import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.host.cpu_info import DECIDING_FLAGS, FLAGS_ENV, cpu_flags, cpu_model  # noqa: F401
from dsbd_jax.models.products import (TRANSPOSED, project, project_t, transpose_block,
                                      transposed_width)
from dsbd_jax.models.weights import program_kind

logger = logging.getLogger("dsbd_jax")

ENV = "DSBD_JAX_CPU_OPTIONS"
CANDIDATES: Mapping[str, Mapping[str, object]] = {
    "default": {},
    "single_thread_eigen": {"xla_cpu_multi_thread_eigen": False},
    # matrix products on Eigen instead of YNNPACK (the empty list of YNN fusion kinds)
    "eigen_dot": {"xla_cpu_experimental_ynn_fusion_type": ""},
}
# candidates whose products add in the same order as "default" (same bits)
SAME_BITS = ("default", "single_thread_eigen")
# candidates that run the matrix products on Eigen. Two kinds of product go badly there, and a
# program with either runs under "default" where its form's choice is one of these
# (options_name): 16-bit kernels (Eigen has no 16-bit product on XLA:CPU, so XLA first converts
# every weight to a float32 copy, and a program with a decode loop keeps those copies as
# temporaries, more bytes than the parameters) and a vocabulary head stored as [V, d] rows, e.g.
# a tied head (its few-row products take several times as long as XLA's own product:
# benchmarks/probes/tied_head.py, figures in docs/results/cpu.md)
EIGEN_PRODUCTS = ("eigen_dot",)
# the measurement: PROBE_LAYERS chained pairs [M, PROBE_IN] x [PROBE_IN, PROBE_OUT] x
# [PROBE_OUT, PROBE_IN] (an MLP's up and down products, each waiting for the previous one)
PROBE_ROWS = (1, 4, 16)
PROBE_IN, PROBE_OUT, PROBE_LAYERS, PROBE_REPEATS = 1536, 8960, 4, 7
MARGIN = 0.05  # a candidate replaces "default" only if >= 5% faster in total, never 5% slower
# the stored forms of projection kernels (dsbd_jax.models.products): each form has its own
# choice, measured on its own products (the two forms can favour different options, e.g. plain
# kernels on Eigen and transposed kernels on XLA's default YNNPACK: benchmarks/forward.py
# --options, docs/performance.md)
PLAIN = "plain"
FORMS = (PLAIN, TRANSPOSED)


def host_key() -> str:
    """The key of every per-host cache: CPU model, its deciding flags, cores, jax and jaxlib
    versions and ``XLA_FLAGS`` (a cache made on one host never answers for another whose
    flags differ)."""
    import jaxlib
    flags = ",".join(cpu_flags()) or "no flags"
    xla = os.environ.get("XLA_FLAGS", "")
    return (f"{cpu_model()} | {flags} | {os.cpu_count()} cpus | jax {jax.__version__} "
            f"jaxlib {jaxlib.__version__}" + (f" | XLA_FLAGS {xla}" if xla else ""))


def options_key(form: str = PLAIN) -> str:
    """The entry (in this host's part of :func:`cache_file`) of the choice for kernels in
    ``form`` (``FORMS``): the form and the candidates this XLA accepts (a new candidate is
    measured, not hidden behind an old choice)."""
    _check_form(form)
    return f"options | {form} kernels | {','.join(sorted(candidates()))}"


def _check_form(form: str) -> None:
    if form not in FORMS:
        raise ValueError(f"kernel form must be one of {FORMS}, got {form!r}")


PLAN_FILE = "host_plan.json"


def cache_file() -> Path:
    """The one JSON file of every per-host choice (:func:`cached_choice`):
    ``$DSBD_JAX_CACHE/host_plan.json`` (default ``~/.cache/dsbd_jax``), ``{host_key(): {entry:
    {"choice": ..., "min_ms": {...}}}}``: the compiler options per form, the kernel form per
    shape, the dtype per model shape, DSBD's node budget per target."""
    return cache_root() / PLAN_FILE


def cache_root(cache_dir=None) -> Path:
    """The library's cache folder: ``cache_dir``, else ``$DSBD_JAX_CACHE``, else
    ``~/.cache/dsbd_jax`` (converted weights, trained heads' links, compiled programs, this
    host's plan)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("DSBD_JAX_CACHE")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "dsbd_jax"


def interleaved_min(fns: Mapping[Hashable, Callable[[], object]], repeats: int
                    ) -> Dict[Hashable, float]:
    """``{key: min seconds}`` of the zero-argument calls ``fns`` (each returns arrays), after
    one warm-up call each, timed round by round so that load on the host hits them alike."""
    for f in fns.values():
        jax.block_until_ready(f())
    best = {k: np.inf for k in fns}
    for _ in range(repeats):
        for k, f in fns.items():
            t0 = time.perf_counter()
            jax.block_until_ready(f())
            best[k] = min(best[k], time.perf_counter() - t0)
    return best


@functools.lru_cache(maxsize=None)
def supported(name: str) -> bool:
    """Whether the installed XLA accepts candidate ``name``'s options (a tiny compile)."""
    try:
        jax.jit(lambda x: x @ x, compiler_options=dict(CANDIDATES[name])).lower(
            jnp.ones((2, 2), jnp.float32)).compile()
        return True
    except Exception as e:  # noqa: BLE001 - XLA raises its own error types for unknown options
        logger.info("XLA:CPU compiler options %r not supported here: %s", name,
                    str(e).splitlines()[0])
        return False


def candidates() -> Dict[str, Mapping[str, object]]:
    """The ``CANDIDATES`` this XLA accepts (``"default"`` always)."""
    return {n: o for n, o in CANDIDATES.items() if n == "default" or supported(n)}


def mlp_pairs(form: str, din: int, dout: int, layers: int, dtype="float32"):
    """``(chain, ups, downs)``: ``layers`` random MLP pairs (``up [din, dout]``, ``down [dout,
    din]``, scaled by one over the root of their fan-in) stored in ``form`` (``FORMS``), and
    ``chain(x, ups, downs)``, which runs them one after another as a forward pass does (each
    product waits for the previous one) with the model's own product for that form
    (:func:`dsbd_jax.models.products.project_t` for transposed kernels). The probe of
    :func:`measure` and of :func:`dsbd_jax.host.forms.measure_forms`."""
    _check_form(form)
    rng = np.random.default_rng(0)
    dt = jnp.dtype(dtype)

    def weights(fan_in, fan_out):
        w = rng.standard_normal((fan_in, fan_out), np.float32) / np.float32(np.sqrt(fan_in))
        w = jnp.asarray(w.astype(dt))
        return transpose_block(w, transposed_width(fan_out)) if form == TRANSPOSED else w
    ups = [weights(din, dout) for _ in range(layers)]
    downs = [weights(dout, din) for _ in range(layers)]
    product = project_t if form == TRANSPOSED else project  # 16-bit: mixed precision

    def chain(x, ups, downs):
        for u, d in zip(ups, downs):
            x = product(product(x, u), d)
        return x
    return chain, ups, downs


def measure(rows=PROBE_ROWS, din=PROBE_IN, dout=PROBE_OUT, layers=PROBE_LAYERS,
            repeats=PROBE_REPEATS, form: str = PLAIN) -> Dict[str, Dict[int, float]]:
    """``{candidate: {M: min seconds}}`` of ``layers`` chained up/down product pairs
    ``[M, din] x [din, dout] x [dout, din]`` (:func:`interleaved_min` over ``repeats``), with
    the kernels in ``form``: ``"plain"`` ``[in, out]``, or ``"transposed"`` (row blocks run by
    :func:`dsbd_jax.models.products.project_t`, the model's own product). The products are
    chained as in a forward pass: XLA:CPU runs independent products side by side, which would
    flatter single-threaded variants."""
    body, ups, downs = mlp_pairs(form, din, dout, layers)
    rng = np.random.default_rng(0)
    fns = {name: jax.jit(body, compiler_options=dict(opts))
           for name, opts in candidates().items()}
    best: Dict[str, Dict[int, float]] = {name: {} for name in fns}
    for M in rows:
        x = jnp.asarray(rng.standard_normal((M, din), np.float32))
        t = interleaved_min({n: functools.partial(f, x, ups, downs) for n, f in fns.items()},
                            repeats)
        for n in fns:
            best[n][M] = t[n]
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


def read_cache(path: Path) -> dict:
    """The JSON cache of per-host choices at ``path`` (``{}`` when missing or unreadable)."""
    try:
        got = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return {}
    return got if isinstance(got, dict) else {}


def host_entries(path: Optional[Path] = None) -> Dict[str, Any]:
    """This host's part of the cache (:func:`cache_file`; ``{}`` if none): ``{entry: {"choice":
    ..., "min_ms": {...}}}``, every choice made here so far (``dsbd host`` prints them)."""
    got = read_cache(cache_file() if path is None else path).get(host_key(), {})
    return got if isinstance(got, dict) else {}


def write_cache(path: Path, entry: str, choice, times: Mapping,
                extra: Optional[Mapping[str, Any]] = None) -> Optional[OSError]:
    """Store one measured choice as ``entry`` of this host (:func:`host_key`) in the JSON cache
    at ``path``, with its figures ``{candidate: {M: seconds}}`` kept in ms, merged into the file
    as it is now (another process may have added entries). Returns the error when the file
    cannot be written (a read-only home: the choice then holds for this process only), else
    ``None``. ``extra``: more fields of the entry (e.g. the dtype's spread, load and whether
    the choice is final)."""
    cached = read_cache(path)
    host = cached.get(host_key())
    host = host if isinstance(host, dict) else {}
    host[entry] = {"choice": choice, "min_ms": _ms(times), **dict(extra or {})}
    return _write(path, cached, host)


def forget_host(path: Optional[Path] = None) -> int:
    """Drop every choice cached for this host (``dsbd host --remeasure``): the next use of each
    measures it again. Returns how many entries were dropped."""
    path = cache_file() if path is None else path
    cached = read_cache(path)
    host = cached.pop(host_key(), None)
    if not isinstance(host, dict) or not host:
        return 0
    error = _write(path, cached, None)
    if error is not None:
        raise error
    return len(host)


def _write(path: Path, cached: dict, host: Optional[dict]) -> Optional[OSError]:
    if host is not None:
        cached[host_key()] = host
    try:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(path).with_name(f".{Path(path).name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(cached, indent=2))
        os.replace(tmp, path)
    except OSError as e:
        return e
    return None


class Cached(NamedTuple):
    """A per-host choice (:func:`cached_choice`): the choice, its figures as the cache stores
    them (``{candidate: {M: ms}}``, string keys), where it came from (``"cached in PATH"``,
    ``"written to PATH"``, ``"not cached (error)"``), whether it was measured now and whether
    it is stored (``False`` only when the file could not be written)."""
    choice: Any
    min_ms: Dict[str, Any]
    where: str
    measured: bool
    stored: bool = True


def cached_choice(entry: str, valid: Callable[[Any], bool], measure: Callable[[], Mapping],
                  pick: Callable[[Mapping], Any],
                  valid_ms: Callable[[Mapping], bool] = lambda ms: True) -> Cached:
    """The one measure / pick / cache step behind every per-host choice (the compiler options,
    the kernel form, the dtype, DSBD's node budget), all in one file under one
    key (:func:`cache_file`, :func:`host_key`): the choice stored as this host's ``entry`` when
    ``valid(choice)`` and ``valid_ms(figures)`` hold; else ``measure()`` (``{candidate: {M:
    seconds}}``), ``pick`` of it, written back (:func:`write_cache`: a read-only home keeps the
    choice for this process only)."""
    path = cache_file()
    got = host_entries(path).get(entry, {})
    if isinstance(got, dict) and "choice" in got and valid(got["choice"]) and valid_ms(
            got.get("min_ms", {})):
        return Cached(got["choice"], got.get("min_ms", {}), f"cached in {path}", False)
    times = measure()
    chosen = pick(times)
    error = write_cache(path, entry, chosen, times)
    where = f"written to {path}" if error is None else f"not cached ({error})"
    return Cached(chosen, _ms(times), where, True, error is None)


def _ms(times: Mapping) -> Dict[str, Dict[str, float]]:
    return {str(c): {str(m): round(1e3 * s, 3) for m, s in t.items()} for c, t in times.items()}


@functools.lru_cache(maxsize=None)
def choice(form: str = PLAIN) -> str:
    """The candidate in use in this process for programs whose projection kernels are in
    ``form`` (``FORMS``; see the module docstring); decided once per form."""
    _check_form(form)
    forced = os.environ.get(ENV, "auto").strip() or "auto"
    if forced != "auto" and forced not in CANDIDATES:
        raise ValueError(f"${ENV} must be 'auto' or one of {sorted(CANDIDATES)}, got {forced!r}")
    if forced != "auto" and jax.default_backend() == "cpu" and forced not in candidates():
        raise ValueError(f"${ENV}={forced!r}: this XLA (jax {jax.__version__}) rejects its "
                         f"options {dict(CANDIDATES[forced])}; supported: {sorted(candidates())}")
    if jax.default_backend() != "cpu":
        name, how = "default", f"{jax.default_backend()} backend"
    elif forced != "auto":
        name, how = forced, f"${ENV}"
    else:
        got = cached_choice(options_key(form), lambda c: c in candidates(),
                            lambda: measure(form=form), pick)
        name, how = got.choice, ("measured, " if got.measured else "") + got.where
    logger.info("XLA:CPU compiler options for %s kernels: %s %s (%s)", form, name,
                dict(CANDIDATES[name]), how)
    return name


def check_name(name) -> str:
    """``name`` if it names a candidate of ``CANDIDATES`` this XLA accepts, else a
    ``ValueError`` listing them."""
    if not isinstance(name, str) or name not in CANDIDATES:
        raise ValueError(f"unknown XLA:CPU options {name!r}; the candidates: {sorted(CANDIDATES)}")
    if jax.default_backend() == "cpu" and name not in candidates():
        raise ValueError(f"this XLA (jax {jax.__version__}) rejects the options {name!r} "
                         f"({dict(CANDIDATES[name])}); supported: {sorted(candidates())}")
    return name


def options_name(form: str = PLAIN, dtype="float32", row_head: bool = False) -> str:
    """The candidate a program runs under whose projection kernels are in ``form`` and stored in
    ``dtype`` (``row_head``: its vocabulary head is stored as ``[V, d]`` rows, e.g. tied):
    :func:`choice` of the form, except that 16-bit and int8 kernels and row heads never run
    under a candidate of ``EIGEN_PRODUCTS`` (then ``"default"``, XLA's own products: Eigen has
    no 16-bit product on XLA:CPU, and runs the int8 products far slower:
    ``docs/results/precision.md``, *Eight-bit products*)."""
    name = choice(form)
    if (jnp.dtype(dtype).itemsize <= 2 or row_head) and name in EIGEN_PRODUCTS:
        return "default"
    return name


def options_of(tree) -> str:
    """:func:`options_name` for a program over the parameters (or call arguments) ``tree``:
    their kernel form, kernel dtype and head, read in one walk
    (:func:`dsbd_jax.models.weights.program_kind`)."""
    return options_name(*program_kind(tree))


def compiler_options(form: str = PLAIN, dtype="float32",
                     row_head: bool = False) -> Dict[str, object]:
    """The ``compiler_options`` in use for kernels in ``form`` stored in ``dtype``, with or
    without a row-stored head (:func:`options_name`; ``{}`` off the CPU). For a parameter tree:
    ``compiler_options(*weights.program_kind(params))``."""
    return dict(CANDIDATES[options_name(form, dtype, row_head)])


def _nested_options_error(e: Exception) -> bool:
    """Whether ``e`` is jax refusing ``compiler_options`` on a jit inside another trace."""
    msg = str(e)
    return "compiler_options" in msg and "top-level" in msg


class tuned_jit:
    """``jax.jit(fun, compiler_options=compiler_options(form), **jit_kwargs)``, built on first
    use (call, ``lower``, ``trace``, ...) so that importing the library measures nothing. Use as
    ``@functools.partial(tuned_jit, static_argnames=...)`` where ``jax.jit`` would go.

    ``form`` is the form of the projection kernels among the call's arguments
    (:func:`dsbd_jax.models.weights.program_kind`: ``"transposed"`` when any is transposed), so a
    program runs under the options measured for its own products. One ``jax.jit`` per distinct
    choice of options: when both forms choose the same options, both share one jit object.

    Called inside another trace (the user's own ``jax.jit``, ``ShardedDecoder``'s jit, a
    ``vmap``), it runs as a plain ``jax.jit(fun, **jit_kwargs)``: jax accepts
    ``compiler_options`` only on a top-level jit, and the enclosing program is compiled with
    whatever options its own jit has."""

    def __init__(self, fun, **jit_kwargs):
        self._fun, self._jit_kwargs = fun, jit_kwargs
        self._jits: Dict[str, Callable] = {}
        functools.update_wrapper(self, fun)

    def for_form(self, form: str = PLAIN, dtype="float32", row_head: bool = False):
        """The ``jax.jit`` object for programs whose kernels are in ``form``, stored in
        ``dtype``, with or without a row-stored head (:func:`options_name`)."""
        return self._jit(options_name(form, dtype, row_head))

    def _jit(self, name: str):
        if name not in self._jits:
            self._jits[name] = jax.jit(self._fun, compiler_options=dict(CANDIDATES[name]),
                                       **self._jit_kwargs)
        return self._jits[name]

    @property
    def jitted(self):
        """The ``jax.jit`` object for plain kernels (``for_form("plain")``)."""
        return self.for_form(PLAIN)

    @functools.cached_property
    def plain(self):
        return jax.jit(self._fun, **self._jit_kwargs)

    def _for_args(self, args, kwargs):
        return self.for_form(*program_kind((args, kwargs)))

    def for_call(self, args, kwargs, options: Optional[str] = None):
        """``(jax.jit object, its compiler options)`` for a top-level call with these
        arguments: what :meth:`run` would run. ``options``: a candidate's name given by the
        caller (a ``HostPlan``'s; checked, :func:`check_name`; XLA's defaults off the CPU),
        used instead of the choice for the arguments' kernels."""
        if options is None:
            name = options_name(*program_kind((args, kwargs)))
        else:
            name = check_name(options) if jax.default_backend() == "cpu" else "default"
        return self._jit(name), dict(CANDIDATES[name])

    def __call__(self, *args, **kwargs):
        return self.run(args, kwargs)

    def run(self, args, kwargs, options: Optional[str] = None):
        """The call, compiled as :meth:`for_call` says; called inside another trace, the plain
        ``jax.jit`` (the enclosing program's options apply)."""
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves((args, kwargs))):
            return self.plain(*args, **kwargs)
        try:
            return self.for_call(args, kwargs, options)[0](*args, **kwargs)
        except ValueError as e:  # under a trace although no argument is a tracer
            if not _nested_options_error(e):
                raise
            return self.plain(*args, **kwargs)

    def lower(self, *args, **kwargs):
        return self._for_args(args, kwargs).lower(*args, **kwargs)

    def trace(self, *args, **kwargs):
        return self._for_args(args, kwargs).trace(*args, **kwargs)

    def eval_shape(self, *args, **kwargs):
        return self._for_args(args, kwargs).eval_shape(*args, **kwargs)

    def clear_cache(self):
        """Drop the compiled programs of every form (and of the plain fallback)."""
        for j in self._jits.values():
            j.clear_cache()
        if "plain" in self.__dict__:
            self.plain.clear_cache()

    def __getattr__(self, name):
        if name.startswith("__") or name in ("_fun", "_jit_kwargs", "_jits", "plain"):
            raise AttributeError(name)
        return getattr(self.jitted, name)
