"""The breakdown of Ascend runs against the profiler's own step summary: step_trace_time.csv of each rank (text
exports) and StepTraceTime in each rank's analysis.db (database export). Everything on our side is read from the
store through the rank_step_breakdown and activity_intervals views, so this checks ingest and views together
against numbers traceana did not compute.

The profiler's Computing is the union of compute tasks, its Communication(Not Overlapped) the HCCL op time outside
it, its Free the idle gaps between the step's first and last device task, and its Preparing the step time before
the first one; our IDLE also holds Preparing and the tail after the last task.
"""

from __future__ import annotations

import csv
import json
import shutil
import sqlite3
from collections.abc import Iterator
from contextlib import closing
from decimal import Decimal

import duckdb
import pytest

from tests.conftest import TRACES
from traceana import store
from traceana.ingest.dispatch import IngestOptions, read_run

ASCEND = TRACES / "ascend"
RUNS = ("torch_npu_2rank_level0", "torch_npu_2rank_level1", "torch_npu_2rank_level1_db")
COLUMNS = ("Computing", "Communication(Not Overlapped)", "Free", "Preparing")


# The text exports with trace_view.json left out (the file users drop first), copied into the test's tmp folder:
# read from kernel_details.csv and (level 1) communication.json, with no host side, so no Preparing.
NO_TRACE_VIEW = {f"{run}_no_trace_view": run for run in ("torch_npu_2rank_level0", "torch_npu_2rank_level1")}
MSPROF = ASCEND / "msprof_db_8npu"


@pytest.fixture(scope="module")
def con(tmp_path_factory: pytest.TempPathFactory) -> Iterator[duckdb.DuckDBPyConnection]:
    folder = tmp_path_factory.mktemp("ascend")
    without = {run: shutil.copytree(ASCEND / full, folder / run, ignore=shutil.ignore_patterns("trace_view.json"))
               for run, full in NO_TRACE_VIEW.items()}
    with store.connect(folder / "t.duckdb") as connection:
        for run, path in [*((run, ASCEND / run) for run in RUNS), *without.items(), ("msprof", MSPROF)]:
            store.write_run(connection, run, read_run([path], "auto", IngestOptions()))
        yield connection


def profiler_summary(run: str, rank: int) -> dict[int, dict[str, float]]:
    """step -> the profiler's columns in µs, from step_trace_time.csv or (database export) analysis.db."""
    run = NO_TRACE_VIEW.get(run, run)  # the export it was made of says it
    output = ASCEND / run / f"rank{rank}_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    if (output / "step_trace_time.csv").is_file():
        with open(output / "step_trace_time.csv", newline="") as handle:
            return {int(r["Step"]): {c: float(r[c]) for c in COLUMNS} for r in csv.DictReader(handle)}
    with closing(sqlite3.connect(f"file:{output / 'analysis.db'}?mode=ro&immutable=1", uri=True)) as db:
        rows = db.execute("SELECT step, computing, communication_not_overlapped, free, preparing "
                          "FROM StepTraceTime").fetchall()
    return {int(r[0]): dict(zip(COLUMNS, map(float, r[1:]), strict=True)) for r in rows}


def ours(con: duckdb.DuckDBPyConnection, run: str, rank: int) -> dict[int, dict[str, float]]:
    """step -> the same quantities in µs from the store's views."""
    rows = con.execute(
        """SELECT b.step, b.COMP_ns, b.MP_WAIT_ns + b.CP_WAIT_ns + b.EP_WAIT_ns + b.DP_WAIT_ns + b.PP_WAIT_ns
                  + b.OTHER_WAIT_ns, b.IDLE_ns, w.start_ns, w.end_ns, a.first_ns, a.last_ns
           FROM rank_step_breakdown b
           JOIN step_windows w USING (run_id, rank, step)
           JOIN (SELECT run_id, rank, step, min(start_ns) AS first_ns, max(end_ns) AS last_ns
                 FROM activity_intervals GROUP BY ALL) a USING (run_id, rank, step)
           WHERE b.run_id = ? AND b.rank = ?""", [run, rank]).fetchall()
    result = {}
    for step, comp, wait, idle, start, end, first, last in rows:
        preparing = first - start
        free = idle - preparing - (end - last)
        result[step] = dict(zip(COLUMNS, (comp / 1e3, wait / 1e3, free / 1e3, preparing / 1e3), strict=True))
    return result


@pytest.mark.parametrize("run", RUNS)
@pytest.mark.parametrize("rank", [0, 1])
def test_breakdown_matches_profiler_step_trace(con: duckdb.DuckDBPyConnection, run: str, rank: int) -> None:
    expected, found = profiler_summary(run, rank), ours(con, run, rank)
    assert found.keys() == expected.keys() == {50}
    for step, columns in expected.items():
        for column, value in columns.items():
            assert found[step][column] == pytest.approx(value, abs=1.0), (step, column)  # 1 µs: far inside 1%


