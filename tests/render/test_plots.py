"""The --plot pictures as a reader sees them: colours that mean one thing each, units chosen for the data and named,
what is assumed marked, stages only where the run has them. Each test draws a real sample's figure and reads it back
(the figure is kept instead of written) against the numbers another command prints."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from matplotlib.collections import LineCollection
from matplotlib.colors import to_rgba
from matplotlib.container import ErrorbarContainer
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle
from matplotlib.text import Annotation, Text

from tests.conftest import SAMPLES, TRACES, ingested, run_main
from tests.test_sample_traces import EXPERIMENTS
from traceana.render import colours, plots
from traceana.render.units import BANDWIDTH, BINARY_BYTES, unit_for

H200 = TRACES / "kineto" / "h200_gpt_h2048_L8_s1024_gb4.json.gz"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ingested(tmp_path_factory.mktemp("plots") / "t.duckdb", {
        **{name: (SAMPLES / name, EXPERIMENTS[name][0]) for name in ("toy8_tp2pp2dp2_1f1b", "moe_skewed")},
        "h200": (H200, None)})


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Figure]]:
    """The figures the commands draw, kept open instead of written."""
    import matplotlib.pyplot as plt

    kept: list[Figure] = []
    monkeypatch.setattr(plots, "save_figure", lambda fig, path, dpi: kept.append(fig))
    yield kept
    for fig in kept:
        plt.close(fig)


def _run(*args: object) -> str:
    code, out, err = run_main(*args)
    assert code == 0, err
    return out


def test_the_critical_path_has_a_colour_no_dim_has(db: Path, figures: list[Figure], tmp_path: Path) -> None:
    # it was red on a chart whose PP communication is red (tab:red)
    taken = {to_rgba(c) for c in (*colours.DIM_COLORS.values(), colours.COMP_COLOR, colours.IDLE_COLOR)}
    assert to_rgba(colours.CRITICAL_PATH_COLOR) not in taken
    assert not taken & {to_rgba(c) for c in colours.IDLE_CAUSE_COLORS.values()}
    _run("critical-path", "toy8_tp2pp2dp2_1f1b", "--plot", tmp_path / "cp.png", "--db", db)
    ax = figures[0].axes[0]
    lines = [c for c in ax.collections if isinstance(c, LineCollection)]
    assert lines and all({tuple(rgba) for rgba in c.get_colors()} == {to_rgba(colours.CRITICAL_PATH_COLOR)}
                         for c in lines)
    drawn = {tuple(rgba) for c in ax.collections if not isinstance(c, LineCollection) for rgba in c.get_facecolors()}
    assert to_rgba(colours.DIM_COLORS["PP"]) in drawn  # the sample's pipeline sends are on the chart too
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "critical path" in legend and "PP communication" in legend


def test_units_follow_the_magnitude() -> None:
    assert unit_for(720_896, BINARY_BYTES)[0] == "KiB"
    assert unit_for(1_048_576, BINARY_BYTES)[0] == "MiB"
    assert unit_for(1023, BINARY_BYTES)[0] == "B" and unit_for(0, BINARY_BYTES)[0] == "B"
    assert unit_for(0.46e9, BANDWIDTH)[0] == "MB/s" and unit_for(25e9, BANDWIDTH)[0] == "GB/s"
    assert unit_for(13_264_896, BINARY_BYTES)[0] == "MiB" and unit_for(6.2 * 2**30, BINARY_BYTES)[0] == "GiB"


def _matrix(db: Path, run: str) -> list[dict]:
    return json.loads(_run("comm", run, "--json", "--db", db))["matrix"]


def test_heatmap_units_and_assumed_all_to_all_cells(db: Path, figures: list[Figure], tmp_path: Path) -> None:
    # moe_skewed: every pair is an all-to-all's even split (sample_traces/moe.py: 2-rank EP groups); the bytes are
    # hundreds of KiB per pair (720,896 and 327,680 in `comm --json`) and were drawn as 0.721 and 0.328 "MB"
    pairs = _matrix(db, "moe_skewed")
    assert {p["bytes"] for p in pairs} == {720_896, 327_680} and all(p["assumed_bytes"] == p["bytes"] for p in pairs)
    _run("comm", "moe_skewed", "--plot", tmp_path / "m.png", "--db", db)
    traffic, bandwidth = figures[0].axes[:2]
    assert traffic.get_title() == "traffic in KiB (2^10 bytes)"
    assert bandwidth.get_title() == "achieved bandwidth in MB/s (1e6 bytes/s)"
    assert sorted(t.get_text() for t in traffic.texts) == ["320", "320", "704", "704"]  # as `comm` prints them
    expected = sorted(f"{p['bytes'] / (p['time_ms'] / 1e3) / 1e6:.3g}" for p in pairs)
    assert sorted(t.get_text() for t in bandwidth.texts) == expected
    for ax in (traffic, bandwidth):
        hatched = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_hatch()]
        assert sorted((int(p.get_y() + 0.5), int(p.get_x() + 0.5)) for p in hatched) == \
            sorted((p["src"], p["dst"]) for p in pairs)
    assert "hatched: an all-to-all's bytes split evenly over its group, assumed" in figures[0].get_suptitle()
    images = [im for ax in (traffic, bandwidth) for im in ax.images]
    for image, values in zip(images, ([p["bytes"] / 2**10 for p in pairs],
                                      [p["bytes"] / p["time_ms"] / 1e3 for p in pairs]), strict=True):
        assert image.norm.vmin == pytest.approx(min(values)) and image.norm.vmax == pytest.approx(max(values))


def test_heatmap_of_equal_cells_says_so(db: Path, figures: list[Figure], tmp_path: Path) -> None:
    # toy8: each stage-0 rank sends its stage-1 peer the same activations, and back the same gradients: one size
    pairs = _matrix(db, "toy8_tp2pp2dp2_1f1b")
    assert len(pairs) == 8 and len({p["bytes"] for p in pairs}) == 1 and not any(p["assumed_bytes"] for p in pairs)
    _run("comm", "toy8_tp2pp2dp2_1f1b", "--plot", tmp_path / "t.png", "--db", db)
    fig = figures[0]
    traffic = fig.axes[0]
    assert traffic.get_title() == f"traffic: every pair {pairs[0]['bytes'] / 2**20:.3g} MiB (2^20 bytes)"
    assert len(fig.axes) == 3  # two panels and one colour bar: the bandwidths differ, the sizes do not
    assert "hatched" not in fig.get_suptitle() and not [p for p in traffic.patches if p.get_hatch()]


def test_memory_plot_and_table_share_a_unit(db: Path, figures: list[Figure], tmp_path: Path) -> None:
    for run, unit in (("toy8_tp2pp2dp2_1f1b", "MiB"), ("h200", "GiB")):
        peaks = json.loads(_run("memory", run, "--json", "--db", db))
        largest = max(r["peak_allocated_bytes"] for r in peaks)
        assert unit_for(largest, BINARY_BYTES)[0] == unit  # toy8 peaks at 12.65 MiB, the H200 GPT at 6.2 GiB
        out = _run("memory", run, "--plot", tmp_path / f"{run}.png", "--db", db)
        assert f"peak_allocated_{unit}" in out and f"({unit} = 2^" in out
        assert figures[-1].axes[0].get_ylabel().startswith(f"memory ({unit} = ")


def test_stages_only_where_the_run_has_pipeline_stages(db: Path, figures: list[Figure], tmp_path: Path) -> None:
    _run("breakdown", "toy8_tp2pp2dp2_1f1b", "--plot", tmp_path / "a.png", "--db", db)
    _run("breakdown", "moe_skewed", "--plot", tmp_path / "b.png", "--db", db)
    _run("timeline", "moe_skewed", "--plot", tmp_path / "c.png", "--db", db)
    staged, flat, gantt = (fig.axes[0] for fig in figures)
    assert staged.get_xlabel() == "rank (grouped by pipeline stage)"
    assert {t.get_text() for t in staged.texts} == {"stage 0", "stage 1"}
    assert flat.get_xlabel() == "rank" and not flat.texts  # moe_skewed: ep=2, dp=4, one stage
    assert [t.get_text() for t in gantt.get_yticklabels()] == [f"rank {r}" for r in range(4)]
    out = _run("stragglers", "moe_skewed", "--db", db)
    assert "straggler stage: all ranks (one pipeline stage: no pipeline parallelism)" in out


def test_roofline_points_and_roofs_are_the_json_numbers(db: Path, figures: list[Figure], tmp_path: Path) -> None:
    out = json.loads(_run("kernels", "h200", "--roofline", "--top", "40", "--json", "--plot", tmp_path / "r.png",
                          "--db", db))
    (fig,) = figures
    ax = fig.axes[0]
    assert ax.get_xscale() == ax.get_yscale() == "log"
    drawn = sorted((float(x), float(y)) for c in ax.collections for x, y in c.get_offsets())
    rows = sorted((r["FLOP_per_B"], r["TFLOP_per_s"]) for r in out["rows"] if r["FLOP_per_B"])
    assert len(drawn) == len(rows) == 35  # of 40: 5 copies and fills have no FLOPs
    assert [v for p in drawn for v in p] == pytest.approx([v for p in rows for v in p])
    roofs = {line.get_label(): max(line.get_ydata()) for line in ax.get_lines()}
    assert roofs == {"roof: bf16 / fp16 tensor cores 989 TFLOP/s, ridge 206 FLOP/B": 989,
                     "roof: fp32 CUDA cores 67 TFLOP/s, ridge 14 FLOP/B": 67}


def test_diff_bars_are_the_json_numbers(db: Path, figures: list[Figure], tmp_path: Path) -> None:
    said = json.loads(_run("diff", "toy8_tp2pp2dp2_1f1b", "moe_skewed", "--json", "--plot", tmp_path / "d.png",
                           "--db", db))
    (fig,) = figures
    bars = [p for p in fig.axes[0].patches if isinstance(p, Rectangle)]
    drawn = {r["part"] for r in said["breakdown"] if r["ms_A"] or r["ms_B"]} - {"OVERLAPPED"}
    expected = [r[c] or 0.0 for r in said["breakdown"] if r["part"] in drawn for c in ("ms_A", "ms_B")]
    assert sorted(p.get_height() for p in bars) == pytest.approx(sorted(expected), abs=1e-6)
    assert sum(bool(p.get_hatch()) for p in bars) == len(bars) // 2  # B hatched, A solid


def test_roofline_numbers_do_not_overlap(db: Path, figures: list[Figure], tmp_path: Path) -> None:
    # the H200 GPT's ten longest ops: nine GEMMs in one cluster at ~900 FLOP/B, whose numbers were drawn on each other
    _run("kernels", "h200", "--roofline", "--plot", tmp_path / "r.png", "--db", db)
    (fig,) = figures
    ax = fig.axes[0]
    fig.canvas.draw()
    numbers = [t for t in ax.texts if isinstance(t, Annotation) and t.get_text().isdigit()]
    assert sorted(int(t.get_text()) for t in numbers) == list(range(1, 11))
    boxes = [Text.get_window_extent(t) for t in numbers]
    frame = ax.get_window_extent()
    assert all(frame.contains(b.x0, b.y0) and frame.contains(b.x1, b.y1) for b in boxes)
    assert not [(a, b) for i, a in enumerate(boxes) for b in boxes[i + 1:] if a.overlaps(b)]
    assert all(t.arrow_patch is not None for t in numbers)  # each on a leader line to its point


def test_whatif_draws_the_step_interval(db: Path, figures: list[Figure], tmp_path: Path) -> None:
    said = json.loads(_run("whatif", "toy8_tp2pp2dp2_1f1b", "--change", "dim=TP:0.5", "--json", "--plot",
                           tmp_path / "w.png", "--db", db))
    (fig,) = figures
    ax = fig.axes[0]
    (interval,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer) and c.get_label().startswith("step")]
    (segment,) = interval.lines[2][0].get_segments()
    assert [y for _, y in segment] == pytest.approx([said["low"], said["high"]])
    assert interval.lines[2][0].get_linewidth()[0] >= 2  # visible beside the bars, not a hairline
    assert said["high"] - said["low"] > 0.05 * said["predicted_step_ms"]  # toy8's interval: about ±5%
    label = f"[{said['low']:,.1f}, {said['high']:,.1f}]"
    assert any(label in t.get_text() and f"({100 * said['level']:.0f}%)" in t.get_text() for t in ax.texts)


def test_the_saved_file_keeps_what_lies_past_the_canvas(tmp_path: Path) -> None:
    # `comm --plot` clipped "destination rank" under its left panel: the saved file is cropped to what is drawn
    import matplotlib.image
    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(4, 3))
    ax = fig.add_axes((0, 0, 1, 1))
    ax.set_xlabel("destination rank")
    plots.save_figure(fig, tmp_path / "f.png", dpi=50)
    height, width = matplotlib.image.imread(tmp_path / "f.png").shape[:2]
    assert height > 3 * 50 and width > 4 * 50  # the tick labels and the axis label below and left of the canvas
