"""`traceana sql --run RUN`: every table and view holds that run only, so ad-hoc SQL cannot mix runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import SAMPLES, run_cli
from traceana import store
from traceana.ingest.run_data import TABLES

RUNS = ("moe_balanced", "moe_skewed")
VIEWS = ("step_windows", "step_segments", "activity_intervals", "rank_step_breakdown", "rank_breakdown",
         "stage_breakdown", "collective_waits", "collective_instances", "stragglers")


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sql") / "two.duckdb"
    for run in RUNS:
        run_cli("ingest", SAMPLES / run, "--db", path)
    return path


def sql(db: Path, query: str, *args: str) -> list[dict]:
    return json.loads(run_cli("sql", query, "--db", db, "--format", "json", *args).stdout)


def test_every_table_and_view_holds_the_run_only(db: Path) -> None:
    names = ("runs", *TABLES, *VIEWS)
    counts = " UNION ALL ".join(f"SELECT '{n}' AS name, run_id, count(*) AS n FROM {n} GROUP BY run_id"
                                for n in names)
    everything = {(r["name"], r["run_id"]): r["n"] for r in sql(db, counts)}
    assert {run for _, run in everything} == set(RUNS)  # the store holds both runs
    for run in RUNS:
        restricted = {(r["name"], r["run_id"]): r["n"] for r in sql(db, counts, "--run", run)}
        # the same counts as the unrestricted views' rows of that run, and nothing of the other run
        assert restricted == {k: v for k, v in everything.items() if k[1] == run}


def test_the_readme_query_gives_the_same_numbers_with_and_without_run(db: Path) -> None:
    query = "SELECT pp, avg(COMP_ns) AS comp, avg(EP_WAIT_ns) FROM rank_breakdown WHERE step IS NULL {} GROUP BY 1"
    named = sql(db, query.format("AND run_id = 'moe_skewed'"))
    assert sql(db, query.format(""), "--run", "moe_skewed") == named
    assert sql(db, query.format("")) != named  # without either, both runs are averaged


def test_an_unknown_run_is_a_one_line_error(db: Path) -> None:
    result = run_cli("sql", "SELECT 1", "--db", db, "--run", "nope", check=False)
    assert result.returncode == 2 and result.stderr.startswith("error: unknown run 'nope'")
    assert result.stderr.count("\n") == 1


def test_restricting_leaves_the_file_as_it_was(db: Path) -> None:
    with store.connect(db, read_only=True) as con:
        store.restrict_to_run(con, "moe_balanced")
        assert con.execute("SELECT count(DISTINCT run_id) FROM ranks").fetchall() == [(1,)]
    with store.connect(db, read_only=True) as con:
        assert con.execute("SELECT count(DISTINCT run_id) FROM ranks").fetchall() == [(2,)]