@pytest.mark.parametrize("run", NO_TRACE_VIEW)
@pytest.mark.parametrize("rank", [0, 1])
def test_export_without_trace_view_matches_profiler_step_trace(con: duckdb.DuckDBPyConnection, run: str,
                                                               rank: int) -> None:
    """Without trace_view.json there is no host side: the step is its device tasks' span, which is the profiler's
    Stage (its Bubble is 0), and Computing, Communication(Not Overlapped) and Free agree as for the full export
    (level 0 has no communication.json: its HCCL ops are kernel_details.csv's rows). Measured, µs, level 1 rank 0:
    8873.737 / 101963.243 / 25744.029 against 8873.756 / 101963.203 / 25744.050."""
    expected, found = profiler_summary(run, rank), ours(con, run, rank)
    assert found.keys() == expected.keys() == {50}
    for column in ("Computing", "Communication(Not Overlapped)", "Free"):
        assert found[50][column] == pytest.approx(expected[50][column], abs=1.0), column
    output = ASCEND / NO_TRACE_VIEW[run] / f"rank{rank}_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    with open(output / "step_trace_time.csv", newline="") as handle:
        (row,) = list(csv.DictReader(handle))
    total = con.execute("SELECT TOTAL_ns FROM rank_step_breakdown WHERE run_id = ? AND rank = ?",
                        [run, rank]).fetchone()[0]
    assert float(row["Bubble"]) == 0 and found[50]["Preparing"] == 0
    assert total / 1e3 == pytest.approx(float(row["Stage"]), abs=1.0)


def test_msprof_database_matches_its_overlap_analysis(con: duckdb.DuckDBPyConnection) -> None:
    """The msprof database's own OVERLAP_ANALYSIS: COMP is its Computing (type 0) to the ns; its Free (type 3) runs
    to the last TASK row, 5.64 ms after the last task traceana reads (the TASK rows of no known kind are left out,
    with a note), so IDLE + that tail is its Free. No communication: its COMMUNICATION_OP is empty."""
    with closing(sqlite3.connect(f"file:{MSPROF / 'msprof_0.db'}?mode=ro&immutable=1", uri=True)) as db:
        overlap = dict(db.execute("SELECT type, sum(endNs - startNs) FROM OVERLAP_ANALYSIS GROUP BY type").fetchall())
        (last_task,) = db.execute("SELECT max(endNs) FROM TASK").fetchone()
    comp, waits, idle, end = con.execute(
        "SELECT COMP_ns, MP_WAIT_ns + CP_WAIT_ns + EP_WAIT_ns + DP_WAIT_ns + PP_WAIT_ns + OTHER_WAIT_ns, IDLE_ns, "
        "w.end_ns FROM rank_step_breakdown JOIN step_windows w USING (run_id, rank, step) "
        "WHERE run_id = 'msprof'").fetchone()
    assert overlap.keys() == {0, 3} and (comp, waits) == (overlap[0], 0)
    assert idle + last_task - end == overlap[3] and last_task - end == 5_640_753


def test_breakdown_rows_add_up(con: duckdb.DuckDBPyConnection) -> None:
    rows = con.execute("SELECT TOTAL_ns, COMP_ns + MP_WAIT_ns + CP_WAIT_ns + EP_WAIT_ns + DP_WAIT_ns + PP_WAIT_ns "
                       "+ OTHER_WAIT_ns + IDLE_ns FROM rank_step_breakdown").fetchall()
    assert len(rows) == 11 and all(total == parts for total, parts in rows)


def raw_collective_ends(run: str, rank: int) -> dict[str, int]:
    """HCCL op name -> end ns, from the rank's own files: trace_view.json (ts and dur in µs) or COMMUNICATION_OP."""
    output = ASCEND / run / f"rank{rank}_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    database = output / f"ascend_pytorch_profiler_{rank}.db"
    if database.is_file():
        with closing(sqlite3.connect(f"file:{database}?mode=ro&immutable=1", uri=True)) as db:
            return dict(db.execute("SELECT s.value, c.endNs FROM COMMUNICATION_OP c JOIN STRING_IDS s "
                                   "ON s.id = c.opName").fetchall())
    with open(output / "trace_view.json") as handle:
        events = json.load(handle)
    return {e["name"]: round((Decimal(e["ts"]) + Decimal(str(e["dur"]))) * 1000) for e in events
            if e.get("ph") == "X" and e["name"].startswith("hcom_") and "@" not in e["name"]}


@pytest.mark.parametrize("run", RUNS)
def test_ranks_aligned_by_collective_ends(con: duckdb.DuckDBPyConnection, run: str) -> None:
    """The two NPUs' clocks disagree by 6-16 µs (rank 1's all-reduces end that much before or after rank 0's, by
    the raw files); per-rank alignment brings every instance's ends within 5 µs. Second route: the raw end times
    plus each rank's stored clock_offset_ns."""
    raw = [raw_collective_ends(run, rank) for rank in (0, 1)]
    assert raw[0].keys() == raw[1].keys() and len(raw[0]) == 4
    offsets = dict(con.execute("SELECT rank, clock_offset_ns FROM ranks WHERE run_id = ?", [run]).fetchall())
    before = [raw[1][op] - raw[0][op] for op in raw[0]]
    after = [raw[1][op] + offsets[1] - raw[0][op] - offsets[0] for op in raw[0]]
    assert max(map(abs, before)) > 5_000 and max(map(abs, after)) <= 5_000, (before, after)
    notes = con.execute("SELECT notes FROM runs WHERE run_id = ?", [run]).fetchone()[0]
    assert any(n.startswith("rank clocks aligned by collective ends onto rank 0's: rank 1") for n in notes)
    stored = con.execute("SELECT c.rank, e.end_ns - r.clock_offset_ns FROM collectives c JOIN device_events e "
                         "USING (run_id, rank, event_id) JOIN ranks r USING (run_id, rank) WHERE c.run_id = ? "
                         "ORDER BY c.rank, e.end_ns", [run]).fetchall()
    assert [end for _, end in stored] == [raw[r][op] for r in (0, 1) for op in sorted(raw[r], key=raw[r].get)]
