"""`export --parquet` / `import-parquet`: every table of a store with real runs of each format and an estimate comes
back equal (rows, as a multiset, and column types); both directions are all or nothing."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest

from tests.conftest import ROOT, TRACES, run_cli
from traceana import store
from traceana.errors import TraceanaError
from traceana.store import dataset

INPUTS = {
    "kineto pg args": TRACES / "kineto" / "hta_rank0of2_pg_args.json.gz",
    "nsys": TRACES / "nsys" / "pipit_cloverleaf_4gpu_nsys2024.5.sqlite",
    "ascend/db": TRACES / "ascend" / "torch_npu_2rank_level1_db",
}


@pytest.fixture(scope="module")
def source_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("pq") / "source.duckdb"
    for run_id, path in INPUTS.items():
        run_cli("ingest", path, "--db", db, "--run-id", run_id)
    run_cli("estimate", ROOT / "examples" / "synth_gpt_tp2pp2.yaml", "--db", db)
    return db


def tables(db: Path) -> dict[str, list[tuple]]:
    """table -> its columns with types."""
    with duckdb.connect(str(db), read_only=True) as con:
        names = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() ORDER BY table_name").fetchall()]
        return {n: con.execute(f'SELECT column_name, column_type FROM (DESCRIBE "{n}")').fetchall() for n in names}


def differences(a: Path, b: Path) -> dict[str, tuple[int, int, int]]:
    """table -> (rows in a, rows only in a, rows only in b), multisets."""
    with duckdb.connect() as con:
        con.execute(f"ATTACH '{a}' AS a (READ_ONLY)")
        con.execute(f"ATTACH '{b}' AS b (READ_ONLY)")
        out = {}
        for name in tables(a):
            count = con.execute(f'SELECT count(*) FROM a."{name}"').fetchall()[0][0]
            only_a = con.execute(f'SELECT count(*) FROM (FROM a."{name}" EXCEPT ALL FROM b."{name}")').fetchall()[0][0]
            only_b = con.execute(f'SELECT count(*) FROM (FROM b."{name}" EXCEPT ALL FROM a."{name}")').fetchall()[0][0]
            out[name] = (count, only_a, only_b)
        return out


def test_every_table_round_trips(source_db: Path, tmp_path: Path) -> None:
    dataset, copy = tmp_path / "dataset", tmp_path / "copy.duckdb"
    run_cli("export", "--parquet", dataset, "--db", source_db)
    run_cli("import-parquet", dataset, "--db", copy)
    assert tables(copy) == tables(source_db)
    diff = differences(source_db, copy)
    assert {n for n, (count, _, _) in diff.items() if count} >= {"runs", "ranks", "device_events", "collectives",
                                                                 "process_groups", "steps", "annotations", "memory",
                                                                 "syncs", "estimate_runs", "estimate_stages"}
    assert all(only_a == only_b == 0 for _, only_a, only_b in diff.values()), diff
    # partitioned by run and rank, readable without traceana (the run id is URL-encoded in the path)
    assert (dataset / "device_events" / "run_id=kineto%20pg%20args" / "rank=0").is_dir()
    # importing again replaces the runs it holds: nothing doubles
    run_cli("import-parquet", dataset, "--db", copy)
    assert all(only_a == only_b == 0 for _, only_a, only_b in differences(source_db, copy).values())


def test_export_is_all_or_nothing(source_db: Path, tmp_path: Path) -> None:
    target = tmp_path / "dataset"
    with store.connect(source_db, read_only=True) as con:
        dataset.export(con, target)
        before = sorted(p.relative_to(target) for p in target.rglob("*"))

        def fail_midway(table: str) -> None:
            if table == "device_events":
                raise KeyboardInterrupt

        with pytest.raises(TraceanaError, match="already exists"):
            dataset.export(con, target)
        with pytest.raises(KeyboardInterrupt):
            dataset.export(con, target, replace=True, progress=fail_midway)
        with pytest.raises(KeyboardInterrupt):
            dataset.export(con, tmp_path / "fresh", progress=fail_midway)
    assert sorted(p.relative_to(target) for p in target.rglob("*")) == before  # the old dataset is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset"]  # no partial folder, no new dataset


def test_a_broken_dataset_leaves_the_store_untouched(source_db: Path, tmp_path: Path) -> None:
    dataset, db = tmp_path / "dataset", tmp_path / "copy.duckdb"
    run_cli("export", "--parquet", dataset, "--db", source_db)
    shutil.copy(source_db, db)
    victim = next((dataset / "steps").rglob("*.parquet"))
    victim.write_bytes(victim.read_bytes()[:100])
    result = run_cli("import-parquet", dataset, "--db", db, check=False)
    assert result.returncode == 2 and result.stderr.startswith(f"error: {dataset}: cannot import")
    assert len(result.stderr.strip().splitlines()) == 1
    assert all(only_a == only_b == 0 for _, only_a, only_b in differences(source_db, db).values())
    result = run_cli("import-parquet", tmp_path, "--db", db, check=False)
    assert result.returncode == 2 and "not a traceana Parquet dataset" in result.stderr


def test_replace_overwrites_only_a_dataset(source_db: Path, tmp_path: Path) -> None:
    """--replace takes the place of a traceana dataset (or an empty folder), never of the user's file or folder,
    even one holding a schema.sql of its own."""
    precious = tmp_path / "precious.txt"
    precious.write_text("the user's\n")
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "precious.txt").write_text("the user's\n")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "schema.sql").write_text("CREATE TABLE accounts(id INTEGER);\n")
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    for target in (precious, folder, foreign):
        result = run_cli("export", "--parquet", target, "--replace", "--db", source_db, check=False)
        assert result.returncode == 2 and result.stderr.startswith(f"error: {target}: not a traceana Parquet dataset")
        assert len(result.stderr.strip().splitlines()) == 1
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    (tmp_path / "empty").mkdir()
    run_cli("export", "--parquet", tmp_path / "empty", "--replace", "--db", source_db)
    assert dataset.is_marked(tmp_path / "empty")
    run_cli("export", "--parquet", tmp_path / "empty", "--replace", "--db", source_db)  # a dataset: replaced
