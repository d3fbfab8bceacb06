"""Benchmarks: the harness (``dsbd bench CONFIG``), its plots (``dsbd plot RESULTS``), energy
counters and the timing helpers the scripts in ``benchmarks/`` share.

* :mod:`.harness` -- :func:`load_config` / :func:`make_config`, :func:`run_bench`, :func:`read_records`,
  :func:`summarize`, :func:`comparisons`: methods x settings x prompts -> JSON lines + summary.
* :mod:`.plot` -- Pareto fronts (speed / energy vs quality) and accepted width vs speed, PNG + SVG.
* :mod:`.energy` -- NVML / RAPL joule counters (or the reason there is none).
* :mod:`.timing` -- ``timed``, ``compile_and_run``, ``run_over_prompts``, ``machine_info``, ...
"""

from .energy import energy_meter
from .harness import (comparisons, format_summary, kv_cache_bytes, load_config, make_config,
                      read_records, run_bench, summarize)
from .timing import (compile_and_run, machine_info, peak_rss_gb, print_table, run_over_prompts,
                     timed, write_json)

__all__ = [
    "comparisons", "compile_and_run", "energy_meter", "format_summary", "kv_cache_bytes",
    "load_config", "machine_info", "make_config", "peak_rss_gb", "print_table", "read_records", "run_bench",
    "run_over_prompts", "summarize", "timed", "write_json",
]
