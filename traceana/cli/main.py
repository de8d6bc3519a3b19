"""The `traceana` command line. Each command is thin: parse options, call the module that owns the concept, print."""

from __future__ import annotations

import os
import re
import traceback
from pathlib import Path
from typing import Annotated

import typer

from traceana import store
from traceana.errors import TraceanaError
from traceana.output import emit, emit_json, emit_rows, ingest_progress

app = typer.Typer(help="Trace-driven analyzer for distributed LLM training.", no_args_is_help=True,
                  pretty_exceptions_enable=False, add_completion=False)

DbOption = Annotated[Path, typer.Option("--db", help="DuckDB store file, or a Parquet dataset: a folder, or a name "
                                         "ending in .parquet.")]
JsonOption = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
LayoutOption = Annotated[str | None, typer.Option(help='Parallel layout, e.g. "tp=2,dp=2,pp=2,order=tp-cp-ep-dp-pp".')]
RunArgument = Annotated[str | None, typer.Argument(help="Run id (default: the latest ingested run).")]


def default_run_id(paths: list[Path]) -> str:
    """A stable id for the same sources: the input's name without trace suffixes, or the common folder's name."""
    if len(paths) == 1:
        name = paths[0].resolve().name
    else:
        parents = {p.resolve().parent for p in paths}
        name = parents.pop().name if len(parents) == 1 else paths[0].resolve().name
    return re.sub(r"(\.(json|gz|sqlite|nsys-rep|db|pt\.trace))+$", "", name) or "run"


@app.command()
def ingest(
    paths: Annotated[list[Path], typer.Argument(help="Trace files or folders (one run).")],
    db: DbOption = Path(store.DEFAULT_DB),
    run_id: Annotated[str | None, typer.Option(help="Run id (default: derived from the inputs).")] = None,
    fmt: Annotated[str, typer.Option("--format", help="auto, nsys, kineto or ascend.")] = "auto",
    layout: LayoutOption = None,
    step_marker: Annotated[str | None, typer.Option(help="Regex over annotation names that marks steps.")] = None,
    rules: Annotated[Path | None, typer.Option(help="Extra classification rules CSV (pattern,category,op).")] = None,
    jobs: Annotated[int | None, typer.Option(
        help="Worker processes parsing files (1: this process; default: every core for runs over 64 MiB).")] = None,
    executor: Annotated[str, typer.Option(help="local (worker processes here) or ray (one Ray task per file; "
                                          "needs the ray extra).")] = "local",
    ray_address: Annotated[str | None, typer.Option(help="With --executor ray: the cluster (default: RAY_ADDRESS, "
                                                    "else the local Ray, else one started here).")] = None,
) -> None:
    """Read one run's traces into the store (replacing an earlier ingest of the same run id). --db may name a Parquet
    dataset folder (a folder, or a name ending in .parquet): the run is added to it."""
    from traceana.ingest.dispatch import IngestOptions, read_run
    from traceana.ingest.parallel import RayCluster
    from traceana.ingest.rules import load_rules
    from traceana.layout import Layout

    parsed_layout = Layout.parse(layout) if layout else None
    if step_marker is not None:
        try:
            re.compile(step_marker)
        except re.error as exc:
            raise TraceanaError(f"--step-marker {step_marker!r}: not a regular expression ({exc})") from None
    if executor not in ("local", "ray"):
        raise TraceanaError(f"--executor {executor!r}: expected local or ray")
    if executor == "local" and ray_address is not None:
        raise TraceanaError("--ray-address goes with --executor ray")
    if executor == "ray" and jobs is not None:
        raise TraceanaError("--jobs sets local worker processes; with --executor ray the Ray cluster sizes itself")
    store.check_path(db)
    workers = RayCluster(ray_address) if executor == "ray" else jobs
    options = IngestOptions(layout=parsed_layout, step_marker=step_marker, rules=load_rules(rules), jobs=workers,
                            cache_dir=db.resolve().parent / ".traceana-cache", spill_near=db.resolve())
    with ingest_progress() as bar:
        options.progress = bar
        data = read_run(paths, fmt, options)
        rid = run_id or default_run_id(paths)
        bar.phase(f"writing run {rid} to {db}")
        with store.connect(db) as con:
            try:
                store.write_run(con, rid, data)
            finally:
                data.discard()
            counts = con.execute(
                "SELECT (SELECT count(*) FROM ranks WHERE run_id=$r), (SELECT count(*) FROM device_events WHERE "
                "run_id=$r), (SELECT count(*) FROM collectives WHERE run_id=$r), (SELECT count(*) FROM steps WHERE "
                "run_id=$r), (SELECT count(DISTINCT step) FROM steps WHERE run_id=$r)", {"r": rid},
            ).fetchall()[0]
    steps = (f"{counts[4]} steps ({counts[3]} rank-steps)" if counts[3]
             else "no step markers: the whole trace is analysed as one step")
    typer.echo(f"{rid}: {data.source_format}, {counts[0]} ranks, {counts[1]} device events, "
               f"{counts[2]} collectives, {steps} -> {db}")
    for note in data.notes:
        typer.echo(f"  note: {note}")


