"""Host: how this machine runs a model fastest, measured once and cached per host.

- ``plan``: :class:`HostPlan` and ``dtype="auto"`` (float32 or bfloat16, from the CPU's flags
  and a short timing of the passes every drafted decoder runs).
- ``forms``: the kernel form (plain or transposed) per model shape, and whether a draft's
  kernels run faster as int8 codes.
- ``cpu_options``: XLA:CPU compiler options per kernel form, ``tuned_jit`` (a ``jax.jit`` under
  those options), the plan cache ``$DSBD_JAX_CACHE/host_plan.json`` and the cache folder.
- ``cpu_info``: the CPU's model name and deciding flags (plain Python; ``$DSBD_JAX_CPU_FLAGS``
  stands in for the flags).
- ``pass_probe``: the probe passes behind these choices (a model cut to a few blocks).
- ``forest_budget``: DSBD's forest node budget per target on this host.
- ``compilation_cache``: JAX's persistent compilation cache in the library's cache folder.

A new per-host choice goes here. May import :mod:`dsbd_jax.models` (to time its passes), never
:mod:`dsbd_jax.loading` or the decoders; nothing here changes what a model computes, only how
fast it runs.
"""
