"""The ``syncs`` table on the real shared traces of each format: rows per kind and name counted a second way on the
raw file (a json count, sqlite3), the edges to device events recomputed from the raw file by the rule, in plain
Python or SQL, and what is left out named in the notes."""

from __future__ import annotations

import gzip
import json
import sqlite3
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import TRACES, run_cli
from traceana.ingest.dispatch import IngestOptions, read_run
from traceana.ingest.run_data import RunData
from traceana.ingest.syncs.edges import TOLERANCE_NS

KINETO, NSYS, ASCEND = TRACES / "kineto", TRACES / "nsys", TRACES / "ascend"


def _run(path: Path) -> RunData:
    return read_run([path], "auto", IngestOptions())


def _names(data: RunData) -> dict[tuple[str, str], int]:
    return {(kind, name): n for kind, name, n in data.table("syncs").group_by("kind", "name").len().iter_rows()}


def _edges(data: RunData, column: str) -> pl.DataFrame:
    """Each sync with the device event its ``column`` names (name, start, end)."""
    events = data.table("device_events").select("rank", pl.col("event_id").alias(column), pl.col("name").alias("ev"),
                                                pl.col("start_ns").alias("ev_start"), pl.col("end_ns").alias("ev_end"))
    return data.table("syncs").join(events, on=["rank", column], how="left").sort("rank", "start_ns")


def _raw_kineto(path: Path) -> list[dict]:
    """The raw events, times in exact ns (``ts`` and ``dur`` are us with up to 3 decimals)."""
    with gzip.open(path) as handle:
        events = json.load(handle, parse_float=Decimal)["traceEvents"]
    for e in events:
        e["ts_ns"], e["dur_ns"] = int(Decimal(e.get("ts", 0)) * 1000), int(Decimal(e.get("dur", 0)) * 1000)
    return events


def _expected_host_waits(events: list[dict]) -> dict[int, tuple[str, int] | None]:
    """The host_wait rule in plain Python on the raw events: per sync call (by its start ns), the (name, start ns)
    of the device event launched before the call with the latest end at most the call's end + the tolerance (any
    stream: these calls name none)."""
    launches: dict[int, int] = {}
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            launches.setdefault(e["args"]["correlation"], e["ts_ns"])
    device = [(launches.get(e["args"].get("correlation")), e["ts_ns"] + e["dur_ns"], e["name"], e["ts_ns"])
              for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    out: dict[int, tuple[str, int] | None] = {}
    for call in events:
        if call.get("cat") == "cuda_runtime" and call["name"].endswith("Synchronize"):
            limit = call["ts_ns"] + call["dur_ns"] + TOLERANCE_NS
            fit = [d for d in device if d[0] is not None and d[0] < call["ts_ns"] and d[1] <= limit]
            best = max(fit, key=lambda d: (d[1], d[0]), default=None)  # equal ends: the later launched
            out[call["ts_ns"]] = (best[2], best[3]) if best else None
    return out


@pytest.mark.parametrize(("trace", "calls", "waits"), [
    ("hta_rank0of16_a2a_rs_ag.json.gz", {"cudaStreamSynchronize": 75, "cudaDeviceSynchronize": 1}, 425),
    ("hta_rank0of2_pg_args.json.gz", {"cudaEventSynchronize": 24, "cudaDeviceSynchronize": 1}, 84),
    ("hta_rank3of8_6steps.json.gz", {"cudaStreamSynchronize": 60, "cudaDeviceSynchronize": 1}, 186),
])
def test_kineto_host_waits_are_the_synchronize_calls_and_wait_for_what_the_rule_gives(
        trace: str, calls: dict[str, int], waits: int) -> None:
    raw = _raw_kineto(KINETO / trace)
    counted = {n: sum(e.get("name") == n and e.get("cat") == "cuda_runtime" for e in raw) for n in calls}
    assert counted == calls  # the brief's 76 / 25 / 61 *Synchronize calls, counted on the raw JSON
    data = _run(KINETO / trace)
    assert _names(data) == {("host_wait", n): c for n, c in calls.items()}
    # the trace names no stream for its stream waits: left out, counted (raw count: `waits`)
    assert f"{waits} cudaStreamWaitEvent calls left out: the trace names no stream" in data.notes
    # every edge equals the rule applied to the raw JSON in plain Python (the store's times less the file's base)
    expected = _expected_host_waits(raw)
    got = _edges(data, "waited_event_id")
    shift = got["start_ns"].min() - min(expected)
    found = {row["start_ns"] - shift: None if row["ev"] is None else (row["ev"], row["ev_start"] - shift)
             for row in got.iter_rows(named=True)}
    assert found == expected
    assert sum(v is not None for v in found.values()) > 0
    assert got["waiter_event_id"].null_count() == got.height  # host waits have no waiter


def test_kineto_pg_args_event_syncs_before_any_launch_have_no_waited_event() -> None:
    # the first 8 cudaEventSynchronize calls (ts 4458676417669.9 ... 17730.8 us) come 5 ms before the trace's first
    # kernel launch (4458676422851.8 us): nothing they could wait for is in the trace; a note counts them
    data = _run(KINETO / "hta_rank0of2_pg_args.json.gz")
    assert data.table("syncs")["waited_event_id"].null_count() == 8
    assert "8 syncs (host_wait) name no waited device event: none matched (waited_event_id NULL)" in data.notes
    # the step-end cudaDeviceSynchronize waits for the last kernel to end (the trace's event 3773, stream 7)
    device = _edges(data, "waited_event_id").filter(pl.col("name") == "cudaDeviceSynchronize")
    assert device["waited_event_id"].to_list() == [data.table("device_events").height - 1]


def _doc(tmp_path: Path, events: list[dict]) -> Path:
    path = tmp_path / "rank0.json"
    path.write_text(json.dumps({"distributedInfo": {"rank": 0, "world_size": 1}, "traceEvents": events}))
    return path


def _kernel(name: str, stream: int, ts: float, dur: float, corr: int) -> list[dict]:
    """A kernel and the cudaLaunchKernel that launched it 5 us before it started."""
    return [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts - 5,
             "dur": 2, "args": {"correlation": corr}},
            {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": ts, "dur": dur,
             "args": {"stream": stream, "correlation": corr}}]


