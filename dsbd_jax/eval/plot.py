"""Figures of a benchmark run (``records.jsonl`` of :func:`.run.run_bench`), as in the paper's
Figure 4: one marker per method setting, and the Pareto fronts of DSBD and of beam sampling.

    plot_results("runs/quick_cpu/records.jsonl")   # CLI: dsbd plot runs/quick_cpu

writes ``speed_vs_quality``, ``energy_vs_quality`` and ``width_vs_speed`` (PNG and SVG) next to the
records (a figure with nothing to draw, e.g. energy without counters, is not written: ``log``
says why), and one ``speed_vs_<quality>`` figure for each other quality figure of the run (the
log-likelihood and each task metric, e.g. ``speed_vs_humaneval_pass1``). Quality points carry
their 95% intervals (Wilson for task metrics, bootstrap for the log-likelihood). Figures are :class:`matplotlib.figure.Figure` objects saved directly, so pyplot and the
session's backend (e.g. a notebook's) are never touched. matplotlib is imported only when plotting.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from dsbd_jax.decoding.methods import label
from dsbd_jax.eval.records import read_records
from dsbd_jax.eval.summary import summarize

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

Row = Dict[str, Any]
Point = Tuple[Row, float, float]  # (summary row, x, y)

# kind of point -> (legend name, colour, marker); kinds are methods, plus single-beam DSBD
_STYLES = {
    "dsbd": ("DSBD", "tab:red", "o"),
    "dsbd_single": ("DSBD single-beam", "tab:orange", "D"),
    "beam": ("beam sampling", "tab:blue", "s"),
    "spec": ("speculative sampling", "tab:green", "^"),
    "tree": ("tree speculative sampling", "tab:purple", "v"),
    "sample": ("multinomial sampling", "tab:gray", "X"),
    "beam_search": ("beam search", "tab:brown", "P"),
}
_FRONT_KINDS = ("dsbd", "beam")  # kinds whose Pareto front is drawn
# settings written next to a point, per method
_NOTE_KEYS = {"beam": ("num_beams",),
              "dsbd": ("gamma", "draft_width", "threshold", "min_width", "max_width")}
_QUALITY_LABELS = {"loglik_per_token": "mean log-likelihood / token (higher is better)",
                   "perplexity": "perplexity (lower is better; axis inverted)"}


def pareto_front(points: Sequence[Tuple[float, float]], maximize_x: bool = True) -> List[int]:
    """Indices of the non-dominated ``(x, y)`` points, sorted by x (then y).

    Higher y is better; higher x is better if ``maximize_x``, lower otherwise. A point is dominated
    when another is at least as good in both and better in one, so equal points are all kept.
    """
    sign = 1.0 if maximize_x else -1.0

    def dominates(a: Tuple[float, float], b: Tuple[float, float]) -> bool:
        ax, bx = sign * a[0], sign * b[0]
        return ax >= bx and a[1] >= b[1] and (ax > bx or a[1] > b[1])

    front = [i for i, p in enumerate(points) if not any(dominates(q, p) for q in points)]
    return sorted(front, key=lambda i: (points[i][0], points[i][1], i))


def plot_results(records_path, out_dir=None, quality: str = "loglik_per_token",
                 formats: Sequence[str] = ("png", "svg"),
                 log: Optional[Callable[[str], None]] = None) -> List[Path]:
    """Write the figures of a results file in every format; return the written paths.

    ``quality`` (the y axis): ``"loglik_per_token"``, ``"perplexity"`` or a task metric of the
    summary's ``task_metrics`` (e.g. ``"humaneval/pass@1"``). ``out_dir`` defaults to the records
    file's folder. A figure with nothing to draw (energy without a reading, the width figure
    without DSBD) is not written (an earlier run's file of that name is removed): ``log``
    (default: INFO on the ``dsbd_jax`` logger) gets one line saying why, e.g.
    ``"energy_vs_quality: not drawn: energy unavailable: no RAPL counter"``.
    ``ValueError`` if the file has no sample lines or no setting has ``quality``.
    """
    log = logging.getLogger("dsbd_jax").info if log is None else log
    try:
        from matplotlib import rc_context
    except ImportError:
        raise ImportError("plotting needs matplotlib, which is in the eval extra: "
                          "pip install 'dsbd-jax[eval]' (or pip install matplotlib)") from None
    records_path = Path(records_path)
    records = read_records(records_path)
    rows = [r for r in summarize(records) if r["tokens_per_s"] is not None]
    if not rows:
        raise ValueError(f"{records_path}: no timed sample records to plot")
    available = ["loglik_per_token", "perplexity",
                 *sorted({k for r in rows for k in r["task_metrics"]})]
    if quality not in available:
        raise ValueError(f"{records_path}: no setting has quality {quality!r}; "
                         f"available: {', '.join(available)}")
    header = next((r for r in records if r.get("type") == "run"), {})
    title = (f"{header.get('name', records_path.parent.name)} on "
             f"{header.get('machine', {}).get('device', 'unknown device')}")
    out_dir = records_path.parent if out_dir is None else Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    figures = {"speed_vs_quality": _speed_figure(rows, quality, title),
               "energy_vs_quality": _energy_figure(rows, quality, title, header),
               "width_vs_speed": _width_figure(rows, title)}
    for q in available:  # one speed figure per quality figure the run has
        if q not in (quality, "perplexity"):
            figures[f"speed_vs_{q.replace('/', '_').replace('@', '')}"] = \
                _speed_figure(rows, q, title)
    paths = []
    with rc_context({"svg.fonttype": "none"}):  # SVG texts stay text (searchable)
        for stem, fig in figures.items():
            if isinstance(fig, str):  # nothing to draw: say why instead of an empty frame
                log(f"{stem}: not drawn: {fig}")
                for fmt in formats:
                    (out_dir / f"{stem}.{fmt}").unlink(missing_ok=True)
                continue
            for fmt in formats:
                path = out_dir / f"{stem}.{fmt}"
                fig.savefig(path, format=fmt, dpi=150)
                paths.append(path)
    return paths


# ---------------------------------------------------------------------------------------------
def _kind(row: Row) -> str:
    if row["method"] == "dsbd" and row["setting"].get("single_beam"):
        return "dsbd_single"
    return row["method"]


def _note(row: Row) -> str:
    """``W=3`` for beam sampling, ``g=3 WS=3 t=0.9 Wmin=1`` for DSBD, ``""`` otherwise."""
    keys = _NOTE_KEYS.get(row["method"], ())
    shown = {k: row["setting"][k] for k in keys if k in row["setting"]}
    return label(row["method"], shown)[len(row["method"]):].strip() if shown else ""


def _quality_of(row: Row, quality: str) -> Optional[float]:
    return row["task_metrics"].get(quality) if quality not in _QUALITY_LABELS else row[quality]


def _interval_of(row: Row, quality: str) -> Optional[Tuple[float, float]]:
    """The 95% interval of ``quality`` in a summary row (Wilson for task metrics, bootstrap for
    the log-likelihood), or None."""
    iv = (row.get("loglik_interval") if quality == "loglik_per_token"
          else row.get("task_intervals", {}).get(quality))
    if not iv or iv.get("lo") is None:
        return None
    return iv["lo"], iv["hi"]


def _new_figure(title: str) -> Tuple[Figure, Axes]:
    from matplotlib.figure import Figure
    fig = Figure(figsize=(8, 5.5), layout="constrained")
    ax = fig.add_subplot()
    ax.set_title(title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.ticklabel_format(useOffset=False)  # plain tick values, no "+2.266" offset
    return fig, ax


# two notes of one kind closer than this (fractions of the points' x and y ranges) are written
# as one ("W=2, W=3"): side by side they would overprint each other ("W=32")
NOTE_NEAR = (0.08, 0.05)


def spans(points: Sequence[Point]) -> Tuple[float, float]:
    """The x and y ranges of a figure's points (1 where all are equal)."""
    span = lambda vals: (max(vals) - min(vals)) or 1.0  # noqa: E731
    return span([p[1] for p in points]), span([p[2] for p in points])


def note_groups(points: Sequence[Point], ranges: Tuple[float, float],
                near: Tuple[float, float] = NOTE_NEAR) -> List[Tuple[float, float, str]]:
    """The notes to write for ``points`` (all of one kind): ``[(x, y, text)]``, one per group of
    points within ``near`` of each other (chained; as fractions of the figure's x and y
    ``ranges``, :func:`spans`), at the group's top-most point, its notes joined in the order of
    ``points`` (the run's order of settings)."""
    pts = [p for p in points if _note(p[0])]
    if not pts:
        return []
    sx, sy = ranges
    group = list(range(len(pts)))  # union-find over close pairs

    def root(i):
        while group[i] != i:
            i = group[i]
        return i
    for i in range(len(pts)):
        for j in range(i + 1, len(pts)):
            if (abs(pts[i][1] - pts[j][1]) <= near[0] * sx
                    and abs(pts[i][2] - pts[j][2]) <= near[1] * sy):
                group[root(j)] = root(i)
    out = []
    for r in sorted({root(i) for i in range(len(pts))}):
        members = [p for i, p in enumerate(pts) if root(i) == r]
        top = max(members, key=lambda p: p[2])
        out.append((top[1], top[2], ", ".join(_note(p[0]) for p in members)))
    return out


def _scatter(ax: Axes, points: Sequence[Point], front_sign: Optional[float] = None,
             maximize_x: bool = True, quality: Optional[str] = None) -> None:
    """One marker per point (styled by kind, annotated with ``_note``), with its 95% interval
    as a vertical bar where ``quality`` has one; with ``front_sign`` (+1: higher y better, -1:
    lower) the Pareto fronts of ``_FRONT_KINDS`` as steps (through the point estimates)."""
    ranges = spans(points) if points else (1.0, 1.0)
    by_kind: Dict[str, List[Point]] = {}
    for p in points:
        by_kind.setdefault(_kind(p[0]), []).append(p)
    for kind, pts in by_kind.items():
        name, colour, marker = _STYLES.get(kind, (kind, "black", "*"))
        ax.scatter([p[1] for p in pts], [p[2] for p in pts], color=colour, marker=marker, s=40,
                   label=name, zorder=3)
        for row, x, y in pts:
            iv = _interval_of(row, quality) if quality else None
            if iv is not None:
                ax.errorbar([x], [y], yerr=[[max(y - iv[0], 0.0)], [max(iv[1] - y, 0.0)]],
                            color=colour, alpha=0.35,
                            capsize=2, linewidth=1, zorder=2)
        for x, y, text in note_groups(pts, ranges):
            ax.annotate(text, (x, y), xytext=(4, 4), textcoords="offset points",
                        fontsize=6, color=colour)
        if front_sign is not None and kind in _FRONT_KINDS:
            front = [pts[i] for i in pareto_front([(x, front_sign * y) for _, x, y in pts],
                                                  maximize_x)]
            ax.step([p[1] for p in front], [p[2] for p in front], color=colour, alpha=0.6,
                    where="pre" if maximize_x else "post", label=f"{name} Pareto front")
    ax.legend(fontsize=7, loc="best")


def _quality_axis(ax: Axes, quality: str) -> float:
    """Label the y axis for ``quality``; return +1 if higher is better, -1 if lower is."""
    ax.set_ylabel(_QUALITY_LABELS.get(quality, f"{quality} (higher is better)"))
    if quality == "perplexity":
        ax.invert_yaxis()
        return -1.0
    return 1.0


def _speed_figure(rows: Sequence[Row], quality: str, title: str) -> Figure:
    fig, ax = _new_figure(f"{title}: speed vs quality")
    points = [(r, r["tokens_per_s"], q) for r in rows
              if (q := _quality_of(r, quality)) is not None]
    batch = sorted({r.get("batch_size", 1) for r in rows})
    ax.set_xlabel(f"tokens / s at batch size {', '.join(map(str, batch))} (higher is better); "
                  "bars: 95% intervals")
    _scatter(ax, points, _quality_axis(ax, quality), maximize_x=True, quality=quality)
    return fig


def _energy_figure(rows: Sequence[Row], quality: str, title: str,
                   header: Row) -> Union[Figure, str]:
    """The figure, or why there is none (no setting with a reading on every sample)."""
    points = [(r, r["joules_per_token"], q) for r in rows
              if r["joules_per_token"] is not None and (q := _quality_of(r, quality)) is not None]
    if not points:
        reason = header.get("energy", {}).get("reason")
        return f"energy unavailable: {reason or 'no setting has a reading on every sample'}"
    fig, ax = _new_figure(f"{title}: energy vs quality")
    ax.set_xlabel("joules / token (lower is better)")
    _scatter(ax, points, _quality_axis(ax, quality), maximize_x=False)
    return fig


def _width_figure(rows: Sequence[Row], title: str) -> Union[Figure, str]:
    """The figure, or why there is none (no DSBD setting with an accepted width)."""
    points = [(r, r["mean_accepted_width"], r["tokens_per_s"]) for r in rows
              if r["method"] == "dsbd" and r["mean_accepted_width"] is not None]
    if not points:
        return "no DSBD settings (with an accepted width) in this run"
    fig, ax = _new_figure(f"{title}: DSBD accepted width vs speed")
    ax.set_xlabel("mean accepted width (accepted candidates / verified layer)")
    ax.set_ylabel("tokens / s")
    _scatter(ax, points)
    return fig
