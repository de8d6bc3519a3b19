"""Values a real export holds where its reader expects something else (issue 11, classes 1-6), one case each.

Sentinels ("none" ids) are data: the export ingests with the field unknown. A value that matters and cannot be
represented is one line naming the file, the table or field, and the value. Rows no store row may be (NULL times,
reversed or absurd intervals) are left out with a note that counts them. Every expected number here is read back
from the damaged file itself (sqlite3 / json) or from the undamaged ingest, not typed in.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import sqlite3
from pathlib import Path

import duckdb
import pytest

from tests.conftest import TRACES, run_main

ASCEND_DB = TRACES / "ascend" / "torch_npu_2rank_level1_db"
ASCEND_TEXT = TRACES / "ascend" / "torch_npu_2rank_level0" / "rank0_ascend_pt"
NSYS_2PROC = TRACES / "nsys" / "nsysai_h100_2proc_nsys2026.2.sqlite"
KINETO = TRACES / "kineto" / "hta_rank0of2_pg_args.json.gz"
FIRST_COMPUTE = "globalTaskId = (SELECT min(globalTaskId) FROM COMPUTE_TASK_INFO)"


def _writable_copy(source: Path, target: Path) -> Path:
    if source.is_dir():
        shutil.copytree(source, target)
    else:
        shutil.copy(source, target)
    for path in [target, *target.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return target


def _rank_db(folder: Path, rank: int) -> Path:
    return folder / f"rank{rank}_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / f"ascend_pytorch_profiler_{rank}.db"


def ascend_db(tmp: Path, *statements: str, ranks: tuple[int, ...] = (0, 1)) -> Path:
    """The real 2-rank database export with ``statements`` run on the given ranks' databases."""
    folder = _writable_copy(ASCEND_DB, tmp / "run")
    for rank in ranks:
        with sqlite3.connect(_rank_db(folder, rank)) as con:
            for sql in statements:
                con.execute(sql)
    return folder


def ingest(path: Path, db: Path, *extra: object) -> tuple[int, str, str]:
    return run_main("ingest", path, "--db", db, *extra)


def one_error(result: tuple[int, str, str]) -> str:
    code, _, err = result
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), result
    return lines[0]


def rows(db: Path, sql: str) -> list[tuple]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute(sql).fetchall()


@pytest.fixture(scope="module")
def undamaged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("undamaged") / "t.duckdb"
    assert ingest(ASCEND_DB, db)[0] == 0
    return db


# --- class 1: numbers outside their column type ---------------------------------------------------------------


def test_ascend_database_with_uint32_none_ids_ingests_with_them_unknown(tmp_path, undamaged) -> None:
    """planeId, deviceId and the STEP_TIME id as 4294967295 (uint32 -1): the level-0 export's real case."""
    folder = ascend_db(tmp_path, "UPDATE COMMUNICATION_TASK_INFO SET planeId = 4294967295",
                       "UPDATE RANK_DEVICE_MAP SET deviceId = 4294967295", "UPDATE TASK SET deviceId = 4294967295",
                       "UPDATE STEP_TIME SET id = 4294967295")
    with sqlite3.connect(_rank_db(folder, 0)) as con:
        step = con.execute("SELECT startNs, endNs FROM STEP_TIME").fetchall()
        tasks = con.execute("SELECT count(*) FROM COMMUNICATION_TASK_INFO").fetchall()[0][0]
    db = tmp_path / "t.duckdb"
    code, _, err = ingest(folder, db)
    assert code == 0, err
    assert rows(db, "SELECT device FROM ranks ORDER BY rank") == [(None,), (None,)]
    # Every HCCL task kept, its plane unknown; the step numbered by order, its times as the profiler wrote them.
    assert rows(db, "SELECT count(*), count(args::JSON->>'plane') FROM annotations WHERE rank = 0 AND "
                    "kind = 'hccl_task'") == [(tasks, 0)]
    assert rows(db, "SELECT step, start_ns, end_ns FROM steps WHERE rank = 0") == [(0, *step[0])]
    # Nothing else moved: the events are those of the undamaged export.
    count = "SELECT count(*), sum(end_ns - start_ns) FROM device_events"
    assert rows(db, count) == rows(undamaged, count)


