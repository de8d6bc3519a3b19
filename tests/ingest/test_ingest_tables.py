"""Every table of every shared trace and bundled sample equals what the single-process ingest gave before the
streaming, parallel reader (issue 12): a digest per table, recorded from that path, guards the faster readers.

Regenerate (only when a change to the numbers is intended and explained):
    .venv/bin/python -m tests.ingest.test_ingest_tables --write
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

import duckdb
import polars as pl
import pytest

from tests.conftest import ROOT, SAMPLES, TRACES, params, run_cli
from traceana.errors import TraceanaError
from traceana.ingest.dispatch import IngestOptions, read_run
from traceana.ingest.run_data import RunData

DIGESTS = ROOT / "tests" / "data" / "ingest_digests.json"
CACHE = Path(tempfile.gettempdir()) / "traceana-test-cache"  # where .nsys-rep exports go (named in the notes)
TABLES = ("ranks", "process_groups", "device_events", "collectives", "steps", "memory", "annotations", "syncs")

_KINETO = TRACES / "kineto"
# name -> the paths of one run (relative to the shared traces or the samples)
RUNS: dict[str, list[Path]] = {
    **{p.name: [p] for p in sorted(_KINETO.glob("*.json.gz")) if "sampled" not in p.name},
    "hta_sampled_2of128": sorted(_KINETO.glob("hta_sampled_rank*.json.gz")),
    **{p.name: [p] for p in sorted((TRACES / "nsys").glob("*.sqlite"))},
    **{p.name: [p] for p in sorted((TRACES / "ascend").glob("torch_npu_*"))},
    **{name: [TRACES / "ascend" / name] for name in ("gpt3_2rank_text_no_trace_view", "msprof_db_8npu")},
    "trace_view_1rank_old_pid_scheme": [TRACES / "ascend" / "trace_view_1rank_old_pid_scheme.json"],
    **{f"samples/{p.name}": [p] for p in sorted(SAMPLES.iterdir()) if p.is_dir()},
    "samples/nsys": sorted((SAMPLES.parent / "nsys").glob("*.nsys-rep")),  # exported by nsys into the cache
}


def digests(data: RunData) -> dict[str, list]:
    """The run's own fields, and per table: [rows, md5 of its rows as text, sorted]; columns in the store's order
    (RunData.table), the ranks' source files by name (the checkout's path is not the trace's content)."""
    con = duckdb.connect()
    notes = [re.sub(r"exported with nsys to \S+", "exported with nsys", n).replace(str(TRACES), "TRACES")
             for n in data.notes]  # path-free
    out: dict[str, list] = {"run": [data.source_format, data.world_size, data.tool_version, data.rank_source, notes]}
    for name in TABLES:
        table = data.table(name)
        if name == "ranks":
            table = table.with_columns(pl.col("source").str.split("/").list.last())
        con.register("t", table.to_arrow())
        rows, digest = con.execute(
            "SELECT count(*), md5(coalesce(string_agg(CAST(t AS VARCHAR), chr(10) ORDER BY CAST(t AS VARCHAR)), '')) "
            "FROM t").fetchall()[0]
        out[name] = [rows, digest]
        con.unregister("t")
    return out


def _ingest(name: str, **options: object) -> RunData:
    return read_run(RUNS[name], "auto", IngestOptions(cache_dir=CACHE, **options))


@pytest.mark.parametrize("name", params(sorted(RUNS), {"samples/nsys"}))
def test_tables_equal_the_recorded_path(name: str) -> None:
    expected = json.loads(DIGESTS.read_text())[name]
    assert digests(_ingest(name)) == expected


@pytest.mark.parametrize("name", params(["hta_sampled_2of128", "samples/toy8_tp2pp2dp2_1f1b", "samples/nsys"],
                                        {"samples/nsys"}))
def test_files_parsed_in_worker_processes_give_the_same_tables(name: str) -> None:
    expected = json.loads(DIGESTS.read_text())[name]
    assert digests(_ingest(name, jobs=2)) == expected


def test_a_worker_failing_on_one_file_names_it_and_writes_nothing(tmp_path: Path) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    for rank in (0, 1, 2):
        shutil.copy(SAMPLES / "moe_balanced" / f"rank{rank}.json.gz", traces)
    broken = traces / "rank3.json"
    broken.write_text('{"traceEvents": [{"ph": "X", "name": "k", "ts": 1, "dur": ')  # cut off mid-write
    for jobs in (1, 2):
        with pytest.raises(TraceanaError, match=rf"^{broken}: not a readable Kineto trace"):
            read_run([traces], "kineto", IngestOptions(jobs=jobs))
    db = tmp_path / "store.duckdb"
    result = run_cli("ingest", traces, "--db", db, "--jobs", "2", check=False)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{broken}: not a readable Kineto trace" in lines[0]
    assert not db.exists()


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    DIGESTS.write_text("{\n" + ",\n".join(
        f" {json.dumps(name)}: {json.dumps(digests(_ingest(name)))}" for name in sorted(RUNS)) + "\n}\n")
