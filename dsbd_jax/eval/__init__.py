"""Evaluation: the tasks, the benchmark harness (``dsbd bench CONFIG``), its statistics and plots.

- ``tasks`` / ``datasets``: the evaluation tasks (loaders of examples, scorers of a completion)
  and prompts from the offline evaluation sets.
- the harness, one concern per module: ``plan`` (the config file, whose keys it documents, the
  prompts and their batches: :func:`load_config`, :func:`make_config`, :func:`plan_batches`),
  ``run`` (:func:`run_bench` and its measurement pieces such as :func:`kv_cache_bytes`),
  ``records`` (the JSON lines: :func:`read_records`, :func:`resume_state`) and ``summary``
  (:func:`summarize`, :func:`comparisons`, :func:`quality_differences`, :func:`format_summary`).
- ``stats``: Wilson and bootstrap 95% intervals, paired differences between methods.
- ``plot``: Pareto fronts (speed / energy vs quality) and accepted width vs speed, PNG + SVG
  (``dsbd plot RESULTS``).
- ``energy``: NVML / RAPL joule counters (or the reason there is none).
- ``timing``: ``timed``, ``compile_and_run``, ``run_over_prompts``, ``machine_info``, ... (shared
  by the scripts in ``benchmarks/`` and the CLI).
- ``profile``: where a decoder's time goes, phase by phase, under the XLA:CPU profiler.

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
