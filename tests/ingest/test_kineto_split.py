"""A Kineto file's traceEvents array streamed to DuckDB through a FIFO (ingest/kineto/split.py) gives the rows and
metadata the whole document read as one value gives; a layout the split cannot take falls back to that read."""

from __future__ import annotations

import gzip
import json
import types
from pathlib import Path

import duckdb
import pytest

from tests.conftest import TRACES
from traceana.ingest.kineto import events
from traceana.ingest.kineto.split import events_pipe

KINETO = TRACES / "kineto"


def _load(file: Path, split: bool) -> tuple[events.Loaded, list[tuple], str]:
    """(what load returns, every row of ev, how it read the events: "streamed", or "whole" where it read the
    document whole), with the split allowed or not."""
    con = duckdb.connect(config={"threads": 1})
    con.execute(events.EVENT_TABLE)
    saved, whole = events.os, events._whole
    read: list[str] = []

    def spy(*args: object) -> tuple[list[tuple], str]:
        read.append("whole")
        return whole(*args)

    events.os, events._whole = saved if split else types.SimpleNamespace(), spy  # no FIFOs: a platform without
    try:
        loaded = events.load(con, file, 0)
    finally:
        events.os, events._whole = saved, whole
    return loaded, con.sql("SELECT * FROM ev ORDER BY ALL").fetchall(), read[0] if read else "streamed"


@pytest.mark.parametrize("name", ["hta_rank3of8_6steps", "hta_rank0of2_pg_args", "tracelens_mi300_rank0of8_rccl"])
def test_the_array_through_the_pipe_equals_the_whole_document(name: str) -> None:
    """hta_rank0of2_pg_args writes the profiler's log lines (a list of strings) after its events."""
    file = KINETO / f"{name}.json.gz"
    piped, whole = _load(file, split=True), _load(file, split=False)
    assert piped[2] == "streamed" and whole[2] == "whole"
    assert len(piped[1]) > 1000 and piped[:2] == whole[:2]


def test_a_list_of_objects_after_the_events_is_read_whole(tmp_path: Path) -> None:
    """deviceProperties moved after traceEvents: its closing bracket looks like the events' end to the split, so
    DuckDB refuses the piped bytes and the document is read whole, with the same rows and metadata as before."""
    trace = json.loads(gzip.decompress((KINETO / "h200_gpt_h2048_L8_s1024_gb4.json.gz").read_bytes()))
    assert trace["deviceProperties"]
    moved = {k: v for k, v in trace.items() if k != "deviceProperties"} | {"deviceProperties":
                                                                            trace["deviceProperties"]}
    original, reordered = tmp_path / "original.json", tmp_path / "reordered.json"
    original.write_text(json.dumps(trace))
    reordered.write_text(json.dumps(moved))
    assert reordered.read_bytes().rstrip().endswith(b"}]}")
    first, second = _load(original, split=True), _load(reordered, split=True)
    assert first[2] == "streamed" and second[2] == "whole"
    assert first[:2] == second[:2] and first[0].device_names == ["NVIDIA H200"]


def test_a_time_out_of_range_without_its_base_is_read_again_whole(tmp_path: Path) -> None:
    """Streamed events get baseTimeNanoseconds added once the document around them is read; an event whose time no
    BIGINT holds before that (ts -9.3e15 us, brought back into range by a base of 2^62 ns) cannot be shifted, so
    the file is read again whole: the same rows as the whole read, the event's time kept."""
    trace = json.loads(gzip.decompress((KINETO / "h200_gpt_h2048_L8_s1024_gb4.json.gz").read_bytes()))
    first = next(e for e in trace["traceEvents"] if e.get("cat") == "kernel")
    trace["baseTimeNanoseconds"] = 2**62
    trace["traceEvents"].append(first | {"ts": -9_300_000_000_000_000, "dur": 1})
    file = tmp_path / "far.json"
    file.write_text(json.dumps(trace))
    piped, whole = _load(file, split=True), _load(file, split=False)
    assert piped[2] == whole[2] == "whole" and piped[:2] == whole[:2]
    assert 2**62 - 9_300_000_000_000_000_000 in {row[6] for row in piped[1]}  # start_ns


def test_a_file_without_an_events_array_releases_the_pipe(tmp_path: Path) -> None:
    """The writer finds no array and DuckDB reads an empty pipe: nothing hangs, and the document read names the
    problem as before."""
    file = tmp_path / "t.json"
    file.write_text('{"schemaVersion": 1, "traceEvents": 7}')
    with events_pipe(file) as pipe:
        rows = duckdb.sql(f"SELECT count(*) FROM read_json('{pipe.path}', format='array', records=true, "
                          "compression='none', columns={'ph': 'VARCHAR'})").fetchall()
        with pytest.raises(Exception, match="no traceEvents array"):
            pipe.document()
    assert rows == [(0,)]
