"""`traceana ingest`: profiler files of one run -> the store (the readers are in ingest/, the store in
traceana/store/)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated

import typer

from traceana import store
from traceana.cli.options import DbOption, LayoutOption
from traceana.errors import TraceanaError
from traceana.render.console import ingest_progress


def default_run_id(paths: list[Path]) -> str:
    """A stable id for the same sources: the input's name without trace suffixes, or the common folder's name."""
    if len(paths) == 1:
        name = paths[0].resolve().name
    else:
        parents = {p.resolve().parent for p in paths}
        name = parents.pop().name if len(parents) == 1 else paths[0].resolve().name
    return re.sub(r"(\.(json|gz|sqlite|nsys-rep|db|pt\.trace))+$", "", name) or "run"


def ingest(
    paths: Annotated[list[Path], typer.Argument(help="Trace files or folders (one run).")],
    db: DbOption = Path(store.DEFAULT_DB),
    run_id: Annotated[str | None, typer.Option(help="Run id (default: derived from the inputs).")] = None,
    fmt: Annotated[str, typer.Option("--format", help="auto, nsys, kineto or ascend.")] = "auto",
    layout: LayoutOption = None,
    step_marker: Annotated[str | None, typer.Option(help="Regex over annotation names that marks steps.")] = None,
    rules: Annotated[Path | None, typer.Option(help="Extra classification rules CSV (pattern,category,op).")] = None,
    jobs: Annotated[int | None, typer.Option(
        help="Worker processes parsing files (1: this process; default: every core once the files hold 64 MiB to "
             "parse, a .json.gz counted uncompressed).")] = None,
    executor: Annotated[str, typer.Option(help="local (worker processes here) or ray (one Ray task per file; "
                                          "needs the ray extra).")] = "local",
    ray_address: Annotated[str | None, typer.Option(help="With --executor ray: the cluster (default: RAY_ADDRESS, "
                                                    "else the local Ray, else one started here).")] = None,
    ray_timeout: Annotated[float, typer.Option(help="With --executor ray: seconds to wait for the cluster to answer "
                                               "before giving up.")] = 30.0,
) -> None:
    """Read one run's traces into the store (replacing an earlier ingest of the same run id). --db may name a Parquet
    dataset folder (a folder, or a name ending in .parquet): the run is added to it."""
    # Polars' allocator (jemalloc) keeps freed pages for a while (polars asks for 500 ms): the cross-rank steps of a
    # large run free and allocate hundreds of MB in turn, and the kept pages add up to this process's peak (1,024
    # ranks: 805 -> 625 MiB in those steps). Read when polars loads (below, in the command's own process; the workers
    # inherit it); a user's own setting wins.
    os.environ.setdefault("_RJEM_MALLOC_CONF", "dirty_decay_ms:0,muzzy_decay_ms:0")
    from traceana.ingest.dispatch import IngestOptions, read_run
    from traceana.ingest.parallel.executor import RayCluster
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
    store.check_writer(db)
    if removed := store.remove_leftovers(db.resolve()):
        typer.echo(f"note: removed {len(removed)} folder(s) that killed writers of {db} left behind: "
                   f"{', '.join(removed)}")
    if not 0 < ray_timeout <= 3600:
        raise TraceanaError(f"--ray-timeout {ray_timeout:g}: seconds between 0 and 3600")
    workers = RayCluster(ray_address, ray_timeout) if executor == "ray" else jobs
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
    if isinstance(workers, RayCluster) and (nodes := workers.tasks_per_node):  # where, not what: not a stored note
        spread = ", ".join(map(str, sorted(nodes.values(), reverse=True)))
        typer.echo(f"  Ray: {nodes.total()} tasks ran on {len(nodes)} node(s) ({spread} tasks)")
