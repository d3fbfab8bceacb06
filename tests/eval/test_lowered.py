"""Counting a program lowered for a GPU without one (``dsbd_jax.eval.lowered``)."""

import jax
import jax.numpy as jnp
import pytest

from dsbd_jax.decoding import methods
from dsbd_jax.eval.lowered import abstract_params, lowered_text, static_counts
from dsbd_jax.models.config import ModelConfig
from dsbd_jax.models.llama import forward_scope


def _lowered(f, *args, platform="cuda"):
    return jax.jit(f).trace(*args).lower(lowering_platforms=(platform,)).as_text(
        dialect="hlo", debug_info=True)


def _program(trips):
    """A decode-like loop: per iteration a scan of ``trips`` steps under ``verify`` and a
    jitted (called) function under ``warp``; before it, a smaller loop of the entry."""
    @jax.jit
    def warped(x):
        return jnp.exp(x) * 3.0

    def f(x):
        x = jax.lax.fori_loop(0, 2, lambda i, x: x + 1.0, x)     # a small loop of the entry

        def iteration(c):
            i, x = c
            with jax.named_scope("verify"):
                x, _ = jax.lax.scan(lambda x, _: (jnp.sin(x) + jnp.cos(x), None), x, None,
                                    length=trips)
            with jax.named_scope("warp"):
                x = warped(x)
            return i + 1, x
        return jax.lax.while_loop(lambda c: (c[0] < 7) & jnp.all(c[1] < 1e6), iteration,
                                  (0, x))[1]
    return f


@pytest.mark.parametrize("platform", ["cuda", "cpu"])
def test_counts_follow_the_trips_and_the_calls(platform):
    x = jnp.zeros((5, 11), jnp.float32)
    c3, c5, c7 = (static_counts(_lowered(_program(n), x, platform=platform), "no_target")
                  for n in (3, 5, 7))
    # the scan's body counts once per trip (its condition once more): linear in the trips
    per_trip = (c5["ops"]["verify"] - c3["ops"]["verify"]) / 2
    assert per_trip >= 2                                    # sin, cos, add at least
    assert c7["ops"]["verify"] - c5["ops"]["verify"] == 2 * per_trip
    assert 0 <= c3["ops"]["verify"] - 3 * per_trip < per_trip
    # the called function's operations take the scope of its call
    assert c3["ops"]["warp"] == c5["ops"]["warp"] > 0
    assert [(lp["phase"], lp["trips"]) for lp in c3["loops"]] == [("verify", 3)]
    assert c3["loop_trips"] == 3 and c5["loop_trips"] == 5 and c3["unknown_trips"] == 0
    assert c3["ops_outside_passes"] == sum(c3["ops"].values())


def test_a_conditional_counts_every_branch_or_its_first():
    """``lax.cond(p, dense, short)``: ``branches="first"`` counts the short (false) branch only,
    ``"all"`` both; a bad value is refused."""
    def f(x):
        def iteration(c):
            i, x = c
            with jax.named_scope("verify"):
                x = jax.lax.cond(x[0, 0] > 1e3,
                                 lambda: jnp.tanh(jnp.exp(jnp.sin(x)) + jnp.cos(x)),   # dense
                                 lambda: x + 1.0)                                    # short
            return i + 1, x
        return jax.lax.while_loop(lambda c: c[0] < 3, iteration, (0, x))[1]
    text = _lowered(f, jnp.zeros((5, 11), jnp.float32))
    every, first = (static_counts(text, "no_target", branches=b) for b in ("all", "first"))
    assert first["ops"]["verify"] >= 1
    assert every["ops"]["verify"] >= first["ops"]["verify"] + 4     # exp, sin, cos, tanh
    with pytest.raises(ValueError, match="branches"):
        static_counts(text, "no_target", branches="last")


def _tiny(**kw):
    base = dict(vocab_size=97, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                num_kv_heads=2, head_dim=8, eos_token_id=(), dtype="float32")
    base.update(kw)
    return ModelConfig(**base)


def test_decoders_lowered_for_cuda_without_a_gpu():
    target, draft = _tiny(), _tiny(num_layers=1, hidden_size=16, head_dim=4)
    params = {"target": abstract_params(target), "draft": abstract_params(draft)}
    ids, lens = jnp.zeros((1, 16), jnp.int32), jnp.array([5], jnp.int32)
    warp = dict(top_k=10, top_p=0.8, max_new_tokens=8)
    counts = {}
    for name, method, s in [("beam4", "beam", {"num_beams": 4}),
                            ("dsbd", "dsbd", {"gamma": 3, "draft_width": 3})]:
        dec = methods.build(method, target, draft, **warp, **s)
        text = lowered_text(dec, params if dec.needs_draft else params["target"], ids,
                            jax.random.key(0), lens, "cuda")
        counts[name] = static_counts(text, forward_scope(target),
                                     forward_scope(draft) if dec.needs_draft else None,
                                     target.vocab_size)
    beam, dsbd = counts["beam4"], counts["dsbd"]
    assert beam["loops"] == [] and beam["loop_trips"] == 0     # threefry: no loop on GPUs
    assert beam["ops"]["target forward"] > 0 and beam["ops"]["draft forward"] == 0
    assert dsbd["ops"]["draft forward"] > 0 and dsbd["ops"]["verify"] > 0
    # DSBD's verification is a loop over the gamma layers, its forest one over gamma - 1
    phases = sorted((lp["phase"], lp["trips"]) for lp in dsbd["loops"])
    assert ("verify", 3) in phases and dsbd["loop_trips"] >= 3
    assert dsbd["ops_outside_passes"] > beam["ops_outside_passes"]
