"""`sql` (CLI and API) reads the store and nothing else, and writes no file anywhere, for both store kinds: each
statement of research/mcp-and-sql-guard.md §4.2 is refused with the layer's message, no file appears or changes
under the test's folder, and the store still answers."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import traceana
from tests.conftest import SAMPLES, ingested, one_line, run_main
from traceana.errors import TraceanaError

RUN = "moe_balanced"
STATEMENT = "SELECT statement"  # the statement check's refusal
ENGINE = "sql reads the store's own files only: Permission Error"
LOCKED = "the configuration has been locked"


@pytest.fixture(scope="module", params=["duckdb", "parquet"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A store of one sample run, as a .duckdb file or as the Parquet dataset exported from it."""
    from traceana import store as st
    from traceana.store import dataset

    folder = tmp_path_factory.mktemp("guard")
    db = ingested(folder / "s.duckdb", {RUN: (SAMPLES / RUN, None)})
    if request.param == "duckdb":
        return db
    with st.connect(db, read_only=True, views=False) as con:
        dataset.export(con, folder / "ds")
    return folder / "ds"


def snapshot(root: Path) -> dict[str, str]:
    """Every file under ``root`` with the hash of its bytes."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def refused(store: Path, query: str) -> str:
    """The error `Traces.sql` gives for ``query``, after checking that nothing under the store's folder (or
    ./.tmp, DuckDB's default temp folder for a dataset) changed, and that the store still answers."""
    root = store.parent
    before = snapshot(root)
    with pytest.raises(TraceanaError) as caught:
        traceana.open(store).sql(query)
    assert snapshot(root) == before, query
    assert not Path(".tmp").exists()
    assert traceana.open(store).sql("SELECT count(*) AS n FROM device_events")["n"][0] > 0
    return str(caught.value)


def outside(store: Path) -> Path:
    """A folder beside the store, with a file in it, and a symlink from inside a dataset to it."""
    out = store.parent / "outside"
    out.mkdir(exist_ok=True)
    (out / "secret.csv").write_text("a\n1\n")
    if store.is_dir() and not (store / "link").exists():
        (store / "link").symlink_to(out)
    return out


@pytest.mark.parametrize(("query", "expected"), [
    ("COPY (SELECT 1) TO '{out}/x.csv'", STATEMENT),
    ("COPY (SELECT 1 AS a) TO '{store}/device_events/evil.parquet'", STATEMENT),
    ("COPY device_events TO '{store}/evil.parquet' (FORMAT parquet)", STATEMENT),
    ("EXPORT DATABASE '{out}/d'", STATEMENT),
    ("ATTACH '{out}/y.duckdb'", STATEMENT),
    ("INSTALL httpfs", STATEMENT),
    ("LOAD httpfs", STATEMENT),
    ("EXPLAIN ANALYZE COPY (SELECT 1) TO '{store}/e.csv'", STATEMENT),
    ("SET enable_external_access = true", STATEMENT),
    ("SELECT 1; COPY (SELECT 1) TO '{out}/x.csv'", "got SELECT + COPY"),
    ("SELECT * FROM read_csv('/etc/passwd')", ENGINE),
    ("SELECT * FROM read_text('/etc/passwd')", ENGINE),
    ("SELECT * FROM glob('/etc/*')", ENGINE),
    ("SELECT * FROM read_csv('{out}/secret.csv')", ENGINE),
    ("SELECT * FROM read_csv('{store}/../outside/secret.csv')", ENGINE),
    ("SELECT * FROM enable_logging('QueryLog', storage = 'file', storage_path = '{out}/logs')", LOCKED),
])
def test_sql_refuses_what_writes_or_reads_another_file(store: Path, query: str, expected: str) -> None:
    out = outside(store)
    assert expected in refused(store, query.format(store=store, out=out))


def test_a_symlink_out_of_a_dataset_is_refused(store: Path) -> None:
    if not store.is_dir():
        pytest.skip("a .duckdb store has no folder to link from")
    outside(store)
    assert ENGINE in refused(store, f"SELECT * FROM read_csv('{store}/link/secret.csv')")


def test_reads_of_the_store_and_its_views_pass(store: Path) -> None:
    traces = traceana.open(store)
    kernels = traces.sql("SELECT count(*) AS n FROM device_events WHERE category = 'compute'")["n"][0]
    assert kernels == traces.sql("SELECT sum(n) AS n FROM (SELECT count(*) AS n FROM device_events "
                                 "WHERE category = 'compute' GROUP BY rank)")["n"][0] > 0
    assert traces.sql("WITH b AS (FROM rank_step_breakdown) SELECT count(*) AS n FROM b", run=RUN)["n"][0] > 0
    assert traces.sql("DESCRIBE device_events").height > 0
    if store.is_dir():  # the dataset's own files stay readable by name
        assert traces.sql(f"SELECT count(*) AS n FROM read_parquet('{store}/device_events/**/*.parquet')"
                          )["n"][0] == traces.sql("SELECT count(*) AS n FROM device_events")["n"][0]


def test_a_held_session_reads_on_after_sql(store: Path) -> None:
    traces = traceana.open(store, run=RUN)
    with traces.session():
        before = traces.breakdown()
        with pytest.raises(TraceanaError, match=ENGINE):
            traces.sql("FROM read_csv('/etc/passwd')")
        traces.sql("SELECT 1")  # a second query on the file's confined instance
        assert traces.breakdown().equals(before)


def test_the_cli_refuses_in_one_line_and_writes_nothing(store: Path) -> None:
    evil = store / "device_events" / "evil.parquet" if store.is_dir() else store.parent / "evil.parquet"
    before = snapshot(store.parent)
    line = one_line(*run_main("sql", f"COPY (SELECT 1 AS a) TO '{evil}'", "--db", store)[::2])
    assert "got COPY" in line and not evil.exists()
    line = one_line(*run_main("sql", "SELECT * FROM read_csv('/etc/passwd')", "--db", store)[::2])
    assert "Permission Error" in line and "/etc/passwd" in line
    assert snapshot(store.parent) == before
