"""Evaluation tasks: a loader of examples and a scorer of one generated completion.

``humaneval`` (pass@1, the problem's unit tests in a sandboxed subprocess), ``gsm8k`` (exact
match of the final number) and ``mtbench`` (not scored: no judge model) from offline packages;
``squad`` (SQuAD exact match) and ``spider`` (execution accuracy) from the hub or local files.
``Example.prompt`` is the user message before the chat template; the offline prompts are
``datasets.chat_prompt``'s, so benchmarks and evaluations send the same text. Generated code
never runs in the calling process: HumanEval programs run in a fresh interpreter with resource
limits and no network, Spider queries on a read-only connection that may only read.
"""

from __future__ import annotations

import collections
import dataclasses
import decimal
import json
import math
import os
import re
import secrets
import signal
import sqlite3
import string
import subprocess
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path
from typing import Any, Iterable

from dsbd_jax.eval import datasets as offline

TASKS = ("humaneval", "gsm8k", "mtbench", "squad", "spider")

_METRICS = {"humaneval": "pass@1", "gsm8k": "exact_match", "mtbench": None,
            "squad": "exact_match", "spider": "execution_accuracy"}

SQUAD_TEMPLATE = ("Answer the question with a short span copied from the passage.\n\n"
                  "Passage: {context}\n\nQuestion: {question}\n\nAnswer:")
SPIDER_TEMPLATE = ("SQLite database schema:\n{schema}\n\nQuestion: {question}\n"
                   "Reply with one SQLite query only.")


@dataclasses.dataclass(frozen=True)
class Example:
    """One evaluation example: ``prompt`` is the user message, ``reference`` what ``score``
    needs (tests and entry point, gold answer(s), database path and gold query...)."""

    task: str
    id: str
    prompt: str
    reference: dict


def _check_task(task: str) -> None:
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; available: {', '.join(TASKS)}")


def metric_name(task: str) -> str | None:
    """The name of ``score``'s metric for ``task``; None for mtbench (not scored)."""
    _check_task(task)
    return _METRICS[task]


def load_examples(task: str, limit: int | None = None, path: str | None = None,
                  split: str | None = None, db_dir: str | None = None) -> list[Example]:
    """The first ``limit`` (all when None) examples of ``task``.

    ``path``: a local file instead of the default source (JSON Lines records of the package's
    format for humaneval/gsm8k/mtbench; a SQuAD or Spider JSON/JSONL file). ``split``: the hub
    split of squad/spider (default ``validation``). ``db_dir``: spider's database folder, holding
    ``<db_dir>/<db_id>/<db_id>.sqlite`` (required)."""
    _check_task(task)
    if split is not None and (task not in ("squad", "spider") or path is not None):
        raise ValueError("split= selects a hub split of squad or spider; it does not apply here")
    if db_dir is not None and task != "spider":
        raise ValueError("db_dir= only applies to spider")
    if task == "squad":
        return _load_squad(path, split, limit)
    if task == "spider":
        return _load_spider(path, split, db_dir, limit)
    records = offline.read_jsonl(Path(path), limit) if path else offline.load(task, limit)
    return [_offline_example(task, i, r) for i, r in enumerate(records)]


def score(example: Example, completion: str, timeout: float = 10.0) -> float | None:
    """1.0 if ``completion`` solves ``example`` else 0.0; None for mtbench. ``timeout`` (seconds)
    bounds a HumanEval program's run and each Spider query."""
    _check_task(example.task)
    if example.task == "humaneval":
        return _score_humaneval(example.reference, completion, timeout)
    if example.task == "gsm8k":
        return _score_gsm8k(example.reference, completion)
    if example.task == "squad":
        return _score_squad(example.reference, completion)
    if example.task == "spider":
        return _score_spider(example.reference, completion, timeout)
    return None


# ---------------------------------------------------------------------------------------------
# offline packages: humaneval, gsm8k, mtbench