def test_ascend_uint64_none_message_count_is_unknown_bytes_not_negative(tmp_path) -> None:
    """COMMUNICATION_OP.count = 2^64-1 (stored as REAL past int64) and -1: bytes unknown, never count x size < 0."""
    folder = ascend_db(tmp_path, "UPDATE COMMUNICATION_OP SET count = 18446744073709551615", ranks=(0,))
    with sqlite3.connect(_rank_db(folder, 1)) as con:
        con.execute("UPDATE COMMUNICATION_OP SET count = -1")
    db = tmp_path / "t.duckdb"
    assert ingest(folder, db)[0] == 0
    assert rows(db, "SELECT count(*), count(bytes) FROM collectives") == [(8, 0)]


@pytest.mark.parametrize(("statement", "message"), [
    ("UPDATE RANK_DEVICE_MAP SET rankId = 1099511627776",
     "RANK_DEVICE_MAP.rankId is 1099511627776, not a rank (an integer 0 .. 2147483647)"),
    (f"UPDATE TASK SET startNs = 9.3e18 WHERE {FIRST_COMPUTE}",
     "TASK/COMPUTE_TASK_INFO column start_ns holds 9.3e+18, which is not an integer of 64 bits"),
    (f"UPDATE TASK SET endNs = 'soon' WHERE {FIRST_COMPUTE}",
     "TASK/COMPUTE_TASK_INFO column end_ns holds 'soon', which is not an integer of 64 bits"),
], ids=["rank-2^40", "time-above-2^63", "text-time"])
def test_ascend_value_that_matters_and_cannot_be_represented_is_one_line(tmp_path, statement, message) -> None:
    folder = ascend_db(tmp_path, statement, ranks=(0,))
    line = one_error(ingest(folder, tmp_path / "t.duckdb"))
    assert str(_rank_db(folder, 0)) in line and message in line
    assert not (tmp_path / "t.duckdb").exists()


def test_profiler_info_rank_sentinel_is_unknown_and_huge_rank_is_one_line(tmp_path) -> None:
    folder = _writable_copy(ASCEND_TEXT, tmp_path / "rank0_ascend_pt")
    info = folder / "profiler_info_0.json"
    original = json.loads(info.read_text())
    info.write_text(json.dumps({**original, "rank_id": 4294967295}))
    db = tmp_path / "t.duckdb"
    assert ingest(folder, db)[0] == 0  # the file name profiler_info_0.json still says rank 0
    assert rows(db, "SELECT rank, rank_source FROM ranks") == [(0, "profiler_info")]
    info.write_text(json.dumps({**original, "rank_id": 2**40}))
    assert f"{info}: rank_id is 1099511627776, not a rank" in one_error(ingest(folder, tmp_path / "u.duckdb"))


def _nsys(tmp: Path, *statements: str) -> Path:
    path = _writable_copy(NSYS_2PROC, tmp / "report.sqlite")
    with sqlite3.connect(path) as con:
        # the export declares these NOT NULL; a sloppier writer would not: rebuild the table without constraints
        con.execute("CREATE TABLE k AS SELECT * FROM CUPTI_ACTIVITY_KIND_KERNEL")
        con.execute("DROP TABLE CUPTI_ACTIVITY_KIND_KERNEL")
        con.execute("ALTER TABLE k RENAME TO CUPTI_ACTIVITY_KIND_KERNEL")
        for sql in statements:
            con.execute(sql)
    return path


def test_nsys_unknown_process_or_device_does_not_split_a_rank(tmp_path) -> None:
    """globalPid -1 / NULL on some kernels: they belong to their device's only process. deviceId uint32 -1 on
    others: left out with a counted note, not a third rank."""
    path = _nsys(tmp_path, "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET globalPid = -1 WHERE rowid % 10 = 0",
                 "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET globalPid = NULL WHERE rowid % 10 = 1",
                 "UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET deviceId = 4294967295 WHERE rowid % 100 = 5")
    with sqlite3.connect(path) as con:
        lost = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL WHERE deviceId = 4294967295").fetchall()
        pids = con.execute("SELECT deviceId, count(DISTINCT globalPid) FROM CUPTI_ACTIVITY_KIND_KERNEL "
                           "WHERE globalPid > 0 AND deviceId < 8 GROUP BY 1").fetchall()
    assert [n for _, n in pids] == [1, 1]  # one process per device: what makes the attribution unambiguous
    db, clean = tmp_path / "t.duckdb", tmp_path / "clean.duckdb"
    code, out, err = ingest(path, db)
    assert code == 0, err
    assert ingest(NSYS_2PROC, clean)[0] == 0
    assert f"report.sqlite: {lost[0][0]} GPU activity rows without a device id left out" in out
    count = "SELECT rank, device, pid FROM ranks ORDER BY rank"
    assert rows(db, count) == rows(clean, count)
    events = "SELECT count(*) FROM device_events"
    assert rows(db, events)[0][0] == rows(clean, events)[0][0] - lost[0][0]