@app.command()
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


@app.command()
def info(run: RunArgument = None, db: DbOption = Path(store.DEFAULT_DB), json: JsonOption = False) -> None:
    """A run's ranks with coordinates, steps, process groups with dims, and event counts by category, op, dim."""
    with store.connect(db, read_only=True) as con:
        rid = store.resolve_run(con, run)
        parts = {
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
                                         "GROUP BY ALL ORDER BY events DESC",
        }
        frames = {title: con.sql(sql, params={"r": rid}).pl() for title, sql in parts.items()}
        notes = con.execute("SELECT notes FROM runs WHERE run_id=$r", {"r": rid}).fetchall()[0]
    if json:
        emit_json({"run_id": rid, "notes": notes[0] or [],
                   **{k: v.to_dicts() for k, v in frames.items()}})
        return
    for title, frame in frames.items():
        emit(frame, title=f"{rid}: {title}")
    for note in notes[0] or []:
        typer.echo(f"note: {note}")


@app.command()
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


def main(argv: list[str] | None = None) -> None:
    """Entry point: user mistakes become one line on stderr and exit code 2, never a traceback. Anything else is a
    bug: one line and exit code 1, the traceback only with TRACEANA_DEBUG=1."""
    try:
        app(args=argv, prog_name="traceana")
    except TraceanaError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from None
    except Exception as exc:
        if os.environ.get("TRACEANA_DEBUG", "") not in ("", "0"):
            traceback.print_exc()
        else:
            line = next(iter(str(exc).strip().splitlines()), "")
            typer.echo(f"error: internal error: {type(exc).__name__}: {line} "
                       "(run again with TRACEANA_DEBUG=1 for the traceback)", err=True)
        raise SystemExit(1) from None


# Commands owned by other modules register here, one line each.
# (breakdown / timeline / stragglers, estimate / search, compare)
from traceana.report_cli import breakdown, stragglers, timeline  # noqa: E402

app.command()(breakdown)
app.command()(timeline)
app.command()(stragglers)
from traceana.estimator.cli import estimate, search  # noqa: E402

app.command()(estimate)
app.command()(search)
from traceana.compare_cli import compare  # noqa: E402

app.command()(compare)
from traceana.export_cli import export  # noqa: E402

app.command()(export)
from traceana.report_html_cli import report  # noqa: E402

app.command()(report)
from traceana.trace_profile_cli import calibrate  # noqa: E402

app.command()(calibrate)
from traceana.synth.cli import synth  # noqa: E402

app.command()(synth)
from traceana.parquet_cli import import_parquet  # noqa: E402

app.command()(import_parquet)
from traceana.analysis_cli import comm, critical_path, diff, idle, kernels, memory  # noqa: E402

app.command("critical-path")(critical_path)
app.command()(comm)
app.command()(kernels)
app.command()(idle)
app.command()(memory)
app.command()(diff)
