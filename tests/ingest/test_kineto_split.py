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
    """(what load returns, every row of ev, which read _read chose), with the split allowed or not."""
    con = duckdb.connect(config={"threads": 1})
    con.execute(events.EVENT_TABLE)
    saved = events.os
    events.os = saved if split else types.SimpleNamespace()  # a platform without FIFOs
    try:
        chosen = events._read(con, file)[1]
        con.execute("DROP TABLE IF EXISTS kineto_file; DROP TABLE IF EXISTS kineto_events")
        loaded = events.load(con, file, 0)
    finally:
        events.os = saved
    return loaded, con.sql("SELECT * FROM ev ORDER BY ALL").fetchall(), chosen


@pytest.mark.parametrize("name", ["hta_rank3of8_6steps", "hta_rank0of2_pg_args", "tracelens_mi300_rank0of8_rccl"])
def test_the_array_through_the_pipe_equals_the_whole_document(name: str) -> None:
    """hta_rank0of2_pg_args writes the profiler's log lines (a list of strings) after its events."""
    file = KINETO / f"{name}.json.gz"
    piped, whole = _load(file, split=True), _load(file, split=False)
    assert piped[2] == "SELECT e FROM kineto_events" and whole[2].startswith("SELECT unnest(traceEvents)")
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
    assert first[2] == "SELECT e FROM kineto_events" and second[2].startswith("SELECT unnest(traceEvents)")
    assert first[:2] == second[:2] and first[0].device_names == ["NVIDIA H200"]


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
