"""The streaming ingest (issue 12): each Kineto file, nsys report and Ascend rank folder is read on its own and its
per-event tables wait as Parquet beside the store until the store write streams them in. The folder they wait in
goes away in every outcome, and what files validated apart report adds up to what the whole run validated at
once reports."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import polars as pl
import pytest

from tests.conftest import TRACES, run_main
from traceana import store
from traceana.errors import TraceanaError
from traceana.ingest.dispatch import IngestOptions, read_run
from traceana.ingest.parallel.executor import GZIP_RATIO, parse_bytes, worker_count
from traceana.ingest.parallel.spill import Spill, spill_part
from traceana.ingest.run_data import RunData
from traceana.ingest.validate import Dropped, check, validate

SAMPLED = sorted((TRACES / "kineto").glob("hta_sampled_rank*.json.gz"))


def spill_folders(folder: Path) -> list[Path]:
    return [p for p in folder.iterdir() if ".ingest-" in p.name]


def test_a_gpu_run_keeps_only_its_compact_tables_in_memory(tmp_path: Path) -> None:
    data = read_run(SAMPLED, "kineto", IngestOptions(spill_near=tmp_path / "s.duckdb"))
    assert data.spill is not None and not {"device_events", "annotations", "memory"} & set(data.frames)
    (folder,) = spill_folders(tmp_path)
    assert sorted(p.name for p in folder.iterdir()) == ["annotations", "device_events", "event_ops",
                                                          "event_scopes"]  # no memory
    assert len(list((folder / "device_events").iterdir())) == len(SAMPLED)  # one part per file
    # the cross-rank steps saw every collective's event, with the times the store gets
    events = data.table("device_events").join(data.table("collectives").select("rank", "event_id"),
                                              on=["rank", "event_id"], how="semi")
    assert events.select("rank", "event_id", "stream", "start_ns", "end_ns").sort("rank", "event_id").equals(
        data.comm_events.sort("rank", "event_id"))
    assert len(events) == len(data.table("collectives")) > 0
    data.discard()
    assert not folder.exists()


def test_the_spill_folder_goes_when_the_ingest_succeeds_or_fails(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    for path in SAMPLED:
        shutil.copy(path, traces)
    db = tmp_path / "store.duckdb"
    assert run_main("ingest", traces, "--db", db, "--jobs", "2")[0] == 0
    assert spill_folders(tmp_path) == []
    broken = traces / "rank9.json"
    broken.write_text('{"traceEvents": [{"ph": "X", "name": "k", "ts": 1, "dur": ')
    code, _, err = run_main("ingest", traces, "--db", tmp_path / "other.duckdb", "--jobs", "2")
    assert code != 0 and f"{broken}: not a readable Kineto trace" in err
    assert spill_folders(tmp_path) == [] and not (tmp_path / "other.duckdb").exists()


def test_the_spill_folder_goes_when_the_store_write_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[Path] = []

    def failing(con: object, run_id: str, data: RunData) -> None:
        assert data.spill is not None
        seen.append(data.spill.folder)
        raise TraceanaError("disk full (simulated)")

    monkeypatch.setattr(store, "write_run", failing)
    code, _, err = run_main("ingest", *SAMPLED, "--db", tmp_path / "s.duckdb")
    assert code != 0 and "disk full (simulated)" in err
    assert seen and not seen[0].exists() and spill_folders(tmp_path) == []


def test_a_part_cut_short_leaves_nothing_the_store_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Ray task killed while it writes a part (its node lost) runs again elsewhere under a new key; the half it
    wrote must not be a ``*.parquet`` of the spill, or the store's read of them all fails ("No magic bytes")."""

    class Killed(BaseException):
        pass

    def cut_short(frame: pl.DataFrame, path: Path, **_: object) -> None:
        Path(path).write_bytes(b"PAR1, then nothing")
        raise Killed

    monkeypatch.setattr(pl.DataFrame, "write_parquet", cut_short)
    spill = Spill(tmp_path / "spill")
    with pytest.raises(Killed):
        spill_part(spill.folder, "device_events", "key", pl.DataFrame({"rank": [0], "name": ["k"]}))
    assert spill.glob("device_events") is None


def test_files_validated_apart_add_up_to_the_whole_runs_notes() -> None:
    """Rank 0 has an event without a name, rank 1 one that ends before it starts and a repeated step: validated
    whole, one note per table naming both reasons; validated per rank and summed, the same notes."""
    events = pl.DataFrame({"rank": [0, 0, 1, 1], "event_id": [0, 1, 0, 1], "start_ns": [10, 20, 10, 30],
                           "end_ns": [15, 25, 15, 20], "name": [None, "k", "k", "k"], "category": ["compute"] * 4})
    steps = pl.DataFrame({"rank": [0, 1, 1], "step": [1, 1, 1], "start_ns": [0, 0, 5], "end_ns": [40, 40, 40]})

    def run(ranks: list[int]) -> RunData:
        return RunData("kineto", ["hand"], 2, frames={
            "ranks": pl.DataFrame({"rank": ranks, "source": ["hand"] * len(ranks)}),
            "device_events": events.filter(pl.col("rank").is_in(ranks)),
            "steps": steps.filter(pl.col("rank").is_in(ranks))})

    whole = validate(run([0, 1])).notes
    assert whole == ["2 device events rows left out (no name, end before start)",
                     "1 steps rows repeat a rank/step of another; the first is kept"]
    parts = check(run([1])) + check(run([0]))
    assert isinstance(parts, Dropped) and parts.notes() == whole