def test_kineto_cuda_sync_records_give_streams_and_stream_wait_edges(tmp_path: Path) -> None:
    """The shapes of Kineto's cuda_sync events as HTA's tests/data/critical_path/cuda_event_sync_multi_stream trace
    holds them (enable_cuda_sync_events): the record call's correlation and the recorded stream on the wait."""
    events = [*_kernel("a20", 20, 100, 50, 1), *_kernel("b24", 24, 110, 10, 2), *_kernel("c20", 20, 300, 10, 3),
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaEventRecord", "pid": 1, "tid": 1, "ts": 96, "dur": 1,
               "args": {"correlation": 10}},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamWaitEvent", "pid": 1, "tid": 1, "ts": 120,
               "dur": 2, "args": {"correlation": 11}},
              {"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 24, "ts": 120.5, "dur": 1,
               "args": {"cuda_sync_kind": "Stream Wait Event", "wait_on_stream": 20,
                        "wait_on_cuda_event_record_corr_id": 10, "stream": 24, "correlation": 11}},
              *_kernel("d24", 24, 200, 10, 4),
              {"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": 0, "tid": 24, "ts": 198, "dur": 17,
               "args": {"cuda_sync_kind": "Stream Sync", "stream": 24, "correlation": 12}},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": 1, "tid": 1, "ts": 198,
               "dur": 17, "args": {"correlation": 12}},
              # the synthesizer's step end: a cudaDeviceSynchronize on the main thread, no correlation
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": 1, "tid": 1, "ts": 305,
               "dur": 10}]
    data = _run(_doc(tmp_path, events))
    ids = dict(data.table("device_events").select("name", "event_id").iter_rows())
    rows = {r["name"]: (r["kind"], r["waited_event_id"], r["waiter_event_id"])
            for r in data.table("syncs").to_dicts()}
    assert rows == {
        # a20 is the last kernel on stream 20 launched (95 us) before the record call (96 us); d24 the first on
        # stream 24 launched (195 us) after the wait call
        "Stream Wait Event": ("stream_wait", ids["a20"], ids["d24"]),
        # on stream 24 only: d24 (launched at 195 us) ends at 210 us, within the call; b24 too, but earlier
        "Stream Sync": ("host_wait", ids["d24"], None),
        # any stream: c20 (launched at 295 us, ends at 310 us)
        "cudaDeviceSynchronize": ("host_wait", ids["c20"], None),
    }  # the cudaStreamSynchronize / cudaStreamWaitEvent calls the records describe are read once, from the records
    assert not [n for n in data.notes if "left out" in n]