# --- class 2: NULL where a value is required; class 4: reversed and absurd intervals -----------------------------


def test_ascend_null_times_and_reversed_tasks_are_left_out_with_counts(tmp_path, undamaged) -> None:
    folder = ascend_db(tmp_path,
                       "UPDATE TASK SET startNs = NULL WHERE globalTaskId IN "
                       "(SELECT globalTaskId FROM COMPUTE_TASK_INFO ORDER BY globalTaskId LIMIT 7)",
                       "UPDATE TASK SET endNs = startNs - 1000 WHERE globalTaskId IN "
                       "(SELECT globalTaskId FROM COMPUTE_TASK_INFO ORDER BY globalTaskId LIMIT 5 OFFSET 7)",
                       "UPDATE STEP_TIME SET endNs = NULL", ranks=(0,))
    db = tmp_path / "t.duckdb"
    code, out, err = ingest(folder, db)
    assert code == 0, err
    assert "12 device events rows left out (no start_ns, end before start)" in out
    assert "1 steps rows left out (no end_ns)" in out
    before = rows(undamaged, "SELECT count(*) FROM device_events")[0][0]
    assert rows(db, "SELECT count(*) FROM device_events")[0][0] == before - 12
    assert rows(db, "SELECT rank FROM steps") == [(1,)]


def _kineto(tmp: Path, change) -> Path:
    trace = json.loads(gzip.decompress(KINETO.read_bytes()))
    change(trace)
    path = tmp / "rank0.json"
    path.write_text(json.dumps(trace))
    return path


def test_kineto_reversed_and_absurd_events_are_left_out_and_the_breakdown_still_runs(tmp_path) -> None:
    """Today's failure: 252 reversed kernels were stored, and breakdown then said the run had no events."""
    def damage(trace: dict) -> None:
        kernels = [e for e in trace["traceEvents"] if e.get("cat") == "kernel"]
        for event in kernels[::15]:
            event["dur"] = -event["dur"] - 1
        kernels[1]["ts"] = -1e15  # -1e15 us: before any clock's epoch
        trace["reversed"] = len(kernels[::15])

    path = _kineto(tmp_path, damage)
    reversed_count = json.loads(path.read_text())["reversed"]
    db = tmp_path / "t.duckdb"
    code, out, err = ingest(path, db)
    assert code == 0, err
    assert (f"{reversed_count + 1} device events rows left out (a time more than a day from the rank's others, "
            "end before start)" in out)
    assert rows(db, "SELECT count(*) FROM device_events WHERE end_ns < start_ns OR start_ns < 0") == [(0,)]
    code, out, err = run_main("breakdown", "--db", db, "--json")
    assert code == 0 and json.loads(out)[0]["COMP_ms"] > 0


# --- class 3: wrong-typed metadata -------------------------------------------------------------------------------


@pytest.mark.parametrize(("field", "value", "message"), [
    ("distributedInfo", [0, 1], "distributedInfo is [0, 1], not an object"),
    ("world_size", "four", "distributedInfo.world_size is 'four', not a number of ranks"),
    ("pg_config", {"0": {}}, 'distributedInfo.pg_config is {"0": {}}, not a list of objects'),
    ("ranks", ["a", "b"], 'distributedInfo.pg_config ranks ["a", "b"] is not a list of ranks'),
    ("ranks", 0, "distributedInfo.pg_config ranks 0 is not a list of ranks"),
    ("rank", 2**40, "distributedInfo.rank is 1099511627776, not a rank"),
    ("baseTimeNanoseconds", "soon", "baseTimeNanoseconds is 'soon', not a time in ns"),
])
def test_kineto_wrong_typed_metadata_is_one_line_naming_the_field(tmp_path, field, value, message) -> None:
    def damage(trace: dict) -> None:
        info = trace["distributedInfo"]
        if field in ("distributedInfo", "baseTimeNanoseconds"):
            trace[field] = value
        elif field == "ranks":
            info["pg_config"][0]["ranks"] = value
        else:
            info[field] = value

    path = _kineto(tmp_path, damage)
    assert f"{path}: {message}" in one_error(ingest(path, tmp_path / "t.duckdb"))


