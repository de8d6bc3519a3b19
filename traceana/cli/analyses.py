"""The analysis commands beyond the breakdown: critical-path, comm, kernels, idle, memory and diff. Each is thin:
it opens the store, calls the module that owns the concept (traceana/analyses/critical_path.py, comm.py, kernels.py,
idle.py, memory.py, diff.py), and prints or plots. Those modules (and Polars) are imported where used, so that
`traceana --help` stays cheap (tests/test_lazy_imports.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from traceana import store
from traceana.cli.options import DbOption, JsonOption, RunArgument, top_count
from traceana.errors import TraceanaError
from traceana.render.console import emit, emit_json, plot_path

if TYPE_CHECKING:
    from traceana.analyses.roofline import Roofline


def critical_path(
    run: RunArgument = None,
    step: Annotated[int | None, typer.Option("--step", help="The step (default: the second, the first carries "
                                             "warm-up).")] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write the step's timeline with the path to this PNG.",
                                              callback=plot_path)]
    = None,
    json: JsonOption = False,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """The chain of work and waits across ranks that set one step's length: segments, totals by rank, stage, kind."""
    from traceana.analyses.critical_path import communication, hops, of_step, report

    with store.connect(db, read_only=True) as con:
        rid = store.resolve_run(con, run)
        step, windows, segments = of_step(con, rid, step)
        split = communication(con, rid, step, segments)
        intervals = con.sql("SELECT rank, lane, start_ns, end_ns FROM activity_intervals WHERE run_id = ? AND "
                            "step = ?", params=[rid, step]).pl() if plot is not None else None
    parts = report(segments)
    length_ms = (segments["end_ns"].max() - segments["start_ns"].min()) / 1e6
    if plot is not None:
        from traceana.render.plots import timeline_gantt

        timeline_gantt(windows, intervals, plot, f"{rid}: step {step}, critical path ({length_ms:,.3f} ms) in red",
                       critical=segments)
    if json:
        emit_json({"run_id": rid, "step": step, "length_ms": length_ms, "communication": split,
                   **{name: frame.to_dicts() for name, frame in parts.items()}})
    else:
        title = f"{rid}: step {step}, {length_ms:,.3f} ms from the first rank's start to the last rank's end"
        emit(hops(parts["segments"]), title=f"{title}: the critical path, hop by hop")
        for name in ("by_rank", "by_stage", "by_kind"):
            emit(parts[name], title=f"critical path {name.replace('_', ' ')}")
        if split["comm_ms"]:
            typer.echo(f"communication on the path: {split['comm_ms']:,.3f} ms, {split['exposed_ms']:,.3f} ms of it "
                       f"exposed and {split['overlapped_ms']:,.3f} ms under compute on another stream (the "
                       "breakdown counts that part as COMP)")
    if plot is not None:
        typer.echo(f"wrote {plot}", err=True)


def comm(
    run: RunArgument = None,
    top: Annotated[int, typer.Option("--top", help="How many of the slowest instances to list.",
                                     callback=top_count)] = 10,
    threshold: Annotated[float, typer.Option("--threshold", help="Flag pairs / groups whose bandwidth is this many "
                                             "percent below their peers' median.")] = 20.0,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write the rank-pair heatmaps (bytes, GB/s) to this "
                                              "PNG.", callback=plot_path)] = None,
    json: JsonOption = False,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """Communication per op and dim (count, bytes, time, algbw and busbw as nccl-tests defines them, intra- or
    inter-node), the slowest instances, the rank-pair matrix and the slow links."""
    from traceana.analyses.comm import by_group, by_op, matrix, slow_links, slowest

    if not 0 <= threshold < 100:
        raise TraceanaError("--threshold must be a percentage in [0, 100)")
    with store.connect(db, read_only=True) as con:
        rid = store.resolve_run(con, run)
        store.materialize(con, "collective_bandwidth", rid)  # the four tables read it
        ops, worst, pairs, groups = by_op(con, rid), slowest(con, rid, top), matrix(con, rid), by_group(con, rid)
        world = con.execute("SELECT world_size FROM runs WHERE run_id = ?", [rid]).fetchall()[0][0]
    if ops.is_empty():
        raise TraceanaError(f"run {rid!r} has no collectives matched into instances, so no communication report")
    slow = slow_links(pairs, groups, threshold)
    if plot is not None:
        if pairs.is_empty():
            raise TraceanaError(f"run {rid!r}: no point-to-point or all-to-all peers, so no matrix to plot")
        from traceana.render.plots import comm_heatmaps

        comm_heatmaps(pairs, world, plot, f"{rid}: point-to-point and all-to-all traffic per rank pair")
    if json:
        emit_json({"run_id": rid, "threshold_pct": threshold, "by_op": ops.to_dicts(), "slowest": worst.to_dicts(),
                   "matrix": pairs.to_dicts(), "groups": groups.to_dicts(), "slow_links": slow.to_dicts()})
    else:
        emit(ops, title=f"{rid}: communication per op and dim (busbw as nccl-tests defines it; GB = 1e9 bytes)")
        emit(worst, title=f"the {top} slowest instances (time from the last arrival to the end)")
        if not pairs.is_empty():
            emit(pairs, title="rank pairs (point-to-point and all-to-all; all-to-all split evenly)")
        emit(slow, title=f"pairs and groups more than {threshold:g}% below their peers' median bandwidth")
    if plot is not None:
        typer.echo(f"wrote {plot}", err=True)