def _sqlite(path: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as con:
        return con.execute(sql).fetchall()


def test_nsys_cloverleaf_device_synchronize_records_and_blocking_copies() -> None:
    path = NSYS / "pipit_cloverleaf_4gpu_nsys2024.5.sqlite"
    assert _sqlite(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION") == [(1312,)]
    copies = _sqlite(path, "SELECT count(DISTINCT r.correlationId) FROM CUPTI_ACTIVITY_KIND_RUNTIME r "
                           "JOIN StringIds s ON s.id = r.nameId WHERE s.value = 'cudaMemcpy_v3020'")
    assert copies == [(279,)]
    data = _run(path)
    assert _names(data) == {("host_wait", "cudaDeviceSynchronize"): 1312, ("host_wait", "cudaMemcpy"): 279}
    assert ("pipit_cloverleaf_4gpu_nsys2024.5.sqlite: 1312 synchronization records' syncType disagrees with their "
            "runtime call (1312 Event sync for cudaDeviceSynchronize): the call is kept") in data.notes
    got = _edges(data, "waited_event_id")
    assert got["waited_event_id"].null_count() == 0
    # the first record (correlationId 453, device 0): the rule in SQL on the raw export, the kernel or copy of
    # device 0 launched before 533339056 with the latest end <= 534708525 + 2 us
    (name, start, end), = _sqlite(path, f"""
        SELECT s.value, k.start, k.end FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.demangledName
        JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId
        WHERE k.deviceId = 0 AND r.start < 533339056 AND k.end <= 534708525 + {TOLERANCE_NS}
        ORDER BY k.end DESC LIMIT 1""")
    device0 = data.table("ranks").filter(pl.col("device") == 0)["rank"].item()
    first = got.filter((pl.col("name") == "cudaDeviceSynchronize") & (pl.col("rank") == device0)).row(0, named=True)
    assert (first["ev"], first["ev_end"] - first["ev_start"]) == (name, end - start)
    # a blocking copy waits for its own copy: the device copy's length equals the raw MEMCPY row of its correlation
    copy_rows = _sqlite(path, "SELECT m.end - m.start FROM CUPTI_ACTIVITY_KIND_MEMCPY m "
                              "JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = m.correlationId "
                              "JOIN StringIds s ON s.id = r.nameId "
                              "WHERE s.value = 'cudaMemcpy_v3020' ORDER BY r.start")
    blocking = got.filter(pl.col("name") == "cudaMemcpy").sort("start_ns")
    assert blocking["ev"].str.starts_with("Memcpy").all()
    assert sorted((blocking["ev_end"] - blocking["ev_start"]).to_list()) == sorted(d for d, in copy_rows)


def test_nsys_h100_stream_syncs_kept_and_stream_waits_without_edges_left_out() -> None:
    path = NSYS / "nsysai_h100_2proc_nsys2026.2.sqlite"
    by_type = dict(_sqlite(path, "SELECT syncType, count(*) FROM CUPTI_ACTIVITY_KIND_SYNCHRONIZATION GROUP BY 1"))
    assert by_type == {2: 236, 3: 8}  # 244 rows: stream wait event, stream synchronize
    assert _sqlite(path, "SELECT count(*) FROM CUPTI_ACTIVITY_KIND_CUDA_EVENT") == [(0,)]  # no recorded streams
    data = _run(path)
    assert _names(data) == {("host_wait", "cudaStreamSynchronize"): 8}
    assert dict(data.table("syncs").group_by("rank").len().iter_rows()) == {0: 4, 1: 4}  # both processes
    assert ("236 cudaStreamWaitEvent stream waits left out: no device event found on either stream (the recorded "
            "stream unknown, no work on the waiting one after the wait)") in data.notes
    # the waiting streams (22, 26, 30, 34) run nothing: no kernel or copy of the export is on them
    assert _sqlite(path, "SELECT count(*) FROM (SELECT streamId FROM CUPTI_ACTIVITY_KIND_KERNEL UNION ALL SELECT "
                         "streamId FROM CUPTI_ACTIVITY_KIND_MEMCPY) WHERE streamId IN (22, 26, 30, 34)") == [(0,)]
    # a stream synchronize waits on its own stream (7 and 15: the streams the two processes' kernels run on)
    got = _edges(data, "waited_event_id").join(
        data.table("device_events").select("rank", pl.col("event_id").alias("waited_event_id"), "stream"),
        on=["rank", "waited_event_id"])
    assert sorted(set(got["stream"].to_list())) == [7, 15]
    assert (got["ev_end"] <= got["end_ns"] + TOLERANCE_NS).all()


def test_nsys_saxpy_2022_blocking_copies_read_once() -> None:
    path = NSYS / "pipit_saxpy_mpi_1rank_nsys2022.2.sqlite"
    # each call is written twice (cudaMemcpy and cudaMemcpy_v3020, one correlationId)
    assert _sqlite(path, "SELECT count(*), count(DISTINCT r.correlationId) FROM CUPTI_ACTIVITY_KIND_RUNTIME r JOIN "
                         "StringIds s ON s.id = r.nameId WHERE s.value LIKE 'cudaMemcpy%'") == [(30, 15)]
    data = _run(path)
    assert _names(data) == {("host_wait", "cudaMemcpy"): 15}
    assert _edges(data, "waited_event_id")["ev"].str.starts_with("Memcpy").all()


@pytest.mark.parametrize("run", ["torch_npu_2rank_level1_db", "torch_npu_2rank_level1"])
def test_ascend_event_waits_pair_with_records_and_point_at_the_allreduce(run: str) -> None:
    db = ASCEND / "torch_npu_2rank_level1_db" / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    waits = _sqlite(db / "ascend_pytorch_profiler_0.db", "SELECT count(*) FROM TASK t JOIN STRING_IDS s ON "
                                                          "s.id = t.taskType WHERE s.value = 'EVENT_WAIT'")
    view = json.loads((ASCEND / "torch_npu_2rank_level1" / "rank0_ascend_pt" / "ASCEND_PROFILER_OUTPUT" /
                       "trace_view.json").read_text())
    assert waits == [(10,)] and sum(e.get("name") == "EVENT_WAIT" for e in view) == 10
    data = _run(ASCEND / run)
    assert _names(data) == {("stream_wait", "EVENT_WAIT"): 20}  # 10 per rank, both ranks
    assert not [n for n in data.notes if "sync" in n]  # every wait resolved
    waited, waiter = _edges(data, "waited_event_id"), _edges(data, "waiter_event_id")
    rank0 = waited.filter(pl.col("rank") == 0)["ev"].to_list(), waiter.filter(pl.col("rank") == 0)["ev"].to_list()
    # By hand from rank 0's TASK rows in start order (sqlite3, stream in brackets): EVENT_WAIT [4] 430852750 ..
    # 431037274 ends 440 ns after EVENT_RECORD [2] 431036814 .. 834; the last work on [2] before that record is
    # aclnnMuls (ends 430938412), the first on [4] after the wait the first all-reduce (its Notify Wait / SDMA tasks
    # are on [4]). EVENT_WAIT [2] 453680247 .. 520384739 ends after EVENT_RECORD [4] 520384339: it waited for that
    # all-reduce (ends 520382799), then MEMCPY_ASYNC on [2] (520384839).
    assert rank0[0][2].startswith("aclnnMuls") and rank0[1][2].startswith("hcom_allReduce__") \
        and rank0[1][2].endswith("_0_1")
    assert rank0[0][3].startswith("hcom_allReduce__") and rank0[0][3].endswith("_0_1") \
        and rank0[1][3] == "MEMCPY_ASYNC"
    # the four all-reduces: each is waited for by the compute stream and waits for it
    assert sum(str(n).startswith("hcom_allReduce") for n in rank0[0]) == 4
    assert sum(str(n).startswith("hcom_allReduce") for n in rank0[1]) == 4
    # device times: a waited event ends by the wait's end, a waiter starts at or after it
    assert (waited["ev_end"] <= waited["end_ns"]).all() and (waiter["ev_start"] >= waiter["end_ns"]).all()


def test_ascend_level0_without_hccl_tasks_puts_the_allreduces_on_the_stream_with_only_event_tasks() -> None:
    # level 0 records no HCCL tasks; stream 4 holds event records and waits and no other task, so the all-reduces
    # stand on it: the same edges as level 1's (by name and order; the two runs are different recordings)
    level0, level1 = (_run(ASCEND / f"torch_npu_2rank_level{n}") for n in ("0", "1"))
    for column in ("waited_event_id", "waiter_event_id"):
        names = [_edges(d, column)["ev"].str.replace(r"__\d+_", "__").to_list() for d in (level0, level1)]
        assert names[0] == names[1] and None not in names[0]


def test_syncs_reach_the_store_and_a_dataset(tmp_path: Path) -> None:
    trace = KINETO / "hta_rank0of2_pg_args.json.gz"
    for db in (tmp_path / "store.duckdb", tmp_path / "runs.parquet"):
        run_cli("ingest", trace, "--db", db)
        out = run_cli("sql", "--db", db, "SELECT kind, syncs.name, count(*) AS n, count(waited_event_id) AS waited "
                                         "FROM syncs JOIN device_events d ON d.run_id = syncs.run_id AND d.rank = "
                                         "syncs.rank AND d.event_id = syncs.waited_event_id "
                                         "GROUP BY ALL ORDER BY ALL")
        assert "cudaDeviceSynchronize" in out.stdout and "cudaEventSynchronize" in out.stdout, out.stdout
