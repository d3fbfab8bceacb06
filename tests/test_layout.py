"""The package layout, enforced: the import-linter contracts in ``pyproject.toml`` (layers
models < host < loading < decoding < parallel < eval < training < cli, the model importing
neither the host nor the loaders, the host no loader, ``testing`` a leaf, decoding reaching the
host only through its private ``_jit``, DSBD's room importing no other decoder, the rules
importing nothing of the library, no cycle among the modules of any sub-package) hold on the
tree, and each contract fails when it is broken on purpose in a copy. The rooms' sizes and the old import paths:
``tests/test_rooms.py``."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` over the package at ``root`` (its own pyproject.toml), no cache."""
    import os
    env = dict(os.environ, PYTHONPATH=str(root))
    return subprocess.run([str(LINT), "--no-cache", "--no-logo", "--config",
                           str(root / "pyproject.toml")], cwd=root, env=env,
                          capture_output=True, text=True, timeout=300)


def test_contracts_hold():
    proc = _lint(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "8 kept, 0 broken" in proc.stdout


@pytest.fixture
def tree_copy(tmp_path):
    shutil.copytree(ROOT / "dsbd_jax", tmp_path / "dsbd_jax",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _append(path: Path, line: str) -> None:
    path.write_text(path.read_text() + "\n" + line + "\n")


@pytest.mark.parametrize("module, line, contract", [
    # an upward import: the cache (models) reaching into decoding
    ("models/cache.py", "from dsbd_jax.decoding import common  # noqa", "models < host"),
    # an upward import from decoding into the sharded runtime
    ("decoding/dsbd/generate.py", "from dsbd_jax.parallel import mesh  # noqa", "models < host"),
    # the model reaching for the host's compiler options (what llama.logits once did)
    ("models/llama.py", "from dsbd_jax.host.cpu_options import tuned_jit  # noqa",
     "the model imports neither the host nor the loaders"),
    # a host choice reading a weights file
    ("host/plan.py", "from dsbd_jax.loading import presets  # noqa",
     "the host's choices read no weights files"),
    # a decoder reaching the host past the private plumbing (what seven modules once did)
    ("decoding/beam.py", "from dsbd_jax.host.cpu_options import tuned_jit  # noqa",
     "decoding reaches the host only through _jit"),
    # DSBD's room borrowing another decoder's code
    ("decoding/dsbd/steps.py", "from dsbd_jax.decoding import speculative  # noqa",
     "DSBD's room imports no other decoder"),
    # the rules reaching for the warping helpers
    ("decoding/rules.py", "from dsbd_jax.decoding import warping  # noqa",
     "the rules import nothing of dsbd_jax"),
    # a cycle inside one sub-package: config -> llama -> config
    ("models/config.py", "from dsbd_jax.models import llama  # noqa", "no import cycle"),
    # the tiny-model maker pulling in the library
    ("testing.py", "from dsbd_jax.models import config  # noqa", "dsbd_jax.testing imports"),
])
def test_a_broken_contract_fails(tree_copy, module, line, contract):
    _append(tree_copy / "dsbd_jax" / module, line)
    proc = _lint(tree_copy)
    assert proc.returncode != 0, proc.stdout
    broken = [ln for ln in proc.stdout.splitlines() if " BROKEN" in ln]
    assert any(contract in ln for ln in broken), proc.stdout


def _module_state(path: Path):
    """``global`` statements and context variables in a module: switches a reader cannot see."""
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found.append(f"{path.name}:{node.lineno}: global {', '.join(node.names)}")
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
            if any("contextvars" in n or n == "ContextVar" for n in names):
                found.append(f"{path.name}:{node.lineno}: contextvars")
    return found


@pytest.mark.parametrize("package", ["models", "host", "loading", "parallel"])
def test_no_hidden_switches(package):
    """The model, cache and sharding code hold no module-level switch: layouts come from the
    caller's mesh and logical-axis rules (``dsbd_jax.models.axes``)."""
    found = [s for p in sorted((ROOT / "dsbd_jax" / package).glob("*.py")) for s in _module_state(p)]
    assert not found, found


def test_public_api_and_cli_entry_point():
    """What users import from the top level is still there (the CHANGELOG lists moved modules)."""
    import dsbd_jax
    for name in ("dsbd_generate", "DSBDConfig", "load_model", "ModelConfig", "Progress",
                 "GenerateOutput", "sample", "beam_sample", "beam_search", "speculative_sample",
                 "tree_speculative_sample", "pad_prompts", "max_prompt_length", "bucket_length",
                 "compile_count", "forward", "logits", "init_params", "causal_mask", "KVCache",
                 "empty_cache", "warp_logits", "list_presets", "LoadedModel"):
        assert hasattr(dsbd_jax, name), name
    from dsbd_jax.cli import main
    assert callable(main)


def test_every_module_is_at_most_500_lines():
    """Modules by concern: none of the package's modules grows past 500 lines (split it by what
    it does when it would)."""
    root = Path(__file__).resolve().parents[1] / "dsbd_jax"
    long = {str(p.relative_to(root)): n for p in root.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 500}
    assert not long, long


# a kernel's storage (plain "kernel", transposed "kernel_t", blocked, a truncated head's rows) is
# the models layer's business: elsewhere the parameters are asked through its functions
# (models.param_check: check_params, plain_projection; models.axes.LOGICAL_AXES). One module
# outside it names the keys: the checkpoint format's name map (parameter path -> file tensor).
NAME_MAPS = {("loading", "checkpoint.py")}
KERNEL_KEYS = r"""["'](kernel|kernel_t|full_kernel)["']|\bT_KEY\b"""


def _kernel_key_readers(root: Path):
    import re
    pattern = re.compile(KERNEL_KEYS)
    return sorted(f"{p.relative_to(root)}:{n}" for p in root.rglob("*.py")
                  if p.relative_to(root).parts[0] != "models"
                  and p.relative_to(root).parts not in NAME_MAPS
                  for n, line in enumerate(p.read_text().splitlines(), 1)
                  if pattern.search(line.split("#")[0]))


def test_no_module_outside_the_models_layer_reads_a_kernel_key(tmp_path):
    assert not _kernel_key_readers(ROOT / "dsbd_jax")
    # the check finds one: a decoder reading the transposed key
    pkg = tmp_path / "dsbd_jax"
    (pkg / "decoding").mkdir(parents=True)
    (pkg / "decoding" / "x.py").write_text('w = params["attn"]["q_proj"]["kernel_t"]\n')
    assert _kernel_key_readers(pkg) == ["decoding/x.py:1"]
