"""Host: how this machine runs a model fastest, measured once and cached per host.

- ``plan``: :class:`HostPlan` and ``dtype="auto"`` (float32 or bfloat16).
- ``forms``: the kernel form per model shape, and whether a draft runs faster as int8 codes.
- ``cpu_options``: XLA:CPU compiler options per kernel form, ``tuned_jit``, the plan cache
  ``$DSBD_JAX_CACHE/host_plan.json`` and the cache folder.
- ``cpu_info``: the CPU's model name and deciding flags (``$DSBD_JAX_CPU_FLAGS`` stands in).
- ``pass_probe``: the probe passes behind these choices; ``forest_budget``: DSBD's node budget;
  ``compilation_cache``: JAX's persistent cache.

A new per-host choice goes here. May import :mod:`dsbd_jax.models`, never :mod:`dsbd_jax.loading`
or the decoders; nothing here changes what a model computes, only how fast it runs.
"""
