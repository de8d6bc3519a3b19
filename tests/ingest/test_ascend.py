"""Ascend ingest on the shared real profiler output. Expected numbers come from a second route: the profiler's own
CSVs (kernel_details.csv), its Overlap Analysis layer, msprof-analyze's outputs, or the raw JSON / SQLite read with
the standard library in the test itself.

The level-1 text export and the level-1 database export are two different runs of the same program (collection
ended 2025-01-09 07:48:04 vs 08:16:16 UTC; their communicators hash to ...586 vs ...210), so their timestamps are
not comparable: the test compares what is (every event's name, stream and category in order, HCCL bytes, HCCL
tasks), and each export's timings against a second route of its own run.
"""

from __future__ import annotations

import csv
import json
import shutil
import sqlite3
from contextlib import closing
from decimal import Decimal
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import TRACES
from traceana.errors import TraceanaError
from traceana.ingest.ascend.groups import double_hash, layout_from_metadata, metadata_groups
from traceana.ingest.ascend.tasks import hcom_columns
from traceana.ingest.dispatch import IngestOptions, detect, read_run
from traceana.ingest.groups.communicators import group_dims
from traceana.ingest.groups.stated import fitting_layouts, settle_layout, stated_roles
from traceana.ingest.run_data import RunData
from traceana.layout import Layout

ASCEND = TRACES / "ascend"
RUNS = ("torch_npu_2rank_level0", "torch_npu_2rank_level1", "torch_npu_2rank_level1_db")


def ingest(*paths: Path, layout: str | None = None) -> RunData:
    return read_run(list(paths), "auto", IngestOptions(layout=Layout.parse(layout) if layout else None))


@pytest.fixture(scope="module")
def runs() -> dict[str, RunData]:
    return {name: ingest(ASCEND / name) for name in RUNS}


def rank_folder(run: str, rank: int) -> Path:
    return ASCEND / run / f"rank{rank}_ascend_pt"


