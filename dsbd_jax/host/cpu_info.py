"""The host's CPU: its model name and the flags that decide how it runs a model.

Plain Python (no jax): the command line's benchmark and the host plan read the same answers.
"""

from __future__ import annotations

import functools
import os


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; ``platform.processor()`` elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform
    return platform.processor() or platform.machine()


# the CPU flags that decide which products, dtypes and options are fastest on a host: two hosts
# with the same model name (e.g. "Intel(R) Xeon(R) Processor") may differ in them
DECIDING_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx512_fp16",
                  "amx_tile", "amx_bf16", "amx_int8")


FLAGS_ENV = "DSBD_JAX_CPU_FLAGS"


@functools.lru_cache(maxsize=1)
def cpu_flags() -> tuple:
    """The host's CPU flags among ``DECIDING_FLAGS`` (``/proc/cpuinfo``; empty elsewhere).
    ``$DSBD_JAX_CPU_FLAGS`` (comma-separated, e.g. ``avx2,fma``) stands in for them: the plan
    of a host with those flags (its prior dtype) is then made and cached under their key, apart
    from the real host's entries (tests of an AVX2-only host on any machine)."""
    forced = os.environ.get(FLAGS_ENV)
    if forced is not None:
        have = {f.strip() for f in forced.split(",") if f.strip()}
        return tuple(flag for flag in DECIDING_FLAGS if flag in have)
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return tuple(flag for flag in DECIDING_FLAGS if flag in have)
    except OSError:
        pass
    return ()