def _offline_example(task: str, index: int, record: dict) -> Example:
    prompt = offline.chat_prompt(task, record)
    if task == "humaneval":
        reference = {k: record[k] for k in ("prompt", "test", "entry_point")}
        return Example(task, record["task_id"], prompt, reference)
    if task == "gsm8k":
        return Example(task, f"gsm8k/{index}", prompt, {"answer": _gsm8k_gold(record["answer"])})
    reference = {"category": record["category"], "turns": record["turns"],
                 "reference": record.get("reference")}
    return Example(task, str(record["question_id"]), prompt, reference)


_FENCE = re.compile(r"```[^\n`]*\n(.*?)(?:```|\Z)", re.DOTALL)


def _extract_code(completion: str) -> str:
    """The first ``` fenced block of ``completion`` (any language tag; an unterminated fence runs
    to the end), else the whole text."""
    match = _FENCE.search(completion)
    return match.group(1) if match else completion


def _humaneval_program(reference: dict, completion: str) -> str:
    """The test program of a HumanEval completion: a full function (``def <entry_point>`` at top
    level) after the prompt's header (imports, helpers), else a body after the whole prompt; then
    the tests and ``check(<entry_point>)``."""
    prompt, entry = reference["prompt"], reference["entry_point"]
    code = _extract_code(completion)
    define = re.compile(rf"^def\s+{re.escape(entry)}\s*\(", re.MULTILINE)
    if define.search(code):
        code = prompt[:define.search(prompt).start()] + code
    else:
        code = prompt + code
    return f"{code}\n{reference['test']}\ncheck({entry})\n"


_MEMORY_BYTES = 2 << 30
_OUTPUT_BYTES = 64 << 20
# Runs in the sandboxed interpreter: caps its resources, disables the network, executes
# program.py and prints the run's token last, so an early exit with status 0 does not pass.
# (The rlimits are set here rather than in a preexec_fn, which is unsafe in a threaded parent.)
_RUNNER = """\
import resource, socket
for limit, value in ((resource.RLIMIT_AS, {memory}), (resource.RLIMIT_CPU, {cpu}),
                     (resource.RLIMIT_FSIZE, {output})):
    hard = resource.getrlimit(limit)[1]
    value = value if hard == resource.RLIM_INFINITY else min(value, hard)
    resource.setrlimit(limit, (value, value))
def _blocked(*args, **kwargs):
    raise OSError("network disabled")
socket.socket = socket.create_connection = socket.getaddrinfo = _blocked
with open("program.py", encoding="utf-8") as f:
    code = compile(f.read(), "program.py", "exec")
exec(code, {{"__name__": "__main__"}})
print({token!r}, flush=True)
"""


