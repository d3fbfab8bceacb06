"""What training a draft took: `dsbd train-head RECIPE` (a draft head) or `dsbd distill RECIPE` (a
distilled draft model; a recipe with a ``distill:`` section) run under ``/usr/bin/time -v``, its
wall time, peak memory and log written to one JSON (what `dsbd demo` quotes when it suggests
training a head: ``results/<recipe>_training.json``).

    .venv/bin/python -m benchmarks.head_training configs/head_qwen.yaml \\
        --out results/head_qwen_training.json          # ~1 h on a 2-core CPU
    # a run already made (resumed runs: the time log of each part, summed):
    .venv/bin/python -m benchmarks.head_training configs/head_qwen.yaml \\
        --time-log /tmp/train.log --out results/head_qwen_training.json
    .venv/bin/python -m benchmarks.head_training configs/head_tiny.yaml --out /tmp/ht.json
    .venv/bin/python -m benchmarks.head_training configs/distill_qwen_fkl.yaml \\
        --out results/distill_qwen_fkl_training.json   # 50-85 min on 2 cores

Each ``/usr/bin/time`` report in the log is a part of the record (a run stopped and resumed
has two). Run this way, every part's report is appended to ``<run_dir>/time.log`` as it ends,
also when Ctrl-C stops it (the script ignores the signal itself and lets the run stop and say how
to resume): running the same command again resumes the run and records the whole of it, every
part from that file. ``--conditions`` records what ran beside it (the default says the machine was quiet);
``--part SECONDS:WHAT`` adds a part of the run timed otherwise (e.g. from its log's
timestamps), whose peak memory is not known.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import subprocess
import sys
from pathlib import Path

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def time_reports(text: str):
    """``[(wall seconds, peak RSS kB, stopped by a signal?)]``, one per ``/usr/bin/time -v``
    report in ``text`` (one per part of a resumed run)."""
    out, start = [], 0
    for w in re.finditer(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([0-9:.]+)", text):
        m = re.compile(r"Maximum resident set size \(kbytes\): (\d+)").search(text, w.end())
        if not m:
            break
        parts = [float(p) for p in w.group(1).split(":")]
        out.append((sum(p * 60 ** i for i, p in enumerate(reversed(parts))), int(m.group(1)),
                    bool(_STOPPED.search(text[start:w.start()]))))
        start = m.end()
    if not out:
        raise ValueError("no /usr/bin/time -v report found (Elapsed ... and Maximum resident "
                         "set size lines)")
    return out


# a part that ended by a signal: killed, or stopped by Ctrl-C (exit status 130 after the run
# caught SIGINT and saved what it had)
_STOPPED = re.compile(r"terminated by signal|exited with non-zero status 130\b")


def run_part(command: str, recipe: str, run_dir: Path, argv=None):
    """``dsbd COMMAND RECIPE`` under ``/usr/bin/time -v``, its output on the terminal as it runs;
    the part's time report appended to ``run_dir/time.log`` (``time -a -o``) whatever its end.
    SIGINT is ignored here while the run lasts: Ctrl-C reaches the run (and ``time``) from the
    terminal, and the run saves what it has and exits 130. Returns ``(exit status,
    run_dir/time.log's text)``. ``argv``: another command to run so (the tests')."""
    import signal
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "time.log"
    # (ignored only once the run has started: an ignored SIGINT would be inherited by it)
    argv = argv or [sys.executable, "-m", "dsbd_jax", command, recipe]
    proc = subprocess.Popen(["/usr/bin/time", "-v", "-a", "-o", str(log), *argv], cwd=_ROOT)
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        code = proc.wait()
    finally:
        signal.signal(signal.SIGINT, old)
    return code, log.read_text(errors="replace") if log.is_file() else ""


def parse_time_log(text: str):
    """``(wall seconds, peak RSS kB)`` summed / maxed over the ``/usr/bin/time -v`` reports in
    ``text``."""
    reports = time_reports(text)
    return sum(r[0] for r in reports), max(r[1] for r in reports)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe")
    ap.add_argument("--time-log", default=None,
                    help="the output of a run made under /usr/bin/time -v (not run again)")
    ap.add_argument("--conditions", default="the machine otherwise quiet")
    ap.add_argument("--part", action="append", default=[], metavar="SECONDS:WHAT",
                    help="a part of the run timed otherwise (added to the wall time)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from dsbd_jax.eval.timing import machine_info, portable_settings, write_json
    from dsbd_jax.models import head as mhead
    from dsbd_jax.loading import heads
    import yaml
    from dsbd_jax.training import head, recipe
    from dsbd_jax.training.head import read_log
    # a distillation recipe has a distill: section; each command reads its own kind
    distill = "distill" in (yaml.safe_load(Path(args.recipe).read_text()) or {})
    command = "distill" if distill else "train-head"
    r = (recipe if distill else head).load_recipe(args.recipe)
    run_dir = Path(_ROOT) / r["run_dir"] if not Path(r["run_dir"]).is_absolute() else \
        Path(r["run_dir"])
    if args.time_log:
        text = Path(args.time_log).read_text(errors="replace")
    else:
        code, text = run_part(command, args.recipe, run_dir)
        if code != 0:
            print(f"dsbd {command} {args.recipe} ended with exit status {code}"
                  + (" (stopped)" if code == 130 else "") + f"; its time is kept in "
                  f"{run_dir / 'time.log'}. Run this same command again to resume the run and "
                  "record all of it.", file=sys.stderr)
            raise SystemExit(code)
    reports = time_reports(text)
    rss = max(r[1] for r in reports)
    parts = [{"what": f"dsbd {command} under /usr/bin/time -v"
              + (f" (run {i + 1} of {len(reports)}"
                 + (", stopped by a signal, then resumed" if stopped else "") + ")"
                 if len(reports) > 1 else ""),
              "wall_s": wall, "peak_rss_kb": peak}
             for i, (wall, peak, stopped) in enumerate(reports)]
    for p in args.part:
        sec, _, what = p.partition(":")
        parts.append({"what": what, "wall_s": float(sec), "peak_rss_kb": None})
    wall = sum(p["wall_s"] for p in parts)
    out = {"machine": machine_info(), "settings": portable_settings(vars(args), _ROOT),
           "dtype": r["dtype"], "command": f"dsbd {command} {args.recipe}",
           "recipe": args.recipe}
    if distill:
        if not (run_dir / "model" / "config.json").is_file():
            raise SystemExit(f"{run_dir / 'model'}: no distilled draft (the run did not finish)")
        out.update(target=str(r["target"]), draft=str(r["draft"]),
                   meta=dataclasses.asdict(r["distill"]))
    else:
        head_dir = run_dir / "head"
        if not heads.is_head_dir(head_dir):
            raise SystemExit(f"{head_dir}: no trained head (the run did not finish)")
        _, params, meta = heads.load(head_dir)
        own = {k: v for k, v in params.items() if k != mhead.VOCAB_HEAD}
        out.update(num_params_own=mhead.num_params(own), meta=meta)
    out.update(wall_s=wall, peak_rss_kb=rss, parts=parts, conditions=args.conditions,
               log=read_log(run_dir))
    write_json(args.out, out)
    print(f"{args.recipe}: {wall / 60:.1f} min, peak {rss / 2 ** 20:.1f} GB; wrote {args.out}")
    return out


if __name__ == "__main__":
    main()
