"""Is ``dtype="auto"`` the same on every fresh run of a host, and the kernel form with it? ``dsbd
host`` N times, each with an empty cache folder (``DSBD_JAX_CACHE`` a new temporary folder: the
kernel forms, the compiler options and the dtype are all measured again), for each model;
records every run's dtype, kernel form and the figures it printed (``plan.dtype_choice``'s pass
timings), its whole output (the node budgets and the draft's kind too, the fresh cache's path
replaced), and whether each is the same on every run.

    .venv/bin/python benchmarks/dtype_runs.py --runs 5 --out results/dtype_runs.json  # ~10 min
    .venv/bin/python benchmarks/dtype_runs.py --small --runs 2 --out /tmp/dtype_runs.json
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if _ROOT not in sys.path:  # run as a script from a checkout
    sys.path.insert(0, _ROOT)

MODELS = ("qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-0.5b-instruct")
LINE = re.compile(r"^(?P<model>\S+) \(\d+x\d+\): dtype (?P<dtype>\w+)(?: for any decoder)? "
                  r"\((?P<why>.*)\); kernels (?P<form>\w+)")
# dsbd host's per-decoder lines below a model's (issue 91: a dtype per role and decoder)
FOR = re.compile(r"^  dtype for (?P<who>[^:]+): (?P<dtype>\w+) ")


def one_run(models, env_extra=None):
    """``{model: (dtype, why)}``, the wall seconds and the printed lines of one ``dsbd host``
    with an empty cache."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "DSBD_JAX_CACHE": cache, "DSBD_JAX_COMPILATION_CACHE": "0",
               **(env_extra or {})}
        env.pop("DSBD_JAX_DTYPE", None)
        args = [sys.executable, "-m", "dsbd_jax", "host"]
        for m in models:
            args += ["--model", m]
        t0 = time.perf_counter()
        r = subprocess.run(args, cwd=_ROOT, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise RuntimeError(f"dsbd host: exit {r.returncode}\n{r.stderr[-2000:]}")
    got, last = {}, None
    for line in r.stdout.splitlines():
        m = LINE.match(line)
        if m:
            last = m["model"]
            got[last] = {"dtype": m["dtype"], "form": m["form"],
                         "why": m["why"].replace(cache, "<fresh cache>"), "by_decoder": {}}
        f = FOR.match(line)
        if f and last is not None:
            got[last]["by_decoder"][f["who"]] = f["dtype"]
    return got, wall, [line.replace(cache, "<fresh cache>") for line in r.stdout.splitlines()]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--small", action="store_true",
                    help="a tiny Hugging Face model made here (a check of the script: a model "
                         "this small is float32 without a measurement)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    from dsbd_jax.eval.timing import machine_info, portable_settings, write_json
    models, env = list(args.models), None
    tmp = None
    if args.small:
        from dsbd_jax.testing import make_tiny_pair
        tmp = tempfile.TemporaryDirectory()
        t, _ = make_tiny_pair(tmp.name, seed=0)
        models = [str(t)]
    runs = []
    for i in range(args.runs):
        got, wall, lines = one_run(models, env)
        runs.append({"choices": got, "wall_s": round(wall, 1),
                     "output": lines if not args.small else []})
        print(f"run {i + 1}: " + ", ".join(f"{m} {c['dtype']} {c['form']}"
                                            for m, c in got.items())
              + f" ({wall:.0f} s)", flush=True)
    name = os.path.basename if args.small else str  # --small: no path of this machine
    for r in runs:
        r["choices"] = {name(k): v for k, v in r["choices"].items()}
    names = [name(m) for m in models]
    same = lambda key: {m: len({r["choices"][m][key] for r in runs}) == 1  # noqa: E731
                        for m in names}
    out = {"machine": machine_info(), "settings": portable_settings(vars(args), _ROOT),
           "models": names, "runs": runs, "same_on_every_run": same("dtype"),
           "same_form_on_every_run": same("form")}
    write_json(args.out, out)
    print(f"same dtype on every run: {out['same_on_every_run']}; same kernel form: "
          f"{out['same_form_on_every_run']}; wrote {args.out}")
    if tmp is not None:
        tmp.cleanup()
    return out


if __name__ == "__main__":
    main()
