"""Draft heads on disk: the file format (:func:`save`, :func:`load`: ``head.safetensors`` and
``head_config.json``), where trained heads live and how a name finds one (``CACHE/heads/NAME``
links made by ``dsbd train-head``, :mod:`dsbd_jax.training.head`), loading a head by name or
path, and a draft source read as a head or a draft model (what the command line and ``dsbd
bench`` take as ``draft``). What a head is and computes: :mod:`dsbd_jax.models.head`."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import List

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np

from dsbd_jax.host.forms import choose_form
from dsbd_jax.loading.presets import cache_root
from dsbd_jax.models import head as mhead
from dsbd_jax.models import kinds
from dsbd_jax.models.config import ModelConfig
from dsbd_jax.models.kinds import unblock_params
from dsbd_jax.models.products import TRANSPOSED



# ---------------------------------------------------------------------------------------------
# a head on disk: safetensors and a config next to it
def save(path, config: mhead.HeadConfig, params, meta: Optional[dict] = None) -> Path:
    """Write ``head.safetensors`` and ``head_config.json`` (with ``meta``) into directory
    ``path``. The kernels are written in the plain ``[in, out]`` form whatever form they run
    in (a block copied from a transposed target), so that the file loads on any host."""
    from safetensors.numpy import save_file
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    flat = {}
    for p, x in jax.tree_util.tree_flatten_with_path(unblock_params(params))[0]:
        name = ".".join(str(getattr(k, "key", k)) for k in p)
        a = np.asarray(jax.device_get(x))
        flat[name] = a.astype(np.float32) if a.dtype.name == "bfloat16" else a
    save_file(flat, str(path / mhead.WEIGHTS_FILE))
    (path / mhead.CONFIG_FILE).write_text(json.dumps({**config.to_dict(), "meta": meta or {}},
                                               indent=2, default=str))
    return path


def is_head_dir(path) -> bool:
    path = Path(path)
    return (path / mhead.CONFIG_FILE).is_file() and (path / mhead.WEIGHTS_FILE).is_file()


def load(path, target_config: Optional[ModelConfig] = None):
    """``(HeadConfig, params, meta)`` from a directory written by :func:`save`. The weights take the
    target's dtype when ``target_config`` is given (a head trained in float32 runs beside a
    bfloat16 target), its block's kernels then in this host's form (:func:`in_host_form`);
    ``ValueError`` if the head was made for another target shape."""
    from safetensors.numpy import load_file
    path = Path(path)
    if not is_head_dir(path):
        raise FileNotFoundError(f"no draft head at {path} (needs {mhead.CONFIG_FILE} and "
                                f"{mhead.WEIGHTS_FILE})")
    d = json.loads((path / mhead.CONFIG_FILE).read_text())
    config = mhead.HeadConfig.from_dict(d)
    if target_config is not None:
        t = config.target
        for k in ("vocab_size", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                  "num_layers"):
            if getattr(t, k) != getattr(target_config, k):
                raise ValueError(f"the draft head at {path} was made for a target with {k} = "
                                 f"{getattr(t, k)}, this target has {getattr(target_config, k)}")
        config = dataclasses.replace(config, target=target_config)
    dt = config.jnp_dtype
    params: dict = {}
    for name, a in load_file(str(path / mhead.WEIGHTS_FILE)).items():
        node = params
        keys = name.split(".")
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        x = jnp.asarray(a)
        node[keys[-1]] = x if keys[-1] == "rows" else x.astype(dt)
    mhead.check_params(config, params)
    if target_config is not None:
        params = in_host_form(config, params)
    return config, params, d.get("meta", {})


def in_host_form(config: mhead.HeadConfig, params: dict) -> dict:
    """``params`` with the block's projection kernels in the form ``load_model`` gives a model
    of the block's shape and dtype on this host (:func:`dsbd_jax.host.forms.choose_form`,
    cached per host; ``$DSBD_JAX_KERNEL_FORM`` forces it): transposed ``[out, in]`` row blocks
    where that form was measured faster (16-bit kernels on AVX512-BF16 hosts: the bfloat16
    ``[in, out]`` product takes XLA:CPU's slow path), else unchanged. :func:`load` applies it when
    it binds a head to its target, so a head drafts in its target's form; :func:`save` writes
    plain kernels whatever the form. Converts ``params`` in place."""
    block = config.block
    if choose_form(block, block.dtype) != TRANSPOSED:
        return params
    return kinds.transpose_params_(params, kinds.transposed_widths(block))


def cache_dir_of_heads() -> Path:
    return cache_root() / "heads"


def load_head(source, target_config=None):
    """``(HeadConfig, params, meta)`` from a head directory or a name registered by training
    (``CACHE/heads/NAME``); bound to ``target_config`` when given."""
    return load(head_path(source), target_config)


def head_path(source) -> Path:
    """The directory of a draft head given by path or registered name (``FileNotFoundError``)."""
    path = Path(str(source)).expanduser()
    if is_head_dir(path):
        return path
    named = cache_dir_of_heads() / str(source)
    if is_head_dir(named):
        return named
    raise FileNotFoundError(f"no draft head {source!r}: neither a directory with "
                            f"{mhead.CONFIG_FILE} nor a trained head's name under "
                            f"{cache_dir_of_heads()}")


def read_head_config(source, target_config) -> mhead.HeadConfig:
    """A head's config (its JSON only, no weights), checked against and bound to the target's."""
    d = json.loads((head_path(source) / mhead.CONFIG_FILE).read_text())
    config = mhead.HeadConfig.from_dict(d)
    for k in ("vocab_size", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "num_layers"):
        if getattr(config.target, k) != getattr(target_config, k):
            raise ValueError(f"the draft head {source!r} was made for a target with {k} = "
                             f"{getattr(config.target, k)}, this target has "
                             f"{getattr(target_config, k)}")
    return dataclasses.replace(config, target=target_config)


def is_head_source(source) -> bool:
    """Whether ``source`` names a draft head (a head directory or a registered name)."""
    path = Path(str(source)).expanduser()
    return is_head_dir(path) or is_head_dir(cache_dir_of_heads() / str(source))


def trained_heads(target_source) -> List[Path]:
    """The registered heads (``CACHE/heads/NAME``) trained for ``target_source`` (the recipe's
    ``target``: a preset name or a path, compared as written and as a resolved path), newest
    first."""
    root = cache_dir_of_heads()
    if not root.is_dir():
        return []
    want = {str(target_source), str(Path(str(target_source)).expanduser().resolve())}
    found = []
    for d in root.iterdir():
        if not is_head_dir(d):
            continue
        try:
            meta = json.loads((d / mhead.CONFIG_FILE).read_text()).get("meta") or {}
        except (OSError, ValueError):
            continue
        t = meta.get("target")
        if t is not None and (str(t) in want
                              or str(Path(str(t)).expanduser().resolve()) in want):
            found.append(d)
    return sorted(found, key=lambda d: (d / mhead.WEIGHTS_FILE).stat().st_mtime, reverse=True)


def register(name: str, head_dir) -> Path:
    link = cache_dir_of_heads() / name
    link.parent.mkdir(parents=True, exist_ok=True)
    if link.is_symlink() or link.exists():
        link.unlink()
    link.symlink_to(Path(head_dir).resolve(), target_is_directory=True)
    return link


def read_draft_config(source, target_config, dtype="auto"):
    """A draft's config before any weight is read: a draft head's (``source`` names a head
    directory or a trained head), bound to ``target_config``; else the draft model's
    (:func:`dsbd_jax.loading.load.read_config`)."""
    if is_head_source(source):
        return read_head_config(source, target_config)
    from dsbd_jax.loading.load import read_config
    try:
        return read_config(source, dtype)
    except ValueError as e:
        if "unknown model source" not in str(e):
            raise
        raise ValueError(f"{e}; nor a draft head: no {mhead.CONFIG_FILE} in {source}, and no "
                         f"trained head of that name under {cache_dir_of_heads()} (`dsbd "
                         f"train-head RECIPE` trains and registers one)") from None


class LoadedHead:
    """A loaded draft head, shaped as :func:`~dsbd_jax.loading.load.load_model`'s result is
    (``config``, ``params``, ``info``, ``tokenizer`` None): the head's weights in the target's
    dtype, ``info["draft_head"]`` the metadata saved with it."""

    def __init__(self, source, target_config):
        path = head_path(source)
        self.config, self.params, meta = load(path, target_config)
        self.info = {"dtype": target_config.dtype, "draft_head": meta, "source": str(path)}
        self.tokenizer = None
