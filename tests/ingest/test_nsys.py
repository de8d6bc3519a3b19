"""Nsight Systems ingest on the real shared exports and on the .nsys-rep reports in sample_traces/nsys.

Every count is checked against a second route: SQL written here directly on the export with Python's sqlite3,
independent of the ingester's Polars pipeline.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from itertools import pairwise
from pathlib import Path

import duckdb
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import ROOT, TRACES, run_cli
from traceana import store
from traceana.errors import TraceanaError
from traceana.ingest.dispatch import IngestOptions, read_run
from traceana.ingest.nsys import reader as nsys
from traceana.ingest.run_data import RunData
from traceana.ingest.step_windows import device_step_windows

NSYS = TRACES / "nsys"
SAXPY = NSYS / "pipit_saxpy_mpi_1rank_nsys2022.2.sqlite"
CLOVERLEAF = NSYS / "pipit_cloverleaf_4gpu_nsys2024.5.sqlite"
H100 = NSYS / "nsysai_h100_2proc_nsys2026.2.sqlite"
MOCK = NSYS / "nsysai_mock_odd_schema.sqlite"
REPORTS = ROOT / "sample_traces" / "nsys"
ASCEND_DB = (TRACES / "ascend" / "torch_npu_2rank_level1_db" / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
             / "ascend_pytorch_profiler_0.db")
DEVICE_TABLES = ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY", "CUPTI_ACTIVITY_KIND_MEMSET")


def sql(path: Path, query: str) -> list[tuple]:
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    con.text_factory = bytes
    try:
        return con.execute(query).fetchall()
    finally:
        con.close()


def tables(path: Path) -> set[str]:
    return {r[0].decode() for r in sql(path, "SELECT name FROM sqlite_master WHERE type = 'table'")}


def device_rows_per_pid(path: Path) -> dict[int, int]:
    """Kernel + memcpy + memset rows per process, pid decoded from globalPid in SQL."""
    present = [t for t in DEVICE_TABLES if t in tables(path)]
    union = " UNION ALL ".join(f"SELECT globalPid FROM {t}" for t in present)
    return dict(sql(path, f"SELECT (globalPid >> 24) & 16777215, count(*) FROM ({union}) GROUP BY 1"))


def nvtx_ranges_per_pid(path: Path) -> dict[int, int]:
    return dict(sql(path, "SELECT (globalTid >> 24) & 16777215, count(*) FROM NVTX_EVENTS "
                          "WHERE eventType IN (59, 60) AND \"end\" IS NOT NULL GROUP BY 1"))


def ingest(*paths: Path, **options: object) -> RunData:
    return read_run(list(paths), "auto", IngestOptions(**options))  # type: ignore[arg-type]


def per_rank(frame: pl.DataFrame) -> dict[int, int]:
    return dict(frame.group_by("rank").len().iter_rows())


def test_saxpy_2022_rank_from_mpi_thread_name_and_mpi_domain() -> None:
    data = ingest(SAXPY)
    assert data.tool_version == "nsys 2022.2.1.31 (export schema 2.9.1)"
    (thread,) = sql(SAXPY, "SELECT s.value FROM ThreadNames t JOIN StringIds s ON s.id = t.nameId "
                           "WHERE s.value LIKE 'MPI Rank %'")
    assert thread[0] == b"MPI Rank 0"
    ranks = data.table("ranks")
    assert ranks.select("rank", "rank_source", "host", "pid").to_dicts() == [
        {"rank": 0, "rank_source": "thread-name", "host": "nid001608", "pid": 1230493}]
    assert per_rank(data.table("device_events")) == {0: sum(device_rows_per_pid(SAXPY).values())} == {0: 20}
    annotations = data.table("annotations")
    assert len(annotations) == sum(nvtx_ranges_per_pid(SAXPY).values()) == 22
    # MPI ranges are registered strings (textId) in the domain the eventType-75 row names.
    (mpi_ranges,) = sql(SAXPY, "SELECT count(*) FROM NVTX_EVENTS e WHERE eventType = 59 AND domainId = "
                               "(SELECT domainId FROM NVTX_EVENTS WHERE eventType = 75 AND text = 'MPI')")
    mpi = annotations.filter(pl.col("domain") == "MPI")
    assert len(mpi) == mpi_ranges[0] == 17
    assert set(mpi["name"]) == {"MPI_Init", "MPI_Send", "MPI_Recv", "MPI_Finalize"}
    assert annotations.filter(pl.col("domain").is_null())["name"].unique().to_list() == ["saxpy"]
    # Busy time per category equals the SQL sums of (end - start).
    busy = dict(data.table("device_events").group_by("category").agg((pl.col("end_ns") - pl.col("start_ns"))
                                                                      .sum()).iter_rows())
    (kernel_ns,) = sql(SAXPY, 'SELECT sum("end" - start) FROM CUPTI_ACTIVITY_KIND_KERNEL')
    (memcpy_ns,) = sql(SAXPY, 'SELECT sum("end" - start) FROM CUPTI_ACTIVITY_KIND_MEMCPY')
    assert busy == {"compute": kernel_ns[0], "memcpy": memcpy_ns[0]}


def test_strings_that_are_not_utf8_are_read_not_fatal(tmp_path: Path) -> None:
    # None of the shared exports holds one (checked column by column), so put one into a copy of the mock:
    # the demangled name of its first kernel becomes invalid UTF-8.
    copy = tmp_path / "latin1.sqlite"
    shutil.copy(MOCK, copy)
    con = sqlite3.connect(copy)
    con.execute("UPDATE StringIds SET value = CAST(x'6be46e6e656c' AS TEXT) WHERE id = 138")  # 'k\xe4nnel'
    con.commit()
    con.close()
    assert sql(copy, "SELECT value FROM StringIds WHERE id = 138") == [(b"k\xe4nnel",)]
    names = ingest(copy).table("device_events")["name"].to_list()
    assert "k\ufffdnnel" in names


def test_cloverleaf_2024_lazy_export_without_nvtx_one_process_on_one_of_four_gpus() -> None:
    data = ingest(CLOVERLEAF)
    assert "NVTX_EVENTS" not in tables(CLOVERLEAF)
    assert any("no NVTX_EVENTS table" in n for n in data.notes)
    (gpus,) = sql(CLOVERLEAF, "SELECT count(*) FROM TARGET_INFO_GPU")
    assert gpus[0] == 4
    # Four GPUs are visible but the process ran on one: one rank per (process, device) with activity.
    active = sql(CLOVERLEAF, "SELECT DISTINCT (globalPid >> 24) & 16777215, deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL"
                             " UNION SELECT DISTINCT (globalPid >> 24) & 16777215, deviceId"
                             " FROM CUPTI_ACTIVITY_KIND_MEMCPY")
    ranks = data.table("ranks")
    assert ranks.select("pid", "device").rows() == active == [(1701896, 0)]
    assert ranks["rank_source"].to_list() == ["env:PMI_RANK"] and data.rank_source == "env:PMI_RANK"
    assert per_rank(data.table("device_events")) == {0: sum(device_rows_per_pid(CLOVERLEAF).values())} == {0: 1591}
    # No step markers: the whole trace is one step, from the first to the last device event.
    (span,) = sql(CLOVERLEAF, 'SELECT min(s), max(e) FROM (SELECT start s, "end" e FROM CUPTI_ACTIVITY_KIND_KERNEL '
                              'UNION ALL SELECT start, "end" FROM CUPTI_ACTIVITY_KIND_MEMCPY)')
    assert data.table("steps").is_empty() and step_windows(data) == [(0, 0, *span)]


def test_one_process_on_four_gpus_is_four_ranks_with_a_note(tmp_path: Path) -> None:
    """Cloverleaf's process ran all its kernels on device 0 (above); an edited copy spreads them over its four
    GPUs (deviceId = correlationId % 4) as a process driving several GPUs records them."""
    copy = tmp_path / "cloverleaf_4gpu.sqlite"
    shutil.copy(CLOVERLEAF, copy)
    con = sqlite3.connect(copy)
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = correlationId % 4")
    con.commit()
    con.close()
    data = ingest(copy)
    per_device = dict(sql(copy, "SELECT deviceId, count(*) FROM (SELECT deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL "
                                "UNION ALL SELECT deviceId FROM CUPTI_ACTIVITY_KIND_MEMCPY) GROUP BY deviceId"))
    ranks = data.table("ranks").sort("rank")
    assert ranks.select("rank", "device", "pid").rows() == [(d, d, 1701896) for d in range(4)]
    assert per_rank(data.table("device_events")) == per_device and len(per_device) == 4
    note = "cloverleaf_4gpu.sqlite: process 1701896 drives 4 GPUs (devices 0, 1, 2, 3): one rank per device"
    assert note in data.notes


def test_h100_2026_two_processes_become_two_ranks_by_device_order() -> None:
    data = ingest(H100)
    ranks = data.table("ranks")
    assert data.world_size == 2 and data.rank_source == "device-order"
    pid_device = sql(H100, "SELECT DISTINCT (globalPid >> 24) & 16777215, deviceId FROM CUPTI_ACTIVITY_KIND_KERNEL "
                           "ORDER BY deviceId")
    assert ranks.select("pid", "device").rows() == pid_device == [(111, 0), (112, 1)]
    pid_of = dict(ranks.select("rank", "pid").iter_rows())
    rows = device_rows_per_pid(H100)
    assert per_rank(data.table("device_events")) == {r: rows[p] for r, p in pid_of.items()} == {0: 2184, 1: 2184}
    ranges = nvtx_ranges_per_pid(H100)
    annotations = data.table("annotations")
    assert per_rank(annotations) == {r: ranges[p] for r, p in pid_of.items()} == {0: 8391, 1: 8391}
    # PyTorch writes inline text "aten::mul, op_id = N": the name loses the suffix, args keep op_id.
    (muls,) = sql(H100, "SELECT count(*) FROM NVTX_EVENTS WHERE text LIKE 'aten::mul, op_id = %'")
    assert annotations.filter(pl.col("name") == "aten::mul").height == muls[0] > 0
    (first,) = sql(H100, "SELECT text FROM NVTX_EVENTS ORDER BY start LIMIT 1")
    op_id = int(first[0].decode().rsplit("op_id = ", 1)[1])
    earliest = annotations.sort("start_ns").row(0, named=True)
    assert f'"op_id":{op_id}' in earliest["args"]
    assert data.table("device_events").filter(pl.col("category") == "comm").is_empty()  # no NCCL in this window
    assert data.table("steps").is_empty() and [w[:2] for w in step_windows(data)] == [(0, 0), (1, 0)]


def test_mock_odd_schema_ingests_what_it_has_and_says_what_is_missing() -> None:
    data = ingest(MOCK)
    assert data.tool_version == "nsys 2026.1.1.204 (export schema 3.24.14)"
    assert per_rank(data.table("device_events")) == {0: sum(device_rows_per_pid(MOCK).values())} == {0: 3}
    assert any("no NVTX_EVENTS table" in n for n in data.notes)
    names = data.table("device_events")["name"].to_list()
    assert "Memcpy DtoH" in names  # copyKind 2 in the export
    assert any(n.startswith("void at::native::reduce_kernel") for n in names)  # the demangled name is kept


def test_event_ids_follow_start_order_per_rank() -> None:
    events = ingest(H100).table("device_events")
    ordered = events.sort("rank", "event_id")
    assert ordered["event_id"].to_list() == [i for r in (0, 1) for i in range(per_rank(events)[r])]
    assert ordered.group_by("rank", maintain_order=True).agg(pl.col("start_ns").diff().min())["start_ns"].min() >= 0


@pytest.fixture(scope="module")
def nsys_reports(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunData, Path]:
    if shutil.which("nsys") is None:
        pytest.skip("nsys is not on PATH (Debian non-free nsight-systems; see sample_traces/nsys/record.sh)")
    cache = tmp_path_factory.mktemp("nsys-cache")
    return ingest(REPORTS / "rank1.nsys-rep", REPORTS / "rank0.nsys-rep", cache_dir=cache), cache


def test_nsys_rep_reports_convert_and_form_one_run(nsys_reports: tuple[RunData, Path]) -> None:
    data, cache = nsys_reports
    exports = sorted(cache.glob("*.sqlite"))
    assert [p.name.split("-")[0] for p in exports] == ["rank0", "rank1"]
    assert data.tool_version == "nsys 2022.4.2.1 (export schema 3.0.0)"
    ranks = data.table("ranks").sort("rank")
    # 2022.4 exports carry no captured environment: the ranks come from the file names.
    assert ranks["rank_source"].to_list() == ["file-name", "file-name"]
    assert [Path(s).name for s in ranks["source"]] == ["rank0.nsys-rep", "rank1.nsys-rep"]
    starts = [sql(p, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")[0][0] for p in exports]
    assert ranks["clock_offset_ns"].to_list() == [s - min(starts) for s in starts]
    assert any("no GPU activity" in n for n in data.notes)
    annotations = data.table("annotations")
    for rank, export in enumerate(exports):
        (pid,) = ranks.filter(pl.col("rank") == rank)["pid"]
        assert nvtx_ranges_per_pid(export) == {pid: 20}
        # Step windows are the "train_step N" ranges (registered strings), shifted by the clock offset.
        marked = sql(export, 'SELECT s.value, e.start, e."end" FROM NVTX_EVENTS e JOIN StringIds s ON s.id = e.textId '
                             "WHERE s.value LIKE 'train_step %' ORDER BY e.start")
        offset = ranks["clock_offset_ns"][rank]
        expected = [(rank, int(name.split()[1]), start + offset, end + offset) for name, start, end in marked]
        steps = data.table("steps").filter(pl.col("rank") == rank).sort("step")
        assert steps.rows() == expected and len(expected) == 4
        assert annotations.filter(pl.col("rank") == rank)["domain"].unique().to_list() == ["traceana"]


def test_nsys_rep_folder_is_the_same_run_and_the_export_is_cached(nsys_reports: tuple[RunData, Path]) -> None:
    data, cache = nsys_reports
    stamps = {p: p.stat().st_mtime_ns for p in cache.glob("*.sqlite")}
    again = ingest(REPORTS, cache_dir=cache)
    assert {p: p.stat().st_mtime_ns for p in cache.glob("*.sqlite")} == stamps
    assert again.table("annotations").equals(data.table("annotations"))


def test_nsys_rep_without_nsys_says_how_to_export(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(TraceanaError, match=r"rank0.nsys-rep: nsys is not on PATH.*nsys export --type sqlite"):
        ingest(REPORTS / "rank0.nsys-rep", cache_dir=tmp_path)


def test_file_numbers_sort_as_numbers(tmp_path: Path) -> None:
    names = ["rank_10.sqlite", "rank_2.sqlite", "rank_1.sqlite"]
    for name in names:
        (tmp_path / name).write_text(name)  # three different files (empty ones would be one file given thrice)
    assert [p.name for p in nsys._inputs([tmp_path / n for n in names])] == [
        "rank_1.sqlite", "rank_2.sqlite", "rank_10.sqlite"]


def _without_activity(tmp: Path) -> Path:
    """A copy of the mock export with its kernel, memcpy and NVTX tables dropped."""
    copy = tmp / "no_activity.sqlite"
    shutil.copy(MOCK, copy)
    con = sqlite3.connect(copy)
    for table in ("CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_MEMCPY"):
        con.execute(f"DROP TABLE {table}")
    con.commit()
    con.close()
    return copy


def bad_inputs(tmp: Path) -> dict[str, tuple[Path, str, str]]:
    (tmp / "notes.sqlite").write_text("not a database")
    raw = H100.read_bytes()
    (tmp / "cut.sqlite").write_bytes(raw[: len(raw) // 2])
    return {
        "not SQLite": (tmp / "notes.sqlite", "auto", "notes.sqlite: not an SQLite database"),
        "SQLite, not nsys": (ASCEND_DB, "nsys", "ascend_pytorch_profiler_0.db: an SQLite database but not an "
                                                "Nsight Systems export"),
        "truncated": (tmp / "cut.sqlite", "auto", "cut.sqlite: truncated SQLite file"),
        "no activity at all": (_without_activity(tmp), "auto", "no_activity.sqlite: nothing to ingest"),
    }


@pytest.mark.parametrize("case", ["not SQLite", "SQLite, not nsys", "truncated", "no activity at all"])
def test_bad_input_is_one_clear_line(case: str, tmp_path: Path) -> None:
    path, fmt, message = bad_inputs(tmp_path)[case]
    with pytest.raises(TraceanaError) as error:
        read_run([path], fmt, IngestOptions())
    text = str(error.value)
    assert message in text and "\n" not in text


def test_cli_ingests_a_good_export_and_leaves_the_database_alone_on_bad_ones(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    out = run_cli("ingest", H100, "--db", db).stdout
    assert out.startswith("nsysai_h100_2proc_nsys2026.2: nsys, 2 ranks, 4368 device events")
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT rank, count(*) FROM device_events GROUP BY 1 ORDER BY 1").fetchall() == [
            (0, 2184), (1, 2184)]
        before = con.execute("SELECT run_id, ingested_at FROM runs").fetchall()
    for path, fmt, message in bad_inputs(tmp_path).values():
        result = run_cli("ingest", path, "--format", fmt, "--db", db, "--run-id", "nsysai_h100_2proc_nsys2026.2",
                         check=False)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ")
        assert message in lines[0]
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT run_id, ingested_at FROM runs").fetchall() == before
        assert con.execute("SELECT count(*) FROM device_events").fetchone() == (4368,)


def step_windows(data: RunData) -> list[tuple]:
    """The breakdown's windows for ``data``: its steps or, without markers, one step 0 per rank over its activity."""
    with tempfile.TemporaryDirectory() as tmp, store.connect(Path(tmp) / "w.duckdb") as con:
        store.write_run(con, "r", data)
        return con.execute("SELECT rank, step, start_ns, end_ns FROM step_windows ORDER BY rank, step").fetchall()


