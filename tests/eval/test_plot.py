"""dsbd_jax.eval.plot: Pareto fronts, and the three figures of a synthetic ``records.jsonl``."""

import importlib.util
import json
import xml.etree.ElementTree as ET

import pytest

from dsbd_jax.eval.plot import pareto_front, plot_results
from dsbd_jax.decoding.methods import label

STEMS = ("speed_vs_quality", "energy_vs_quality", "width_vs_speed",
         "speed_vs_humaneval_pass1")  # one speed figure per other quality figure
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# ---------------------------------------------------------------------------------------------
# pareto_front
def test_pareto_front_excludes_dominated_and_sorts_by_x():
    pts = [(1.0, 1.0), (2.0, 0.5), (0.5, 0.5), (1.5, 1.2), (3.0, 0.1)]
    # (1, 1) loses to (1.5, 1.2); (0.5, 0.5) to everything but (3, 0.1)
    assert pareto_front(pts) == [3, 1, 4]


def test_pareto_front_ties():
    # equal points are both kept; same x with lower y and same y with lower x are dominated
    pts = [(2.0, 1.0), (2.0, 1.0), (2.0, 0.5), (1.0, 1.0), (3.0, 0.2)]
    assert pareto_front(pts) == [0, 1, 4]


def test_pareto_front_minimize_x():
    pts = [(1.0, 1.0), (2.0, 2.0), (3.0, 1.5), (0.5, 0.2)]
    assert pareto_front(pts, maximize_x=False) == [3, 0, 1]  # (3, 1.5) loses to (2, 2)
    assert pareto_front(pts, maximize_x=True) == [1, 2]


def test_pareto_front_single_and_empty():
    assert pareto_front([(4.0, -2.0)]) == [0]
    assert pareto_front([(4.0, -2.0)], maximize_x=False) == [0]
    assert pareto_front([]) == []


# ---------------------------------------------------------------------------------------------
# plot_results on synthetic records (matplotlib is optional)
needs_mpl = pytest.mark.skipif(importlib.util.find_spec("matplotlib") is None,
                               reason="matplotlib is not installed")
HEADER = {"type": "run", "name": "synthetic", "machine": {"device": "TestChip 9000"},
          "energy": {"source": None, "reason": "no counter in the test"}}

# (method, setting, tokens/s, loglik/token, accepted width, pass@1 per prompt)
SETTINGS = [
    ("beam", {"num_beams": 1}, 30.0, -1.20, None, (0, 1)),
    ("beam", {"num_beams": 2}, 18.0, -0.90, None, (1, 1)),
    ("beam", {"num_beams": 4}, 9.0, -0.70, None, (1, 0)),
    ("dsbd", {"gamma": 2, "draft_width": 3, "threshold": 0.9, "min_width": 1},
     40.0, -0.85, 1.7, (1, 1)),
    ("dsbd", {"gamma": 3, "draft_width": 3, "threshold": 0.7, "min_width": 2},
     25.0, -0.65, 2.4, (1, 0)),
    ("dsbd", {"gamma": 3, "draft_width": 2, "threshold": 0.9, "min_width": 1, "single_beam": True},
     55.0, -1.10, 1.3, (0, 1)),
    ("spec", {"gamma": 4}, 60.0, -1.25, None, (0, 0)),
]


def write_records(path, energy=True, scores=True, methods=None, header=True):
    """A header and two sample lines per setting (J/token = 0.01 x tokens/s when ``energy``)."""
    lines = [HEADER] if header else []
    for method, setting, tps, ll, width, passes in SETTINGS:
        if methods is not None and method not in methods:
            continue
        for p, passed in enumerate(passes):
            n = 32
            rec = {"type": "sample", "label": label(method, setting), "method": method,
                   "setting": setting, "task": "humaneval", "example_id": f"HumanEval/{p}",
                   "metric": "pass@1", "new_tokens": n, "seconds": n / tps, "tokens_per_s": tps,
                   "loglik": ll * n, "loglik_per_token": ll, "target_calls": n // 2,
                   "draft_calls": n, "iterations": n // 2, "kv_cache_bytes": 1 << 20,
                   "compile_s": 0.0, "peak_device_bytes": None,
                   "energy_j": 0.01 * tps * n if energy else None,
                   "score": passed if scores else None}
            if width is not None:
                rec["mean_accepted_width"] = width
            lines.append(rec)
    path.write_text("".join(json.dumps(r) + "\n" for r in lines))
    return path


def svg_text(path) -> str:
    ET.parse(path)  # well-formed XML
    return path.read_text()


@pytest.fixture(scope="module")
def full_run(tmp_path_factory):
    d = tmp_path_factory.mktemp("full")
    return d, plot_results(write_records(d / "records.jsonl"))


@needs_mpl
def test_writes_all_figures(full_run):
    d, paths = full_run
    assert sorted(paths) == sorted(d / f"{s}.{f}" for s in STEMS for f in ("png", "svg"))
    for p in paths:
        assert p.stat().st_size > 0
        if p.suffix == ".png":
            assert p.read_bytes()[:8] == PNG_MAGIC


