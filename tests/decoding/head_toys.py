"""Toy draft heads for the exactness tests: a head over ``exact_reference.toy_model`` targets."""

from __future__ import annotations

import jax
import numpy as np

from dsbd_jax.models import head as mhead


def toy_head(target_config, seed: int = 5, intermediate: int = 16, feature_layers=()):
    """``(HeadConfig, params)`` with every weight redrawn at O(1) scale (as ``toy_model`` does:
    kernels ~ N(0, 1 / fan_in), norms 1, biases 0), so the head's next-token distributions
    differ from the target's and depend on the token, the feature and the context."""
    config = mhead.HeadConfig(target_config, intermediate_size=intermediate,
                              feature_layers=tuple(feature_layers))
    shapes = jax.eval_shape(lambda: mhead.init_params(config, jax.random.PRNGKey(0)))
    leaves, treedef = jax.tree_util.tree_flatten_with_path(shapes)
    rng = np.random.default_rng(seed)
    new = []
    for path, leaf in leaves:
        name = getattr(path[-1], "key", str(path[-1]))
        if name == "weight":
            value = np.ones(leaf.shape)
        elif name == "bias":
            value = np.zeros(leaf.shape)
        else:
            value = rng.normal(0.0, 1.0 / np.sqrt(leaf.shape[0]), leaf.shape)
        new.append(np.asarray(value, leaf.dtype))
    return config, jax.tree_util.tree_unflatten(treedef, new)
