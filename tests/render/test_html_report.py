"""`traceana report --html`: one self-contained, interactive file. Its numbers are the CLI's (`--json` of the same
commands), and in headless Chromium it logs nothing, requests nothing, draws every chart, shows a bar's value on
hover, and drills down from a stage to its ranks and from a rank to its steps. The browser checks are first run on
a page broken on purpose, so a check that cannot fail would be noticed."""

from __future__ import annotations

import gzip
import html
import itertools
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import SAMPLES, TRACES, ingested, run_cli
from tests.render.browser import MISSING, chromium

TOY = "toy8_tp2pp2dp2_1f1b"
CONFIG = SAMPLES.parent / "configs" / f"{TOY}.yaml"
browser = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


class Tables(HTMLParser):
    """Every table of a page by its caption: rows of cell texts (header first)."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self._caption: str | None = None
        self._rows: list[list[str]] = []
        self._cell: list[str] | None = None
        self._in_caption = False
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "table":
            self._caption, self._rows = "", []
        elif tag == "caption":
            self._in_caption = True
        elif tag == "tr":
            self._rows.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "caption":
            self._in_caption = False
        elif tag in ("td", "th") and self._cell is not None:
            self._rows[-1].append("".join(self._cell))
            self._cell = None
        elif tag == "table" and self._caption is not None:
            self.tables[self._caption] = self._rows
            self._caption = None

    def handle_data(self, data: str) -> None:
        if self._in_caption and self._caption is not None:
            self._caption += data
        elif self._cell is not None:
            self._cell.append(data)

    def find(self, start: str) -> list[list[str]]:
        """The table whose caption starts with ``start``."""
        found = [rows for caption, rows in self.tables.items() if caption.startswith(start)]
        assert len(found) == 1, (start, list(self.tables))
        return found[0]


def ms(value: float) -> str:
    return f"{value:,.3f}"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("report")
    db, out = folder / "r.duckdb", folder / "report.html"
    ingested(db, {TOY: (SAMPLES / TOY, "tp=2,pp=2,dp=2")})
    said = run_cli("report", TOY, "--html", out, "--estimate", CONFIG, "--db", db).stdout
    assert said.startswith(f"wrote {out} ({TOY}; ")
    return db, out


def test_self_contained_with_the_numbers_of_the_cli(report: tuple[Path, Path]) -> None:
    db, out = report
    text = out.read_text(encoding="utf-8")
    # nothing is fetched: no script, style or image from elsewhere, every link an anchor in the page (BokehJS's
    # licence comments name URLs; the browser test checks that none is requested)
    assert not re.search(r"<(script|img|iframe)[^>]*\ssrc=|<link\b", text)
    assert re.findall(r'href="([^"]*)"', text) and all(h.startswith("#") for h in re.findall(r'href="([^"]*)"', text))
    tables = Tables(text)
    # the first screen: the mean rank's step and the top findings of advise, in its order
    ranks = json.loads(run_cli("breakdown", TOY, "--json", "--db", db).stdout)
    total = sum(r["TOTAL_ms"] for r in ranks) / len(ranks)
    first = text[text.index('id="first"'):text.index("</section>", text.index('id="first"'))]
    assert f"Step time {ms(total)} ms" in first
    advised = json.loads(run_cli("advise", TOY, "--config", CONFIG, "--json", "--db", db).stdout)["findings"]
    at = [first.index(f"<code>{f['change']}</code> would take the step from {ms(f['measured_step_ms'])} to "
                      f"{ms(f['predicted_step_ms'])} ms (gain {ms(f['gain_ms'])} ms [{ms(f['gain_low_ms'])}, "
                      f"{ms(f['gain_high_ms'])}] (80%)")
          for f in advised[:3]]
    assert at == sorted(at)
    # one step time, related to advise's (the median rank's TOTAL) and the timeline's span; the first screen names
    # the stragglers advise finds, by the same threshold
    first = html.unescape(first)
    assert first.count("Step time ") == 1 and f"median rank's TOTAL is {ms(advised[0]['measured_step_ms'])} ms" in first
    path = json.loads(run_cli("critical-path", TOY, "--json", "--db", db).stdout)
    assert f"step {path['step']}: " in first and f"it spans {ms(path['length_ms'])} ms" in first
    named = re.findall(r"rank (\d+) \+", first[first.index("Stragglers, as advise finds them"):])
    assert [f["finding"] for f in advised if f["finding"].startswith("straggler rank ") and "," not in f["finding"]
            ] and sorted(named) == sorted(f["finding"].split()[-1] for f in advised
                                         if f["finding"].startswith("straggler rank ") and "," not in f["finding"])
    assert [row[1] for row in tables.find("measured step")[1:]] == [f["change"] for f in advised]
    # the stage table holds what `traceana breakdown --by stage --json` prints, to 3 decimals
    stages = json.loads(run_cli("breakdown", TOY, "--by", "stage", "--json", "--db", db).stdout)
    assert tables.find("mean over each stage's ranks")[1:] == [
        [str(s["pp"]), "4", *[ms(s[f"{p}_mean_ms"]) for p in ("TOTAL", "COMP", "MP_WAIT", "DP_WAIT", "PP_WAIT",
                                                               "IDLE", "OVERLAPPED")]] for s in stages]
    # every rank-step, not a sample of them
    steps = json.loads(run_cli("sql", "--run", TOY, "SELECT count(*) AS n FROM rank_step_breakdown", "--format", "json",
                               "--db", db).stdout)[0]["n"]
    assert len(tables.find("each rank's steps")) - 1 == steps == 16
    # the critical path's totals and the communication per op are the commands' numbers
    path = json.loads(run_cli("critical-path", TOY, "--json", "--db", db).stdout)
    assert f"Step {path['step']}: {ms(path['length_ms'])} ms" in text
    assert tables.find("the path's time per rank")[1:] == [
        [str(r["rank"]), str(r["stage"]), f"{r['segments']:,}", ms(r["duration_ms"]), ms(r["share_pct"])]
        for r in path["by_rank"]]
    comm = json.loads(run_cli("comm", TOY, "--json", "--db", db).stdout)["by_op"]
    assert [row[:6] for row in tables.find("per op, dim and link")[1:]] == [
        [r["op"], r["dim"], "", str(r["n"]), f"{r['instances']:,}", f"{r['size_bytes']:,}"] for r in comm]
    # and the estimate the compare command prints
    compare = json.loads(run_cli("compare", "--estimate", CONFIG, TOY, "--json", "--db", db).stdout)
    comp = next(r for r in compare["by_dimension"] if r["dim"] == "COMP")
    row = next(r for r in tables.find("per dimension:")[1:] if r[0] == "COMP")
    assert row[1] == ms(comp["measured_ms"]) and row[3] == ms(comp["estimated_ms"])


@browser
def test_the_checks_fail_on_a_broken_page(tmp_path: Path) -> None:
    broken = tmp_path / "broken.html"
    broken.write_text('<!DOCTYPE html><p>x</p><img src="http://127.0.0.1:9/x.png"><script>'
                      'console.error("broken on purpose"); nothing();</script>')
    with chromium(tmp_path) as page:
        page.open(broken)
        console = page.console()
        assert any("broken on purpose" in c for c in console) and any("ReferenceError" in c for c in console)
        assert page.requests() == ["http://127.0.0.1:9/x.png"]
        assert page.tooltips() == [] and page.visible_rows("nothing") is None


@browser
def test_in_a_browser_it_draws_hovers_and_drills_down(report: tuple[Path, Path], tmp_path: Path) -> None:
    db, out = report
    ranks = {r["rank"]: r for r in json.loads(run_cli("breakdown", TOY, "--json", "--db", db).stdout)}
    with chromium(tmp_path) as page:
        page.open(out)
        assert page.console() == [] and page.requests() == []
        plots = page.plots()
        assert len(plots) == 9 and min(plots.values()) > 0.05, plots  # every chart drawn, none blank
        title = next(t for t in plots if t.startswith("time per rank"))
        # hovering rank 6's COMP bar shows its value, as `breakdown --json` has it
        page.hover(*page.point(title, "6", ranks[6]["COMP_ms"] / 2))
        tips = " ".join(page.tooltips())
        assert "6" in tips and "COMP_ms" in tips and ms(ranks[6]["COMP_ms"]) in tips, tips
        # clicking stage 1's bar leaves stage 1's ranks in the rank table and the stragglers table
        stage_title = next(t for t in plots if t.startswith("mean over each stage"))
        page.click(*page.point(stage_title, "1", 10.0))
        caption = "each rank's typical step, ms (click a row for its steps)"
        shown = [int(r[0]) for r in page.visible_rows(caption)]
        assert shown == sorted(r for r, row in ranks.items() if row["pp"] == 1) == [4, 5, 6, 7]
        assert page.driver.find_element("id", "filter").get_attribute("textContent").startswith("Showing stage 1 only.")
        # clicking rank 5's row there leaves rank 5's steps in the steps table
        page.driver.execute_script("""
            for (const t of document.querySelectorAll("table.data")) if (t.caption.textContent === arguments[0])
              [...t.tBodies[0].rows].find((r) => r.cells[0].textContent === "5").click();""", caption)
        steps = page.visible_rows("each rank's steps, ms (pick a rank or stage above to filter)")
        assert [(r[0], r[2]) for r in steps] == [("5", "2"), ("5", "3")]
        # "show all" clears it; a header click sorts by that column
        page.driver.find_element("id", "clear-filter").click()
        assert len(page.visible_rows(caption)) == 8
        page.driver.execute_script("""
            for (const t of document.querySelectorAll("table.data")) if (t.caption.textContent === arguments[0])
              [...t.tHead.rows[0].cells].find((c) => c.textContent === "TOTAL ms").click();""", caption)
        header = Tables(out.read_text(encoding="utf-8")).find(caption)[0]
        totals = [r[header.index("TOTAL ms")] for r in page.visible_rows(caption)]
        assert totals == [ms(t) for t in sorted(r["TOTAL_ms"] for r in ranks.values())]
        page.screenshot(tmp_path / "report.png")


def test_without_a_config_there_is_no_estimate_section(report: tuple[Path, Path], tmp_path: Path) -> None:
    out = tmp_path / "plain.html"
    run_cli("report", "--html", out, "--db", report[0])
    assert "Estimate vs measured" not in out.read_text(encoding="utf-8")


# unbalanced on purpose: kernel short names cut every <...> pair, but this one reaches the report whole
HOSTILE = "aten::mm</script <img src=x onerror=window.pwned=1"


@pytest.fixture(scope="module")
def hostile_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The sample run with its matrix products renamed to markup that would run if the page did not escape it."""
    folder = tmp_path_factory.mktemp("hostile")
    for trace in sorted((SAMPLES / TOY).glob("rank*.json.gz")):
        events = json.loads(gzip.decompress(trace.read_bytes()))
        for event in events["traceEvents"]:
            if event.get("name") == "aten::mm":
                event["name"] = HOSTILE
        (folder / trace.name).write_bytes(gzip.compress(json.dumps(events).encode()))
    db, out = folder / "h.duckdb", folder / "hostile.html"
    run_cli("ingest", folder, "--layout", "tp=2,pp=2,dp=2", "--db", db)
    run_cli("report", "--html", out, "--db", db)
    return out


