"""A Parquet dataset as the store (`--db DIR`): ingest adds a run to it all or nothing, and every command reads it
with the output it gives from a .duckdb store holding the same runs."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest

from tests.conftest import ROOT, SAMPLES, TRACES, run_main, store_rows
from traceana.store import dataset

TOY8 = SAMPLES / "toy8_tp2pp2dp2_1f1b"
PG = TRACES / "kineto" / "hta_rank0of2_pg_args.json.gz"
NSYS = TRACES / "nsys" / "nsysai_h100_2proc_nsys2026.2.sqlite"
TOY8_CONFIG = ROOT / "sample_traces" / "configs" / "toy8_tp2pp2dp2_1f1b.yaml"
INGESTS = (("toy8", [TOY8, "--layout", "tp=2,pp=2,dp=2"]), ("pg", [PG]), ("nsys", [NSYS]))


def files(folder: Path) -> dict[str, str]:
    """Every file under ``folder`` (hidden siblings included) with its content hash."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def ok(*args: object) -> str:
    code, out, err = run_main(*args)
    assert code == 0, (args, err)
    return out


def one_error(*args: object) -> str:
    code, _, err = run_main(*args)
    lines = err.strip().splitlines()
    assert code != 0 and len(lines) == 1 and lines[0].startswith("error: "), (args, code, err)
    return lines[0]


