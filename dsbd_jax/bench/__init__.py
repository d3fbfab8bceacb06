"""Benchmarks: the harness (``dsbd bench CONFIG``), its plots (``dsbd plot RESULTS``), energy
counters and the timing helpers the scripts in ``benchmarks/`` share.

* :mod:`.harness` -- :func:`load_config` / :func:`make_config`, :func:`run_bench`, :func:`read_records`,
  :func:`summarize`, :func:`comparisons`: methods x settings x prompts -> JSON lines + summary.
* :mod:`.plot` -- Pareto fronts (speed / energy vs quality) and accepted width vs speed, PNG + SVG.
* :mod:`.stats` -- Wilson and bootstrap 95% intervals, paired differences between methods.
* :mod:`.energy` -- NVML / RAPL joule counters (or the reason there is none).
* :mod:`.timing` -- ``timed``, ``compile_and_run``, ``run_over_prompts``, ``machine_info``, ...
"""

from .energy import energy_meter
from .harness import (comparisons, format_summary, kv_cache_bytes, load_config, make_config,
                      plan_batches, quality_differences, read_records, resume_state, run_bench,
                      summarize)
from .stats import bootstrap_interval, paired_difference, wilson_interval
from .timing import (compile_and_run, machine_info, peak_rss_gb, print_table, run_over_prompts,
                     timed, write_json)

__all__ = [
    "bootstrap_interval", "comparisons", "compile_and_run", "energy_meter", "format_summary",
    "kv_cache_bytes", "load_config", "machine_info", "make_config", "paired_difference",
    "peak_rss_gb", "plan_batches", "print_table", "quality_differences", "read_records",
    "resume_state", "run_bench", "run_over_prompts", "summarize", "timed", "wilson_interval",
    "write_json",
]
