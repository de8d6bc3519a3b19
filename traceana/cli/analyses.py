"""The analysis commands beyond the breakdown: critical-path, comm, kernels (and its --launch statistics and
--roofline), ops, idle, memory and diff. Each is thin: it opens the store, calls the module that owns the concept
(traceana/analyses/critical_path.py, comm.py, kernels.py, launches.py, roofline.py, ops.py, idle.py, memory.py,
diff.py), and prints or plots. Those modules (and Polars) are imported where used, so that `traceana --help` stays cheap
(tests/test_lazy_imports.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from traceana import store
from traceana.cli.options import DbOption, JsonOption, OneStepOption, RunArgument, StepOption, plot_option, top_count
from traceana.errors import TraceanaError
from traceana.render.console import emit, emit_json, html_path

if TYPE_CHECKING:  # imported where used, as above
    import polars as pl

    from traceana.analyses.roofline import Roofline


def critical_path(
    run: RunArgument = None,
    step: OneStepOption = None,
    plot: Annotated[Path | None, plot_option("the step's timeline with the path")] = None,
    json: JsonOption = False,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """The chain of work and waits across ranks that set one step's length: segments, totals by rank, stage, kind."""
    from traceana.analyses.breakdown import named_step, resolve_step
    from traceana.analyses.critical_path import communication, hops, of_step, report

    with store.connect(db, read_only=True) as con:
        rid = store.open_run(con, run)
        chosen, windows, segments = of_step(con, rid, resolve_step(con, rid, step))
        split = communication(con, rid, chosen, segments)
        intervals = con.sql("SELECT rank, lane, start_ns, end_ns FROM activity_intervals WHERE run_id = ? AND "
                            "step = ?", params=[rid, chosen]).pl() if plot is not None else None
    parts = report(segments)
    length_ms = (segments["end_ns"].max() - segments["start_ns"].min()) / 1e6
    if plot is not None:
        from traceana.render.plots import timeline_gantt

        timeline_gantt(windows, intervals, plot, f"{rid}: {named_step(chosen, step)}, critical path "
                       f"({length_ms:,.3f} ms) in black",
                       critical=segments)
    if json:
        emit_json({"run_id": rid, "step": chosen, "length_ms": length_ms, "communication": split,
                   **{name: frame.to_dicts() for name, frame in parts.items()}})
    else:
        title = (f"{rid}: {named_step(chosen, step)}, {length_ms:,.3f} ms from the first rank's start to the last "
                 "rank's end")
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
    plot: Annotated[Path | None, plot_option("the rank-pair heatmaps (bytes, GB/s)")] = None,
    json: JsonOption = False,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """Communication per op and dim (count, bytes, time, algbw and busbw as nccl-tests defines them, intra- or
    inter-node), the slowest instances, the rank-pair matrix and the slow links."""
    from traceana.analyses.comm import by_group, by_op, matrix, slow_links, slowest

    if not 0 <= threshold < 100:
        raise TraceanaError("--threshold must be a percentage in [0, 100)")
    with store.connect(db, read_only=True) as con:
        rid = store.open_run(con, run)
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
    top: Annotated[int, typer.Option("--top", help="How many kernels (per stage with --by stage; with --launch, "
                                     "kernels and streams).", callback=top_count)] = 20,
    by: Annotated[str | None, typer.Option("--by", help="run (all ranks together, the default) or stage; with "
                                           "--roofline shape (op and input shapes, the default) or kernel.")]
    = None,
    launch: Annotated[bool, typer.Option("--launch", help="Launch statistics instead: the delay from each launch "
                                         "call to the kernel's start per kernel, rank and step, the share of "
                                         "kernels shorter than their launch cost, and each stream's queue length "
                                         "(launched, not yet started).")] = False,
    roofline: Annotated[bool, typer.Option("--roofline", help="The roofline instead: achieved TFLOP/s and GB/s "
                                           "against the hardware's roof, from the launching ops' shapes (Kineto "
                                           "record_shapes).")] = False,
    profile: Annotated[str | None, typer.Option("--profile", help="With --roofline: the hardware profile (a100, "
                                                "h100, h200 or a YAML file); default: the trace's device.")] = None,
    plot: Annotated[Path | None, plot_option("the launch delay and queue length over time (--launch) or the "
                                             "log-log roofline (--roofline)")] = None,
    json: JsonOption = False,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """Top kernels by total device time: short name, category, calls, mean, share of COMP, time per rank-step;
    or, with --launch, how long kernels waited from their launch and how deep each stream's queue ran; or, with
    --roofline, per op shape or kernel: FLOPs and bytes, intensity, TFLOP/s, GB/s, bound and share of the roof."""
    if launch and roofline:
        raise TraceanaError("--launch and --roofline are two reports: choose one")
    if profile is not None and not roofline:
        raise TraceanaError("--profile goes with --roofline")
    if launch:
        if by is not None:
            raise TraceanaError("--launch reports per kernel, rank and step: drop --by")
        _launches(run, top, plot, json, db)
        return
    if plot is not None and not roofline:
        raise TraceanaError("--plot draws the launch statistics or the roofline: add --launch or --roofline")
    from traceana.analyses.kernels import ranking

    with store.connect(db, read_only=True) as con:
        rid = store.open_run(con, run)
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
        emit(_compact(frame.select(what, "calls", "total_ms", "FLOP_per_B", "TFLOP_per_s", "GB_per_s", "bound",
                                   "roof_pct")), title=f"{rid}: roofline per op {by}, the {top} longest by kernel time")
        for note in result.notes:
            typer.echo(f"note: {note}")
    if plot is not None:
        typer.echo(f"wrote {plot}", err=True)


