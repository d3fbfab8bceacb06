"""tasks: example loading and scoring of the five evaluation tasks (HumanEval sandbox, GSM8K
number extraction, MT-Bench questions, SQuAD exact match, Spider execution accuracy). Offline
and fast: local files and databases are written under tmp_path."""

import json
import socket
import sqlite3
import time

import datasets as hf_datasets
import pytest

from dsbd_jax.eval import datasets
from dsbd_jax.eval import tasks

# ---------------------------------------------------------------------------------------------
# HumanEval


@pytest.fixture(scope="module")
def humaneval0():
    """HumanEval/0 as an Example, and its canonical solution (a function body)."""
    example = tasks.load_examples("humaneval", limit=1)[0]
    return example, datasets.load("humaneval", 1)[0]["canonical_solution"]


def test_humaneval_example(humaneval0):
    example, _ = humaneval0
    assert example.task == "humaneval" and example.id == "HumanEval/0"
    assert example.prompt == datasets.chat_prompts("humaneval", 1)[0]
    assert example.prompt.endswith(example.reference["prompt"])
    assert example.reference["entry_point"] == "has_close_elements"
    assert tasks.metric_name("humaneval") == "pass@1"


def test_humaneval_body_and_fenced_function_pass(humaneval0):
    example, body = humaneval0
    assert tasks.score(example, body) == 1.0
    # the full function in a fence, without the prompt's `from typing import List` (prepended)
    function = "def has_close_elements(numbers: List[float], threshold: float) -> bool:\n" + body
    assert tasks.score(example, f"Here it is:\n```python\n{function}```\nDone.") == 1.0
    assert tasks.score(example, f"```\n{function}") == 1.0  # no tag, unterminated fence


def test_humaneval_wrong_code_fails(humaneval0):
    example, body = humaneval0
    assert tasks.score(example, body.replace("distance < threshold", "distance > threshold")) == 0.0
    assert tasks.score(example, "    return True\n") == 0.0
    assert tasks.score(example, "```python\ndef has_close_elements(:\n```") == 0.0  # syntax


def test_humaneval_infinite_loop_times_out(humaneval0):
    example, _ = humaneval0
    start = time.monotonic()
    assert tasks.score(example, "    while True:\n        pass\n", timeout=2) == 0.0
    elapsed = time.monotonic() - start
    assert 1.9 < elapsed < 5.0  # ran until the wall timeout, and was killed promptly


def test_humaneval_early_exit_does_not_pass(humaneval0):
    example, body = humaneval0
    for exit_call in ("import os; os._exit(0)", "import sys; sys.exit(0)", "raise SystemExit"):
        # at import time, before check() runs: the exit status is 0 but the tests never ran
        completion = f"{body}\n{exit_call}\n"
        assert tasks.score(example, completion) == 0.0, exit_call


def test_humaneval_network_is_blocked(humaneval0):
    example, body = humaneval0
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        socket.create_connection(("127.0.0.1", port), timeout=2).close()  # reachable from here
        completion = (f"    import socket\n"
                      f"    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n"
                      + body)
        assert tasks.score(example, completion) == 0.0


# ---------------------------------------------------------------------------------------------
# GSM8K


def _gsm8k_example(answer: str) -> tasks.Example:
    return tasks.Example("gsm8k", "gsm8k/test", "question", {"answer": answer})


def test_gsm8k_real_record():
    example = tasks.load_examples("gsm8k", limit=2)[0]
    assert example.id == "gsm8k/0" and example.reference == {"answer": "18"}
    assert example.prompt == datasets.chat_prompts("gsm8k", 1)[0]
    assert tasks.score(example, "9 eggs remain, 9 * 2 = 18. The answer is $18.") == 1.0
    assert tasks.score(example, "9 * 2 = 18. The answer is 19.") == 0.0
    assert tasks.metric_name("gsm8k") == "exact_match"