def test_an_nsys_report_of_several_ranks_spills_one_part_per_rank(tmp_path: Path) -> None:
    """One report holding two processes (ranks): each rank's rows are their own part, mapped to the rank the run
    decided. Per process, the export has 1,721 kernels, 452 memcpys and 11 memsets (SQLite: count(*) GROUP BY
    globalPid >> 24, deviceId of the three CUPTI tables): 2,184 device events on each rank."""
    report = TRACES / "nsys" / "nsysai_h100_2proc_nsys2026.2.sqlite"
    data = read_run([report], "nsys", IngestOptions(spill_near=tmp_path / "s.duckdb"))
    assert data.spill is not None and not {"device_events", "annotations"} & set(data.frames)
    (folder,) = spill_folders(tmp_path)
    assert len(list((folder / "device_events").iterdir())) == data.world_size == 2
    assert sorted(data.spill.parts["rank"].to_list()) == [0, 1]
    per_rank = data.table("device_events").group_by("rank").len().sort("rank")
    assert per_rank.rows() == [(0, 2184), (1, 2184)]
    data.discard()
    assert not folder.exists()


def test_a_broken_nsys_report_leaves_no_spill_and_no_store(tmp_path: Path) -> None:
    reports = tmp_path / "reports"
    reports.mkdir()
    for path in (TRACES / "nsys").glob("nsysai_h100*.sqlite"):
        shutil.copy(path, reports / "rank0.sqlite")
    broken = reports / "rank1.sqlite"
    broken.write_bytes(b"SQLite format 3\x00" + b"\x00" * 100)
    code, _, err = run_main("ingest", reports, "--db", tmp_path / "s.duckdb", "--jobs", "2")
    assert code != 0 and len(err.strip().splitlines()) == 1 and str(broken) in err
    assert spill_folders(tmp_path) == [] and not (tmp_path / "s.duckdb").exists()


ASCEND_DB = TRACES / "ascend" / "torch_npu_2rank_level1_db"


def test_an_ascend_run_spills_one_part_per_rank_folder(tmp_path: Path) -> None:
    """Each rank folder's rows are their own part, mapped to the rank its profiler_info names. Per rank, the
    database has 16 EVENT_RECORD + 10 EVENT_WAIT tasks (sync), 24 MEMCPY_ASYNC + 2 PROFILING_* tasks (other) and 4
    COMMUNICATION_OP rows (SQLite: count(*) of TASK GROUP BY STRING_IDS.value of taskType; of COMMUNICATION_OP)."""
    data = read_run([ASCEND_DB], "ascend", IngestOptions(spill_near=tmp_path / "s.duckdb", jobs=2))
    assert data.spill is not None and not {"device_events", "annotations", "memory"} & set(data.frames)
    (folder,) = spill_folders(tmp_path)
    assert len(list((folder / "device_events").iterdir())) == data.world_size == 2
    assert sorted(data.spill.parts["rank"].to_list()) == [0, 1]
    counts = data.table("device_events").filter(pl.col("category") != "compute").group_by("rank", "category").len()
    assert sorted(counts.rows()) == [(r, c, n) for r in (0, 1) for c, n in (("comm", 4), ("other", 26), ("sync", 26))]
    assert data.table("collectives").group_by("rank").len().sort("rank").rows() == [(0, 4), (1, 4)]
    data.discard()
    assert not folder.exists()


def test_a_broken_ascend_rank_folder_leaves_no_spill_and_no_store(tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(ASCEND_DB, run)
    (broken,) = run.glob("rank1_ascend_pt/ASCEND_PROFILER_OUTPUT/ascend_pytorch_profiler_1.db")
    broken.write_bytes(b"SQLite format 3\x00" + b"\x00" * 100)
    code, _, err = run_main("ingest", run, "--db", tmp_path / "s.duckdb", "--jobs", "2")
    assert code != 0 and len(err.strip().splitlines()) == 1 and "ascend_pytorch_profiler_1.db" in err
    assert spill_folders(tmp_path) == [] and not (tmp_path / "s.duckdb").exists()


def test_the_no_launch_records_note_names_the_file_s_rank_not_its_position(tmp_path: Path) -> None:
    # hta_rank3of8 (distributedInfo rank 3, one file) without its runtime calls: its kernels have no launch record,
    # so its steps are the ProfilerStep CPU ranges, and the note must name rank 3 (the worker only knows "this file")
    with gzip.open(TRACES / "kineto" / "hta_rank3of8_6steps.json.gz") as raw:
        trace = json.load(raw)
    trace["traceEvents"] = [e for e in trace["traceEvents"] if e.get("cat") not in ("cuda_runtime", "cuda_driver")]
    path = tmp_path / "rank3.json"
    path.write_text(json.dumps(trace))
    data = read_run([path], "kineto", IngestOptions(spill_near=tmp_path / "s.duckdb"))
    assert data.table("ranks")["rank"].to_list() == [3]
    assert "no launch records on rank(s) 3: steps there are the step markers' CPU ranges" in data.notes
    data.discard()


def test_the_default_worker_count_weighs_a_gzipped_file_by_what_it_holds(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 37: two gzipped copies of a real 35 MB trace are 3.5 MB on disk but 70 MB to parse, which pays for
    workers (one a file); one copy is read in-process."""
    source = TRACES / "kineto" / "hta_rank3of8_6steps.json.gz"
    copies = [tmp_path / f"rank{rank}.json.gz" for rank in range(2)]
    for copy in copies:
        shutil.copyfile(source, copy)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    assert parse_bytes(copies[0]) == len(gzip.decompress(source.read_bytes()))
    assert worker_count(None, copies) == 2
    assert worker_count(None, copies[:1]) == 1
    # two gzip members: the trailer states only the last one's size, below the file's own, so the size is estimated
    joined = tmp_path / "joined.json.gz"
    joined.write_bytes(source.read_bytes() + gzip.compress(b"{}"))
    assert parse_bytes(joined) == joined.stat().st_size * GZIP_RATIO