def test_markup_in_a_kernel_name_is_text(hostile_report: Path) -> None:
    text = hostile_report.read_text(encoding="utf-8")
    assert HOSTILE not in text and html.escape(HOSTILE) in text
    assert [row[0] for row in Tables(text).find("top 50 kernels")[1:]].count(HOSTILE) == 1


@browser
def test_markup_in_a_kernel_name_runs_nothing(hostile_report: Path, tmp_path: Path) -> None:
    with chromium(tmp_path) as page:
        page.open(hostile_report)
        assert page.driver.execute_script("return window.pwned") is None
        assert page.console() == [] and page.requests() == []
        assert HOSTILE in page.driver.find_element("tag name", "body").text


@pytest.fixture(scope="module")
def report_64(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A synthesized 64-rank TP2·PP2·DP16 run and its report."""
    folder = tmp_path_factory.mktemp("r64")
    config = SAMPLES.parents[1] / "examples" / "synth_gpt_tp2pp2.yaml"
    run_cli("synth", config, folder / "run", "--ranks", 64, "--steps", 3)
    db, out = folder / "r64.duckdb", folder / "r64.html"
    run_cli("ingest", folder / "run" / "traces", "--db", db, "--layout", "tp=2,pp=2,dp=16", "--run-id", "r64")
    run_cli("report", "--html", out, "--db", db)
    return db, out


@browser
def test_a_64_rank_report_draws_hovers_and_drills_down(report_64: tuple[Path, Path], tmp_path: Path) -> None:
    db, out = report_64
    assert out.stat().st_size < 5e6  # small enough to mail: decimated timelines, BokehJS once
    ranks = {r["rank"]: r for r in json.loads(run_cli("breakdown", "--json", "--db", db).stdout)}
    with chromium(tmp_path) as page:
        page.open(out)
        assert page.console() == [] and page.requests() == []
        plots = page.plots()
        assert len(plots) >= 5 and min(plots.values()) > 0.02, plots
        # hover rank 40's bar in the timeline-free rank chart, then pick stage 0 by its bar
        title = next(t for t in plots if t.startswith("time per rank"))
        page.hover(*page.point(title, "40", ranks[40]["COMP_ms"] / 2))
        assert ms(ranks[40]["COMP_ms"]) in " ".join(page.tooltips())
        page.click(*page.point(next(t for t in plots if t.startswith("mean over each stage")), "0", 1.0))
        shown = [int(r[0]) for r in page.visible_rows("each rank's typical step, ms (click a row for its steps)")]
        assert shown == sorted(r for r, row in ranks.items() if row["pp"] == 0) and len(shown) == 32
        # hovering the middle of rank 0's longest compute interval in the timeline names it, with its length
        timeline = next(t for t in plots if t.startswith("step "))
        step = int(timeline.split()[1])
        longest = json.loads(run_cli("sql", "--format", "json", "--db", db, f"""
            SELECT (i.start_ns + i.end_ns) / 2 - (SELECT min(start_ns) FROM step_windows WHERE step = {step}) AS mid_ns,
                   i.end_ns - i.start_ns AS length_ns FROM activity_intervals i
            WHERE i.step = {step} AND i.rank = 0 AND i.lane = 'COMP' ORDER BY length_ns DESC LIMIT 1""").stdout)[0]
        page.hover(*page.point(timeline, longest["mid_ns"] / 1e6, 0.25))
        tips = " ".join(page.tooltips())
        assert "rank" in tips and "COMP" in tips and ms(longest["length_ns"] / 1e6) in tips, tips
        page.screenshot(tmp_path / "r64.png")


def test_the_roofline_section_of_a_gpu_trace_has_the_hand_computed_flops(tmp_path: Path) -> None:
    """On the H200 GPT trace the report's roofline rows are the op's FLOPs from its shapes: the MLP's addmm of a
    2048 x 2048 by 2048 x 8192 product is 2·2048·2048·8192 FLOPs (the bias adds no product)."""
    trace = TRACES / "kineto" / "h200_gpt_h2048_L8_s1024_gb4.json.gz"
    db, out = tmp_path / "h.duckdb", tmp_path / "h200.html"
    run_cli("ingest", trace, "--db", db)
    run_cli("report", "--html", out, "--db", db)
    rows = Tables(out.read_text(encoding="utf-8")).find("per op, input shapes and kernel")
    header = rows[0]
    mlp = [r for r in rows[1:] if r[header.index("op")] == "aten::addmm"
           and r[header.index("shapes")] == "8192, 2048x2048, 2048x8192"]
    assert mlp and {r[header.index("GFLOP")] for r in mlp} == {f"{2 * 2048 * 2048 * 8192 / 1e9:,.3f}"}


def test_a_timeline_of_many_ranks_keeps_the_paths_ranks_and_spaces_the_rest() -> None:
    from traceana.render.report.run import TIMELINE_RANKS, _timeline_ranks

    ranks = list(range(1024))
    drawn = _timeline_ranks(ranks, {5, 6, 1023})
    assert len(drawn) <= TIMELINE_RANKS and {5, 6, 1023} <= set(drawn) and drawn == sorted(drawn)
    gaps = {b - a for a, b in itertools.pairwise(drawn) if a not in (5, 6) and b not in (5, 6, 1023)}
    assert len(gaps) == 1  # the others evenly spaced
    assert _timeline_ranks(ranks[:64], {3}) == ranks[:64]  # few ranks: all drawn


@pytest.fixture(scope="module")
def h200_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("h200")
    db, out = folder / "h.duckdb", folder / "h200.html"
    run_cli("ingest", TRACES / "kineto" / "h200_gpt_h2048_L8_s1024_gb4.json.gz", "--db", db)
    run_cli("report", "--html", out, "--db", db)
    return out


def test_long_kernel_names_are_cut_with_the_whole_name_on_hover(h200_report: Path) -> None:
    text = h200_report.read_text(encoding="utf-8")
    cut = re.findall(r'<td class="s cut" title="([^"]*)"><div>([^<]*)</div></td>', text)
    assert cut and all(title == shown and len(html.unescape(shown)) > 32 for title, shown in cut)
    assert any(html.unescape(shown).startswith("cudnn_generated_fort_native_sdpa") for _, shown in cut)


@browser
def test_at_1280_px_the_page_does_not_scroll_sideways(h200_report: Path, tmp_path: Path) -> None:
    """The H200 GPT report (cuDNN and nvjet names, 47 roofline rows) at a laptop's width: no sideways scroll, a
    contents list that stays on screen, and a filter box that keeps the rows holding what is typed."""
    with chromium(tmp_path) as page:
        page.driver.set_window_size(1280, 900)
        page.open(h200_report)
        assert page.console() == [] and page.requests() == []
        width = page.driver.execute_script("return [document.documentElement.scrollWidth, window.innerWidth]")
        assert width[1] == 1280 and width[0] <= width[1], width
        page.driver.execute_script("document.getElementById('s-memory').scrollIntoView()")
        toc = page.driver.execute_script("""const r = document.querySelector('nav.toc').getBoundingClientRect();
            return [r.top, r.bottom, document.querySelectorAll('nav.toc a').length]""")
        sections = re.findall(r'<section id="s-', h200_report.read_text(encoding="utf-8"))
        assert toc[0] >= 0 and toc[1] <= 900 and toc[2] == 1 + len(sections)  # the first screen and each section
        caption = next(c for c in Tables(h200_report.read_text(encoding="utf-8")).tables if c.startswith("top 50"))
        every = page.visible_rows(caption)
        wanted = [r for r in every if "nvjet" in r[0]]
        assert 0 < len(wanted) < len(every)
        box = page.driver.execute_script("""for (const t of document.querySelectorAll("table.data"))
            if (t.caption.textContent === arguments[0]) return t.parentNode.querySelector("input.search");""", caption)
        box.send_keys("NVJET")
        assert page.visible_rows(caption) == wanted
        assert box.find_element("xpath", "following-sibling::span").text == f"{len(wanted)} of {len(every)} rows shown"
        box.clear()
        box.send_keys(" ")  # an input event with nothing to look for shows every row again
        assert page.visible_rows(caption) == every
        page.screenshot(tmp_path / "h200.png")


def test_an_interval_comes_from_low_and_high_when_a_result_carries_them() -> None:
    from traceana.render.report.run import with_intervals

    plain = pl.DataFrame({"finding": ["f"], "measured_step_ms": [100.0], "predicted_step_ms": [90.0],
                          "gain_ms": [10.0], "error_bar_ms": [0.004]})
    row = with_intervals(plain).row(0, named=True)
    assert (row["gain_low_ms"], row["gain_high_ms"], row["interval"]) == (9.996, 10.004, "10.000 ± 0.004 ms")
    bounded = plain.with_columns(low=pl.lit(88.0), high=pl.lit(95.0), level=pl.lit(0.8))
    row = with_intervals(bounded).row(0, named=True)
    assert (row["gain_low_ms"], row["gain_high_ms"], row["interval"]) == (5.0, 12.0, "10.000 ms [5.000, 12.000] (80%)")


@browser
def test_the_icicle_zooms_into_the_node_clicked(h200_report: Path, tmp_path: Path) -> None:
    """The ops section's icicle: a click on a node zooms the chart to that node (its kernels fill the width, their
    labels less cut), a click on the top row zooms out; a hover names the node's path and time."""
    ranges = """for (const doc of Bokeh.documents) for (const m of doc.all_models)
        if (m.type === "Figure" && m.title && m.title.text === arguments[0]) {
          const source = m.renderers[0].data_source;
          const d = source.data, first = d.x1[d.level.indexOf(1)];  // the first op's kernels: their labels' length
          const kernels = d.text.filter((t, i) => d.level[i] === 2 && d.x1[i] <= first + 1e-9);
          return [m.x_range.start, m.x_range.end, kernels.join("").length];
        }"""
    with chromium(tmp_path) as page:
        page.open(h200_report)
        title = next(t for t in page.plots() if t.startswith("device time by where it was launched"))
        assert page.plots()[title] > 0.05 and page.console() == []
        start, end, labels = page.driver.execute_script(ranges, title)
        page.hover(*page.point(title, end * 0.001, 1.5))
        tips = page.tooltips()
        assert tips[:3] == ["autograd::engine::evaluate_function: AddmmBackward0", "time:", "9.001 ms per rank-step"]
        page.click(*page.point(title, end * 0.001, 1.5))  # the largest op, the leftmost node of its row
        zoomed = page.driver.execute_script(ranges, title)
        assert zoomed[0] == start == 0 and 0 < zoomed[1] < end and zoomed[2] > labels
        page.screenshot(tmp_path / "icicle.png")
        page.click(*page.point(title, zoomed[1] / 2, 0.5))
        assert page.driver.execute_script(ranges, title)[:2] == [start, end]