@pytest.mark.parametrize("gold, completion, expected", [
    ("1000", "So 500 + 500. The answer is 1,000.", 1.0),
    ("1,000", "The answer is 1000", 1.0),
    ("18", "Total: \\boxed{18}", 1.0),
    ("18", "the answer is 18.00 dollars", 1.0),
    ("18.0", "Step 1: 9 * 2 = 18", 1.0),  # last number fallback
    ("18", "The answer is 18, not 20.", 1.0),  # first number after the last "The answer is"
    ("20", "The answer is 18, not 20.", 0.0),
    ("-3", "The answer is -3.", 1.0),
    ("3", "The answer is -3.", 0.0),
    ("18", "18 first, then 2 * 10 = 20", 0.0),
    ("18", "I do not know.", 0.0),
])
def test_gsm8k_number_extraction(gold, completion, expected):
    assert tasks.score(_gsm8k_example(gold), completion) == expected


# ---------------------------------------------------------------------------------------------
# MT-Bench


def test_mtbench_package():
    examples = tasks.load_examples("mtbench")
    assert len(examples) == 80 and len({e.id for e in examples}) == 80
    first = examples[0]
    assert first.id == "81" and first.reference["category"] == "writing"
    assert first.prompt == first.reference["turns"][0] and len(first.reference["turns"]) == 2
    assert tasks.score(first, "A blog post.") is None and tasks.metric_name("mtbench") is None
    assert len(tasks.load_examples("mtbench", limit=5)) == 5


