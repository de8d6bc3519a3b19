"""What the store holds: `traceana runs`, `info` (one run's ranks, steps, groups and event counts), `sql`, and `mcp`,
the store served to coding assistants (the server, traceana/mcp/server.py, and the SDK imported on use: `traceana
--help` pays for neither)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from traceana import store
from traceana.cli.options import DbOption, JsonOption, RunArgument
from traceana.errors import TraceanaError
from traceana.render.console import emit, emit_json, emit_rows


def runs(db: DbOption = Path(store.DEFAULT_DB), json: JsonOption = False) -> None:
    """List the runs in the store."""
    with store.connect(db, read_only=True, views=False) as con:
        result = con.execute(
            "SELECT run_id, source_format, world_size, layout, tool_version, rank_source, ingested_at, "
            "len(sources) AS n_sources, COLUMNS(lambda c: c = 'traceana_version') FROM runs ORDER BY ingested_at"
        )
        columns = [c[0] for c in result.description]
        rows = result.fetchall()
    numeric = [c in ("world_size", "n_sources") for c in columns]
    emit_rows(columns, rows, numeric, title="runs", fmt="json" if json else "table")


def info(run: RunArgument = None, db: DbOption = Path(store.DEFAULT_DB), json: JsonOption = False) -> None:
    """A run's ranks with coordinates, steps, process groups with dims, and event counts by category, op, dim."""
    from traceana.analyses.info import tables as info_tables

    with store.connect(db, read_only=True) as con:
        rid = store.open_run(con, run)
        frames, notes = info_tables(con, rid)
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


def mcp(
    db: DbOption = Path(store.DEFAULT_DB),
    output_dir: Annotated[Path | None, typer.Option("--output-dir", help="Folder the report tool writes into; "
                                                    "estimator YAMLs under it are readable too.")] = None,
    config: Annotated[list[Path] | None, typer.Option("--config", help="An estimator YAML the advise, predict and "
                                                      "report tools may read. Repeat for more.")] = None,
) -> None:
    """Serve the store over the Model Context Protocol on stdin/stdout, read-only: one tool per analysis, SQL,
    the schema as resources, a "diagnose" prompt. Register it with an MCP client (docs/mcp.md)."""
    from traceana.api import Traces

    try:
        import traceana.mcp.server  # noqa: F401 (the SDK, imported here to say what to install when it is missing)
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] not in ("mcp", "mcp_types", "pydantic"):
            raise
        raise TraceanaError("traceana mcp needs the MCP SDK: pip install 'traceana[mcp]'") from None
    if output_dir is not None and not output_dir.is_dir():
        raise TraceanaError(f"--output-dir {output_dir}: not a folder")
    for path in config or []:
        if not path.is_file():
            raise TraceanaError(f"--config {path}: no such file")
    # a missing or empty store: one line now, not a server that fails every call
    Traces(db).mcp_server(output_dir, tuple(config or ())).run()  # stdio; nothing may reach stdout before this
