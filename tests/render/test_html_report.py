"""`traceana report --html`: one self-contained file, checked for its numbers and rendered in headless Chromium
(no console message, a screenshot that is not blank). The browser check is first run on a page that is broken on
purpose, so a check that cannot fail would be noticed."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib import image

from tests.conftest import SAMPLES, run_cli

TOY = "toy8_tp2pp2dp2_1f1b"
CONFIG = SAMPLES.parent / "configs" / f"{TOY}.yaml"
CHROMIUM = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("report")
    db, out = folder / "r.duckdb", folder / "report.html"
    run_cli("ingest", SAMPLES / TOY, "--layout", "tp=2,pp=2,dp=2", "--db", db)
    said = run_cli("report", TOY, "--html", out, "--estimate", CONFIG, "--db", db).stdout
    assert said.startswith(f"wrote {out} ({TOY}; ")
    return db, out


def render(page: Path, tmp: Path) -> tuple[list[str], np.ndarray]:
    """Console messages Chromium logged while loading ``page``, and its screenshot (RGB floats in 0..1)."""
    shot = tmp / f"{page.stem}.png"
    result = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={tmp / 'profile'}", "--enable-logging=stderr", "--v=0", "--window-size=1400,3000",
         f"--screenshot={shot}", page.as_uri()], capture_output=True, text=True, timeout=180)
    assert shot.exists(), result.stderr[-2000:]
    console = [line for line in result.stderr.splitlines() if re.search(r":CONSOLE[:(]", line)]
    return console, image.imread(shot)[..., :3]


def ink(pixels: np.ndarray) -> float:
    """The share of pixels that are not (nearly) white."""
    return float((pixels.min(axis=2) < 0.9).mean())


@pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (Debian: apt-get install chromium)")
def test_renders_in_a_real_browser(report: tuple[Path, Path], tmp_path: Path) -> None:
    broken = tmp_path / "broken.html"
    broken.write_text('<!DOCTYPE html><p>x</p><script>console.error("broken on purpose"); nothing();</script>')
    console, pixels = render(broken, tmp_path)
    assert len(console) == 2 and "broken on purpose" in console[0] and "ReferenceError" in console[1]
    assert ink(pixels) < 0.01  # one letter on a white page counts as blank

    console, pixels = render(report[1], tmp_path)
    assert console == []
    assert ink(pixels) > 0.05 and len(np.unique(pixels.reshape(-1, 3), axis=0)) > 50  # text, tables and plots


def test_self_contained_with_the_numbers_of_the_cli(report: tuple[Path, Path]) -> None:
    db, out = report
    text = out.read_text(encoding="utf-8")
    sources = re.findall(r'(?:src|href)\s*=\s*"([^"]*)"', text) + re.findall(r"url\(([^)]*)\)", text)
    assert sources and all(s.startswith("data:image/png;base64,") for s in sources)
    assert "http:" not in text and "https:" not in text and "<script" not in text
    assert len(re.findall(r"<img ", text)) == 4  # rank bars, timeline, critical path, estimate vs measured
    headings = re.findall(r"<h2>([^<]*)</h2>", text)
    assert headings == ["Run summary", "What to change (advise)", "Breakdown per pipeline stage", "Breakdown per rank",
                        "Timeline of the first analysed step", "Stragglers", "Critical path", "Communication",
                        "Top kernels", "Why the device was idle", "Memory", "Estimate vs measured"]
    # the critical path's totals and the communication per op are the commands' numbers
    path = json.loads(run_cli("critical-path", TOY, "--json", "--db", db).stdout)
    assert f"Step {path['step']}: {path['length_ms']:,.3f} ms" in text
    for row in path["by_rank"]:
        assert (f'<td class="n">{row["rank"]}</td><td class="n">{row["stage"]}</td><td class="n">{row["segments"]}'
                f'</td><td class="n">{row["duration_ms"]:,.3f}</td>') in text
    for row in json.loads(run_cli("comm", TOY, "--json", "--db", db).stdout)["by_op"]:
        assert f'<td class="n">{row["instances"]}</td><td class="n">{row["size_bytes"]}</td>' in text
    # the stage table holds what `traceana breakdown --by stage --json` prints, to the table's 3 decimals
    stages = json.loads(run_cli("breakdown", TOY, "--by", "stage", "--json", "--db", db).stdout)
    for stage in stages:
        cells = [f"{stage[f'{p}_mean_ms']:,.3f}" for p in ("TOTAL", "COMP", "MP_WAIT", "DP_WAIT", "PP_WAIT")]
        row = f'<td class="n">{stage["pp"]}</td><td class="n">4</td>' + "".join(f'<td class="n">{c}</td>'
                                                                                 for c in cells)
        assert row in text
    # the findings `traceana advise --config` ranks, first to last
    advised = json.loads(run_cli("advise", TOY, "--config", CONFIG, "--json", "--db", db).stdout)["findings"]
    at = [text.index(f'<td class="s">{html.escape(f["change"])}</td><td class="n">{f["predicted_step_ms"]:,.3f}</td>')
          for f in advised]
    assert advised and at == sorted(at)
    # and the estimate the compare command prints
    compare = json.loads(run_cli("compare", "--estimate", CONFIG, TOY, "--json", "--db", db).stdout)
    comp = next(r for r in compare["by_dimension"] if r["dim"] == "COMP")
    assert f'<td class="s">COMP</td><td class="n">{comp["measured_ms"]:,.3f}</td>' in text
    assert f'<td class="n">{comp["estimated_ms"]:,.3f}</td>' in text


def test_without_a_config_there_is_no_estimate_section(report: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "plain.html"
    run_cli("report", "--html", out, "--db", report[0])
    assert "Estimate vs measured" not in out.read_text(encoding="utf-8")
