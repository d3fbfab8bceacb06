"""A plain ``pip install dsbd-jax`` (no extras) is enough for ``dsbd generate`` and ``dsbd
bench``, and the commands that need an extra say so in one line.

The test builds a site folder holding only the distributions that ``[project].dependencies`` of
pyproject.toml pull in (the declared ones and, recursively, their own non-extra requirements, as
pip would install them), and runs the CLI in a fresh interpreter (``python -S``) that sees only
that folder and the repository. A module the runtime imports but nobody declared (for example
jinja2, which ``apply_chat_template`` needs and transformers does not require) is missing there,
so the command fails and so does the test. The tiny model pair is made beforehand in this
process (torch is in the test extra, not a runtime dependency)."""

import importlib.metadata as md
import os
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ImportError:  # Python 3.10
    tomllib = pytest.importorskip("tomli")

ROOT = Path(__file__).resolve().parent.parent


def runtime_distributions():
    """The installed distributions a plain install of the project needs: the closure of
    ``[project].dependencies`` over the requirements without extras."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    todo, seen = [Requirement(d) for d in deps], {}
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name in seen:
            continue
        seen[name] = md.distribution(req.name)  # a declared dependency must be installed
        todo += [Requirement(r) for r in seen[name].requires or []]
    return seen


def runtime_site(directory: Path) -> Path:
    """A folder with links to the files of the runtime distributions only (their top-level
    modules and their metadata), like a virtualenv with a plain install."""
    directory.mkdir(parents=True, exist_ok=True)
    for dist in runtime_distributions().values():
        base = Path(dist.locate_file(""))
        for f in dist.files or []:
            parts = Path(f).parts
            if not parts or parts[0] == ".." or parts[0] == "__pycache__":
                continue
            top = parts[0]
            if top.endswith(".pth"):
                continue
            link = directory / top
            if not link.exists() and (base / top).exists():
                link.symlink_to(base / top)
    return directory


@pytest.fixture(scope="module")
def plain_install(tmp_path_factory):
    site = runtime_site(tmp_path_factory.mktemp("site"))

    def run(*argv, cwd=None):
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        env.update(PYTHONPATH=f"{site}{os.pathsep}{ROOT}", PYTHONNOUSERSITE="1",
                   TOKENIZERS_PARALLELISM="false")
        return subprocess.run([sys.executable, "-S", "-m", "dsbd_jax", *argv], cwd=cwd or ROOT,
                              env=env, capture_output=True, text=True, timeout=600)
    return run


def test_runtime_closure_excludes_the_extras():
    """The check is meaningful: the test extra's packages are not in the runtime closure, and
    the chat template's jinja2 is only there because pyproject declares it."""
    dists = runtime_distributions()
    for extra_only in ("torch", "matplotlib", "pytest", "datasets"):
        assert extra_only not in dists
    assert "jinja2" in dists


def test_generate_and_bench_with_a_plain_install(plain_install, tmp_path, torch):
    from bench_setup import write_bench_config, write_gsm
    from dsbd_jax.testing import make_tiny_pair

    t, d = make_tiny_pair(tmp_path / "tiny", seed=0, noise=0.1)
    r = plain_install("generate", "--target", str(t), "--draft", str(d), "--prompt", "hi",
                      "--method", "dsbd", "--max-new-tokens", "3", "--no-eos")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "best beam" in r.stdout
    cfg = write_bench_config(tmp_path / "cfg.yaml", t, d, write_gsm(tmp_path / "gsm.jsonl"),
                             [{"method": "beam", "num_beams": 1}], max_new_tokens=3, name="plain")
    r = plain_install("bench", str(cfg), "--out", str(tmp_path / "out"), "--no-progress")
    assert r.returncode == 0, r.stderr[-3000:]
    assert (tmp_path / "out" / "summary.json").is_file()
    # without the eval extra, plotting fails in one line that names the extra
    r = plain_install("plot", str(tmp_path / "out"))
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("dsbd: error:") and "dsbd-jax[eval]" in lines[0]


def test_make_tiny_pair_without_torch_names_it(plain_install, tmp_path):
    r = plain_install("make-tiny-pair", str(tmp_path / "tiny"))
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert r.returncode == 2 and len(lines) == 1, r.stderr[-3000:]
    assert lines[0].startswith("dsbd: error:") and "torch" in lines[0]
    assert not (tmp_path / "tiny").exists()