def _launches(run: str | None, top: int, plot: Path | None, json: bool, db: Path) -> None:
    """`kernels --launch`: a run without launch records gets its one-line note and exit 0 (there is nothing wrong
    with the run), unless a plot was asked for, which cannot be drawn (exit 2)."""
    from traceana.analyses import launches as la

    with store.connect(db, read_only=True) as con:
        rid = store.open_run(con, run)
        la.compute_once(con, rid)
        notes = la.notes(con, rid)
        parts = {"by_kernel": la.by_kernel(con, rid), "by_rank": la.by_rank(con, rid), "by_step": la.by_step(con, rid),
                 "queue": la.queue_summary(con, rid)}
        if plot is not None and not parts["by_rank"].is_empty():
            delays, queues = la.over_time(con, rid), la.queue_over_time(con, rid)
            steps = con.sql("SELECT step, min(start_ns) - $origin AS start_ns FROM step_windows WHERE run_id = $run "
                            "GROUP BY step", params={"run": rid, "origin": la.origin_ns(con, rid)}).pl()
    if plot is not None:
        if parts["by_rank"].is_empty():
            raise TraceanaError(f"--plot: {notes[0]}")
        from traceana.render.plots import launch_timeline

        launch_timeline(delays, queues, parts["by_rank"], steps, plot, f"{rid}: kernel launches over time")
    if json:
        emit_json({"run_id": rid, "notes": notes, **{name: frame.to_dicts() for name, frame in parts.items()}})
    elif parts["by_rank"].is_empty():
        typer.echo(f"note: {notes[0]}")
    else:
        ranks = parts["by_rank"]
        over = "; the median over ranks" if ranks.height > 1 else ""
        typer.echo(f"{rid}: {ranks['events'].sum():,} launched device events on {ranks.height} rank(s); launch cost "
                   f"(median delay onto an idle device{over}) {ranks['launch_cost_us'].median():,.2f} us; "
                   f"{(ranks['short_pct'] * ranks['events']).sum() / ranks['events'].sum():.1f}% of events ran "
                   "shorter than it")
        emit(_compact(parts["by_kernel"].head(top)), title=f"launch delay (call start to kernel start) of the {top} "
             "most launched kernels")
        emit(_compact(ranks.head(top)), title=f"per rank (the first {top}); cost: the median delay onto an idle "
             "device")
        emit(_compact(parts["by_step"]), title="per step, all ranks")
        emit(_compact(parts["queue"].head(top)), title=f"queue length (launched, not started): the {top} streams "
             "with the longest mean queue")
        for note in notes:
            typer.echo(f"note: {note}")
    if plot is not None:
        typer.echo(f"wrote {plot}", err=True)


def _compact(frame: pl.DataFrame) -> pl.DataFrame:
    """A launch or roofline table for a terminal of ~100 columns: short headers with their unit, no mean delay
    beside the quantiles (the JSON keeps every column and full names)."""
    names = {"short_name": "kernel", "category": "cat", "span_ms": "span ms", "p50_delay_us": "p50 us",
             "p95_delay_us": "p95 us", "max_delay_us": "max us", "short_pct": "short %", "mean_duration_us":
             "dur us", "launch_cost_us": "cost us", "idle_device_events": "idle-device", "busy_queue_pct": "busy %",
             "mean_queue": "mean queue", "max_queue": "max queue", "total_ms": "total ms", "FLOP_per_B": "FLOP/B",
             "TFLOP_per_s": "TFLOP/s", "GB_per_s": "GB/s", "roof_pct": "roof %"}
    frame = frame.drop("mean_delay_us", strict=False)
    return frame.rename({c: n for c, n in names.items() if c in frame.columns})


