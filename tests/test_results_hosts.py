"""Every result JSON records its host, and no path of the measuring machine.

1. Every committed JSON (and JSONL) under ``results/`` has a ``machine`` block with the host
   fields of :data:`dsbd_jax.eval.timing.HOST_KEYS` (``cpu_model``, ``cpu_flags``,
   ``cpu_count``, ``jax``, ``jaxlib``, ``xla_flags``; a JSONL file in one of its lines, a bench
   run's header), a GPU result under ``results/gpu`` the device name too, and no absolute path
   of the measuring machine (``/work/``, ``/root/``, ``/home/``, ``/tmp/``).
2. Every benchmark writer produces such a block: each ``benchmarks/*.py`` that writes JSON calls
   ``machine_info()`` (or copies the block of the records it reports on), and
   ``machine_info()`` returns the host fields.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
ABSOLUTE = re.compile(r"/(?:work|root|home|tmp)/")

# Results written before their writers recorded the whole host (or, for a few, any host, or
# with a path of the measuring machine in them). Each is to be re-measured (its writer now
# records everything) or deleted; this list only shrinks. Reason per file: test_legacy_reasons.
LEGACY_WITHOUT_HOST = {}  # empty: every committed result records its whole host

# benchmarks that write JSON without calling machine_info() themselves: each copies the block
# that the processes it ran (or the records it reports on) wrote, by this expression
COPIES_MACHINE = {
    "quality_report.py": '"machine": summary["machine"]',   # the records' header's
}


def host_keys():
    from dsbd_jax.eval.timing import HOST_KEYS
    return HOST_KEYS


def result_files():
    return sorted(p.relative_to(RESULTS).as_posix() for p in RESULTS.rglob("*")
                  if p.is_file() and p.suffix in (".json", ".jsonl"))


def problems(rel: str, base: Path = RESULTS) -> list:
    """What the result file ``base / rel`` lacks: the machine block or its host fields, the
    GPU's name (under ``gpu/``), or it names an absolute path. Empty when it is whole."""
    path = base / rel
    text = path.read_text()
    docs = ([json.loads(x) for x in text.splitlines() if x.strip()] if path.suffix == ".jsonl"
            else [json.loads(text)])
    blocks = [d["machine"] for d in docs if isinstance(d, dict) and isinstance(d.get("machine"),
                                                                                  dict)]
    out = []
    if not blocks:
        out.append("no machine block")
    for block in blocks[:1]:
        missing = [k for k in host_keys() if k not in block]
        if missing:
            out.append(f"machine block lacks {missing}")
        if rel.startswith("gpu/") and not str(block.get("device", "")).strip():
            out.append("no device name")
    hits = sorted(set(re.findall(r"/(?:work|root|home|tmp)/[^\"\s,]*", text)))
    if hits:
        out.append(f"absolute paths {hits[:3]}")
    return out


@pytest.mark.parametrize("rel", result_files())
def test_result_records_its_host(rel):
    found = problems(rel)
    if rel in LEGACY_WITHOUT_HOST:
        assert found, f"results/{rel} is whole now: remove it from LEGACY_WITHOUT_HOST"
        # a legacy file may lack host fields, never name a path of the measuring machine
        assert not any(p.startswith("absolute") for p in found), (rel, found)
        return
    assert not found, f"results/{rel}: {'; '.join(found)}"


def test_legacy_list_names_files_that_exist():
    gone = sorted(set(LEGACY_WITHOUT_HOST) - set(result_files()))
    assert not gone, f"LEGACY_WITHOUT_HOST names files no longer in results/: {gone}"


def test_problems_sees_what_is_missing(tmp_path):
    """The check itself: a whole block passes; a missing field, a missing block, a GPU block
    without a device name and an absolute path each fail."""
    whole = {k: "x" for k in host_keys()}
    cases = {
        "ok.json": ({"machine": whole, "rows": []}, []),
        "ok.jsonl": ([{"type": "run", "machine": whole}, {"type": "sample"}], []),
        "no_flags.json": ({"machine": {k: v for k, v in whole.items() if k != "cpu_flags"}},
                          ["machine block lacks ['cpu_flags']"]),
        "none.json": ({"rows": []}, ["no machine block"]),
        "gpu/x.json": ({"machine": whole}, ["no device name"]),
        "path.json": ({"machine": whole, "table": "/tmp/t.npz"}, ["absolute paths ['/tmp/t.npz']"]),
    }
    for rel, (doc, want) in cases.items():
        f = tmp_path / rel
        f.parent.mkdir(exist_ok=True)
        f.write_text("\n".join(map(json.dumps, doc)) if rel.endswith("l") else json.dumps(doc))
        assert problems(rel, tmp_path) == want, rel


def _writers():
    out = {}
    for p in sorted((ROOT / "benchmarks").rglob("*.py")):
        src = p.read_text()
        if re.search(r"write_json\(|json\.dump\(|json\.dumps\(.*(?:write_text|indent)", src) or \
                ("write_text(json.dumps" in src):
            out[p.name] = src
    return out


def test_every_benchmark_writer_records_the_host():
    writers = _writers()
    assert len(writers) >= 6, sorted(writers)  # the check sees the writers
    for name, src in writers.items():
        if name in COPIES_MACHINE:
            assert COPIES_MACHINE[name] in src, name
            continue
        assert "machine_info()" in src, f"benchmarks/{name} writes JSON without machine_info()"


def test_machine_info_has_the_host_fields():
    from dsbd_jax.eval.timing import machine_info
    m = machine_info()
    missing = [k for k in host_keys() if k not in m]
    assert not missing, missing
    assert m["cpu_model"] and isinstance(m["cpu_flags"], list) and m["cpu_count"] >= 1
    assert m["jax"] and m["jaxlib"] and isinstance(m["xla_flags"], str)
    json.dumps(m)  # a JSON block as it is


def test_portable_paths(tmp_path):
    from dsbd_jax.eval.timing import portable_path, portable_settings
    root = tmp_path / "checkout"
    assert portable_path(root / "results" / "x.json", root) == "results/x.json"
    assert portable_path("/somewhere/else/table.npz", root) == "table.npz"
    s = portable_settings({"out": str(root / "r.json"), "n": 3, "xs": ["/a/b.npz", "rel/c"],
                           "name": "qwen", "datasets": [{"path": "/data/gsm8k.jsonl"}]}, root)
    assert s == {"out": "r.json", "n": 3, "xs": ["b.npz", "rel/c"], "name": "qwen",
                 "datasets": [{"path": "gsm8k.jsonl"}]}
    assert not ABSOLUTE.search(json.dumps(s))