@needs_mpl
def test_svg_texts(full_run):
    d, _ = full_run
    speed = svg_text(d / "speed_vs_quality.svg")
    for text in ("synthetic on TestChip 9000", "W=1", "W=2", "W=4", "g=2 WS=3 t=0.9 Wmin=1",
                 "g=3 WS=3 t=0.7 Wmin=2", "g=3 WS=2 t=0.9 Wmin=1", "DSBD Pareto front",
                 "beam sampling Pareto front", "speculative sampling", "DSBD single-beam"):
        assert text in speed, text
    energy = svg_text(d / "energy_vs_quality.svg")
    assert "energy unavailable" not in energy and "W=4" in energy
    width = svg_text(d / "width_vs_speed.svg")
    assert "g=3 WS=3 t=0.7 Wmin=2" in width and "W=4" not in width
    passes = svg_text(d / "speed_vs_humaneval_pass1.svg")
    assert "humaneval/pass@1" in passes and "95% intervals" in passes


@needs_mpl
def test_no_energy_draws_no_empty_frame_and_says_why(tmp_path):
    """Without energy readings there is no energy figure (an empty frame with a sentence
    before): the log says why, and an earlier run's figure of that name is removed."""
    path = write_records(tmp_path / "records.jsonl")
    plot_results(path, formats=("svg",))
    assert (tmp_path / "energy_vs_quality.svg").exists()
    lines = []
    paths = plot_results(write_records(path, energy=False), log=lines.append)
    assert lines == ["energy_vs_quality: not drawn: energy unavailable: no counter in the test"]
    assert not list(tmp_path.glob("energy_vs_quality.*"))
    assert sorted(p.stem for p in paths) == sorted(
        2 * [s for s in STEMS if s != "energy_vs_quality"])


@needs_mpl
def test_task_metric_and_perplexity_quality(tmp_path):
    path = write_records(tmp_path / "records.jsonl")
    paths = plot_results(path, out_dir=tmp_path / "pass", quality="humaneval/pass@1",
                         formats=("svg",))
    assert [p.name for p in paths] == [f"{s}.svg" for s in STEMS[:3]] + [
        "speed_vs_loglik_per_token.svg"]  # the quality asked for takes speed_vs_quality
    assert "humaneval/pass@1" in svg_text(tmp_path / "pass" / "speed_vs_quality.svg")
    plot_results(path, out_dir=tmp_path / "ppl", quality="perplexity", formats=("svg",))
    assert "perplexity" in svg_text(tmp_path / "ppl" / "speed_vs_quality.svg")


@needs_mpl
def test_no_dsbd(tmp_path):
    lines = []
    plot_results(write_records(tmp_path / "records.jsonl", methods={"beam", "spec"}),
                 formats=("svg",), log=lines.append)
    assert lines == ["width_vs_speed: not drawn: no DSBD settings (with an accepted width) in "
                     "this run"]
    assert not (tmp_path / "width_vs_speed.svg").exists()


def overlapping_texts(fig):
    """Pairs of the axes' texts (the notes) whose rendered boxes overlap."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    texts = fig.axes[0].texts
    boxes = [t.get_window_extent(canvas.get_renderer()) for t in texts]
    return [(texts[i].get_text(), texts[j].get_text()) for i in range(len(boxes))
            for j in range(i + 1, len(boxes)) if boxes[i].overlaps(boxes[j])]


@needs_mpl
def test_notes_of_nearby_points_do_not_collide():
    """Beam W=2 and W=3 at almost the same speed and quality drew "W=2" over "W=3"
    ("W=32"); near points of one kind get one note ("W=2, W=3"), and no two notes overlap."""
    from dsbd_jax.eval.plot import _speed_figure
    rows = [{"method": "beam", "setting": {"num_beams": w}, "tokens_per_s": tps,
             "loglik_per_token": ll, "task_metrics": {}}
            for w, tps, ll in ((1, 30.0, -1.2), (2, 18.0, -0.90), (3, 17.6, -0.895),
                               (4, 9.0, -0.7))]
    fig = _speed_figure(rows, "loglik_per_token", "t")
    notes = sorted(t.get_text() for t in fig.axes[0].texts)
    assert notes == ["W=1", "W=2, W=3", "W=4"], notes
    assert overlapping_texts(fig) == []


@needs_mpl
def test_unknown_quality_lists_available(tmp_path):
    path = write_records(tmp_path / "records.jsonl")
    with pytest.raises(ValueError, match=r"available: loglik_per_token, perplexity, "
                                         r"humaneval/pass@1"):
        plot_results(path, quality="gsm8k/exact_match")
    path = write_records(tmp_path / "records.jsonl", scores=False)
    with pytest.raises(ValueError, match=r"'humaneval/pass@1'.*available: loglik_per_token, "
                                         r"perplexity$"):
        plot_results(path, quality="humaneval/pass@1")


@needs_mpl
def test_header_only_raises(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text(json.dumps(HEADER) + "\n")
    with pytest.raises(ValueError, match="no timed sample records"):
        plot_results(path)
    assert not list(tmp_path.glob("*.png"))
