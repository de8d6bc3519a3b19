"""`memory` and the peaks `breakdown --json` carries: the H200 trace's [memory] samples read from the raw JSON."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.conftest import TRACES, add_run
from traceana import store
from traceana.cli.main import app

H200 = TRACES / "kineto" / "h200_gpt_h2048_L8_s1024_gb4.json.gz"
NO_MEMORY = TRACES / "kineto" / "hta_rank3of8_6steps.json.gz"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("memory")
    with store.connect(folder / "t.duckdb") as con:
        for run_id, path in (("h200", H200), ("nomem", NO_MEMORY)):
            add_run(con, run_id, [path], "kineto")
    return folder / "t.duckdb"


def test_peaks_against_the_json(db: Path) -> None:
    with gzip.open(H200) as handle:
        raw = json.load(handle)
    base = int(raw.get("baseTimeNanoseconds") or 0)
    samples = sorted((base + round(e["ts"] * 1000), e["args"]["Total Allocated"], e["args"]["Total Reserved"])
                     for e in raw["traceEvents"] if e.get("name") == "[memory]" and e["args"]["Device Type"] == 1)
    with store.connect(db, read_only=True) as con:
        windows = con.execute("SELECT step, start_ns, end_ns FROM step_windows WHERE run_id = 'h200' "
                              "ORDER BY step").fetchall()
        got = con.execute("SELECT step, samples, start_allocated_bytes, peak_allocated_bytes, peak_reserved_bytes "
                          "FROM memory_peaks WHERE run_id = 'h200' ORDER BY step").fetchall()
    expected = []
    for step, w0, w1 in windows:
        before = [s for s in samples if s[0] <= w0]
        inside = [s for s in samples if w0 < s[0] < w1]
        levels = inside + before[-1:]
        expected.append((step, len(inside), before[-1][1] if before else None, max(s[1] for s in levels),
                         max(s[2] for s in levels)))
    assert len(expected) == 2 and got == expected
    assert got[0][3] > 6e9  # 6.2 GiB at the peak of the backward pass, 2.9 GiB of weights and optimizer state


def test_breakdown_json_and_the_command(db: Path, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["breakdown", "h200", "--db", str(db), "--json", "--step", "2"])
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)[0]
    with store.connect(db, read_only=True) as con:
        peak = con.execute("SELECT peak_allocated_bytes FROM memory_peaks WHERE run_id = 'h200' AND step = 2")
        assert row["peak_allocated_bytes"] == peak.fetchall()[0][0]
    png = tmp_path / "m.png"
    result = runner.invoke(app, ["memory", "h200", "--db", str(db), "--json", "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert [r["step"] for r in json.loads(result.stdout)] == [1, 2] and png.stat().st_size > 10_000
    result = runner.invoke(app, ["memory", "nomem", "--db", str(db)])
    assert result.exit_code != 0 and "no memory samples" in str(result.exception)
    result = runner.invoke(app, ["breakdown", "nomem", "--db", str(db), "--json"])
    assert result.exit_code == 0 and json.loads(result.stdout)[0]["peak_allocated_bytes"] is None