def test_mtbench_local_path(tmp_path):
    path = tmp_path / "question.jsonl"
    rows = [{"question_id": 1, "category": "math", "turns": ["What is 2+2?", "And 3+3?"],
             "reference": ["4", "6"]},
            {"question_id": 2, "category": "writing", "turns": ["Write a haiku.", "Another."]}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    examples = tasks.load_examples("mtbench", path=str(path))
    assert [(e.id, e.prompt) for e in examples] == [("1", "What is 2+2?"), ("2", "Write a haiku.")]
    assert examples[0].reference["reference"] == ["4", "6"]


# ---------------------------------------------------------------------------------------------
# SQuAD

_SQUAD_FLAT = [
    {"id": "q1", "title": "Paris", "context": "The Eiffel Tower stands in Paris.",
     "question": "What stands in Paris?",
     "answers": {"text": ["The Eiffel Tower", "Eiffel Tower"], "answer_start": [0, 4]}},
    {"id": "q2", "title": "Paris", "context": "Paris is the capital of France.",
     "question": "Of which country is Paris the capital?",
     "answers": {"text": ["France"], "answer_start": [24]}},
]


def _write_squad(tmp_path, layout: str):
    if layout == "jsonl":
        path = tmp_path / "squad.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in _SQUAD_FLAT))
    elif layout == "json-list":
        path = tmp_path / "squad.json"
        path.write_text(json.dumps(_SQUAD_FLAT))
    else:  # the original SQuAD v1.1 nested layout
        paragraphs = [{"context": r["context"],
                       "qas": [{"id": r["id"], "question": r["question"],
                                "answers": [{"text": t, "answer_start": s} for t, s in
                                            zip(r["answers"]["text"],
                                                r["answers"]["answer_start"])]}]}
                      for r in _SQUAD_FLAT]
        path = tmp_path / "dev-v1.1.json"
        path.write_text(json.dumps({"version": "1.1",
                                    "data": [{"title": "Paris", "paragraphs": paragraphs}]}))
    return str(path)


@pytest.mark.parametrize("layout", ["jsonl", "json-list", "nested"])
def test_squad_local_file(tmp_path, layout):
    examples = tasks.load_examples("squad", path=_write_squad(tmp_path, layout))
    assert [e.id for e in examples] == ["q1", "q2"]
    for example, row in zip(examples, _SQUAD_FLAT):
        assert row["context"] in example.prompt and row["question"] in example.prompt
        assert example.reference["answers"] == row["answers"]["text"]
    assert len(tasks.load_examples("squad", path=_write_squad(tmp_path, layout), limit=1)) == 1


@pytest.mark.parametrize("completion, expected", [
    ("Eiffel Tower", 1.0),
    ("The Eiffel Tower!", 1.0),
    ("  answer:  the  eiffel tower.\nBecause the passage says so.", 1.0),
    ("An Eiffel, Tower", 1.0),
    ("Tower", 0.0),
    ("The Eiffel Tower in Paris", 0.0),
    ("Paris", 0.0),
])
def test_squad_exact_match(completion, expected):
    example = tasks.Example("squad", "q1", "prompt", {"answers": ["The Eiffel Tower"]})
    assert tasks.score(example, completion) == expected
    assert tasks.metric_name("squad") == "exact_match"


def test_squad_hub_unreachable_is_one_clear_line(monkeypatch):
    def unreachable(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'rajpurkar/squad' on the Hub\n(details)")

    monkeypatch.setattr(hf_datasets, "load_dataset", unreachable)
    with pytest.raises(FileNotFoundError) as info:
        tasks.load_examples("squad")
    message = str(info.value)
    assert "\n" not in message and "path=" in message and "rajpurkar/squad" in message
    assert isinstance(info.value.__cause__, ConnectionError)


# ---------------------------------------------------------------------------------------------
# Spider

_SPIDER_DEV = [
    {"db_id": "concert", "question": "How many singers are there?",
     "query": "SELECT count(*) FROM singer"},
    {"db_id": "concert", "question": "List the singers' names by age, oldest first.",
     "query": "SELECT name FROM singer ORDER BY age DESC"},
    {"db_id": "concert", "question": "Show the name of each singer and the concert they sang in.",
     "query": "SELECT T1.name, T2.concert_name FROM singer AS T1 JOIN concert AS T2 "
              "ON T1.singer_id = T2.singer_id"},
]


@pytest.fixture
def spider(tmp_path):
    """A tiny Spider layout: ``(dev.json path, db_dir, db path)`` with the ``concert`` db."""
    db_path = tmp_path / "db" / "concert" / "concert.sqlite"
    db_path.parent.mkdir(parents=True)
    with sqlite3.connect(db_path) as conn:
        conn.execute("CREATE TABLE singer (singer_id INTEGER PRIMARY KEY, name TEXT, age INT)")
        conn.execute("CREATE TABLE concert (concert_id INTEGER PRIMARY KEY, concert_name TEXT, "
                     "singer_id INT REFERENCES singer(singer_id))")
        conn.executemany("INSERT INTO singer VALUES (?, ?, ?)",
                         [(1, "Joe", 52), (2, "Ann", 29), (3, "Tim", 41),
                          (4, "Eve", 35)])
        conn.executemany("INSERT INTO concert VALUES (?, ?, ?)",
                         [(1, "Spring", 1), (2, "Summer", 2), (3, "Autumn", 1)])
    conn.close()
    dev = tmp_path / "dev.json"
    dev.write_text(json.dumps(_SPIDER_DEV))
    return str(dev), str(tmp_path / "db"), db_path


def test_spider_examples(spider):
    dev, db_dir, _ = spider
    examples = tasks.load_examples("spider", path=dev, db_dir=db_dir)
    assert [e.id for e in examples] == ["spider/0", "spider/1", "spider/2"]
    for example, row in zip(examples, _SPIDER_DEV):
        assert "CREATE TABLE singer (singer_id INTEGER PRIMARY KEY" in example.prompt
        assert "CREATE TABLE concert" in example.prompt and row["question"] in example.prompt
        assert example.reference["query"] == row["query"]
    assert tasks.metric_name("spider") == "execution_accuracy"
    assert len(tasks.load_examples("spider", path=dev, db_dir=db_dir, limit=2)) == 2


def test_spider_missing_databases(spider, tmp_path):
    dev, _, _ = spider
    with pytest.raises(FileNotFoundError, match="db_dir"):
        tasks.load_examples("spider", path=dev)
    with pytest.raises(FileNotFoundError, match="concert.sqlite"):
        tasks.load_examples("spider", path=dev, db_dir=str(tmp_path / "elsewhere"))


def test_spider_execution_accuracy(spider):
    dev, db_dir, _ = spider
    count, by_age, join = tasks.load_examples("spider", path=dev, db_dir=db_dir)
    assert tasks.score(count, "```sql\nSELECT COUNT(singer_id) AS n FROM singer;\n```") == 1.0
    assert tasks.score(count, "SELECT count(*) FROM concert;") == 0.0
    assert tasks.score(count, "SELEC count(*) FROM singer") == 0.0
    assert tasks.score(count, "") == 0.0
    # a join written the other way round, rows in another order: the gold has no ORDER BY
    assert tasks.score(join, "SELECT s.name, c.concert_name FROM concert c JOIN singer s "
                             "USING (singer_id) ORDER BY c.concert_name DESC; -- done") == 1.0
    assert tasks.score(join, "SELECT c.concert_name, s.name FROM concert c JOIN singer s "
                             "USING (singer_id)") == 0.0  # columns swapped
    # the gold has ORDER BY: order matters
    assert tasks.score(by_age, "SELECT name FROM singer WHERE age > 0 ORDER BY age DESC") == 1.0
    assert tasks.score(by_age, "SELECT name FROM singer ORDER BY age ASC") == 0.0
    # a ';' inside a string literal does not end the statement
    assert tasks.score(count, "SELECT count(*) FROM singer WHERE name != 'a;b';") == 1.0
    # no statement is not an empty result
    empty = tasks.Example("spider", "spider/x", "prompt",
                          dict(count.reference, query="SELECT name FROM singer WHERE age > 99"))
    assert tasks.score(empty, "SELECT name FROM singer WHERE age > 60") == 1.0
    assert tasks.score(empty, "") == 0.0
    assert tasks.score(empty, "-- SELECT name FROM singer") == 0.0


def test_spider_runaway_query_times_out(spider):
    dev, db_dir, _ = spider
    count = tasks.load_examples("spider", path=dev, db_dir=db_dir, limit=1)[0]
    forever = ("WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) "
               "SELECT count(*) FROM c")
    start = time.monotonic()
    assert tasks.score(count, forever, timeout=1.0) == 0.0
    assert 0.9 < time.monotonic() - start < 3.0  # ran until the time limit, then was stopped


def test_spider_cannot_write(spider, tmp_path, monkeypatch):
    dev, db_dir, db_path = spider
    count = tasks.load_examples("spider", path=dev, db_dir=db_dir, limit=1)[0]
    monkeypatch.chdir(tmp_path)
    assert tasks.score(count, "DROP TABLE singer") == 0.0
    assert tasks.score(count, "DELETE FROM singer") == 0.0
    assert tasks.score(count, "ATTACH DATABASE 'new.sqlite' AS n") == 0.0
    assert not (tmp_path / "new.sqlite").exists()
    with sqlite3.connect(db_path) as conn:
        assert conn.execute("SELECT count(*) FROM singer").fetchone() == (4,)
    conn.close()
    assert tasks.score(count, "SELECT count(*) FROM singer") == 1.0


# ---------------------------------------------------------------------------------------------
# common


def test_unknown_task_and_options():
    with pytest.raises(ValueError, match="humaneval, gsm8k, mtbench, squad, spider"):
        tasks.load_examples("mmlu")
    with pytest.raises(ValueError):
        tasks.metric_name("mmlu")
    with pytest.raises(ValueError, match="db_dir"):
        tasks.load_examples("gsm8k", db_dir="/tmp")
    with pytest.raises(ValueError, match="split"):
        tasks.load_examples("humaneval", split="test")
