"""The kernel's memory-map limit (``dsbd_jax/decoding/_jit/compiles.py``): every compiled XLA program
holds memory maps, ``jax.clear_caches()`` gives them back, and a compilation past
``MAP_WARN_FRACTION`` of ``vm.max_map_count`` logs one WARNING that says what to do."""

import json
import logging
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from dsbd_jax.decoding._jit import compiles

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def _compile_fresh(n, salt):
    """``n`` new programs (distinct shapes), kept alive by jax's caches only."""
    for i in range(n):
        jax.jit(lambda x, i=i: jnp.tanh(x @ x.T + i + salt).sum(0))(jnp.ones((4, 3 + i)))


_MAPS_PROBE = """
import gc, json, jax, jax.numpy as jnp
from dsbd_jax.decoding._jit import compiles
def fresh(n):
    for i in range(n):
        jax.jit(lambda x, i=i: jnp.tanh(x @ x.T + i + 0.5).sum(0))(jnp.ones((4, 3 + i)))
fresh(1)                        # the backend's own maps are made before the first count
gc.collect()
used0, limit = compiles.map_usage()
fresh(60)
used1 = compiles.map_usage()[0]
jax.clear_caches()
gc.collect()
used2 = compiles.map_usage()[0]
print(json.dumps([used0, used1, used2, limit]))
"""


@linux_only
def test_compiled_programs_hold_maps_and_clear_caches_frees_them():
    # In a fresh process: in the suite's own process, programs that earlier tests left behind
    # can be collected while these 60 compile, and the count then falls instead of rising.
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    env.pop("XLA_FLAGS", None)
    run = subprocess.run([sys.executable, "-c", _MAPS_PROBE], capture_output=True, text=True,
                         env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    used0, used1, used2, limit = json.loads(run.stdout.strip().splitlines()[-1])
    assert 0 < used0 < limit
    assert used1 > used0 + 60, (used0, used1)  # several maps per program
    assert used2 < used1 - 60, (used1, used2)


def test_warns_once_past_the_fraction_and_again_after_falling_back(monkeypatch, caplog):
    usage = {"now": (100, 1000)}
    monkeypatch.setattr(compiles, "map_usage", lambda: usage["now"])
    monkeypatch.setitem(compiles._MAPS, "warned", False)
    monkeypatch.setitem(compiles._MAPS, "checked", float("-inf"))

    def compile_one(salt):
        compiles._MAPS["checked"] = float("-inf")   # past the once-a-second throttle
        _compile_fresh(1, salt)

    def warnings():
        return [r for r in caplog.records
                if r.levelno == logging.WARNING and "vm.max_map_count" in r.getMessage()]

    with caplog.at_level(logging.WARNING, logger="dsbd_jax"):
        compile_one(0.25)
        assert warnings() == []                    # 10 %: quiet
        usage["now"] = (760, 1000)                 # past 75 %
        compile_one(0.75)
        (w,) = warnings()
        assert "760 memory maps" in w.getMessage() and "jax.clear_caches()" in w.getMessage()
        compile_one(1.25)
        assert len(warnings()) == 1                # once per crossing
        usage["now"] = (300, 1000)
        compile_one(1.75)
        usage["now"] = (800, 1000)
        compile_one(2.25)
        assert len(warnings()) == 2                # fell back, crossed again


def test_check_is_throttled_and_quiet_without_proc(monkeypatch):
    monkeypatch.setitem(compiles._MAPS, "checked", float("-inf"))
    monkeypatch.setitem(compiles._MAPS, "warned", False)
    monkeypatch.setattr(compiles, "map_usage", lambda: (1, 10))
    assert compiles.check_map_usage() == (1, 10)
    assert compiles.check_map_usage() is None          # within the interval: skipped
    assert compiles.check_map_usage(force=True) == (1, 10)
    monkeypatch.setattr(compiles, "map_usage", lambda: None)
    assert compiles.check_map_usage(force=True) is None