def kernel_details(run: str, rank: int) -> list[dict[str, str]]:
    with open(rank_folder(run, rank) / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def trace_events(path: Path) -> tuple[list[dict], dict[int, str]]:
    """The raw timeline and its pid -> process_name map, by the standard library."""
    events = json.loads(path.read_text())
    return events, {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}


def read_only(path: Path) -> sqlite3.Connection:
    """A shared database, opened so that SQLite writes nothing beside it."""
    return sqlite3.connect(f"file:{path}?mode=ro&immutable=1", uri=True)


def exact_ns(ts: str) -> int:
    return int(Decimal(ts) * 1000)


def raw_clock(data: RunData, frame: pl.DataFrame, *columns: str) -> pl.DataFrame:
    """``frame`` (with a rank column) with its times back on each rank's own clock: clock_offset_ns taken out."""
    offsets = data.table("ranks").select("rank", "clock_offset_ns")
    return frame.join(offsets, on="rank").with_columns(
        pl.col(c) - pl.col("clock_offset_ns") for c in columns or ("start_ns", "end_ns")).drop("clock_offset_ns")


@pytest.mark.parametrize("run", RUNS)
def test_two_rank_runs(runs: dict[str, RunData], run: str) -> None:
    data = runs[run]
    ranks = data.table("ranks")
    assert data.source_format == "ascend" and data.world_size == 2
    assert ranks["rank"].to_list() == [0, 1] and set(ranks["rank_source"]) == {"profiler_info"}
    assert ranks["host"].n_unique() == 1 and ranks["host"].null_count() == 0  # devices 0 and 1 of one host
    assert data.table("steps").select("rank", "step").rows() == [(0, 50), (1, 50)]  # ProfilerStep#50 / STEP_TIME


@pytest.mark.parametrize("run", RUNS)
def test_collective_instances_end_together(runs: dict[str, RunData], run: str) -> None:
    """Both ranks share one host but each NPU its own clock: rank 1 is shifted onto rank 0's by their all-reduce
    ends (by 6-16 µs; test_ascend_step_trace checks against the raw files), after which each instance ends on both
    within 5 µs although rank 0 arrives up to ms earlier and waits (a Notify_Wait) for rank 1."""
    data = runs[run]
    offsets = data.table("ranks").sort("rank")["clock_offset_ns"].to_list()
    assert offsets[0] == 0 and 5_000 < abs(offsets[1]) < 20_000
    spans = (data.table("collectives").join(data.table("device_events"), on=["rank", "event_id"])
             .group_by("instance").agg(pl.len(), (pl.col("end_ns").max() - pl.col("end_ns").min()).alias("end"),
                                       (pl.col("start_ns").max() - pl.col("start_ns").min()).alias("start")))
    assert spans.height == 4 and set(spans["len"]) == {2}
    assert spans["end"].max() <= 5_000 and spans["start"].max() > 1_000_000


@pytest.mark.parametrize("run", ["torch_npu_2rank_level0", "torch_npu_2rank_level1"])
@pytest.mark.parametrize("rank", [0, 1])
def test_hccl_ops_equal_kernel_details(runs: dict[str, RunData], run: str, rank: int) -> None:
    """HCCL ops = kernel_details.csv rows with Accelerator Core HCCL: count, total duration, and each op's start
    and duration within 1 µs (the CSV rounds to the µs's third decimal)."""
    rows = [r for r in kernel_details(run, rank) if r["Accelerator Core"] == "HCCL"]
    data = runs[run]
    ops = raw_clock(data, data.table("collectives").filter(pl.col("rank") == rank)
                    .join(data.table("device_events"), on=["rank", "event_id"]).sort("start_ns"))
    assert ops.height == len(rows) == 4
    assert ops["name"].to_list() == [r["Name"] for r in rows]
    total_us = sum(float(r["Duration(us)"]) for r in rows)
    assert (ops["end_ns"] - ops["start_ns"]).sum() / 1e3 == pytest.approx(total_us, abs=0.01)
    for (start, end), row in zip(ops.select("start_ns", "end_ns").rows(), rows, strict=True):
        assert abs(start / 1e3 - float(row["Start Time(us)"].strip())) < 1
        assert abs((end - start) / 1e3 - float(row["Duration(us)"])) < 1
    assert set(ops["op"]) == {"AllReduce"} and set(ops["dtype"]) == {"float32"}
    assert ops["seq"].to_list() == [0, 1, 2, 3]  # hcom_allReduce__{hash3}_{index}_1


@pytest.mark.parametrize("rank", [0, 1])
def test_compute_tasks_equal_kernel_details_within_1us(runs: dict[str, RunData], rank: int) -> None:
    """Every non-HCCL row of level 1's kernel_details.csv is one compute event: same name, start and duration
    within 1 µs."""
    rows = sorted((r for r in kernel_details("torch_npu_2rank_level1", rank) if r["Accelerator Core"] != "HCCL"),
                  key=lambda r: float(r["Start Time(us)"].strip()))
    data = runs["torch_npu_2rank_level1"]
    compute = raw_clock(data, data.table("device_events").filter(
        (pl.col("rank") == rank) & (pl.col("category") == "compute")).sort("start_ns"))
    assert compute.height == len(rows) == 187
    assert compute["name"].to_list() == [r["Name"] for r in rows]
    for (start, end), row in zip(compute.select("start_ns", "end_ns").rows(), rows, strict=True):
        assert abs(start / 1e3 - float(row["Start Time(us)"].strip())) < 1
        assert abs((end - start) / 1e3 - float(row["Duration(us)"])) < 1


def test_timestamps_are_exact_ns(runs: dict[str, RunData]) -> None:
    """Device task starts equal Decimal(ts) * 1000 of the raw JSON, exactly (no float rounding)."""
    events, process = trace_events(rank_folder("torch_npu_2rank_level1", 0) / "ASCEND_PROFILER_OUTPUT" /
                                   "trace_view.json")
    raw = sorted(exact_ns(e["ts"]) for e in events
                 if e["ph"] == "X" and process[e["pid"]] == "Ascend Hardware" and e["args"]["Task Type"] in
                 ("AI_CORE", "MIX_AIV", "DSA_SQE"))
    ours = runs["torch_npu_2rank_level1"].table("device_events").filter(
        (pl.col("rank") == 0) & (pl.col("category") == "compute")).sort("start_ns")["start_ns"].to_list()
    assert ours == raw


def _normalized(data: RunData, rank: int) -> list[tuple]:
    """(stream, name, category) of a rank's events in order, HCCL op names without their group-hash digits."""
    events = data.table("device_events").filter(pl.col("rank") == rank).sort("event_id")
    return events.select("stream", pl.col("name").str.replace(r"^(hcom_[A-Za-z]+__)\d+", "${1}N"), "category").rows()


@pytest.mark.parametrize("rank", [0, 1])
def test_text_and_database_exports_agree(runs: dict[str, RunData], rank: int) -> None:
    text, db = runs["torch_npu_2rank_level1"], runs["torch_npu_2rank_level1_db"]
    for stream in {s for s, _, _ in _normalized(text, rank)}:
        assert [e for e in _normalized(text, rank) if e[0] == stream] == \
               [e for e in _normalized(db, rank) if e[0] == stream]
    columns = ["op", "kernel_op", "bytes", "dtype", "seq", "instance"]
    assert text.table("collectives").filter(pl.col("rank") == rank).select(columns).rows() == \
           db.table("collectives").filter(pl.col("rank") == rank).select(columns).rows()

    def tasks(data: RunData) -> list[tuple]:
        frame = data.table("annotations").filter((pl.col("rank") == rank) & (pl.col("kind") == "hccl_task"))
        fields = pl.col("args").str.json_decode(pl.Struct({"size_bytes": pl.Int64, "plane": pl.Int32,
                                                           "transport": pl.String}))
        return frame.select("name", fields.alias("a")).unnest("a").group_by("name", "plane", "transport").agg(
            pl.len(), pl.col("size_bytes").sum()).sort(pl.all()).rows()

    assert tasks(text) == tasks(db) and len(tasks(text)) > 0


def test_database_events_match_its_own_tables(runs: dict[str, RunData]) -> None:
    """Second route on the database run: direct SQL over the SQLite file (COMPUTE_TASK_INFO ⋈ TASK, and
    COMMUNICATION_OP), every event to the ns."""
    for rank in (0, 1):
        path = rank_folder("torch_npu_2rank_level1_db", rank) / "ASCEND_PROFILER_OUTPUT" / \
            f"ascend_pytorch_profiler_{rank}.db"
        with closing(read_only(path)) as con:
            compute = con.execute("SELECT t.startNs, t.endNs FROM TASK t JOIN COMPUTE_TASK_INFO c "
                                  "USING (globalTaskId) ORDER BY 1, 2").fetchall()
            hcom = con.execute("SELECT startNs, endNs FROM COMMUNICATION_OP ORDER BY 1").fetchall()
        data = runs["torch_npu_2rank_level1_db"]
        events = raw_clock(data, data.table("device_events").filter(pl.col("rank") == rank))
        assert events.filter(pl.col("category") == "compute").select("start_ns", "end_ns").sort(pl.all()).rows() \
            == compute
        assert events.filter(pl.col("category") == "comm").select("start_ns", "end_ns").sort(pl.all()).rows() == hcom


def test_ops_linked_to_their_communicator(runs: dict[str, RunData]) -> None:
    """Text: communication.json's op@hash; database: COMMUNICATION_OP.groupName, whose double_hash is the group id
    msprof-analyze wrote into that run's analysis.db."""
    text = runs["torch_npu_2rank_level1"]
    assert set(text.table("collectives")["pg"]) == {"17522688603477080586"}
    assert text.table("process_groups").select("pg", "ranks", "source").rows() == \
           [("17522688603477080586", [0, 1], "inferred")]
    db = runs["torch_npu_2rank_level1_db"]
    (comm,) = set(db.table("collectives")["pg"])
    assert comm == "90.91.105.46%enp189s0f0_60000_0_1736410538306028"
    analysis = rank_folder("torch_npu_2rank_level1_db", 0) / "ASCEND_PROFILER_OUTPUT" / "analysis.db"
    with closing(read_only(analysis)) as con:
        assert {int(r[0]) for r in con.execute("SELECT group_name FROM CommAnalyzerTime")} == {double_hash(comm)}
    level0 = runs["torch_npu_2rank_level0"]
    assert level0.table("collectives")["pg"].null_count() == 8  # no evidence at level 0: the 3 digits do not count
    assert any("no communicator evidence" in n for n in level0.notes)


@pytest.mark.parametrize(("name", "op", "kernel_op", "seq"), [
    ("hcom_allReduce__586_0_1", "AllReduce", "hcom_allReduce_", 0),  # the shared level-1 run
    ("hcom_send__822_0", "Send", "hcom_send_", 0),  # older CANN, no trailing _n (msprof-analyze cluster sample)
    ("hcom_receive__822_3", "Recv", "hcom_receive_", 3),
    ("hcom_broadcast__483_1", "Broadcast", "hcom_broadcast_", 1),
    ("hcom_allGather__501_7_1", "AllGather", "hcom_allGather_", 7),
    ("hcom_reduceScatter__501_8_1", "ReduceScatter", "hcom_reduceScatter_", 8),
    ("hcom_alltoallv__210_2_1", "AllToAll", "hcom_alltoallv_", 2),
    ("hcom_batchsendrecv__210_4_1", "SendRecv", "hcom_batchsendrecv_", 4),
    ("hcom_reduce__210_5_1", "Reduce", "hcom_reduce_", 5),
    ("hcom_scatter__210_6_1", "Scatter", "hcom_scatter_", 6),
])
def test_hcom_names(name: str, op: str, kernel_op: str, seq: int) -> None:
    parsed = hcom_columns(pl.DataFrame({"name": [name], "hccl_dtype": ["BFP16"], "count": [1000]})).row(0, named=True)
    assert (parsed["op"], parsed["kernel_op"], parsed["seq"], parsed["dtype"], parsed["bytes"]) == \
           (op, kernel_op, seq, "bfloat16", 2000)


def test_double_hash_matches_msprof_analyze() -> None:
    """communication_group.json: msprof-analyze's group_name is double_hash(group_id) for every communicator."""
    groups = json.loads((ASCEND / "metadata" / "communication_group_msprof_analyze.json").read_text())
    pairs = [(g["group_id"], int(g["group_name"])) for g in groups["comm_group_parallel_info"] if g["group_id"]]
    assert len(pairs) == 21 and all(double_hash(name) == value for name, value in pairs)


def test_metadata_groups_map_to_dimensions() -> None:
    """The 8-rank MindSpeed run's parallel_group_info under tp=2, pp=2, dp=2 (Megatron order tp-cp-ep-dp-pp)."""
    metadata = json.loads((ASCEND / "metadata" / "profiler_metadata_8rank_tp2_pp2_dp2.json").read_text())
    layout = layout_from_metadata([metadata])
    assert layout is not None and layout.spec == Layout.parse("tp=2,pp=2,dp=2").spec
    groups = group_dims(metadata_groups([metadata]), layout)
    assert groups.height == 21
    found = {(name, tuple(ranks)): dim for name, ranks, dim in groups.select("name", "ranks", "dim").rows()}
    single = {("tp", (0, 1)): "TP", ("dp", (0, 2)): "DP", ("pp", (0, 4)): "PP", ("pp_new_stream", (0, 4)): "PP",
              ("embd", (0, 4)): "PP", ("cp", (0,)): "CP", ("exp", (0,)): "EP", ("embd", (0,)): "PP"}
    combined = {("dp_cp", (0, 2)): "DP-CP", ("tp_cp", (0, 1)): "TP-CP", ("tp_exp", (0, 1)): "EP-TP",
                ("dp_modulo_exp", (0, 2)): "DP-EP", ("mp", (0, 1, 4, 5)): "TP-PP", ("mp_exp", (0, 1, 4, 5)): "TP-PP",
                ("tp_dp", (0, 1, 2, 3)): "TP-DP", ("tp_dp_cp", (0, 1, 2, 3)): "TP-DP"}  # cp=1: tp_dp_cp is tp x dp
    world = {("default_group", tuple(range(8))): "UNKNOWN"}  # every rank: no one dimension
    assert found == {**single, **combined, **world}


def test_old_pid_scheme_ingests() -> None:
    """Older torch_npu: Ascend Hardware pid 800, CANN pid*100+2, task type 'Other'. Compute = the file's own
    Overlap Analysis 'Computing' layer (274 intervals)."""
    path = ASCEND / "trace_view_1rank_old_pid_scheme.json"
    assert detect(path) == "ascend"
    data = ingest(path)
    events, process = trace_events(path)
    computing = [e for e in events if e["ph"] == "X" and process[e["pid"]] == "Overlap Analysis" and e["tid"] == 0]
    compute = data.table("device_events").filter(pl.col("category") == "compute")
    assert compute.height == len(computing) == 274
    assert (compute["end_ns"] - compute["start_ns"]).sum() == pytest.approx(
        sum(round(e["dur"] * 1000) for e in computing), abs=300)  # 274 durations each rounded to the ns
    assert data.table("collectives").is_empty() and data.table("steps")["step"].to_list() == [1]
    assert data.table("ranks")["pid"].to_list() == [437675]


def _copy_rank(source: Path, target: Path, *, drop_end_info: bool = False) -> Path:
    """A writable copy of a rank folder's data files (the shared ones are read-only; CSVs are not needed)."""
    for file in source.rglob("*"):
        if file.is_file() and file.suffix in (".json", ".db") and file.name != "communication_matrix.json":
            copy = target / file.relative_to(source)
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(file, copy)
    if drop_end_info:
        info = next(target.glob("profiler_info_*.json"))
        content = json.loads(info.read_text())
        content.pop("end_info")
        info.write_text(json.dumps(content))
    return target


def test_newest_folder_of_a_rank_wins(tmp_path: Path) -> None:
    cluster = tmp_path / "cluster"
    cluster.mkdir()
    (cluster / "old_ascend_pt").symlink_to(rank_folder("torch_npu_2rank_level0", 0))
    (cluster / "new_ascend_pt").symlink_to(rank_folder("torch_npu_2rank_level1", 0))
    (cluster / "rank1_ascend_pt").symlink_to(rank_folder("torch_npu_2rank_level1", 1))
    data = ingest(cluster)
    assert data.table("ranks").select("rank", "source").rows() == [
        (0, str(cluster / "new_ascend_pt")), (1, str(cluster / "rank1_ascend_pt"))]
    assert any("kept" in n and "old_ascend_pt" in n for n in data.notes)


def test_database_preferred_over_text(tmp_path: Path) -> None:
    folder = tmp_path / "r_ascend_pt"
    (folder / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    db_folder = rank_folder("torch_npu_2rank_level1_db", 0)
    shutil.copy(db_folder / "profiler_info_0.json", folder)
    (folder / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_0.db").symlink_to(
        db_folder / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_0.db")
    (folder / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").symlink_to(
        rank_folder("torch_npu_2rank_level1", 0) / "ASCEND_PROFILER_OUTPUT" / "trace_view.json")
    data = ingest(folder)
    assert "database schema 1.0.0" in (data.tool_version or "")
    expected = db_folder / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_0.db"
    assert [Path(s).resolve() for s in data.sources] == [expected.resolve()]  # ../shared may be a symlink


def test_msprof_slices_merge(tmp_path: Path, runs: dict[str, RunData]) -> None:
    """A raw msprof export cut into msprof_slice_{i}_{time}.json parts reads as the whole timeline (the parts are
    the real trace_view.json split in two, each with all metadata events, as msprof writes them)."""
    events, _ = trace_events(rank_folder("torch_npu_2rank_level1", 0) / "ASCEND_PROFILER_OUTPUT" / "trace_view.json")
    meta = [e for e in events if e["ph"] == "M"]
    data_events = [e for e in events if e["ph"] != "M"]
    half = len(data_events) // 2
    out = tmp_path / "PROF_000001_20250109074800000_ABC" / "mindstudio_profiler_output"
    out.mkdir(parents=True)
    for index, part in enumerate((data_events[:half], data_events[half:])):
        (out / f"msprof_slice_{index}_20250109074804.json").write_text(json.dumps(meta + part))
    merged = ingest(out.parent)
    whole = runs["torch_npu_2rank_level1"]
    columns = ["start_ns", "end_ns", "name", "category", "stream"]
    assert merged.table("device_events").select(columns).rows() == \
           whole.table("device_events").filter(pl.col("rank") == 0).select(columns).rows()


def test_msprof_database_ranked_by_rank_device_map(tmp_path: Path) -> None:
    """A raw msprof PROF_* folder with its msprof_{time}.db: no profiler_info, so the rank is RANK_DEVICE_MAP's."""
    prof = tmp_path / "PROF_000001_20250109081616000_XYZ"
    prof.mkdir()
    (prof / "msprof_20250109081616.db").symlink_to(
        rank_folder("torch_npu_2rank_level1_db", 1) / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_1.db")
    data = ingest(prof)
    assert data.table("ranks").select("rank", "device", "rank_source").rows() == [(1, 1, "RANK_DEVICE_MAP")]
    assert data.world_size == 2


def test_step_marker_option(runs: dict[str, RunData]) -> None:
    """--step-marker over the CPU ops gives the database run the same step as its STEP_TIME table."""
    marked = read_run([ASCEND / "torch_npu_2rank_level1_db"], "auto", IngestOptions(step_marker=r"^ProfilerStep#"))
    assert marked.table("steps").rows() == runs["torch_npu_2rank_level1_db"].table("steps").rows()


def test_layout_gives_group_dims(runs: dict[str, RunData]) -> None:
    data = ingest(ASCEND / "torch_npu_2rank_level1_db", layout="dp=2")
    assert data.table("process_groups")["dim"].to_list() == ["DP"]
    assert set(data.table("collectives")["dim"]) == {"DP"}


@pytest.mark.parametrize(("make", "expected"), [
    (lambda d: (d / "x_ascend_pt").mkdir(), "no ASCEND_PROFILER_OUTPUT"),
    (lambda d: _truncated_trace(d), "not a complete JSON array"),
    (lambda d: _database_version(d, "9.0.0"), "schema version 9.0.0 is not supported"),
    (lambda d: _database_version(d, None), "COMPUTE_TASK_INFO lacks"),
    (lambda d: [_copy_rank(rank_folder("torch_npu_2rank_level1", 0), d / f"{n}_ascend_pt", drop_end_info=True)
                for n in ("a", "b")], "rank 0 is also claimed by"),
    (lambda d: _kernel_details_renamed(d, "Duration(us)", "Duration"), "kernel_details.csv: lacks the column "
                                                                       "Duration(us)"),
    (lambda d: (d / "r_ascend_pt" / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True), "no profiler database"),
])
def test_bad_input_is_one_line(tmp_path: Path, make, expected: str) -> None:
    make(tmp_path)
    with pytest.raises(TraceanaError) as error:
        ingest(tmp_path)
    message = str(error.value)
    assert expected in message and "\n" not in message and str(tmp_path) in message


def _kernel_details_renamed(folder: Path, column: str, name: str) -> None:
    """A level-0 rank folder without trace_view.json whose kernel_details.csv names ``column`` otherwise."""
    output = folder / "r_ascend_pt" / "ASCEND_PROFILER_OUTPUT"
    output.mkdir(parents=True)
    text = (rank_folder("torch_npu_2rank_level0", 0) / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv").read_text()
    header, rest = text.split("\n", 1)
    (output / "kernel_details.csv").write_text(header.replace(column, name) + "\n" + rest)


def _truncated_trace(folder: Path) -> None:
    target = _copy_rank(rank_folder("torch_npu_2rank_level1", 0), folder / "r_ascend_pt")
    trace = target / "ASCEND_PROFILER_OUTPUT" / "trace_view.json"
    text = trace.read_bytes()
    trace.write_bytes(text[: len(text) // 2])


def _database_version(folder: Path, version: str | None) -> None:
    """The real database with its schema version changed, or (None) with COMPUTE_TASK_INFO's name column gone."""
    target = _copy_rank(rank_folder("torch_npu_2rank_level1_db", 0), folder / "r_ascend_pt")
    with closing(sqlite3.connect(target / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_0.db")) as con:
        if version:
            con.execute("UPDATE META_DATA SET value = ? WHERE name = 'SCHEMA_VERSION'", [version])
        else:
            con.execute("ALTER TABLE COMPUTE_TASK_INFO DROP COLUMN name")
        con.commit()


@pytest.mark.parametrize("run", ["torch_npu_2rank_level0", "torch_npu_2rank_level1"])
def test_memory_samples_equal_memory_record_csv(runs: dict[str, RunData], run: str) -> None:
    """The allocator (PTA) rows of memory_record.csv, read by the csv module: same count, times, peak."""
    memory = raw_clock(runs[run], runs[run].table("memory"), "ts_ns")
    for rank in (0, 1):
        path = rank_folder(run, rank) / "ASCEND_PROFILER_OUTPUT" / "memory_record.csv"
        with open(path, newline="") as handle:
            rows = [r for r in csv.DictReader(handle) if r["Component"] == "PTA"]
        mine = memory.filter(pl.col("rank") == rank).sort("ts_ns")
        assert mine["ts_ns"].to_list() == sorted(exact_ns(r["Timestamp(us)"].strip()) for r in rows)
        assert mine["allocated_bytes"].max() == round(max(float(r["Total Allocated(MB)"]) for r in rows) * 2**20)
        assert mine["reserved_bytes"].max() == round(max(float(r["Total Reserved(MB)"]) for r in rows) * 2**20)


def test_memory_samples_equal_the_database(runs: dict[str, RunData]) -> None:
    for rank in (0, 1):
        output = rank_folder("torch_npu_2rank_level1_db", rank) / "ASCEND_PROFILER_OUTPUT"
        db = output / f"ascend_pytorch_profiler_{rank}.db"
        with closing(read_only(db)) as con:
            expected = con.execute("SELECT count(*), max(totalAllocated), max(totalReserved) FROM MEMORY_RECORD m "
                                   "JOIN STRING_IDS s ON s.id = m.component WHERE s.value = 'PTA'").fetchone()
        mine = runs["torch_npu_2rank_level1_db"].table("memory").filter(pl.col("rank") == rank)
        assert (mine.height, mine["allocated_bytes"].max(), mine["reserved_bytes"].max()) == expected


NO_TRACE_VIEW = "gpt3_2rank_text_no_trace_view"


def communication_ops(run: str, rank: int) -> list[tuple[str, str, Decimal, Decimal]]:
    """(op name, group hash, start µs, elapse ms) of every op in the rank's communication.json, by the json module,
    the numbers exactly as written."""
    data = json.loads((rank_folder(run, rank) / "ASCEND_PROFILER_OUTPUT" / "communication.json").read_text(),
                      parse_float=Decimal)
    return [(key.split("@")[0], key.split("@")[1], info["Communication Time Info"]["Start Timestamp(us)"],
             info["Communication Time Info"]["Elapse Time(ms)"])
            for step in data.values() for kind in ("p2p", "collective") for key, info in step[kind].items()
            if "@" in key]


@pytest.mark.parametrize("rank", [0, 1])
def test_text_export_without_trace_view_ops_equal_communication_json(rank: int) -> None:
    """The GPT-3 export without trace_view.json: its HCCL ops are communication.json's, every one (28 per rank, 1 of
    them a send), each with its start (a µs float there) to the ns and its elapsed time, in the group it names."""
    data = ingest(ASCEND / NO_TRACE_VIEW)
    ops = raw_clock(data, data.table("collectives").filter(pl.col("rank") == rank)
                    .join(data.table("device_events"), on=["rank", "event_id"]).sort("start_ns"))
    expected = sorted(communication_ops(NO_TRACE_VIEW, rank), key=lambda op: op[2])
    assert ops.height == len(expected) == 28
    assert ops.select("name", "pg").rows() == [(name, group) for name, group, _, _ in expected]
    for (start, end), (_, _, start_us, elapse_ms) in zip(ops.select("start_ns", "end_ns").rows(), expected,
                                                         strict=True):
        assert start == start_us * 1000 and abs(end - start - elapse_ms * 10**6) <= Decimal("0.5")
    assert set(ops["op"]) == {"Broadcast", "AllReduce", "AllGather", "ReduceScatter", "Send"}
    assert data.table("steps").select("rank", "step").rows() == [(0, 2), (1, 2)]  # Step Id 2, communication.json step2


def test_text_export_without_trace_view_tasks_equal_kernel_details() -> None:
    """Its device tasks are kernel_details.csv's non-HCCL rows (read here by the csv module), each start to the ns
    and on its stream;
    rank 0's row 17 has a field too few (the file's maintainers cut it) and is left out with a note, as are the
    HCCL rows communication.json stands for, whose times disagree with it on rank 0 (by 2.8 µs to 1.12 ms)."""
    data = ingest(ASCEND / NO_TRACE_VIEW)
    for rank, short in ((0, 1), (1, 0)):
        with open(rank_folder(NO_TRACE_VIEW, rank) / "ASCEND_PROFILER_OUTPUT" / "kernel_details.csv",
                  newline="") as handle:
            header, *rows = list(csv.reader(handle))
        whole = [dict(zip(header, r, strict=True)) for r in rows if len(r) == len(header)]
        assert len(rows) - len(whole) == short
        tasks = sorted((r["Name"], exact_ns(r["Start Time(us)"].strip()), int(r["Stream ID"])) for r in whole
                       if r["Accelerator Core"] != "HCCL")
        events = raw_clock(data, data.table("device_events").filter(
            (pl.col("rank") == rank) & (pl.col("category") == "compute")))
        assert sorted(events.select("name", "start_ns", "stream").rows()) == tasks and len(tasks) == (16, 20)[rank]
    notes = [n.split("ASCEND_PROFILER_OUTPUT/")[-1] for n in data.notes]
    assert "kernel_details.csv: 1 rows left out, the CSV reader rejects them (line 17: Expected Number of " \
           "Columns: 32 Found: 31)" in notes
    assert "kernel_details.csv: its 4 HCCL rows left out, the ops are communication.json's (4 of those rows " \
           "missing there or > 1 µs off in start or end)" in notes
    assert any(n.startswith("2 of 2 ranks have no trace_view.json") and "no host side" in n for n in data.notes)
    assert data.table("annotations").is_empty() and data.table("syncs").is_empty()


MSPROF = ASCEND / "msprof_db_8npu"


def test_msprof_database_ingests_its_own_rows() -> None:
    """A CANN msprof export (msprof --export, not torch_npu): read from its folder, its empty COMMUNICATION_OP
    lacking dataType and count is no error. Second route: SQL over the file. Every TASK row is accounted for:
    11 compute tasks, 8 HCCL tasks of no op (annotations), 5 of no known kind and 1 task info without its TASK row
    counted in notes."""
    assert detect(MSPROF) == "ascend"
    data = ingest(MSPROF)
    with closing(read_only(MSPROF / "msprof_0.db")) as con:
        compute = con.execute("SELECT t.startNs, t.endNs, s.value FROM TASK t JOIN COMPUTE_TASK_INFO c "
                              "USING (globalTaskId) JOIN STRING_IDS s ON s.id = c.name ORDER BY 1, 2").fetchall()
        (ops,), (hccl_tasks,), (tasks,), (device,) = (con.execute(sql).fetchone() for sql in (
            "SELECT count(*) FROM COMMUNICATION_OP",
            "SELECT count(*) FROM COMMUNICATION_TASK_INFO JOIN TASK USING (globalTaskId)",
            "SELECT count(*) FROM TASK", "SELECT DISTINCT deviceId FROM TASK"))
    events = data.table("device_events")
    assert events.select("start_ns", "end_ns", "name").sort("start_ns", "end_ns").rows() == compute
    assert len(compute) == 11 and set(events["category"]) == {"compute"}
    assert ops == 0 and data.table("collectives").is_empty()
    assert data.table("annotations").filter(pl.col("kind") == "hccl_task").height == hccl_tasks == 8
    assert tasks == len(compute) + hccl_tasks + 5
    assert data.table("ranks").select("rank", "device", "rank_source").rows() == [(0, device, "device-order")]
    notes = [n.removeprefix(f"{MSPROF / 'msprof_0.db'}: ") for n in data.notes]
    assert "1 COMMUNICATION_TASK_INFO rows name no TASK row (a missing or cut-down table); they are left out" in notes
    assert any(n.startswith("8 HCCL tasks belong to no COMMUNICATION_OP row (the table holds 0)") for n in notes)
    assert any(n.startswith("5 TASK rows left out, neither compute") for n in notes)


def _without_columns(folder: Path, table: str, *columns: str) -> Path:
    """A copy of the real level-1 database with ``columns`` of ``table`` dropped (an older or newer schema)."""
    target = _copy_rank(rank_folder("torch_npu_2rank_level1_db", 0), folder / "r_ascend_pt")
    with closing(sqlite3.connect(target / "ASCEND_PROFILER_OUTPUT" / "ascend_pytorch_profiler_0.db")) as con:
        for column in columns:
            con.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
        con.commit()
    return target


def test_database_columns_a_version_lacks_are_unknown(tmp_path: Path, runs: dict[str, RunData]) -> None:
    """COMMUNICATION_OP without dataType and count (msprof's schema): the same ops at the same times, bytes unknown."""
    data = ingest(_without_columns(tmp_path, "COMMUNICATION_OP", "dataType", "count"))
    whole = runs["torch_npu_2rank_level1_db"]
    columns = ["name", "start_ns", "end_ns"]

    def ops(run: RunData, rank: int) -> list[tuple]:
        return raw_clock(run, run.table("collectives").filter(pl.col("rank") == rank).join(
            run.table("device_events"), on=["rank", "event_id"])).select(*columns, "op", "pg").sort("start_ns").rows()

    assert ops(data, 0) == ops(whole, 0) and len(ops(data, 0)) == 4
    assert data.table("collectives")["bytes"].null_count() == 4
    assert whole.table("collectives")["bytes"].null_count() == 0


def test_database_table_lacking_what_its_rows_need_is_refused(tmp_path: Path) -> None:
    with pytest.raises(TraceanaError, match=r"COMMUNICATION_OP lacks startNs$"):
        ingest(_without_columns(tmp_path, "COMMUNICATION_OP", "startNs"))


def test_metadata_groups_give_the_layout_distributed_args_states() -> None:
    """Issue 23 §2 on the 8-rank MindSpeed metadata: parallel_group_info alone (rank 0's tp [0, 1], dp [0, 2],
    pp [0, 4], one-rank cp and exp, tp_exp, dp_modulo_exp, dp_cp, tp_cp, mp) fits exactly one layout, the one its
    distributed_args records; a layout with pp before dp is refused, naming the dp group."""
    metadata = json.loads((ASCEND / "metadata" / "profiler_metadata_8rank_tp2_pp2_dp2.json").read_text())
    groups = metadata_groups([metadata]).with_columns(pl.lit("trace").alias("source"))
    stated = layout_from_metadata([metadata])
    fits = fitting_layouts(stated_roles(groups), 8)
    assert stated is not None and [f.spec for f in fits or []] == [stated.spec]
    assert settle_layout(groups, 8, None, None, "meta") == (
        fits[0], [f"layout {stated.spec} from the trace's own groups (dp, dp_cp, cp, mp, tp, pp, tp_cp, tp_exp, exp, "
                  "dp_modulo_exp)"])
    assert settle_layout(groups, 8, None, stated, "meta") == (stated, [])
    with pytest.raises(TraceanaError, match=r"^meta: --layout .*order=tp-cp-ep-pp-dp contradicts the trace: the "
                                            r"trace's group 'dp' \(ranks \[0, 2\]\) is not a DP group of it \(its DP "
                                            r"group of rank 0: \[0, 4\]\)"):
        settle_layout(groups, 8, Layout.parse("tp=2,pp=2,dp=2,order=tp-cp-ep-pp-dp"), None, "meta")
