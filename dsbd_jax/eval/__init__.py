"""Evaluation: the tasks, the benchmark harness (``dsbd bench CONFIG``), its statistics and plots.

- ``tasks`` / ``datasets``: the tasks (examples, scorers) and the offline prompts; ``vocab``:
  token-frequency tables for truncated draft heads.
- the harness: ``plan`` (the config file, the prompts' batches), ``run`` (:func:`run_bench`),
  ``records`` (the JSON lines, resuming) and ``summary`` (rows, comparisons, paired differences).
- ``stats``: Wilson and bootstrap 95% intervals; ``plot``: Pareto fronts, PNG + SVG.
- ``energy``: NVML / RAPL joule counters; ``timing``: timers and ``machine_info`` (shared by
  ``benchmarks/`` and the CLI).
- ``profile``, ``lowered``, ``hlo``: where a decoder's time goes and what its programs hold.

May import: ``dsbd_jax.models``, ``dsbd_jax.decoding`` and ``dsbd_jax.parallel``; never ``cli``.
"""

from dsbd_jax.eval.energy import energy_meter
from dsbd_jax.eval.plan import load_config, make_config, plan_batches
from dsbd_jax.eval.records import read_records, resume_state
from dsbd_jax.eval.run import kv_cache_bytes, run_bench
from dsbd_jax.eval.stats import bootstrap_interval, paired_difference, wilson_interval
from dsbd_jax.eval.summary import comparisons, format_summary, quality_differences, summarize
from dsbd_jax.eval.timing import (compile_and_run, machine_info, peak_rss_gb, print_table,
                                  run_over_prompts, timed, write_json)

__all__ = [
    "bootstrap_interval", "comparisons", "compile_and_run", "energy_meter", "format_summary",
    "kv_cache_bytes", "load_config", "machine_info", "make_config", "paired_difference",
    "peak_rss_gb", "plan_batches", "print_table", "quality_differences", "read_records",
    "resume_state", "run_bench", "run_over_prompts", "summarize", "timed", "wilson_interval",
    "write_json",
]
