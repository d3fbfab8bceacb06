"""A preset's parameters in the form a host runs them: per-layer, transposed or int8 kernels,
written once by :func:`save_host_layout` under ``<cache>/<preset>/params-v1-host-*`` and read
back memory-mapped by :func:`load_host_layout` (``dsbd_jax.loading.load._host_form`` names the
folder and the key each load's form is cached under)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import jax.numpy as jnp

from dsbd_jax.loading.checkpoint import config_from_json, config_to_json
from dsbd_jax.loading.presets import _PARAMS_DIR, _lock, drop_joined_gguf, get_preset, preset_dir
from dsbd_jax.models import weights
from dsbd_jax.models.config import ModelConfig


def host_layout_dir_name(dtype_name: str, layout: str, form: str, head_rows_form: bool) -> str:
    """The folder of a preset's parameters in the form a host runs them: dtype, layout
    (``per_layer`` / ``stacked``), kernel form (``plain`` / ``transposed``) and whether the
    head is stored as ``[V, d]`` rows."""
    return (f"{_PARAMS_DIR}-host-{jnp.dtype(dtype_name).name}-{layout}-{form}"
            + ("-rowhead" if head_rows_form else ""))


def _flatten(tree, prefix=()):
    for k, v in tree.items():
        if not isinstance(k, str) or "." in k or "/" in k:
            raise ValueError(f"parameter key {k!r} cannot name a file")
        if isinstance(v, dict):
            yield from _flatten(v, prefix + (k,))
        else:
            yield prefix + (k,), v


def save_host_layout(name: str, folder: str, params, config: ModelConfig, dtype, key: dict,
                     cache_dir=None) -> Path:
    """Write ``params`` (any nesting of dicts, e.g. per-layer with transposed kernels) to
    ``<cache>/<preset>/<folder>/`` (one ``.npy`` per leaf, :func:`save_host`, and
    ``config.json`` with ``key``: what the form was made from), published by an atomic rename.
    A folder made from another file or ``key`` (an older format) is replaced: renamed aside
    first, so a process that mapped its files keeps reading them. Returns the folder."""
    from dsbd_jax.loading.checkpoint import save_host
    directory = preset_dir(name, cache_dir)
    final = directory / folder
    with _lock(directory):
        if (final / "config.json").exists():
            try:
                old = json.loads((final / "config.json").read_text())
            except (OSError, ValueError):
                old = {}
            if old.get("sha256") == get_preset(name).sha256 and old.get("key") == key:
                return final
            stale = directory / f"{folder}.stale-{os.getpid()}"
            shutil.rmtree(stale, ignore_errors=True)
            os.replace(final, stale)
            shutil.rmtree(stale, ignore_errors=True)
        tmp = directory / f"{folder}.partial-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            leaves, kinds = [], {}
            for path, leaf in _flatten(params):
                if weights.is_kernel(leaf):  # a typed kernel: one file per array, its kind named
                    kinds[".".join(path)] = type(leaf).__name__
                    for field in leaf.fields:
                        value = getattr(leaf, field)
                        save_host(tmp / (".".join(path + (field,)) + ".npy"), value,
                                  value.dtype if leaf.stored else dtype)
                else:                    # a leaf narrower than the model's dtype keeps its own
                    save_host(tmp / (".".join(path) + ".npy"), leaf,
                              _narrower(getattr(leaf, "dtype", dtype), dtype) or dtype)
                leaves.append(list(path))
            meta = {"preset": name, "sha256": get_preset(name).sha256, "key": key,
                    "config": config_to_json(config), "leaves": leaves, "kinds": kinds}
            (tmp / "config.json").write_text(json.dumps(meta, indent=1))
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        drop_joined_gguf(name, cache_dir)
    return final


def _narrower(own, dtype):
    """``own`` (a leaf's or a cache file's dtype) where it is a floating dtype narrower than
    ``dtype`` (an int8 model's bfloat16 embedding in a float32 model), else ``None``: such a
    leaf is written and read back in its own dtype."""
    own = jnp.dtype(own)
    if (jnp.issubdtype(own, jnp.floating) and jnp.issubdtype(jnp.dtype(dtype), jnp.floating)
            and own.itemsize < jnp.dtype(dtype).itemsize):
        return own
    return None


def load_host_layout(name: str, folder: str, dtype, key: dict, cache_dir=None):
    """``(config, params)`` written by :func:`save_host_layout` when its folder exists and was
    made from the same preset file and ``key``; else ``None``. A read: each leaf memory-mapped
    and copied to the device as it is."""
    from dsbd_jax.loading.checkpoint import _to_device, load_host
    final = preset_dir(name, cache_dir) / folder
    if not (final / "config.json").exists():
        return None
    meta = json.loads((final / "config.json").read_text())
    if meta.get("sha256") != get_preset(name).sha256 or meta.get("key") != key:
        return None
    dtype = jnp.dtype(dtype)

    def read(path, own=False):   # own: the file's dtype, else the model's unless narrower
        host = load_host(final / (".".join(path) + ".npy"))
        keep = own or _narrower(host.dtype, dtype) is not None
        return _to_device(tuple(path), host, host.dtype if keep else dtype)
    params: dict = {}
    for path in meta["leaves"]:
        tree = params
        for k in path[:-1]:
            tree = tree.setdefault(k, {})
        kind = meta.get("kinds", {}).get(".".join(path))
        if kind is None:
            tree[path[-1]] = read(path)
        else:  # a typed kernel: one file per array
            cls = weights.kind(kind)
            tree[path[-1]] = cls(*(read(path + [f], cls.stored) for f in cls.fields))
    return config_from_json(meta["config"], dtype.name), params
