"""``dsbd_jax.models.axes``: a cache states its axes; the caller's mesh and logical-axis rules
decide what that means, and without them nothing is added to the program."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import pytest
from jax.sharding import PartitionSpec as P

from dsbd_jax.models import axes
from dsbd_jax.models import cache as kvc
from dsbd_jax.models.config import ModelConfig

CFG = ModelConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=4,
                  num_kv_heads=2, head_dim=4)
RULES = (("batch", "data"), ("kv_heads", "model"))


def _mesh():
    return jax.make_mesh((1, 1), ("data", "model"), axis_types=(jax.sharding.AxisType.Auto,) * 2)


def _constraints(fn, *args) -> int:
    return str(jax.make_jaxpr(fn)(*args)).count("sharding_constraint")


def test_no_mesh_no_rules_is_the_identity():
    x = jnp.ones((2, 3, 4, 2, 4))
    assert axes.partition(axes.CACHE, x.shape) is None
    assert axes.shards("batch", 4) == 1
    make = lambda: kvc.empty_cache(CFG, 3, 8)          # noqa: E731
    assert _constraints(make) == 0
    with nn.logical_axis_rules(RULES):                   # rules without a mesh: still nothing
        assert _constraints(make) == 0
    with jax.set_mesh(_mesh()):                          # a mesh without rules: still nothing
        assert _constraints(make) == 0


def test_mesh_and_rules_state_the_cache_layout():
    with jax.set_mesh(_mesh()), nn.logical_axis_rules(RULES):
        assert axes.partition(axes.CACHE, (2, 4, 8, 2, 4)) == P(None, "data", None, "model", None)
        assert _constraints(lambda: kvc.empty_cache(CFG, 4, 8)) == 2      # k and v
    with jax.set_mesh(_mesh()), nn.logical_axis_rules((("batch", None), ("kv_heads", "model"))):
        assert axes.partition(axes.CACHE, (2, 4, 8, 2, 4)) == P(None, None, None, "model", None)
    with pytest.raises(ValueError, match="do not match shape"):
        with jax.set_mesh(_mesh()), nn.logical_axis_rules(RULES):
            axes.partition(axes.CACHE, (2, 4))


def test_indivisible_axes_stay_whole():
    """A mesh axis that does not divide a dimension leaves it whole (abstract 2 x 3 mesh)."""
    mesh = jax.sharding.AbstractMesh((2, 3), ("data", "model"))
    with jax.sharding.use_abstract_mesh(mesh), nn.logical_axis_rules(RULES):
        assert axes.partition(axes.CACHE, (2, 4, 8, 3, 4)) == P(None, "data", None, "model", None)
        assert axes.partition(axes.CACHE, (2, 5, 8, 2, 4)) == P(None, None, None, None, None)
        assert axes.shards("batch", 8) == 2 and axes.shards("batch", 5) == 1
        assert axes.shards("kv_heads", 6) == 3 and axes.shards("slots", 8) == 1


def test_gather_rows_is_the_same_with_and_without_the_context():
    c = kvc.KVCache(jax.random.normal(jax.random.key(0), (2, 4, 8, 2, 4)),
                    jax.random.normal(jax.random.key(1), (2, 4, 8, 2, 4)))
    rows = jnp.array([1, 1, 3, 2])
    plain = kvc.gather_rows(c, rows)
    with jax.set_mesh(_mesh()), nn.logical_axis_rules(RULES):
        ruled = jax.jit(kvc.gather_rows)(c, rows)
    assert jnp.array_equal(plain.k, ruled.k) and jnp.array_equal(plain.v, ruled.v)
    assert jnp.array_equal(plain.k, c.k[:, rows])
