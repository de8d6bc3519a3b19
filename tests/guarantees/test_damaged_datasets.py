"""A damaged Parquet dataset is one line, never a breakdown: a rank's partition, a table folder or a file gone read
as ranks 100% IDLE (exit 0), and a NULL end time, a column of another type or a partition value that is not a number
were internal errors or silently wrong."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest

from tests.conftest import TRACES, run_main

ASCEND = TRACES / "ascend" / "torch_npu_2rank_level0"
RUN = "torch_npu_2rank_level0"


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ds") / "runs.parquet"
    assert run_main("ingest", ASCEND, "--db", path)[0] == 0
    return path


@pytest.fixture
def copy(dataset: Path, tmp_path: Path) -> Path:
    target = tmp_path / "runs.parquet"
    shutil.copytree(dataset, target)
    return target


def one_line(copy: Path) -> str:
    code, _, err = run_main("breakdown", "--db", copy)
    lines = err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err)
    return lines[0]


def rewrite(file: Path, select: str) -> None:
    """``file`` written anew from ``SELECT <select> FROM file``, as a foreign or damaged writer would."""
    with duckdb.connect() as con:
        con.execute(f"COPY (SELECT {select} FROM '{file}') TO '{file}.new' (FORMAT parquet)")
    Path(f"{file}.new").replace(file)


def test_the_undamaged_dataset_gives_both_ranks_their_device_time(dataset) -> None:
    code, out, err = run_main("breakdown", "--db", dataset, "--json")
    assert code == 0, err
    assert '"rank": 1' in out


def test_a_missing_rank_partition_is_one_line(copy) -> None:
    shutil.rmtree(copy / "device_events" / f"run_id={RUN}" / "rank=1")
    line = one_line(copy)
    assert line.startswith(f"error: {copy}: damaged dataset: device_events of run {RUN} rank 1 has 0 rows in its "
                           "files, the write left ")


def test_a_missing_table_folder_is_one_line(copy) -> None:
    shutil.rmtree(copy / "device_events")
    assert "damaged dataset: device_events of run" in one_line(copy)


def test_a_null_where_the_schema_says_not_null_is_one_line(copy) -> None:
    file = next((copy / "device_events" / f"run_id={RUN}" / "rank=0").glob("*.parquet"))
    rewrite(file, "* REPLACE (CASE WHEN event_id % 3 = 0 THEN NULL ELSE end_ns END AS end_ns)")
    assert one_line(copy) == (f"error: {file}: NULL end_ns values, which no device_events row may have (a damaged "
                              "or foreign file); restore the dataset or ingest the run again")


def test_a_column_of_another_type_is_one_line(copy) -> None:
    file = next((copy / "device_events" / f"run_id={RUN}" / "rank=0").glob("*.parquet"))
    rewrite(file, "* REPLACE (name || 'x' AS end_ns)")
    assert one_line(copy).startswith(f"error: {copy}: cannot read the dataset (Conversion Error: ")


def test_a_partition_value_that_is_not_a_number_is_one_line(copy) -> None:
    (copy / "steps" / f"run_id={RUN}" / "rank=1").rename(copy / "steps" / f"run_id={RUN}" / "rank=one")
    assert "damaged dataset: steps of run" in one_line(copy)
    shutil.rmtree(copy / "_rows")  # a dataset written before the row counts: the cast still fails in one line
    assert one_line(copy).startswith(f"error: {copy}: cannot read the dataset (Conversion Error: ")


def test_files_written_before_a_column_existed_read_it_as_null(copy) -> None:
    """Not damage: a dataset written by a version without device_events.launch_thread still reads, that column NULL
    and the Hive columns (run_id, rank) from the folders."""
    files = sorted((copy / "device_events").rglob("*.parquet"))
    for file in files:
        rewrite(file, "* EXCLUDE (launch_thread)")
    code, out, err = run_main("sql", "SELECT count(*) FILTER (WHERE launch_thread IS NOT NULL) AS threads, "
                              "count(DISTINCT rank) AS ranks, count(DISTINCT run_id) AS runs FROM device_events",
                              "--db", copy, "--format", "json")
    assert code == 0, err
    assert '"threads": 0' in out and '"ranks": 2' in out and '"runs": 1' in out
    assert run_main("breakdown", "--db", copy)[0] == 0


def test_reingesting_and_exporting_keep_the_counts_right(dataset, tmp_path) -> None:
    """The row counts follow the runs through a replacing ingest, a second run and export/import."""
    db = tmp_path / "runs.parquet"
    shutil.copytree(dataset, db)
    for _ in range(2):
        assert run_main("ingest", ASCEND, "--db", db)[0] == 0
    assert run_main("ingest", TRACES / "kineto" / "hta_rank0of2_pg_args.json.gz", "--db", db)[0] == 0
    assert run_main("breakdown", "--db", db, RUN)[0] == 0
    store = tmp_path / "s.duckdb"
    assert run_main("import-parquet", db, "--db", store)[0] == 0
    assert run_main("export", "--db", store, "--parquet", tmp_path / "out")[0] == 0
    assert run_main("breakdown", "--db", tmp_path / "out", RUN)[0] == 0
