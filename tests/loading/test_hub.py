"""Hub ids without a network: a tiny pair written into a local Hugging Face hub cache layout
(``$HF_HOME/hub/models--org--name/{refs,snapshots}``), then loaded by id in a fresh process with
``HF_HOME`` pointing there and ``HF_HUB_OFFLINE=1`` (``huggingface_hub`` reads both at import, as
a user's shell would set them). Branch ``main`` holds the target, tag ``v1`` the draft, so
``revision=`` and ``@rev`` are seen to pick the right files; an id that is not cached fails in
one line; the CLI takes ids for ``--target`` / ``--draft``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dsbd_jax.loading.hub import is_hub_id, split_revision

REPO = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys
from dsbd_jax import load_model
from dsbd_jax.loading.load import read_config
out = {}
m = load_model("tiny-org/tiny-llama", progress=False)
out["main"] = [m.config.hidden_size, m.tokenizer is not None]
out["v1"] = load_model("tiny-org/tiny-llama", revision="v1", progress=False).config.hidden_size
out["at_v1"] = read_config("tiny-org/tiny-llama@v1").hidden_size
try:
    load_model("tiny-org/not-cached", progress=False)
except ValueError as err:
    out["missing"] = str(err)
print("RESULT " + json.dumps(out))
"""


def write_hub_cache(hf_home: Path, repo_id: str, refs: dict) -> None:
    """``refs``: ref name -> checkpoint directory to store as that ref's snapshot."""
    root = hf_home / "hub" / ("models--" + repo_id.replace("/", "--"))
    for i, (ref, src) in enumerate(refs.items()):
        commit = f"{i + 1:040x}"
        (root / "refs").mkdir(parents=True, exist_ok=True)
        (root / "refs" / ref).write_text(commit)
        shutil.copytree(src, root / "snapshots" / commit)


@pytest.fixture(scope="module")
def hub_home(tmp_path_factory, torch):
    from dsbd_jax.testing import make_tiny_pair

    t = make_tiny_pair(tmp_path_factory.mktemp("pair64"), seed=0, hidden_size=64)[0]
    d = make_tiny_pair(tmp_path_factory.mktemp("pair32"), seed=1, hidden_size=32)[0]
    home = tmp_path_factory.mktemp("hf_home")
    write_hub_cache(home, "tiny-org/tiny-llama", {"main": t, "v1": d})
    return home


def _env(home):
    env = dict(os.environ, HF_HOME=str(home), HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO),
               JAX_PLATFORMS="cpu")
    env.pop("HF_HUB_CACHE", None)
    return env


def test_ids_and_revisions():
    assert is_hub_id("Qwen/Qwen3-1.7B") and is_hub_id("org/name@v1.0")
    assert not is_hub_id("qwen2.5-0.5b") and not is_hub_id("/abs/path") and not is_hub_id("a/b/c")
    assert split_revision("org/x@v2") == ("org/x", "v2")
    assert split_revision("org/x", "abc") == ("org/x", "abc")
    with pytest.raises(ValueError, match="revision"):
        split_revision("org/x@v2", "v3")


def test_load_by_id_from_a_local_hub_cache_offline(hub_home):
    res = subprocess.run([sys.executable, "-c", SCRIPT], env=_env(hub_home), cwd=REPO,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.split("RESULT ", 1)[1])
    assert out["main"] == [64, True]
    assert out["v1"] == 32 and out["at_v1"] == 32
    msg = out["missing"]
    assert "tiny-org/not-cached" in msg and "HF_HUB_OFFLINE=1" in msg and "\n" not in msg


def test_cli_takes_ids(hub_home):
    res = subprocess.run([sys.executable, "-m", "dsbd_jax", "generate", "--target",
                          "tiny-org/tiny-llama", "--draft", "tiny-org/tiny-llama",
                          "--method", "sample", "--prompt", "hello", "--max-new-tokens", "3",
                          "--no-progress"],
                         env=_env(hub_home), cwd=REPO, capture_output=True, text=True,
                         timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "loaded target tiny-org/tiny-llama" in res.stderr + res.stdout
