"""Where trained draft heads live and how a name finds one: ``CACHE/heads/NAME`` links made by
``dsbd train-head`` (:mod:`dsbd_jax.training.head`), loading a head by name or path, and a
draft source read as a head or a draft model (what the command line and ``dsbd bench`` take as
``draft``)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import List

from dsbd_jax.models import head as mhead
from dsbd_jax.models.presets import cache_root


def cache_dir_of_heads() -> Path:
    return cache_root() / "heads"


def load_head(source, target_config=None):
    """``(HeadConfig, params, meta)`` from a head directory or a name registered by training
    (``CACHE/heads/NAME``); bound to ``target_config`` when given."""
    return mhead.load(head_path(source), target_config)


def head_path(source) -> Path:
    """The directory of a draft head given by path or registered name (``FileNotFoundError``)."""
    path = Path(str(source)).expanduser()
    if mhead.is_head_dir(path):
        return path
    named = cache_dir_of_heads() / str(source)
    if mhead.is_head_dir(named):
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
    return mhead.is_head_dir(path) or mhead.is_head_dir(cache_dir_of_heads() / str(source))


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
        if not mhead.is_head_dir(d):
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
    (:func:`dsbd_jax.models.loading.read_config`)."""
    if is_head_source(source):
        return read_head_config(source, target_config)
    from dsbd_jax.models.loading import read_config
    try:
        return read_config(source, dtype)
    except ValueError as e:
        if "unknown model source" not in str(e):
            raise
        raise ValueError(f"{e}; nor a draft head: no {mhead.CONFIG_FILE} in {source}, and no "
                         f"trained head of that name under {cache_dir_of_heads()} (`dsbd "
                         f"train-head RECIPE` trains and registers one)") from None


class LoadedHead:
    """A loaded draft head, shaped as :func:`~dsbd_jax.models.loading.load_model`'s result is
    (``config``, ``params``, ``info``, ``tokenizer`` None): the head's weights in the target's
    dtype, ``info["draft_head"]`` the metadata saved with it."""

    def __init__(self, source, target_config):
        path = head_path(source)
        self.config, self.params, meta = mhead.load(path, target_config)
        self.info = {"dtype": target_config.dtype, "draft_head": meta, "source": str(path)}
        self.tokenizer = None