def test_the_timeline_has_host_lanes_and_launch_lines(h200_report: Path) -> None:
    """Item 2 of issue 34 in the report: the H200 timeline draws the host threads' ranges above the rank's lane and
    lines from the ops that launched its longest kernels (their names in the chart's data, for the hover)."""
    text = html.unescape(h200_report.read_text(encoding="utf-8"))
    assert "Above each rank's lane, the top 3 levels of its host threads' range trees" in text
    assert "a line from the CPU op or NVTX range that launched each of its 12 longest kernels" in text
    assert "launch of a rank's longest kernels, from its CPU op or NVTX range" in text and "aten::mm" in text


@pytest.fixture(scope="module")
def nsys_report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    report = TRACES / "nsys" / "nsysai_h100_2proc_nsys2026.2.sqlite"
    if not report.exists():
        pytest.skip(f"{report} is not here")
    folder = tmp_path_factory.mktemp("nsys")
    db, out = folder / "n.duckdb", folder / "nsys.html"
    run_cli("ingest", report, "--db", db)
    run_cli("report", "--html", out, "--db", db)
    return out


def test_an_nsys_timeline_has_nvtx_lanes_and_launch_lines(nsys_report: Path) -> None:
    """The same for the shared 2xH100 nsys export, whose kernels reach their NVTX range through the launching thread:
    the chart's data holds a line for each rank's 12 longest linked events, each from its aten::copy_ range."""
    text = nsys_report.read_text(encoding="utf-8")
    assert "a line from the CPU op or NVTX range that launched each of its 12 longest kernels" in text
    assert "launch of a rank's longest kernels, from its CPU op or NVTX range" in html.unescape(text)
    lines = re.findall(r'\["kernel",\[([^]]*)\]\],\["op",\[([^]]*)\]\]', text)
    assert len(lines) == 1
    kernels, ops = (json.loads(f"[{names}]") for names in lines[0])
    assert len(kernels) == len(ops) == 24 and set(ops) == {"aten::copy_"} and set(kernels) == {"Memcpy HtoD"}


@browser
def test_an_nsys_report_draws_in_a_browser(nsys_report: Path, tmp_path: Path) -> None:
    with chromium(tmp_path) as page:
        page.open(nsys_report)
        assert page.console() == [] and page.requests() == []
        plots = page.plots()
        timeline = next(t for t in plots if t.startswith("step 0 across 2 ranks"))
        assert min(plots.values()) > 0.02 and plots[timeline] > 0.05, plots  # every chart drawn, none blank
        page.screenshot(tmp_path / "nsys.png")