def ops(
    run: RunArgument = None,
    by: Annotated[str, typer.Option("--by", help="op (outermost CPU op; Ascend: the operator), module (nn.Module "
                                    "path), layer (a module or NVTX range with a layer index) or nvtx (nsys).")]
    = "op",
    step: StepOption = None,
    top: Annotated[int, typer.Option("--top", help="How many rows; the rest are summed into one row.",
                                     callback=top_count)] = 20,
    plot: Annotated[Path | None, plot_option("the rows as stacked bars")] = None,
    json: JsonOption = False,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """Device time by op, module, layer or NVTX range: each row's COMP and exposed communication by dim (ms per
    rank-step), its kernels and share of the step; the rows add up to the breakdown's COMP and waits, "(none)"
    holding what was launched outside any."""
    from traceana.analyses.ops import attribute

    with store.connect(db, read_only=True) as con:
        rid = store.open_run(con, run)
        result = attribute(con, rid, by, step, top)
    frame = result.frame
    if plot is not None:
        from traceana.render.plots import ops_bars

        ops_bars(frame, by, plot, f"{rid}: device time by {by}, {result.step}")
    if json:
        emit_json({"run_id": rid, "by": by, "step": result.step, "rank_steps": result.rank_steps,
                   "levels": result.levels, "rows": frame.to_dicts(), "notes": result.notes})
        return
    shown = frame.select(c for c in frame.columns if not c.endswith("WAIT_ms") or frame[c].abs().sum() > 0)
    emit(shown, title=f"{rid}: device time by {by}, {result.step} (ms per rank-step, "
                      f"{result.rank_steps} rank-steps)")
    for note in result.notes:
        typer.echo(f"  note: {note}")
    if plot is not None:
        typer.echo(f"wrote {plot}")


def idle(
    run: RunArgument = None,
    step: StepOption = None,
    plot: Annotated[Path | None, plot_option("IDLE per rank stacked by cause")] = None,
    json: JsonOption = False,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """Why the device was idle: IDLE per rank split into host-bound launch gaps, sync waits, queued work waiting,
    and step-boundary gaps (ms and % of IDLE)."""
    import polars as pl

    from traceana.analyses.breakdown import named_step, resolve_step
    from traceana.analyses.idle import CAUSES, idle_causes
    from traceana.render.console import with_shares

    with store.connect(db, read_only=True) as con:
        rid = store.open_run(con, run)
        chosen = resolve_step(con, rid, step)
        frame = idle_causes(con, rid, chosen)
        launches = con.execute("SELECT count(launch_ns) FROM device_events WHERE run_id = ?", [rid]).fetchall()[0][0]
    if frame.is_empty():
        raise TraceanaError(f"run {rid!r} has no device events, so no idle time")
    note = None if launches else ("no launch records in this run (CPU-only, or a format without runtime "
                                  "correlation): interior gaps are left whole as 'unknown'")
    which = named_step(chosen, step) if chosen is not None else "typical step (mean over steps after the first)"
    if plot is not None:
        from traceana.render.colours import IDLE_CAUSE_COLORS
        from traceana.render.plots import breakdown_bars

        breakdown_bars(frame, plot, f"{rid}\nwhy the device was idle, {which}", stack=IDLE_CAUSE_COLORS,
                       ylabel="idle time per step (ms)")
        typer.echo(f"wrote {plot}", err=True)
    if json:
        emit_json({"run_id": rid, "step": chosen, "note": note, "ranks": frame.to_dicts()})
        return
    shares = [pl.Series(f"{c} ms (%)", with_shares(frame[f"{c}_ms"].to_list(),
                                                   (100 * frame[f"{c}_ms"] / frame["IDLE_ms"]).round(1).to_list()))
              for c in CAUSES if frame[f"{c}_ms"].sum() > 0]
    emit(frame.select("rank", "pp", "steps", "gaps", "IDLE_ms").with_columns(shares),
         title=f"{rid}: why the device was idle, {which}")
    if note:
        typer.echo(f"note: {note}")


def memory(
    run: RunArgument = None,
    plot: Annotated[Path | None, plot_option("allocated and reserved over time")] = None,
    json: JsonOption = False,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """Peak allocated and reserved memory per rank and step, and the timeline of both (--plot)."""

    from traceana.analyses.memory import peaks
    from traceana.render.units import BINARY_BYTES, unit_for

    with store.connect(db, read_only=True) as con:
        rid = store.open_run(con, run)
        frame = peaks(con, rid)
        if frame.is_empty():
            raise TraceanaError(f"run {rid!r} has no memory samples (Kineto needs profile_memory=True; Ascend "
                                "needs the allocator records)")
        if plot is not None:
            samples = con.sql("SELECT rank, ts_ns, allocated_bytes, reserved_bytes FROM memory WHERE run_id = ? "
                              "ORDER BY rank, ts_ns", params=[rid]).pl()
            windows = con.sql("SELECT rank, step, start_ns, end_ns FROM step_windows WHERE run_id = ?",
                              params=[rid]).pl()
    # the table prints its byte columns in the unit their largest calls for (console.emit_rows): the plot's
    chosen = unit_for(max(frame[c].max() or 0 for c in frame.columns if c.endswith("_bytes")), BINARY_BYTES)
    unit, _, meaning = chosen
    if plot is not None:
        from traceana.render.plots import memory_timeline

        memory_timeline(samples, windows, plot, f"{rid}: allocator memory per rank", chosen)
    emit(frame, title=f"{rid}: memory per rank and step ({unit} = {meaning})", fmt="json" if json else "table")
    if plot is not None:
        typer.echo(f"wrote {plot}", err=True)


def diff(
    run_a: Annotated[str, typer.Argument(help="The first run (A, the reference).")],
    run_b: Annotated[str, typer.Argument(help="The second run (B), compared with A.")],
    top: Annotated[int, typer.Option("--top", help="How many kernels to list in each table.",
                                     callback=top_count)] = 15,
    html: Annotated[Path | None, typer.Option("--html", help="Also write the diff as one interactive HTML file "
                                              "(every kernel, not --top).", callback=html_path)] = None,
    plot: Annotated[Path | None, plot_option("A beside B per stage and part")] = None,
    json: JsonOption = False,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """What changed from run A to run B: step time and breakdown per stage (which dims explain the change),
    kernels whose time changed most, new and vanished kernels, collectives by op and dim (all per rank and step)."""
    import polars as pl

    from traceana.analyses.diff import breakdown_diff, collective_diff, kernel_diff, occurring

    if html is not None:
        from traceana.render.report.page import need_bokeh

        need_bokeh()
    with store.connect(db, read_only=True) as con:
        for run in (run_a, run_b):
            store.resolve_run(con, run)
        parts = breakdown_diff(con, run_a, run_b)
        kernel_rows = kernel_diff(con, run_a, run_b)
        comms = collective_diff(con, run_a, run_b)
        if parts.is_empty():
            raise TraceanaError(f"runs {run_a!r} and {run_b!r} have no device events to compare")
        if html is not None:
            from traceana.render.report.diff import write

            size = write(con, db, run_a, run_b, html)
            typer.echo(f"wrote {html} ({size / 1e6:.1f} MB)", err=True)
    if plot is not None:
        from traceana.render.plots import diff_bars

        diff_bars(parts, plot, f"{run_a} (A) -> {run_b} (B): ms per typical step, B − A over each pair")
        typer.echo(f"wrote {plot}", err=True)
    changed = kernel_rows.filter(pl.col("status") == "both").head(top)
    new = kernel_rows.filter(pl.col("status") == "new").head(top)
    vanished = kernel_rows.filter(pl.col("status") == "vanished").sort("ms_A", descending=True).head(top)
    if json:
        emit_json({"run_a": run_a, "run_b": run_b, "breakdown": parts.to_dicts(), "kernels_changed": changed.to_dicts(),
                   "kernels_new": new.to_dicts(), "kernels_vanished": vanished.to_dicts(),
                   "collectives": comms.to_dicts()})
        return
    title = f"{run_a} (A) -> {run_b} (B)"
    emit(occurring(parts), title=f"{title}: breakdown per stage, ms per typical step (mean over the stage's "
                                      "ranks); explains_pct = share of the stage's TOTAL change", keys=2)
    from traceana.analyses.breakdown import PARTS

    moved = parts.filter((pl.col("part") == "TOTAL") & (pl.col("ms_delta") != 0))["stage"].to_list()
    shared = parts.filter(pl.col("part").is_in(PARTS) & pl.col("explains_pct").is_not_null())["stage"].to_list()
    offset = [s for s in moved if s not in shared]
    if offset:
        typer.echo(f"note: explains_pct is blank for stage(s) {', '.join(map(str, offset))}: TOTAL changed less than "
                   "one of its parts did (the parts offset each other; read ms_delta)")
    for name, frame in (("changed most", changed), ("new in B", new), ("vanished from A", vanished)):
        if not frame.is_empty():
            emit(frame.drop("status"), title=f"kernels {name} (ms and calls per rank and step)")
    if not comms.is_empty():
        emit(comms, title="collectives by op and dim (per rank and step; ms include waiting)", keys=2)
