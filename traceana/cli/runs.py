"""What the store holds: `traceana runs`, `info` (one run's ranks, steps, groups and event counts) and `sql`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from traceana import store
from traceana.cli.options import DbOption, JsonOption, RunArgument
from traceana.errors import TraceanaError
from traceana.render.console import emit, emit_json, emit_rows

if TYPE_CHECKING:  # imported where used: `traceana --help` loads neither
    import duckdb
    import polars as pl


def runs(db: DbOption = Path(store.DEFAULT_DB), json: JsonOption = False) -> None:
    """List the runs in the store."""
    with store.connect(db, read_only=True, views=False) as con:
        result = con.execute(
            "SELECT run_id, source_format, world_size, layout, tool_version, rank_source, ingested_at, "
            "len(sources) AS n_sources FROM runs ORDER BY ingested_at"
        )
        columns = [c[0] for c in result.description]
        rows = result.fetchall()
    numeric = [c in ("world_size", "n_sources") for c in columns]
    emit_rows(columns, rows, numeric, title="runs", fmt="json" if json else "table")


# `info`'s tables, one query each over the run's rows ($r: its id); `traceana mcp`'s info tool reads them too.
INFO_PARTS = {
    "ranks": "SELECT rank, host, device, pid, clock_offset_ns, tp, cp, ep, dp, pp, rank_source "
             "FROM ranks WHERE run_id=$r ORDER BY rank",
    "steps": "SELECT step, count(*) AS ranks, round(avg(end_ns - start_ns) / 1e6, 3) AS mean_ms, "
             "round(max(end_ns - start_ns) / 1e6, 3) AS max_ms, bool_and(from_markers) AS from_markers "
             "FROM step_windows WHERE run_id=$r GROUP BY step ORDER BY step",
    # streams: a column stores written before it existed lack, hence COLUMNS (source is always there)
    "process_groups": "SELECT pg, dim, name, ranks, COLUMNS(lambda c: c IN ('source', 'streams')) "
                      "FROM process_groups WHERE run_id=$r ORDER BY dim, pg",
    "events by category": "SELECT category, count(*) AS events, sum(end_ns-start_ns)/1e6 AS busy_ms "
                          "FROM device_events WHERE run_id=$r GROUP BY ALL ORDER BY events DESC",
    "collectives by op and dim": "SELECT op, kernel_op, dim, evidence, count(*) AS events, "
                                 "sum(bytes) AS bytes FROM collectives WHERE run_id=$r "
                                 "GROUP BY ALL ORDER BY events DESC, op, kernel_op, dim, evidence",
}


def info_frames(con: duckdb.DuckDBPyConnection, rid: str) -> tuple[dict[str, pl.DataFrame], list[str]]:
    """(each of INFO_PARTS' tables, the run's notes) on a connection that shows run ``rid``."""
    frames = {title: con.sql(sql, params={"r": rid}).pl() for title, sql in INFO_PARTS.items()}
    notes = con.execute("SELECT notes FROM runs WHERE run_id=$r", {"r": rid}).fetchall()[0][0]
    return frames, notes or []


def info(run: RunArgument = None, db: DbOption = Path(store.DEFAULT_DB), json: JsonOption = False) -> None:
    """A run's ranks with coordinates, steps, process groups with dims, and event counts by category, op, dim."""
    with store.connect(db, read_only=True) as con:
        rid = store.open_run(con, run)
        frames, notes = info_frames(con, rid)
    if json:
        emit_json({"run_id": rid, "notes": notes, **{k: v.to_dicts() for k, v in frames.items()}})
        return
    for title, frame in frames.items():
        emit(frame, title=f"{rid}: {title}")
    for note in notes:
        typer.echo(f"note: {note}")


def sql(
    query: Annotated[str, typer.Argument(help="SQL over the store's tables and views.")],
    db: DbOption = Path(store.DEFAULT_DB),
    fmt: Annotated[str, typer.Option("--format", help="table, csv or json.")] = "table",
    run: Annotated[str | None, typer.Option("--run", help="Show the tables and views of this run only.")] = None,
) -> None:
    """Run ad-hoc SQL (read-only) and print the result. With --run, every table and view holds that run only."""
    from traceana.api import Traces

    if fmt not in ("table", "csv", "json"):
        raise TraceanaError(f"--format {fmt!r}: choose table, csv or json")
    emit(Traces(db, run).sql(query), fmt=fmt)
