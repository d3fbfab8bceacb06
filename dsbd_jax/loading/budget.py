"""Accelerator memory budget of a model from its config: parameters + KV cache (+ one pass's
logits), so one can check before loading whether a model fits a device.

Parameters: every shape of :func:`dsbd_jax.loading.checkpoint.param_shapes` times the dtype's
bytes; KV cache: keys and values ``[L, rows, slots, K, D]`` in the model's dtype for ``beams``
rows of ``slots`` slots (prompt + new tokens + lookahead); logits: one pass's ``[tokens, V]``
float32 (DSBD's target pass: ``Wc + gamma * draft_width`` tokens per prompt). Run it as
``python -m dsbd_jax.loading.budget SOURCE_OR_CONFIG_JSON --dtype bfloat16 --beams 4 --slots
2048 --device-gb 16`` (see ``docs/models.md``). Compiled programs' workspace and the runtime's
own reserve come on top; keep a margin.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Dict, Optional

import jax.numpy as jnp

from dsbd_jax.loading.checkpoint import param_shapes
from dsbd_jax.models.config import ModelConfig

GIB = 1024 ** 3


def memory_budget(config: ModelConfig, beams: int, slots: int, pass_tokens: int = 0,
                  dtype: Optional[str] = None) -> Dict[str, float]:
    """Bytes of ``params``, ``kv_cache``, ``logits`` and their ``total`` (see module doc);
    ``dtype`` defaults to ``config.dtype``."""
    if beams < 1 or slots < 1 or pass_tokens < 0:
        raise ValueError(f"beams and slots must be >= 1 and pass_tokens >= 0, got "
                         f"{beams}, {slots}, {pass_tokens}")
    size = jnp.dtype(dtype or config.dtype).itemsize
    n_params = sum(math.prod(s) for s in param_shapes(config).values())
    kv = 2 * config.num_layers * beams * slots * config.num_kv_heads * config.head_dim * size
    logits = 4 * pass_tokens * config.vocab_size
    out = dict(num_params=float(n_params), params=float(n_params * size), kv_cache=float(kv),
               kv_per_token=float(kv / (beams * slots)), logits=float(logits))
    out["total"] = out["params"] + out["kv_cache"] + out["logits"]
    return out


def format_budget(config: ModelConfig, budget: Dict[str, float], beams: int, slots: int,
                  device_gb: Optional[float] = None) -> str:
    """The budget as a few lines of text (GiB), with the headroom on a ``device_gb`` device."""
    lines = [f"{config.architecture}: {budget['num_params'] / 1e9:.2f} B parameters, "
             f"L={config.num_layers} K={config.num_kv_heads} D={config.head_dim} "
             f"V={config.vocab_size}",
             f"  parameters           {budget['params'] / GIB:8.2f} GiB",
             f"  KV cache {beams} x {slots:<6d}    {budget['kv_cache'] / GIB:8.2f} GiB "
             f"({budget['kv_per_token'] / 1024:.0f} KiB per token)",
             f"  logits of one pass   {budget['logits'] / GIB:8.2f} GiB",
             f"  total                {budget['total'] / GIB:8.2f} GiB"]
    if device_gb is not None:
        room = device_gb * GIB - budget["total"]
        lines.append(f"  on {device_gb:g} GiB: {'fits' if room >= 0 else 'does NOT fit'}, "
                     f"{room / GIB:+.2f} GiB left"
                     + (f" (= {int(room // budget['kv_per_token'])} more cached tokens)"
                        if room > 0 else ""))
    return "\n".join(lines)


def _config(source: str, dtype: str) -> ModelConfig:
    path = Path(source).expanduser()
    if path.suffix == ".json" and path.is_file():
        from dsbd_jax.loading.hf import config_from_hf
        return config_from_hf(json.loads(path.read_text()), dtype)
    from dsbd_jax.loading.load import read_config
    return read_config(source, jnp.dtype(dtype))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python -m dsbd_jax.loading.budget", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("source", help="config.json, checkpoint directory, GGUF, preset or hub id")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--beams", type=int, default=4, help="cache rows (beams x prompts)")
    p.add_argument("--slots", type=int, default=2048, help="slots per row")
    p.add_argument("--pass-tokens", type=int, default=0, help="tokens of one forward pass")
    p.add_argument("--device-gb", type=float, default=None, help="device memory in GiB")
    a = p.parse_args(argv)
    config = _config(a.source, a.dtype)
    budget = memory_budget(config, a.beams, a.slots, a.pass_tokens)
    print(format_budget(config, budget, a.beams, a.slots, a.device_gb))


if __name__ == "__main__":
    main()