def kernels(
    run: RunArgument = None,
    top: Annotated[int, typer.Option("--top", help="How many kernels (per stage with --by stage).",
                                     callback=top_count)] = 20,
    by: Annotated[str | None, typer.Option("--by", help="run (all ranks together, the default) or stage; with "
                                           "--roofline shape (op and input shapes, the default) or kernel.")]
    = None,
    roofline: Annotated[bool, typer.Option("--roofline", help="Achieved TFLOP/s and GB/s against the hardware's "
                                           "roof, from the launching ops' shapes (Kineto record_shapes).")] = False,
    profile: Annotated[str | None, typer.Option("--profile", help="With --roofline: the hardware profile (a100, "
                                                "h100, h200 or a YAML file); default: the trace's device.")] = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="With --roofline: write the log-log roofline to this "
                                              "PNG.", callback=plot_path)] = None,
    json: JsonOption = False,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """Top kernels by total device time: short name, category, calls, mean, share of COMP, time per rank-step; with
    --roofline, per op shape or kernel: FLOPs and bytes, intensity, TFLOP/s, GB/s, bound and share of the roof."""
    from traceana.analyses.kernels import ranking

    if not roofline and (profile is not None or plot is not None):
        raise TraceanaError(f"{'--profile' if profile is not None else '--plot'} goes with --roofline")
    with store.connect(db, read_only=True) as con:
        rid = store.resolve_run(con, run)
        if roofline:
            from traceana.analyses.roofline import measure

            result = measure(con, rid, by or "shape", profile, top)
        else:
            frame = ranking(con, rid, top, by or "run")
    if roofline:
        _roofline(rid, result, by or "shape", top, plot, json)
        return
    if frame.is_empty():
        raise TraceanaError(f"run {rid!r} has no device events in its steps, so no kernels")
    emit(frame, title=f"{rid}: top {top} kernels by total time" + (" per stage" if by == "stage" else "")
         + " (share of COMP over the same ranks and steps)", fmt="json" if json else "table")


def _roofline(rid: str, result: Roofline, by: str, top: int, plot: Path | None, json: bool) -> None:
    """Print (or write as JSON, or plot) what :func:`traceana.analyses.roofline.measure` gave."""
    frame = result.frame
    if plot is not None:
        from traceana.render.plots import roofline_chart

        peaks = set(frame["peak_TFLOP_per_s"].drop_nulls().to_list())
        roofline_chart(frame, [r for r in result.peaks.roofs() if r[1] in peaks], result.peaks.hbm_gb_per_s, plot,
                       f"{rid}: measured roofline per op {by}, profile {result.peaks.profile} (HBM "
                       f"{result.peaks.hbm_gb_per_s:,.0f} GB/s), the {frame.height} longest")
    if json:
        emit_json({"run_id": rid, "by": by, "profile": result.peaks.profile, "notes": result.notes,
                   "rows": frame.to_dicts()})
    else:
        import polars as pl

        # to fit 100 columns, one text column (--json has them all): the op and its shapes, or the kernel
        what = (pl.concat_str("op", pl.lit(": "), "shapes").alias("op: shapes") if by == "shape"
                else pl.col("kernel").str.slice(0, 48))
        emit(frame.select(what, "calls", "total_ms", "FLOP_per_B", "TFLOP_per_s", "GB_per_s", "bound", "roof_pct"),
             title=f"{rid}: roofline per op {by}, the {top} longest by kernel time")
        for note in result.notes:
            typer.echo(f"note: {note}")
    if plot is not None:
        typer.echo(f"wrote {plot}", err=True)