@pytest.fixture(scope="module")
def stores(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The same three runs (Kineto CPU with a layout, Kineto GPU, nsys) and one estimate, in a .duckdb store and in
    a dataset created by naming it *.parquet."""
    folder = tmp_path_factory.mktemp("stores")
    db, dataset = folder / "s.duckdb", folder / "s.parquet"
    for target in (db, dataset):
        for run_id, args in INGESTS:
            ok("ingest", *args, "--db", target, "--run-id", run_id)
        ok("estimate", TOY8_CONFIG, "--db", target)
    return db, dataset


def test_every_table_equals_the_duckdb_stores(stores: tuple[Path, Path]) -> None:
    db, dataset = stores
    assert dataset.is_dir() and (dataset / "schema.sql").is_file()
    assert (dataset / "device_events" / "run_id=toy8" / "rank=7").is_dir()  # the layout `export --parquet` writes
    expected = store_rows(db)
    assert {t: len(rows) - 1 for t, rows in expected.items() if t in ("runs", "ranks")} == {"runs": 3, "ranks": 11}
    assert store_rows(dataset) == expected


@pytest.mark.parametrize("args", [
    ["info", "toy8", "--json"], ["breakdown", "toy8", "--by", "stage", "--json"], ["breakdown", "nsys", "--json"],
    ["stragglers", "toy8", "--json"], ["critical-path", "toy8", "--json"], ["comm", "pg", "--json"],
    ["kernels", "nsys", "--json"], ["idle", "pg", "--json"], ["memory", "toy8", "--json"], ["diff", "toy8", "pg"],
    ["sql", "--run", "pg", "--format", "json", "SELECT count(*), sum(end_ns - start_ns) AS busy FROM device_events"],
    ["sql", "--format", "json", "SELECT estimate_id, count(*) AS stages FROM estimate_stages GROUP BY ALL"],
    ["compare", "--estimate", TOY8_CONFIG, "toy8", "--json"],
], ids=lambda args: " ".join(map(str, args[:2])))
def test_commands_read_a_dataset_as_they_read_a_store(stores: tuple[Path, Path], args: list) -> None:
    db, dataset = stores
    assert ok(*args, "--db", dataset).replace(str(dataset), "DB") == ok(*args, "--db", db).replace(str(db), "DB")


def test_runs_lists_the_datasets_runs(stores: tuple[Path, Path]) -> None:
    runs = json.loads(ok("runs", "--db", stores[1], "--json"))
    assert sorted((r["run_id"], r["world_size"]) for r in runs) == [("nsys", 2), ("pg", 2), ("toy8", 8)]


def test_a_session_moves_between_runs_as_fresh_reads_do(stores: tuple[Path, Path]) -> None:
    """One connection (a report's session) reading a run, every run, then another: the views a run held the rows
    of (its step windows, advise's measured breakdown) compute again for the next. On a dataset, whose views are
    all temporary, moving on dropped step_windows for good (`report` was an internal error); on either store the
    next run read the last one's breakdown rows."""
    import traceana

    for target in stores:
        traces = traceana.open(target)
        fresh = {run: traces.breakdown(run=run) for run in ("toy8", "pg")}
        with traces.session():
            traces.advise(run="pg")
            toy8, _, pg = traces.breakdown(run="toy8"), traces.runs(), traces.breakdown(run="pg")
        assert toy8.equals(fresh["toy8"]) and pg.equals(fresh["pg"]) and toy8.height and pg.height, target


def test_report_reads_a_dataset(stores: tuple[Path, Path], tmp_path: Path) -> None:
    pytest.importorskip("bokeh")
    assert "wrote" in ok("report", "toy8", "--db", stores[1], "--html", tmp_path / "toy8.html")


def test_reingest_replaces_a_run_and_keeps_the_others(stores: tuple[Path, Path], tmp_path: Path) -> None:
    dataset = tmp_path / "d"
    shutil.copytree(stores[1], dataset)
    ok("ingest", PG, "--db", dataset, "--run-id", "toy8")  # toy8's rows all go, pg's file takes its place
    rows = store_rows(dataset)
    expected = store_rows(stores[0])
    for table, table_rows in rows.items():
        run = table_rows[0].index("run_id")
        mine = sorted((r for r in table_rows[1:] if r[run] != "toy8"), key=repr)
        assert mine == [r for r in expected[table][1:] if r[run] != "toy8"], table
        pg = [r[:run] + r[run + 1:] for r in expected[table][1:] if r[run] == "pg"]
        assert sorted((r[:run] + r[run + 1:] for r in table_rows[1:] if r[run] == "toy8"), key=repr) == pg, table
    assert not list(tmp_path.glob(".d.*"))  # no staging folder left behind


def test_a_failing_ingest_leaves_the_dataset_as_it_was(stores: tuple[Path, Path], tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "d"
    shutil.copytree(stores[1], folder)
    before = files(tmp_path)
    bad = tmp_path / "rank1.json"
    bad.write_text('{"traceEvents": [')
    assert f"{bad}:" in one_error("ingest", bad, "--db", folder)
    bad.unlink()

    real = dataset._write

    def interrupted(con, folder, progress=lambda _: None):
        real(con, folder, progress)  # every new partition written, then killed before the rename
        raise KeyboardInterrupt

    monkeypatch.setattr(dataset, "_write", interrupted)
    assert run_main("ingest", PG, "--db", folder, "--run-id", "toy8")[0] != 0
    assert files(tmp_path) == before


def test_a_full_disk_is_one_line_and_leaves_the_dataset_as_it_was(stores: tuple[Path, Path], tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "d"
    shutil.copytree(stores[1], folder)
    before = files(tmp_path)

    def full(source: str, target: str) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(dataset, "_link", full)
    line = one_error("ingest", PG, "--db", folder, "--run-id", "pg2")
    assert f"{folder}: cannot write the dataset (" in line and "No space left on device); it is unchanged" in line
    assert files(tmp_path) == before


def test_a_failing_ingest_creates_no_dataset(tmp_path: Path) -> None:
    bad = tmp_path / "rank1.json"
    bad.write_text('{"traceEvents": [')
    one_error("ingest", bad, "--db", tmp_path / "new.parquet")
    assert [p.name for p in tmp_path.iterdir()] == ["rank1.json"]


def test_what_is_not_a_dataset_is_one_line(stores: tuple[Path, Path], tmp_path: Path) -> None:
    assert "a folder but not a traceana Parquet dataset (no schema.sql)" in one_error("info", "--db", tmp_path)
    assert "no such database" in one_error("breakdown", "--db", tmp_path / "absent.parquet")
    (tmp_path / "file.parquet").write_bytes(b"PAR1")
    assert "a file; a Parquet dataset is a folder" in one_error("runs", "--db", tmp_path / "file.parquet")
    damaged = tmp_path / "damaged"
    shutil.copytree(stores[1], damaged)
    (damaged / "schema.sql").write_text("CREATE TABLE runs (x INT);\n")
    assert f"{damaged}: a store of another traceana schema" in one_error("runs", "--db", damaged)
    shutil.rmtree(damaged)
    shutil.copytree(stores[1], damaged)
    part = next((damaged / "steps").rglob("*.parquet"))
    part.write_bytes(part.read_bytes()[:100])
    assert f"{damaged}: cannot read the dataset" in one_error("breakdown", "toy8", "--db", damaged)
    assert "already a Parquet dataset" in one_error("export", "--parquet", tmp_path / "out", "--db", stores[1])


def test_the_dataset_rule() -> None:
    assert dataset.is_dataset(Path("runs.parquet")) and dataset.is_dataset(ROOT)
    assert not dataset.is_dataset(Path("runs.duckdb")) and not dataset.is_dataset(Path("runs"))


def test_a_reader_spills_past_its_memory_limit_into_a_private_folder_removed_after(stores: tuple[Path, Path]) -> None:
    # thousands of ranks read out of core: DuckDB's joins and sorts go to disk past READ_MEMORY instead of growing
    from traceana import store

    with store.connect(stores[1], read_only=True) as con:
        limit, temp = con.execute("SELECT current_setting('memory_limit'), "
                                  "current_setting('temp_directory')").fetchone()
        assert Path(temp).is_dir() and Path(temp).name.startswith("traceana-read-")
        assert con.execute("SELECT count(*) FROM rank_breakdown").fetchone()[0] > 0
    assert limit == "640.0 MiB" and not Path(temp).exists()