def test_store_round_trip_of_every_shared_export(tmp_path: Path) -> None:
    with store.connect(tmp_path / "s.duckdb") as con:
        for path in (SAXPY, CLOVERLEAF, H100, MOCK):
            store.write_run(con, path.stem, ingest(path))
        got = dict(con.execute("SELECT run_id, count(*) FROM device_events GROUP BY 1").fetchall())
    assert got == {p.stem: sum(device_rows_per_pid(p).values()) for p in (SAXPY, CLOVERLEAF, H100, MOCK)}


def test_nccl_path_through_the_ingester_on_an_edited_copy(tmp_path: Path) -> None:
    """The comm path end to end: the shared exports hold no NCCL kernel, so a copy of the mock gets one.

    Its first kernel is renamed ncclDevKernel_SendRecv, and an NCCL-domain ncclSend range is added on the thread
    whose cudaLaunchKernel (correlationId 143, same process) launched it: the ingester must tie kernel -> launch ->
    range and call it a Send, on the event_id of that kernel.
    """
    copy = tmp_path / "nccl.sqlite"
    shutil.copy(MOCK, copy)
    con = sqlite3.connect(copy)
    (tid, launch, short) = con.execute(
        "SELECT r.globalTid, r.start, k.shortName FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN CUPTI_ACTIVITY_KIND_KERNEL k "
        "ON k.correlationId = r.correlationId AND (k.globalPid >> 24) = (r.globalTid >> 24) WHERE k.correlationId = 143"
    ).fetchone()
    con.execute("UPDATE StringIds SET value = 'ncclDevKernel_SendRecv' WHERE id = ?", [short])
    con.execute('CREATE TABLE NVTX_EVENTS (start INTEGER, "end" INTEGER, eventType INTEGER, text TEXT, '
                "globalTid INTEGER, textId INTEGER, domainId INTEGER)")
    con.execute("INSERT INTO NVTX_EVENTS VALUES (?, NULL, 75, 'NCCL', ?, NULL, 1)", [launch - 100, tid])
    con.execute("INSERT INTO NVTX_EVENTS VALUES (?, ?, 59, 'ncclSend', ?, NULL, 1)", [launch - 10, launch + 10, tid])
    con.commit()
    con.close()
    data = ingest(copy)
    coll = data.table("collectives")
    assert coll.select("op", "kernel_op", "evidence", "dim").rows() == [("Send", "SendRecv", "nvtx", "UNKNOWN")]
    (start,) = sql(copy, "SELECT start FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE correlationId = 143")[0]
    event = data.table("device_events").filter(pl.col("event_id") == coll["event_id"][0])
    assert event.select("start_ns", "category").rows() == [(start, "comm")]