def idle(
    run: RunArgument = None,
    step: Annotated[int | None, typer.Option("--step", help="One step (default: mean over steps after the first).")]
    = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write IDLE per rank stacked by cause to this PNG.",
                                              callback=plot_path)]
    = None,
    json: JsonOption = False,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """Why the device was idle: IDLE per rank split into host-bound launch gaps, sync waits, queued work waiting,
    and step-boundary gaps (ms and % of IDLE)."""
    import polars as pl

    from traceana.analyses.idle import CAUSES, idle_causes

    with store.connect(db, read_only=True) as con:
        rid = store.resolve_run(con, run)
        frame = idle_causes(con, rid, step)
        launches = con.execute("SELECT count(launch_ns) FROM device_events WHERE run_id = ?", [rid]).fetchall()[0][0]
    if frame.is_empty():
        raise TraceanaError(f"run {rid!r} has no device events, so no idle time")
    note = None if launches else ("no launch records in this run (CPU-only, or a format without runtime "
                                  "correlation): interior gaps are left whole as 'unknown'")
    which = f"step {step}" if step is not None else "typical step (mean over steps after the first)"
    if plot is not None:
        from traceana.render.plots import IDLE_CAUSE_COLORS, breakdown_bars

        breakdown_bars(frame, plot, f"{rid}\nwhy the device was idle, {which}", stack=IDLE_CAUSE_COLORS,
                       ylabel="idle time per step (ms)")
        typer.echo(f"wrote {plot}", err=True)
    if json:
        emit_json({"run_id": rid, "step": step, "note": note, "ranks": frame.to_dicts()})
        return
    shares = [pl.format("{} ({}%)", pl.col(f"{c}_ms").round_sig_figs(4),
                        (100 * pl.col(f"{c}_ms") / pl.col("IDLE_ms")).round(1).fill_nan(None)).alias(f"{c} ms (%)")
              for c in CAUSES if frame[f"{c}_ms"].sum() > 0]
    emit(frame.select("rank", "pp", "steps", "gaps", pl.col("IDLE_ms").round_sig_figs(4), *shares),
         title=f"{rid}: why the device was idle, {which}")
    if note:
        typer.echo(f"note: {note}")


def memory(
    run: RunArgument = None,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write allocated and reserved over time to this PNG.",
                                              callback=plot_path)]
    = None,
    json: JsonOption = False,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """Peak allocated and reserved memory per rank and step, and the timeline of both (--plot)."""
    import polars as pl

    from traceana.analyses.memory import peaks

    with store.connect(db, read_only=True) as con:
        rid = store.resolve_run(con, run)
        frame = peaks(con, rid)
        if frame.is_empty():
            raise TraceanaError(f"run {rid!r} has no memory samples (Kineto needs profile_memory=True; Ascend "
                                "needs the allocator records)")
        if plot is not None:
            samples = con.sql("SELECT rank, ts_ns, allocated_bytes, reserved_bytes FROM memory WHERE run_id = ? "
                              "ORDER BY rank, ts_ns", params=[rid]).pl()
            windows = con.sql("SELECT rank, step, start_ns, end_ns FROM step_windows WHERE run_id = ?",
                              params=[rid]).pl()
    if plot is not None:
        from traceana.render.plots import memory_timeline

        memory_timeline(samples, windows, plot, f"{rid}: allocator memory per rank")
    if json:
        emit(frame, fmt="json")
    else:
        sizes = [c for c in frame.columns if c.endswith("_bytes")]
        emit(frame.with_columns((pl.col(c) / 2**20).round(1).alias(c.replace("_bytes", "_MiB")) for c in sizes)
             .drop(sizes), title=f"{rid}: memory per rank and step (MiB = 2^20 bytes)")
    if plot is not None:
        typer.echo(f"wrote {plot}", err=True)


def diff(
    run_a: Annotated[str, typer.Argument(help="The first run (A, the reference).")],
    run_b: Annotated[str, typer.Argument(help="The second run (B), compared with A.")],
    top: Annotated[int, typer.Option("--top", help="How many kernels to list in each table.",
                                     callback=top_count)] = 15,
    json: JsonOption = False,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """What changed from run A to run B: step time and breakdown per stage (which dims explain the change),
    kernels whose time changed most, new and vanished kernels, collectives by op and dim (all per rank and step)."""
    import polars as pl

    from traceana.analyses.diff import breakdown_diff, collective_diff, kernel_diff

    with store.connect(db, read_only=True) as con:
        for run in (run_a, run_b):
            store.resolve_run(con, run)
        parts = breakdown_diff(con, run_a, run_b)
        kernel_rows = kernel_diff(con, run_a, run_b)
        comms = collective_diff(con, run_a, run_b)
    if parts.is_empty():
        raise TraceanaError(f"runs {run_a!r} and {run_b!r} have no device events to compare")
    changed = kernel_rows.filter(pl.col("status") == "both").head(top)
    new = kernel_rows.filter(pl.col("status") == "new").head(top)
    vanished = kernel_rows.filter(pl.col("status") == "vanished").sort("ms_A", descending=True).head(top)
    if json:
        emit_json({"run_a": run_a, "run_b": run_b, "breakdown": parts.to_dicts(), "kernels_changed": changed.to_dicts(),
                   "kernels_new": new.to_dicts(), "kernels_vanished": vanished.to_dicts(),
                   "collectives": comms.to_dicts()})
        return
    title = f"{run_a} (A) -> {run_b} (B)"
    nonzero = (pl.col("ms_A").fill_null(0).abs() + pl.col("ms_B").fill_null(0).abs()).sum().over("part") > 0
    emit(parts.filter(nonzero), title=f"{title}: breakdown per stage, ms per typical step (mean over the stage's "
                                      "ranks); explains_pct = share of the stage's TOTAL change")
    for name, frame in (("changed most", changed), ("new in B", new), ("vanished from A", vanished)):
        if not frame.is_empty():
            emit(frame.drop("status"), title=f"kernels {name} (ms and calls per rank and step)")
    if not comms.is_empty():
        emit(comms, title="collectives by op and dim (per rank and step; ms include waiting)")
