"""Token-frequency tables for truncated draft heads (``dsbd vocab``), from text or generations.

Sources (each a token count over the model's tokenizer; :mod:`dsbd_jax.models.vocab` stores,
loads and turns them into head rows):

* text files: ``.jsonl`` (every string value of every record is counted) or plain text;
* task slices ``NAME:START:STOP`` of the offline datasets, **training-side text**: GSM8K
  question + worked answer, HumanEval prompt + canonical solution, MT-Bench turns. Pick slices
  the evaluation does not use (``configs/quality_cpu.yaml`` reads GSM8K and HumanEval 0-39);
* a model's own generations (:func:`generation_counts`): prompts sampled with the model at the
  given warping, the new tokens counted.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, List, Sequence, Tuple

import numpy as np

from dsbd_jax.eval import datasets
from dsbd_jax.models.vocab import count_tokens


def parse_slice(spec: str) -> Tuple[str, int, int]:
    """``"gsm8k:40:1319"`` -> ``("gsm8k", 40, 1319)``; ``STOP`` may be empty (to the end)."""
    parts = spec.split(":")
    if len(parts) != 3 or not parts[0]:
        raise ValueError(f"a task slice is NAME:START:STOP (e.g. gsm8k:40:1319), got {spec!r}")
    try:
        start = int(parts[1] or 0)
        stop = int(parts[2]) if parts[2] else -1
    except ValueError:
        raise ValueError(f"a task slice is NAME:START:STOP with integers, got {spec!r}") from None
    if start < 0 or (stop != -1 and stop <= start):
        raise ValueError(f"task slice {spec!r}: need 0 <= START < STOP")
    return parts[0], start, stop


def task_texts(spec: str) -> List[str]:
    """Training-side text of a task slice (module doc)."""
    name, start, stop = parse_slice(spec)
    records = datasets.load(name)
    records = records[start:stop if stop != -1 else None]
    if name == "gsm8k":
        return [r["question"] + "\n" + r["answer"] for r in records]
    if name == "humaneval":
        return [r["prompt"] + r.get("canonical_solution", "") for r in records]
    if name == "mtbench":
        return ["\n".join(r["turns"]) for r in records]
    raise ValueError(f"unknown task {name!r}; available: humaneval, gsm8k, mtbench")


def file_texts(path) -> List[str]:
    """Strings of a ``.jsonl`` file (every string value) or a plain text file (one text)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no such corpus file: {path}")
    if path.suffix != ".jsonl":
        return [path.read_text(encoding="utf-8")]
    out = []

    def strings(x):
        if isinstance(x, str):
            out.append(x)
        elif isinstance(x, dict):
            for v in x.values():
                strings(v)
        elif isinstance(x, list):
            for v in x:
                strings(v)
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines()):
        if line.strip():
            try:
                strings(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i + 1}: not JSON ({e.msg})") from None
    return out


def text_counts(tokenizer, texts: Iterable[str], vocab_size: int) -> np.ndarray:
    """Counts of the token ids of ``texts`` (plain encoding, no special tokens added)."""
    seqs = (tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts)
    return count_tokens(seqs, vocab_size)


def generation_counts(config, params, prompt_ids: Sequence[Sequence[int]], vocab_size: int, *,
                      max_new_tokens: int = 128, batch_size: int = 4, seed: int = 0,
                      temperature: float = 1.0, top_k=10, top_p: float = 0.8,
                      eos_token_id=None) -> np.ndarray:
    """Counts of the tokens a model samples after each prompt (multinomial sampling, the given
    warping; tokens after EOS are not counted)."""
    import jax

    from dsbd_jax.decoding.common import pad_prompts
    from dsbd_jax.decoding.configs import SampleConfig
    from dsbd_jax.decoding.sampling import sample
    cfg = SampleConfig(config, max_new_tokens=max_new_tokens, temperature=temperature,
                       top_k=top_k, top_p=top_p, eos_token_id=eos_token_id)
    counts = np.zeros(vocab_size, np.int64)
    for i in range(0, len(prompt_ids), batch_size):
        chunk = list(prompt_ids[i:i + batch_size])
        n = len(chunk)
        chunk += [chunk[-1]] * (batch_size - n)  # one compiled shape
        ids, lens = pad_prompts(chunk, pad_id=0)
        out = sample(params, ids, jax.random.fold_in(jax.random.key(seed), i), cfg,
                     prompt_lengths=lens)
        seqs = np.asarray(out.sequences[:n, 0])
        lengths = np.asarray(out.lengths[:n, 0])
        counts += count_tokens([s[:k] for s, k in zip(seqs, lengths)], vocab_size)
    return counts