def test_step_marker_regex_numbers_unnumbered_ranges_in_order() -> None:
    """Five unnumbered 'saxpy' NVTX ranges are steps 0-4. Their windows are on the device (second route: the
    RUNTIME launch records read here): step i opens at the kernel launched inside range i and runs to step i+1's
    start (the host-to-device copies launched between two ranges are the earlier step's); the last one ends where
    the copy launched after the last range begins."""
    steps = ingest(SAXPY, step_marker="^saxpy$").table("steps")
    saxpy = sql(SAXPY, "SELECT start, \"end\" FROM NVTX_EVENTS WHERE eventType = 59 AND text = 'saxpy' ORDER BY start")
    assert len(saxpy) == 5
    launched = sql(SAXPY, "SELECT DISTINCT k.start FROM CUPTI_ACTIVITY_KIND_KERNEL k "
                          "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r USING (correlationId) JOIN NVTX_EVENTS n "
                          "ON n.eventType = 59 AND n.text = 'saxpy' AND r.start BETWEEN n.start AND n.\"end\""
                          " ORDER BY 1")
    (after,) = sql(SAXPY, "SELECT min(m.start) FROM CUPTI_ACTIVITY_KIND_MEMCPY m "
                          "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r USING (correlationId) "
                          "WHERE r.start > (SELECT max(\"end\") FROM NVTX_EVENTS WHERE text = 'saxpy')")
    starts = [s for (s,) in launched]
    assert len(starts) == 5 and all(a < b for (a, _), b in zip(saxpy, starts, strict=True))
    assert steps.select("step", "start_ns", "end_ns").rows() == [
        (i, s, e) for i, (s, e) in enumerate(zip(starts, [*starts[1:], after[0]], strict=True))]
    with pytest.raises(TraceanaError, match=r"^--step-marker '\(\?<=M\)PI': regex"):
        ingest(SAXPY, step_marker="(?<=M)PI")


