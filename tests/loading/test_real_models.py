"""The real offline models: JAX logits vs transformers' own GGUF loading (slow).

For each preset, one subprocess loads it with ``dsbd_jax.load_model`` (float32) and writes the
logits of a chat-template prompt to ``tmp_path``; a second subprocess loads the same joined GGUF
with ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=..., dtype=float32)`` and writes its
logits. Two processes because a 1.5B float32 model takes ~7 GB per framework (24 GB machine).
Each JAX side runs with its own empty ``DSBD_JAX_CACHE`` under ``tmp_path`` and
``DSBD_JAX_CACHE_PARAMS=0``: it joins the GGUF there and dequantises it, so the test is of the
conversion, never of a cache an earlier load left, and the float32 caches a load would write
(the generic one and the host's form: about 22 GB for the four presets) never reach the disk.

Both sides dequantise the same file, so the remaining difference is float32 rounding over
24-30 layers. Measured on a 49-52 token chat prompt (``-s`` prints it): max abs diff 1.2e-4
(SmolLM2, logit scale 38), 5e-5 (0.5B, scale 32), 8e-5 (1.5B, scale 26) -- a few 1e-6 of the
logit scale -- and 100% argmax agreement. Thresholds: max abs diff <= 5e-4 (4x the worst
measured, ~1.5e-5 of the logit scale) and 100% argmax agreement; a wrong RoPE base, bias, head
mapping or q/k permutation moves logits by O(1).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

pytestmark = pytest.mark.slow

PROMPT = [{"role": "user", "content": "Write a Python function that returns the n-th Fibonacci "
                                      "number, and explain its complexity in one sentence."}]

_JAX_SIDE = r"""
import json, sys, time
import numpy as np
from dsbd_jax.loading.load import load_model
from dsbd_jax.models.llama import logits
from dsbd_jax.loading.presets import preset_dir
name, out = sys.argv[1], sys.argv[2]
messages = json.loads(sys.argv[3])
t0 = time.perf_counter()
m = load_model(name, "float32", progress=False)
load_s = time.perf_counter() - t0
if m.tokenizer.chat_template:
    ids = m.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
else:  # a base model's GGUF (gemma3-270m) has no chat template: the plain text
    ids = m.tokenizer(messages[0]["content"])["input_ids"]
ids = np.asarray(ids["input_ids"] if hasattr(ids, "keys") else ids, np.int32)
np.save(out + "/ids.npy", ids)
np.save(out + "/jax.npy", np.asarray(logits(m.config, m.params, ids[None]))[0])
json.dump({"dir": str(preset_dir(name)), "load_s": load_s, "eos": list(m.config.eos_token_id),
           "vocab": m.config.vocab_size}, open(out + "/jax.json", "w"))
"""

_TORCH_SIDE = r"""
import sys
import numpy as np
import torch
from transformers import AutoModelForCausalLM
torch.set_num_threads(2)
directory, out = sys.argv[1], sys.argv[2]
model = AutoModelForCausalLM.from_pretrained(directory, gguf_file="model.gguf",
                                             dtype=torch.float32).eval()
ids = torch.as_tensor(np.load(out + "/ids.npy")[None].astype(np.int64))
with torch.no_grad():
    np.save(out + "/torch.npy", model(ids).logits[0].float().numpy())
"""


def _env(cache):
    """The subprocesses' environment: two threads, the checkout importable, an own empty cache
    folder without parameter caches (module doc)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    # forced options: a fresh cache would first measure XLA:CPU's (15-20 s), not this test's subject
    return dict(os.environ, OMP_NUM_THREADS="2", TOKENIZERS_PARALLELISM="false",
                PYTHONPATH=path, DSBD_JAX_CACHE=str(cache), DSBD_JAX_CACHE_PARAMS="0",
                DSBD_JAX_CPU_OPTIONS="default")


def _run(code, cache, *args):
    env = _env(cache)
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                          env=env, timeout=900)
    if proc.returncode != 0:
        raise AssertionError(f"subprocess failed ({proc.returncode}):\n{proc.stderr[-4000:]}")


@pytest.mark.parametrize("name", [
    # CI: Gemma 3 and the default pair's draft (their K-quant blocks, two architectures); the
    # 1.5B (the 0.5B's architecture at 7 GB) and SmolLM2 (the Llama GGUF's q/k permutation,
    # checked on tiny Llama GGUFs against transformers in test_model_parity.py) extended
    pytest.param("smollm2-135m-instruct", marks=pytest.mark.extended), "gemma3-270m",
    "qwen2.5-coder-0.5b-instruct",
    pytest.param("qwen2.5-coder-1.5b-instruct", marks=pytest.mark.extended)])
def test_logits_match_transformers_gguf(name, tmp_path):
    cache = tmp_path / "cache"
    _run(_JAX_SIDE, cache, name, str(tmp_path), json.dumps(PROMPT))
    info = json.loads((tmp_path / "jax.json").read_text())
    assert info["dir"].startswith(str(cache))   # the preset joined in the test's own cache
    _run(_TORCH_SIDE, cache, info["dir"], str(tmp_path))
    ids = np.load(tmp_path / "ids.npy")
    got, want = np.load(tmp_path / "jax.npy"), np.load(tmp_path / "torch.npy")
    assert got.shape == want.shape == (len(ids), info["vocab"])
    assert len(ids) >= 20
    diff = float(np.max(np.abs(got - want)))
    scale = float(np.max(np.abs(want)))
    agree = float(np.mean(got.argmax(-1) == want.argmax(-1)))
    print(f"\n{name}: {len(ids)} tokens, max abs diff {diff:.3g}, logit scale {scale:.3g}, "
          f"argmax agreement {agree:.3f}, load {info['load_s']:.1f}s")
    assert np.isfinite(got).all()
    assert diff <= 5e-4, f"{name}: max abs diff {diff:.3g} (logit scale {scale:.3g})"
    assert agree == 1.0, f"{name}: argmax agreement {agree:.3f}"


_GENERATE = r"""
import json, sys
import jax, numpy as np
from dsbd_jax.decoding import beam
from dsbd_jax.decoding.configs import BeamSampleConfig
from dsbd_jax.loading.load import load_model
m = load_model(sys.argv[1], "float32", progress=False)
ids = np.asarray([m.tokenizer("1, 2, 3, 4, 5,")["input_ids"]], np.int32)
cfg = BeamSampleConfig(target=m.config, max_new_tokens=8, num_beams=2, temperature=0.5)
out = beam.beam_sample(m.params, ids, jax.random.PRNGKey(0), cfg)
best = int(out.best[0])
print("RESULT " + json.dumps(m.tokenizer.decode(np.asarray(out.sequences[0, best]))))
"""


@pytest.mark.extended   # Gemma 3's real logits: test_logits_match_transformers_gguf; its cached
# decoding steps: test_family_parity.py (tiny Gemma 3 models against transformers)
def test_gemma3_270m_generates(tmp_path):
    """A real generation offline with the Gemma 3 preset (beam sampling, 2 beams, 8 tokens):
    the continuation of a count (a broken model loses it; measured output: ' 6, 7, 8')."""
    env = _env(tmp_path / "cache")
    proc = subprocess.run([sys.executable, "-c", _GENERATE, "gemma3-270m"], capture_output=True,
                          text=True, env=env, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = json.loads(proc.stdout.split("RESULT ", 1)[1])
    print(f"\ngemma3-270m: '1, 2, 3, 4, 5,' -> {text!r}")
    assert text.replace(" ", "").startswith("6,7,8"), text
