"""The notebooks in notebooks/ run end to end (tiny random models: DSBD_NOTEBOOK_MODELS=tiny,
the switch each notebook reads; the default is the offline Qwen pair), so they never rot."""

import os
import re
from pathlib import Path

import pytest

NOTEBOOKS = Path(__file__).resolve().parent.parent / "notebooks"


def execute(name):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    os.environ["DSBD_NOTEBOOK_MODELS"] = "tiny"
    try:
        nbclient.NotebookClient(nb, timeout=600, kernel_name="python3",
                                resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
    finally:
        os.environ.pop("DSBD_NOTEBOOK_MODELS", None)
    texts, images = [], 0
    for cell in nb.cells:
        for o in cell.get("outputs", []):
            assert o.get("output_type") != "error", o
            texts.append(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")))
            images += "image/png" in o.get("data", {})
    return "\n".join(texts), images


def test_quickstart_notebook(torch):
    text, _ = execute("quickstart.ipynb")
    for expected in ("second call", "prompt 0, layer 0", "average accepted width",
                     "beam sampling W=2", "log-likelihood per token of the best beam",
                     "same tokens as on one device: True",
                     "N = V gives the same tokens as the full head: True"):
        assert expected in text
    # the distillation section: held-out acceptance rises from step 0 to the last step
    acc = [float(a) for a in re.findall(r"held-out acceptance sum min\(p, q\) = ([0-9.]+)", text)]
    assert len(acc) >= 2 and acc[-1] > acc[0] + 0.05, acc
    # the draft-head section: trained, saved, read back, drafting for speculative and DSBD
    assert "trained 60 steps" in text and "speculative, trained head" in text
    assert "DSBD with the trained head: tokens per iteration" in text


@pytest.mark.extended   # the benchmark notebook: the harness the eval tests cover, drawn
def test_benchmark_notebook(torch):
    text, images = execute("benchmark.ipynb")
    assert "dsbd g=2 WS=3 t=0.9 Wmin=1 single-beam" in text and "beam W=3" in text
    # speed vs quality, width vs speed, speed vs each task metric (2), and energy vs quality where
    # the host has an energy reading (else no empty frame: a line says why it is not drawn)
    assert images == 4 + ("energy_vs_quality: not drawn: energy unavailable" not in text)
