"""A head-training run's log (``RUN/log.jsonl``: loss and held-out acceptance by step) and its
plot (``RUN/training.png``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional


def read_log(run_dir) -> List[dict]:
    path = Path(run_dir) / "log.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def plot_log(run_dir) -> Optional[Path]:
    """``RUN/training.png``: training loss and held-out acceptance by step."""
    log = [r for r in read_log(run_dir) if "heldout_acceptance_1" in r]
    if not log:
        return None
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.4))
    steps = [r["step"] for r in log]
    for key, lab in (("loss", "train loss"), ("heldout_loss", "held-out loss")):
        pts = [(r["step"], r[key]) for r in log if key in r]
        if pts:
            a.plot(*zip(*pts), marker="o", label=lab)
    a.set_xlabel("step")
    a.set_ylabel("loss")
    a.legend()
    for k in (1, 2):
        key = f"heldout_acceptance_{k}"
        if key in log[0]:
            b.plot(steps, [r[key] for r in log], marker="o", label=f"draft step {k}")
    b.set_xlabel("step")
    b.set_ylabel("held-out acceptance")
    b.legend()
    fig.tight_layout()
    out = Path(run_dir) / "training.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
