"""JAX's persistent compilation cache under the project's cache folder, so a compiled program
(a decoder, a model's forward) is compiled once per host and read back by later processes.

:func:`enable_compilation_cache` points ``jax_compilation_cache_dir`` at
``<cache>/xla`` (``<cache>``: ``$DSBD_JAX_CACHE``, default ``~/.cache/dsbd_jax``) and keeps
programs whose compilation took at least ``MIN_COMPILE_S`` seconds. The ``dsbd`` command line
and :func:`dsbd_jax.loading.load.load_model` call it; ``DSBD_JAX_COMPILATION_CACHE=0`` (or
``false`` / ``no``) leaves it off, and a cache folder already set
(``JAX_COMPILATION_CACHE_DIR`` or ``jax.config``) is kept as it is. JAX keys every entry by the
program, the compiler options, the jax/jaxlib version and the devices, so an entry never
answers for another build or machine.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

# programs that compile faster than this are not written (they cost more to read back than
# to compile; the decoders' programs take seconds to tens of seconds on a CPU)
MIN_COMPILE_S = 1.0
ENV = "DSBD_JAX_COMPILATION_CACHE"


def compilation_cache_wanted() -> bool:
    """``False`` when ``$DSBD_JAX_COMPILATION_CACHE`` is ``0`` / ``false`` / ``no`` / ``off``."""
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def enable_compilation_cache(cache_dir=None) -> Optional[Path]:
    """Turn on JAX's persistent compilation cache in ``<cache>/xla`` (``cache_dir``: default
    ``$DSBD_JAX_CACHE`` or ``~/.cache/dsbd_jax``). Returns the folder in use, or ``None`` when
    ``$DSBD_JAX_COMPILATION_CACHE`` turns it off. A folder already configured is kept."""
    if not compilation_cache_wanted():
        return None
    import jax

    from dsbd_jax.host.cpu_options import cache_root
    current = jax.config.jax_compilation_cache_dir
    if current:
        return Path(current)
    folder = cache_root(cache_dir) / "xla"
    folder.mkdir(parents=True, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", str(folder))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_S)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return folder
