"""The `breakdown`, `timeline` and `stragglers` commands: read the breakdown views, print or plot them."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from traceana import store
from traceana.cli.options import DbOption, JsonOption, OneStepOption, RunArgument, StepOption, plot_option
from traceana.errors import TraceanaError
from traceana.render.console import emit, emit_json

if TYPE_CHECKING:  # imported where used: the CLI's fixed cost stays small (`traceana --help` loads no Polars)
    import polars as pl


def _varying_coords(frame: pl.DataFrame) -> list[str]:
    """The coordinates worth a column: those of dimensions larger than 1."""
    from traceana.analyses import breakdown as bd

    return [c for c in bd.COORDS if frame[c].n_unique() > 1]


def _cells(frame: pl.DataFrame, suffix: str, share: list[bool]) -> list[pl.Series]:
    """TOTAL, each part that is not zero everywhere as 'ms (pct%)' on the rows ``share`` marks (plain ms on the
    others), and OVERLAPPED as 'ms (its share of the communication time%)', for a table: each column's ms with one
    number of decimals (console.column_text)."""
    import polars as pl

    from traceana.analyses import breakdown as bd
    from traceana.render.console import with_shares

    def cell(part: str, shares: pl.Series) -> list[str]:
        return with_shares(frame[f"{part}{suffix}"].to_list(),
                           [v if keep else None for v, keep in zip(shares.to_list(), share, strict=True)])

    shown = [p for p in bd.PARTS if p not in bd.WAITS or frame[f"{p}{suffix}"].abs().sum() > 0]
    total = frame[f"TOTAL{suffix}"]
    cells = [total.alias("TOTAL ms")]
    cells += [pl.Series(f"{bd.label(part)} ms (%)", cell(part, (100 * frame[f"{part}{suffix}"] / total).round(1)))
              for part in shown]
    return [*cells, pl.Series("OVERLAPPED ms (% comm)", cell("OVERLAPPED", frame["OVERLAP_pct"].round(1)))]


def breakdown(
    run: RunArgument = None,
    by: Annotated[str, typer.Option("--by", help="rank or stage.")] = "rank",
    step: StepOption = None,
    plot: Annotated[Path | None, plot_option("stacked bars per rank")] = None,
    json: JsonOption = False,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """Where each rank's step time went: COMP, each dimension's exposed communication wait, IDLE (ms, % of TOTAL)."""
    from traceana.analyses import breakdown as bd

    if by not in ("rank", "stage"):
        raise TraceanaError(f"--by {by!r}: choose rank or stage")
    with store.connect(db, read_only=True) as con:
        rid = store.open_run(con, run)
        store.materialize(con, "rank_step_breakdown", rid)  # read for the ranks, the step and the outlier notes
        chosen = bd.resolve_step(con, rid, step)
        ranks = bd.by_rank(con, rid, chosen)
        frame = ranks if by == "rank" else bd.by_stage(con, rid, chosen)
        if ranks.is_empty():
            raise TraceanaError(f"run {rid!r} has no device events, so no breakdown")
        which = bd.which_step(con, rid, chosen, step)
        notes = bd.outlier_notes(con, rid) if chosen is None else []
        if json and by == "rank":  # the memory peak of the same step (of the steps averaged), where sampled
            from traceana.analyses.memory import rank_peaks

            frame = frame.join(rank_peaks(con, rid, chosen), on="rank", how="left")
    if plot is not None:
        from traceana.render.plots import breakdown_bars

        breakdown_bars(ranks, plot, f"{rid}\ntime per rank, {which}")
    if json:
        suffix = "_ms" if by == "rank" else "_mean_ms"
        emit(bd.percent_of_total(frame, suffix), fmt="json")
    else:
        table = _rank_table(frame, typical=chosen is None) if by == "rank" else _stage_table(frame)
        emit(table, title=f"{rid}: breakdown per {by}, {which}", keys=1 if by == "rank" else 2)
        typer.echo(_overlap_line(ranks))
    for note in notes:
        typer.echo(f"note: {note}", err=True)
    if plot is not None:
        typer.echo(f"wrote {plot}", err=True)


def _overlap_line(ranks: pl.DataFrame) -> str:
    """The run's communication / computation overlap, the headline beside OVERLAPPED, with its spread over ranks."""
    from traceana.analyses import breakdown as bd

    run = bd.run_overlap_pct(ranks)
    if run is None:
        return "comm/compute overlap: no communication in these steps"
    spread = ranks["OVERLAP_pct"].drop_nulls()
    ranks_part = f"; per rank {spread.min():.1f}% to {spread.max():.1f}%" if spread.len() > 1 else ""
    return (f"comm/compute overlap: {run:.1f}% of communication ran under compute (OVERLAPPED / (OVERLAPPED + "
            f"waits){ranks_part})")