@pytest.mark.parametrize(("key", "value", "message"), [
    ("parallel_group_info", "[1, 2]", "parallel_group_info is [1, 2], not an object"),
    ("parallel_group_info", '{"hccl_1": {"group_name": "tp", "global_ranks": ["x"]}}',
     'parallel_group_info hccl_1 global_ranks ["x"] is not a list of ranks'),
    ("distributed_args", '{"tensor_model_parallel_size": "two"}', "distributed_args tp='two' is not a group size"),
    ("distributed_args", '{"world_size": "four"}', "distributed_args world_size is 'four', not a number of ranks"),
])
def test_ascend_wrong_typed_metadata_is_one_line_naming_the_field(tmp_path, key, value, message) -> None:
    folder = ascend_db(tmp_path, f"INSERT INTO META_DATA (name, value) VALUES ('{key}', '{value}')", ranks=(0,))
    assert f"profiler metadata: {message}" in one_error(ingest(folder, tmp_path / "t.duckdb"))


# --- class 5: Ascend memory records ------------------------------------------------------------------------------


@pytest.mark.parametrize("damage", ["missing column", "broken rows", "not UTF-8"])
def test_broken_memory_record_csv_is_left_out_with_a_note(tmp_path, damage) -> None:
    folder = _writable_copy(ASCEND_TEXT, tmp_path / "rank0_ascend_pt")
    csv = folder / "ASCEND_PROFILER_OUTPUT" / "memory_record.csv"
    lines = csv.read_bytes().splitlines(keepends=True)
    if damage == "missing column":
        lines[0] = lines[0].replace(b"Total Reserved(MB),", b"")
    elif damage == "broken rows":
        lines[5:5] = [b'PTA,"unterminated,1,2\n']
    else:
        lines[5:5] = [b"PTA,\xff\xfe,1,2,,,NPU:0\n"]
    csv.write_bytes(b"".join(lines))
    db = tmp_path / "t.duckdb"
    code, out, err = ingest(folder, db)
    assert code == 0, err
    assert f"note: {csv}: memory samples left out, the file is not readable (" in out
    assert rows(db, "SELECT count(*) FROM memory") == [(0,)]
    assert rows(db, "SELECT count(*) FROM device_events")[0][0] > 0


def test_unreadable_memory_record_table_is_left_out_with_a_note(tmp_path) -> None:
    folder = ascend_db(tmp_path, "UPDATE MEMORY_RECORD SET timestamp = 'x'", ranks=(0,))
    db = tmp_path / "t.duckdb"
    code, out, err = ingest(folder, db)
    assert code == 0, err
    assert "MEMORY_RECORD column ts_ns holds 'x', which is not an integer of 64 bits; memory samples left out" in out
    with sqlite3.connect(_rank_db(folder, 1)) as con:
        pta = con.execute("SELECT count(*) FROM MEMORY_RECORD m JOIN STRING_IDS s ON s.id = m.component "
                          "WHERE s.value = 'PTA'").fetchall()[0][0]
    assert rows(db, "SELECT rank, count(*) FROM memory GROUP BY rank") == ([(1, pta)] if pta else [])


# --- class 6: missing or dangling string tables ------------------------------------------------------------------


def test_nsys_dangling_kernel_names_get_a_note(tmp_path) -> None:
    path = _nsys(tmp_path, "DELETE FROM StringIds WHERE id IN (SELECT shortName FROM CUPTI_ACTIVITY_KIND_KERNEL)")
    with sqlite3.connect(path) as con:
        kernels = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchall()[0][0]
    code, out, err = ingest(path, tmp_path / "t.duckdb")
    assert code == 0, err
    assert f"report.sqlite: {kernels} kernels name no string in StringIds" in out


def test_ascend_emptied_string_table_gets_a_note(tmp_path) -> None:
    folder = ascend_db(tmp_path, "DELETE FROM STRING_IDS", ranks=(0,))
    with sqlite3.connect(_rank_db(folder, 0)) as con:
        compute, ops = (con.execute(f"SELECT count(*) FROM {t}").fetchall()[0][0]
                        for t in ("COMPUTE_TASK_INFO", "COMMUNICATION_OP"))
    code, out, err = ingest(folder, tmp_path / "t.duckdb")
    assert code == 0, err
    assert f"{compute} compute tasks and {ops} HCCL ops name no STRING_IDS row" in out


