"""Hugging Face hub ids (``"Qwen/Qwen3-1.7B"``) -> a local checkpoint directory.

:func:`snapshot` resolves an id through ``huggingface_hub.snapshot_download``, fetching only what
:func:`dsbd_jax.loading.hf.load_hf_checkpoint` reads (:data:`HUB_FILES`: the config, tokenizer
files and safetensors weights, never ``*.bin`` / ``*.pt`` / ``*.gguf`` duplicates). The usual
environment applies, read by ``huggingface_hub`` itself: ``HF_HOME`` / ``HF_HUB_CACHE`` (where the
cache lives), ``HF_TOKEN`` (gated or private repositories), ``HF_HUB_OFFLINE=1`` (the local cache
only, no network). A revision (branch, tag or commit) is ``revision=`` or the id's ``@rev``
suffix (``"org/name@v1.0"``, what the CLI takes).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional, Tuple

HUB_FILES = ("config.json", "generation_config.json", "*.safetensors",
             "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
             "tokenizer.model", "special_tokens_map.json", "vocab.json", "merges.txt",
             "added_tokens.json", "chat_template.jinja", "chat_template.json")

_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")


def is_hub_id(name: str) -> bool:
    """Does ``name`` look like ``org/name`` (optionally ``@revision``)? (Checked only after it
    turned out not to be a local path.)"""
    return bool(_ID.match(name)) and ".." not in name


def split_revision(name: str, revision: Optional[str] = None) -> Tuple[str, Optional[str]]:
    """``("org/name", revision)`` from ``"org/name@rev"``; a ``revision`` argument that
    contradicts the suffix is an error."""
    repo, _, rev = name.partition("@")
    if rev and revision is not None and rev != revision:
        raise ValueError(f"{name!r} names revision {rev!r} but revision={revision!r} was given")
    return repo, (rev or revision)


def snapshot(name: str, revision: Optional[str] = None) -> Path:
    """The local directory of hub id ``name`` at ``revision`` (downloaded or from the cache);
    ``ValueError`` in one line when it is neither cached nor reachable."""
    repo, rev = split_revision(name, revision)
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.constants import HF_HUB_CACHE, HF_HUB_OFFLINE
    except ImportError as err:  # a dependency, but say what is missing
        raise ValueError(f"loading hub id {repo!r} needs huggingface_hub ({err})") from None
    try:
        path = snapshot_download(repo, revision=rev, allow_patterns=list(HUB_FILES))
    except Exception as err:  # offline miss, unknown repo / revision, no network, gated
        where = "HF_HUB_OFFLINE=1 and it is not" if HF_HUB_OFFLINE else "it is neither reachable nor"
        reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ValueError(f"cannot load {repo!r}" + (f" at revision {rev!r}" if rev else "")
                         + f" from the Hugging Face hub: {where} in the local cache "
                         f"{HF_HUB_CACHE} ({type(err).__name__}: {reason})") from None
    return Path(path)
