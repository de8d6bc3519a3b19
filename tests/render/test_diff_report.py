"""`traceana diff A B --html`: the diff page holds `diff --json`'s numbers (every kernel, not --top), and in headless
Chromium it logs nothing, requests nothing, draws its charts and shows a kernel's change on hover."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import SAMPLES, run_cli
from tests.render.browser import MISSING, chromium
from tests.render.test_html_report import Tables, ms


@pytest.fixture(scope="module")
def diff_page(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, Path]:
    folder = tmp_path_factory.mktemp("diff")
    db, out = folder / "d.duckdb", folder / "diff.html"
    for run in ("pp2_mb1", "pp2_mb8"):
        run_cli("ingest", SAMPLES / run, "--db", db)
    said = run_cli("diff", "pp2_mb1", "pp2_mb8", "--html", out, "--json", "--top", 3, "--db", db)
    assert said.stderr.startswith(f"wrote {out} (")
    return json.loads(said.stdout), out


def test_the_page_holds_the_numbers_of_diff_json(diff_page: tuple[dict, Path]) -> None:
    said, out = diff_page
    text = out.read_text(encoding="utf-8")
    tables = Tables(text)
    rows = tables.find("per stage and part")
    header = rows[0]
    got = {(r[0], r[1]): r for r in rows[1:]}
    for part in said["breakdown"]:
        row = got.get((str(part["stage"]), part["part"]))
        if row is None:  # a part zero in both runs is left out, as the terminal table leaves it out
            assert not part["ms_A"] and not part["ms_B"]
            continue
        assert row[header.index("ms_A")] == ms(part["ms_A"]) and row[header.index("ms_B")] == ms(part["ms_B"])
    total = next(p for p in said["breakdown"] if p["part"] == "TOTAL" and p["stage"] == 0)
    assert f"step {ms(total['ms_A'])} → {ms(total['ms_B'])} ms" in text
    # every kernel in both runs, though --top 3 limited the JSON's list
    kernels = tables.find("every kernel in both runs")
    assert len(kernels) - 1 > 3 and [r[0] for r in kernels[1:4]] == [k["short_name"] for k in said["kernels_changed"]]


@pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
def test_in_a_browser_it_draws_and_hovers(diff_page: tuple[dict, Path], tmp_path: Path) -> None:
    said, out = diff_page
    with chromium(tmp_path) as page:
        page.open(out)
        assert page.console() == [] and page.requests() == []
        plots = page.plots()
        assert len(plots) == 2 and min(plots.values()) > 0.03, plots
        first = said["kernels_changed"][0]
        title = next(t for t in plots if t.startswith("the 20 kernels"))
        page.hover(*page.point(title, first["short_name"], first["ms_delta"] / 2))
        tips = " ".join(page.tooltips())
        assert first["short_name"] in tips and ms(first["ms_delta"]) in tips, tips