def test_reports_of_two_recordings_are_refused() -> None:
    """saxpy (2022) and the H100 run (2026): their session starts (utcEpochNs) are years apart, so even aligned by
    session start their activity never overlaps."""
    starts = [sql(p, "SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME")[0][0] for p in (SAXPY, H100)]
    assert starts[1] - starts[0] > 365 * 86400 * 10**9
    with pytest.raises(TraceanaError, match=r"^\S*nsysai_h100_2proc_nsys2026.2.sqlite: recorded at times that never "
                                            r"overlap those of pipit_saxpy_mpi_1rank_nsys2022.2.sqlite"):
        ingest(SAXPY, H100)


def _misplaced_at(cut: int, earlier: list[tuple[int, int]], later: list[tuple[int, int]]) -> int:
    """Device time on the wrong side of ``cut``: the earlier step's after it, the later step's before it."""
    return (sum(max(0, end - max(start, cut)) for start, end in earlier)
            + sum(max(0, min(end, cut) - start) for start, end in later))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 120), st.integers(0, 40), st.integers(0, 3)),
                min_size=1, max_size=30))
def test_step_windows_cut_where_the_least_work_is_misplaced(rows: list[tuple[int, int, int, int]]) -> None:
    """DESIGN §4's cut (shared by the Kineto and nsys readers), by brute force: windows tile the rank's timeline
    from the first step's first event to the last step's last end, and each cut between consecutive steps is at
    their later step's first event where their work does not overlap, else at an instant of the overlap that
    misplaces the least device time (checked against every integer instant of it)."""
    events = pl.DataFrame([(0, *r[:2], r[0] + r[1] + r[2], r[3]) for r in rows], orient="row",
                          schema={"rank": pl.Int64, "stream": pl.Int64, "start_ns": pl.Int64, "end_ns": pl.Int64,
                                  "step": pl.Int64})
    events = events.with_columns(pl.col("end_ns") - pl.col("stream"))  # some zero-length and shifted ends
    events = events.filter(pl.col("end_ns") >= pl.col("start_ns"))
    if events.is_empty():
        return
    windows = device_step_windows(events).rows(named=True)
    spans = {s: [(a, b) for _, _, a, b, t in events.rows() if t == s] for s in sorted(set(events["step"]))}
    steps = list(spans)
    assert [w["step"] for w in windows] == steps
    assert windows[0]["start_ns"] == min(a for a, _ in spans[steps[0]])
    assert windows[-1]["end_ns"] == max(b for _, b in spans[steps[-1]])
    for (before, s), (after, t) in pairwise(zip(windows, steps, strict=True)):
        cut = before["end_ns"]
        assert after["start_ns"] == cut
        lo, hi = min(a for a, _ in spans[t]), max(b for _, b in spans[s])
        if lo >= hi:
            assert cut == lo
        else:
            assert lo <= cut <= hi
            best = min(_misplaced_at(c, spans[s], spans[t]) for c in range(lo, hi + 1))
            assert _misplaced_at(cut, spans[s], spans[t]) == best