def test_kineto_uint64_none_message_count_is_unknown_bytes_not_negative(tmp_path) -> None:
    """"In msg nelems" -1 (uint64 -1 written signed) once became bytes = -4: now every such size is unknown."""
    def damage(trace: dict) -> None:
        for event in trace["traceEvents"]:
            if "In msg nelems" in (event.get("args") or {}):
                event["args"]["In msg nelems"] = -1

    clean = tmp_path / "clean.duckdb"
    assert ingest(KINETO, clean)[0] == 0
    sized = rows(clean, "SELECT count(bytes) FROM collectives")[0][0]
    assert sized > 0
    db = tmp_path / "t.duckdb"
    code, out, err = ingest(_kineto(tmp_path, damage), db)
    assert code == 0, err
    assert f"{sized} collectives have a message size outside 0 .. 2^50 bytes; read as unknown" in out
    assert rows(db, "SELECT count(*), count(bytes) FROM collectives") == [(rows(clean, "SELECT count(*) FROM "
                                                                                  "collectives")[0][0], 0)]


def test_ascend_ranks_whose_steps_come_from_different_places_ingest(tmp_path) -> None:
    """Rank 0 without STEP_TIME (steps from its ProfilerStep markers), rank 1 with it: found by the fuzz suite."""
    folder = ascend_db(tmp_path, "DROP TABLE STEP_TIME", ranks=(0,))
    with sqlite3.connect(_rank_db(folder, 1)) as con:
        step = con.execute("SELECT id, startNs, endNs FROM STEP_TIME").fetchall()
    db = tmp_path / "t.duckdb"
    code, _, err = ingest(folder, db)
    assert code == 0, err
    assert rows(db, "SELECT step, start_ns - clock_offset_ns, end_ns - clock_offset_ns FROM steps "
                    "JOIN ranks USING (run_id, rank) WHERE rank = 1") == step  # on rank 1's own clock


def test_kineto_step_number_beyond_int32_is_left_out_with_a_note(tmp_path) -> None:
    def damage(trace: dict) -> None:
        step = next(e for e in trace["traceEvents"] if str(e.get("name", "")).startswith("ProfilerStep#"))
        step["name"] = "ProfilerStep#99999999999"

    code, out, err = ingest(_kineto(tmp_path, damage), tmp_path / "t.duckdb")
    assert code == 0, err
    assert "1 ProfilerStep ranges left out: their step number does not fit an INTEGER" in out


def test_a_repeated_step_number_keeps_the_first_with_a_note(tmp_path) -> None:
    """Two STEP_TIME rows of one id would break the store's (rank, step) key: found by the fuzz suite."""
    folder = ascend_db(tmp_path, "INSERT INTO STEP_TIME SELECT id, startNs + 1, endNs + 1 FROM STEP_TIME", ranks=(0,))
    with sqlite3.connect(_rank_db(folder, 0)) as con:
        first = con.execute("SELECT id, startNs, endNs FROM STEP_TIME ORDER BY rowid LIMIT 1").fetchall()
    db = tmp_path / "t.duckdb"
    code, out, err = ingest(folder, db)
    assert code == 0, err
    assert "1 steps rows repeat a rank/step of another; the first is kept" in out
    assert rows(db, "SELECT step, start_ns, end_ns FROM steps WHERE rank = 0") == first


def test_ascend_timeline_durations_past_any_clock_are_left_out(tmp_path) -> None:
    """dur 2^63 us in trace_view.json once overflowed the ns conversion (found by the fuzz suite)."""
    folder = _writable_copy(ASCEND_TEXT, tmp_path / "rank0_ascend_pt")
    timeline = folder / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    events = json.loads(timeline.read_text())
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    for event in ops[:3]:
        event["dur"] = 2**63
    timeline.write_text(json.dumps(events))
    code, out, err = ingest(folder, tmp_path / "t.duckdb")
    assert code == 0, err
    assert "3 annotations rows left out (no end_ns)" in out


def test_ascend_timeline_device_label_sentinel_is_an_unknown_device(tmp_path) -> None:
    """process_labels "4294967295" (uint32 -1) once overflowed the ranks table (found by the fuzz suite)."""
    folder = _writable_copy(ASCEND_TEXT, tmp_path / "rank0_ascend_pt")
    timeline = folder / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    events = json.loads(timeline.read_text())
    for event in events:
        if isinstance(event.get("args"), dict) and "labels" in event["args"]:
            event["args"]["labels"] = 4294967295
    timeline.write_text(json.dumps(events))
    db = tmp_path / "t.duckdb"
    code, _, err = ingest(folder, db)
    assert code == 0, err
    assert rows(db, "SELECT rank, device FROM ranks") == [(0, None)]