def _rank_table(frame: pl.DataFrame, typical: bool) -> pl.DataFrame:
    return frame.select("rank", *_varying_coords(frame), *(["steps"] if typical else [])).with_columns(
        _cells(frame, "_ms", share=[True] * frame.height))


def _stage_table(frame: pl.DataFrame) -> pl.DataFrame:
    """Two rows per stage: the mean over its ranks (with % of the mean TOTAL) and the max."""
    import polars as pl

    from traceana.analyses import breakdown as bd

    parts = ("TOTAL", *bd.PARTS, "OVERLAPPED")
    rows = pl.concat([frame.select(pl.col("pp").alias("stage"), pl.lit(stat).alias("over ranks"), "ranks",
                                   *[pl.col(f"{p}_{stat}_ms").alias(f"{p}_ms") for p in parts], "OVERLAP_pct")
                      for stat in ("mean", "max")]).sort("stage", "over ranks", descending=[False, True],
                                                         nulls_last=False)
    return rows.select("stage", "over ranks", "ranks").with_columns(
        _cells(rows, "_ms", share=[stat == "mean" for stat in rows["over ranks"]]))


def timeline(
    plot: Annotated[Path, plot_option("the step's Gantt across ranks")],
    step: OneStepOption = None,
    run: RunArgument = None,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """Gantt of one step across ranks: compute grey, communication colored by dimension, idle blank."""
    from traceana.analyses import breakdown as bd
    from traceana.render.plots import timeline_gantt

    with store.connect(db, read_only=True) as con:
        rid = store.open_run(con, run)
        chosen = bd.resolve_step(con, rid, step)
        if chosen is None:
            chosen = bd.first_analysed_step(con, rid)
        windows, intervals = bd.timeline(con, rid, chosen)
    ranks = f"{windows.height} rank" + ("s" if windows.height != 1 else "")
    which = bd.named_step(chosen, step)
    timeline_gantt(windows, intervals, plot, f"{rid}: {which} across {ranks}")
    typer.echo(f"wrote {plot} ({which}, {ranks}, {intervals.height} activity intervals)")


def stragglers(
    run: RunArgument = None,
    threshold: Annotated[float, typer.Option("--threshold", help="Flag ranks whose COMP exceeds their stage's "
                                             "median by more than this many percent.")] = 5.0,
    json: JsonOption = False,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """The straggler stage (largest mean COMP per step), ranks slower than their stage, and who others waited for."""
    import polars as pl

    from traceana.analyses import breakdown as bd

    if not threshold >= 0 or threshold == float("inf"):  # NaN compares false with everything
        raise TraceanaError(f"--threshold {threshold}: must be a finite percentage >= 0")
    with store.connect(db, read_only=True) as con:
        rid = store.open_run(con, run)
        per_rank = bd.stragglers(con, rid)
        late = bd.late_ranks(con, rid)
    if per_rank.is_empty():
        raise TraceanaError(f"run {rid!r} has no device events, so no stragglers")
    stage_ranks = per_rank.filter(pl.col("straggler_stage"))
    stage = stage_ranks["pp"][0]
    slow = per_rank.filter(pl.col("COMP_excess_pct") > threshold).drop("straggler_stage")
    if json:
        emit_json({"run_id": rid, "threshold_pct": threshold, "straggler_stage": stage,
                   "straggler_stage_mean_COMP_ms": stage_ranks["COMP_ms"].mean(),
                   "straggler_ranks": slow.to_dicts(), "late_ranks": late.to_dicts()})
        return
    stages = per_rank["pp"].drop_nulls().n_unique()
    where = (f"stage {stage}" if stages > 1 else "all ranks (one pipeline stage: no pipeline parallelism)"
             if stage is not None else "all ranks (no pipeline stages: the run has no layout)")
    typer.echo(f"{rid}: straggler stage: {where}, mean COMP {stage_ranks['COMP_ms'].mean():,.3f} ms per step")
    emit(slow, title=f"ranks whose COMP exceeds their stage's median by more than {threshold:g}%")
    emit(late, title="ranks the others waited for: last to arrive at collectives, by dim")
