"""Every parameter of every family variant has a sharding rule (q/k norms, Gemma's
sandwich norms), in both weight layouts."""

from __future__ import annotations

import jax
import pytest

from dsbd_jax.models.config import ModelConfig
from dsbd_jax.models.llama import init_params
from dsbd_jax.parallel.rules import logical_axes, path_keys

BASE = dict(vocab_size=32, hidden_size=16, intermediate_size=24, num_layers=2, num_heads=2,
            num_kv_heads=1, head_dim=8)
VARIANTS = {
    "qwen3": dict(qk_norm=True),
    "gemma": dict(qk_norm=True, norm_style="gemma", sandwich_norms=True, embed_scale=True,
                  hidden_act="gelu_tanh", sliding_window=4,
                  layer_types=("sliding_attention", "full_attention"), rope_local_theta=10.0),
}


@pytest.mark.parametrize("layout", ["stacked", "per_layer"])
@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_every_parameter_has_a_rule(name, layout):
    config = ModelConfig(**BASE, **VARIANTS[name])
    shapes = jax.eval_shape(lambda: init_params(config, jax.random.PRNGKey(0), layout))
    seen = set()
    for path, leaf in jax.tree_util.tree_flatten_with_path(shapes)[0]:
        keys = path_keys(path)
        axes = logical_axes(keys, leaf.ndim)
        assert len(axes) == leaf.ndim
        seen.add(keys[-2])
    assert {"q_norm", "k_norm"} <= seen
    if name == "gemma":
        assert {"attn_out_norm", "mlp_out_norm"} <= seen