def _run_python(program: str, timeout: float) -> bool:
    """Whether ``program`` runs to completion (exit status 0 and the final token printed) in a
    fresh isolated interpreter: empty temp dir as cwd, minimal environment, 2 GiB of address
    space, ``timeout`` + 1 s of CPU, no network, its process group killed after ``timeout``
    seconds of wall time."""
    token = secrets.token_hex(16)
    runner = _RUNNER.format(memory=_MEMORY_BYTES, cpu=math.ceil(timeout) + 1,
                            output=_OUTPUT_BYTES, token=token)
    with tempfile.TemporaryDirectory(prefix="dsbd_eval_", ignore_cleanup_errors=True) as tmp:
        Path(tmp, "program.py").write_text(program, encoding="utf-8")
        env = {"PATH": os.defpath, "HOME": tmp, "TMPDIR": tmp, "LANG": "C.UTF-8",
               "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}
        with open(Path(tmp, "stdout"), "wb") as out:
            proc = subprocess.Popen([sys.executable, "-I", "-c", runner], cwd=tmp, env=env,
                                    stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=subprocess.DEVNULL, start_new_session=True)
            try:
                status = proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                status = None
            finally:
                try:  # the program's own children too
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                proc.wait()
        return status == 0 and token.encode() in Path(tmp, "stdout").read_bytes()


def _score_humaneval(reference: dict, completion: str, timeout: float) -> float:
    return float(_run_python(_humaneval_program(reference, completion), timeout))


_NUMBER = re.compile(r"(?:(?<!\w)-)?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?")
_ANSWER_IS = re.compile(r"the answer is", re.IGNORECASE)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def _gsm8k_gold(solution: str) -> str:
    """The gold answer of a GSM8K solution: the text after its ``####``."""
    if "####" not in solution:
        raise ValueError(f"GSM8K solution without '####': {solution[-80:]!r}")
    return solution.rsplit("####", 1)[1].strip()


def _gsm8k_prediction(completion: str) -> str | None:
    """The final number of a completion: the first after the last "The answer is", else the
    one in the last ``\\boxed{}``, else the last number of the text; None if there is none."""
    answers = list(_ANSWER_IS.finditer(completion))
    if answers:
        match = _NUMBER.search(completion, answers[-1].end())
        if match:
            return match.group()
    for boxed in reversed(_BOXED.findall(completion)):
        match = _NUMBER.search(boxed)
        if match:
            return match.group()
    numbers = _NUMBER.findall(completion)
    return numbers[-1] if numbers else None


def _to_decimal(number: str) -> decimal.Decimal | None:
    try:
        return decimal.Decimal(number.replace(",", "").replace("$", "").strip().rstrip("."))
    except decimal.InvalidOperation:
        return None


def _score_gsm8k(reference: dict, completion: str) -> float:
    prediction = _gsm8k_prediction(completion)
    gold = _to_decimal(reference["answer"])
    return float(prediction is not None and gold is not None and _to_decimal(prediction) == gold)


# ---------------------------------------------------------------------------------------------
# hub / local files: squad, spider

def _hf_datasets() -> Any:
    try:
        import datasets
    except ImportError as e:
        raise ImportError("squad and spider need the Hugging Face `datasets` package: "
                          "pip install datasets") from e
    return datasets


def _hub_dataset(name: str, split: str, hint: str) -> Any:
    """``datasets.load_dataset(name, split=split)``; a failure (no network, unknown split...)
    becomes a one-line FileNotFoundError ending with ``hint``."""
    try:
        return _hf_datasets().load_dataset(name, split=split)
    except Exception as e:  # anything the hub client raises: report it in one line
        detail = (str(e).splitlines() or [""])[0][:200]
        raise FileNotFoundError(f"cannot load {name!r} split {split!r} from the Hugging Face hub "
                                f"(unreachable? {type(e).__name__}: {detail}); {hint}") from e


def _read_json(path: Path) -> Any:
    """A JSON document, or the list of records of a JSON Lines file (whatever its suffix)."""
    text = path.read_text(encoding="utf-8")
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def _head(rows: Iterable[dict], limit: int | None) -> list[dict]:
    out = []
    for row in rows:
        if limit is not None and len(out) >= limit:
            break
        out.append(row)
    return out


def _squad_nested_records(data: dict) -> list[dict]:
    """The flat (hub) records of a SQuAD v1.1 file ``{"data": [{"title", "paragraphs"}]}``."""
    return [{"id": qa["id"], "title": article.get("title", ""), "context": paragraph["context"],
             "question": qa["question"],
             "answers": {"text": [a["text"] for a in qa["answers"]],
                         "answer_start": [a["answer_start"] for a in qa["answers"]]}}
            for article in data["data"] for paragraph in article["paragraphs"]
            for qa in paragraph["qas"]]


def _load_squad(path: str | None, split: str | None, limit: int | None) -> list[Example]:
    if path is None:
        rows = _hub_dataset("rajpurkar/squad", split or "validation",
                            "pass path= a local SQuAD file (.json or .jsonl)")
    else:
        data = _read_json(Path(path))
        if isinstance(data, dict) and "data" in data:
            rows = _squad_nested_records(data)
        else:
            rows = _hf_datasets().load_dataset("json", data_files=str(path), split="train")
    return [Example("squad", str(r["id"]),
                    SQUAD_TEMPLATE.format(context=r["context"], question=r["question"]),
                    {"answers": list(r["answers"]["text"])})
            for r in _head(rows, limit)]


def _squad_normalize(text: str) -> str:
    """The official SQuAD answer normalisation: lowercase, no punctuation, no articles, single
    spaces."""
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _score_squad(reference: dict, completion: str) -> float:
    answer = re.sub(r"^answer\s*:", "", completion.strip(), flags=re.IGNORECASE).strip()
    answer = _squad_normalize(answer.split("\n", 1)[0])
    return float(any(answer == _squad_normalize(gold) for gold in reference["answers"]))


def _connect_read_only(db_path: str | Path) -> sqlite3.Connection:
    conn = sqlite3.connect(Path(db_path).resolve().as_uri() + "?mode=ro", uri=True)
    conn.text_factory = lambda b: b.decode(errors="replace")  # some Spider dbs hold bad UTF-8
    return conn


def _schema(db_path: Path) -> str:
    """The ``CREATE TABLE`` statements of a database."""
    with closing(_connect_read_only(db_path)) as conn:
        rows = conn.execute("SELECT sql FROM sqlite_master WHERE type = 'table' "
                            "AND sql IS NOT NULL ORDER BY rowid").fetchall()
    return "\n".join(sql.strip() + ";" for (sql,) in rows)


def _load_spider(path: str | None, split: str | None, db_dir: str | None,
                 limit: int | None) -> list[Example]:
    if db_dir is None:
        raise FileNotFoundError("spider needs db_dir=: the folder of the Spider databases "
                                "(<db_dir>/<db_id>/<db_id>.sqlite)")
    if path is None:
        rows = _hub_dataset("xlangai/spider", split or "validation",
                            "pass path= a local Spider dev.json and db_dir= its databases")
    else:
        data = _read_json(Path(path))
        rows = data if isinstance(data, list) else [data]
    schemas: dict[str, str] = {}
    examples = []
    for i, r in enumerate(_head(rows, limit)):
        db_path = Path(db_dir, r["db_id"], f"{r['db_id']}.sqlite")
        if r["db_id"] not in schemas:
            if not db_path.is_file():
                raise FileNotFoundError(f"spider database {db_path} not found (db_dir={db_dir})")
            schemas[r["db_id"]] = _schema(db_path)
        prompt = SPIDER_TEMPLATE.format(schema=schemas[r["db_id"]], question=r["question"])
        examples.append(Example("spider", f"spider/{i}", prompt,
                                {"db_id": r["db_id"], "db_path": str(db_path),
                                 "query": r["query"]}))
    return examples


def _extract_sql(completion: str) -> str:
    """The first statement of a completion's first ``` fenced block (else of the whole text),
    without its ``;``."""
    text = _extract_code(completion)
    for semicolon in re.finditer(";", text):
        if sqlite3.complete_statement(text[:semicolon.end()]):  # not a ';' inside a literal
            return text[:semicolon.start()].strip()
    return text.strip()


_READ_ACTIONS = {sqlite3.SQLITE_SELECT, sqlite3.SQLITE_READ, sqlite3.SQLITE_FUNCTION,
                 sqlite3.SQLITE_RECURSIVE}


def _read_only_authorizer(action: int, *args: Any) -> int:
    """Allow reads only (``mode=ro`` alone still lets ATTACH create and write another file)."""
    return sqlite3.SQLITE_OK if action in _READ_ACTIONS else sqlite3.SQLITE_DENY


def _execute(conn: sqlite3.Connection, sql: str, timeout: float) -> list[tuple]:
    """The rows of one query, interrupted (sqlite3.OperationalError) after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    conn.set_progress_handler(lambda: time.monotonic() > deadline, 1000)
    cursor = conn.execute(sql)
    if cursor.description is None:
        raise sqlite3.ProgrammingError(f"not a query: {sql[:80]!r}")
    return cursor.fetchall()


_ORDER_BY = re.compile(r"\border\s+by\b", re.IGNORECASE)


def _score_spider(reference: dict, completion: str, timeout: float) -> float:
    """Execution accuracy: the prediction's rows equal the gold query's, in order if the gold
    query has ORDER BY, else as multisets (columns are compared in the order selected). An
    error in the gold query raises."""
    with closing(_connect_read_only(reference["db_path"])) as conn:
        conn.set_authorizer(_read_only_authorizer)
        gold = _execute(conn, reference["query"], timeout)
        try:
            predicted = _execute(conn, _extract_sql(completion), timeout)
        except (sqlite3.Error, sqlite3.Warning):
            return 0.0
    if _ORDER_BY.search(reference["query"]):
        return float(predicted == gold)
    return float(collections.Counter(predicted) == collections.Counter(gold))
