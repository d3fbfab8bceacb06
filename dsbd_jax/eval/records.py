"""The benchmark's records: the JSON lines of a run (``records.jsonl``), read back, and resumed.

:func:`read_records` reads a results file; :func:`resume_state` tells what an earlier run of the
same config left (and refuses a different config); :func:`record_of` turns one row of a decoder's
output into the figures of its ``type: "sample"`` line. The config file and the lines' keys are
described in :mod:`.plan`.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Dict, List, Optional

import numpy as np

logger = logging.getLogger("dsbd_jax")


def read_records(path) -> List[Dict[str, Any]]:
    """All JSON lines of a results file (``ValueError`` naming the line if one is broken)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"results file {path} does not exist")
    out = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{path}:{n}: not a JSON line ({e.msg})") from None
    return out


# may differ between machines or edits; ``warmup`` only decides how compilation is kept out of
# the timings (untimed runs or ahead-of-time compiles), not what a record holds
_RESUME_IGNORED = ("description", "models_file", "warmup")


def _comparable(config: Dict[str, Any]) -> Dict[str, Any]:
    """The config as the header records it (absolute paths as ``portable_settings`` writes them),
    without the keys a resume ignores."""
    from dsbd_jax.eval.timing import portable_settings
    return json.loads(json.dumps(portable_settings(
        {k: v for k, v in config.items() if k not in _RESUME_IGNORED and k != "runs"})))


def resume_state(records_path, config: Dict[str, Any]) -> Optional[Dict[str, Any]]:
    """What an earlier run of ``config`` left in ``records_path``, or ``None`` if there is none.

    Returns ``{"done": {(label, prompt_index), ...}, "records": n}``. A last line cut off by a
    kill (no newline, or not JSON) is removed from the file; every earlier line must be JSON.
    ``ValueError`` if the file was written by a different config (naming the keys that differ)
    or has no ``type: "run"`` header first."""
    path = Path(records_path)
    if not path.is_file() or path.stat().st_size == 0:
        return None
    with open(path, "rb") as f:
        data = f.read()
    keep = data.rfind(b"\n") + 1  # bytes up to the last complete line
    tail = data[keep:]
    if tail.strip():
        try:
            json.loads(tail)  # a whole record whose newline was never written: keep it
            with open(path, "ab") as f:
                f.write(b"\n")
            keep = len(data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            logger.warning("%s: dropping a cut-off last line (%d bytes)", path, len(tail))
            with open(path, "r+b") as f:
                f.truncate(keep)
    lines = data[:keep].decode().splitlines()
    records = []
    for n, line in enumerate(lines, 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not a JSON line ({e.msg}); the records file is "
                                 "damaged before its last line, so the run cannot resume") from None
    if not records:
        return None
    head = records[0]
    if head.get("type") != "run":
        raise ValueError(f"{path}: the first line is not a run header; not a dsbd bench records file")
    old, new = _comparable(head.get("config", {})), _comparable(config)
    if old != new:
        keys = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        raise ValueError(
            f"{path} holds a run of a different config (differs in: {', '.join(keys)}); resuming "
            "would mix two configs. Use another output folder (--out), or delete the file to "
            "start over")
    done = {(r["label"], r["prompt_index"]) for r in records
            if r.get("type") == "sample" and "prompt_index" in r}
    return {"done": done, "records": len(done)}


def record_of(out, tokenizer, row: int = 0) -> Dict[str, Any]:
    """Per-prompt figures of row ``row`` of a ``GenerateOutput`` (its best beam).
    ``target_calls`` / ``draft_calls`` / ``iterations`` are the whole batch's;
    ``row_target_calls`` counts the target passes in which this prompt was still decoding
    (prefill included)."""
    from dsbd_jax.eval.timing import best_beam
    bb = best_beam(out, row)
    stats, n, ll = bb["stats"], bb["new_tokens"], bb["loglik"]
    rec = {"new_tokens": n, "loglik": ll, "loglik_per_token": ll / n if n else None,
           **{k: bb[k] for k in ("target_calls", "draft_calls", "iterations")},
           "completion": tokenizer.decode(bb["token_ids"], skip_special_tokens=True)}
    if "row_iterations" in stats:  # speculative, tree, DSBD: one target pass per iteration
        rec["row_target_calls"] = int(np.asarray(stats["row_iterations"]).reshape(-1)[row]) + 1
    else:  # sample / beam: the prefill, then one step per token after the first
        rec["row_target_calls"] = max(n, 1)
    for k in ("mean_accepted_width", "mean_layers_per_iteration", "acceptance_rate"):
        if k in stats:
            v = np.asarray(stats[k]).reshape(-1)
            rec[k] = float(v[row] if v.size > 1 else v[0])
    return rec
