"""The trace-anchored prediction commands (DESIGN §8): replay, whatif, predict, advise. Thin: open the store, call
traceana/model/replay.py, whatif.py, predict.py or advise.py, print or plot."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from traceana import store
from traceana.cli.options import DbOption, JsonOption, OneStepOption, RunArgument, plot_option, step_option
from traceana.errors import TraceanaError
from traceana.render.console import emit, emit_json, progress, with_intervals


def replay(
    run: RunArgument = None,
    step: Annotated[str | None, step_option("every step", every=True)] = None,
    json: JsonOption = False,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """Replay steps from the run's own dependency graph: per rank-step the replayed TOTAL and breakdown against the
    measured ones, the error, and the graph's edges by kind (what was recorded, inferred, or missing)."""
    from traceana.analyses.breakdown import named_step, resolve_step
    from traceana.model import replay as model

    with store.connect(db, read_only=True) as con:
        rid = store.open_run(con, run)
        chosen = resolve_step(con, rid, step, every=True)
        with progress(None, "replaying") as advance:
            g, table = model.replay_run(con, rid, chosen)
            advance("done")
    counts, missing = g.counts, g.missing
    summary = model.summary(table)
    if json:
        emit_json({"run_id": rid, **summary, "edges": counts, "missing": missing, "rank_steps": table.to_dicts()})
        return
    emit(table.select("step", "rank", "stage", "TOTAL_ms", "replayed_TOTAL_ms", "error_pct", "IDLE_ms",
                      "replayed_IDLE_ms", "external_hold_ms"),
         title=f"{rid}: replay per rank-step{'' if chosen is None else ', ' + named_step(chosen, step)} (ms; "
               "--json has every part)")
    typer.echo(f"replay error over {summary['rank_steps']} rank-steps: median {summary['median_abs_error_pct']:.2f}%,"
               f" worst {summary['worst_abs_error_pct']:.2f}%")
    typer.echo("edges: " + ", ".join(f"{k} {v:,}" for k, v in counts.items()))
    for line in missing:
        typer.echo(f"note: {line}")


def whatif(
    run: RunArgument = None,
    change: Annotated[list[str], typer.Option("--change", help="KEY=TARGET[:FACTOR]: dim=TP:0.5, op=AllToAll:0.7, "
                                              "pg=ID:0.5, link=0-4:2, kernel=*flash*:0.8, kernel=*flash*:roof=60, "
                                              "host=0, host=capturable:0, rank=5:median, rank=5:1.4, "
                                              "rank=*:median, stage=0:median, stage=0:1.3, "
                                              "overlap=DP, overlap=DP:backward. Repeat to compose.")] = ...,
    step: OneStepOption = None,
    plot: Annotated[Path | None, plot_option("measured vs predicted per rank, grouped by stage")] = None,
    json: JsonOption = False,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """Predict a step after changes to its dependency graph: per rank the measured and predicted TOTAL and
    breakdown with the error bar (the plain replay's residual), and the critical path after the change."""
    from traceana.analyses.breakdown import named_step, resolve_step
    from traceana.analyses.critical_path import report
    from traceana.model import whatif as model
    from traceana.model.whatif import by_stage

    changes = [model.parse(spec) for spec in change]
    with store.connect(db, read_only=True) as con:
        rid = store.open_run(con, run)
        chosen, g, frame, segments, interval = model.whatif_interval(con, rid, changes, resolve_step(con, rid, step))
    which = named_step(chosen, step)
    path = report(segments)["by_kind"] if segments is not None and segments.height else None
    measured, predicted = float(frame["TOTAL_ms"].median()), interval.value
    if plot is not None:
        from traceana.render.plots import whatif_bars

        whatif_bars(frame, plot, f"{rid}: {which}, {' '.join(map(str, changes))}", interval, measured)
    if json:
        emit_json({"run_id": rid, "step": chosen, "changes": [str(c) for c in changes], "measured_step_ms": measured,
                   "predicted_step_ms": predicted, "low": interval.low, "high": interval.high,
                   "level": interval.level, "sources": interval.sources,
                   "error_bar_ms": float(frame["error_bar_ms"].max()),
                   "edges": g.counts, "missing": g.missing, "ranks": frame.to_dicts(),
                   "stages": by_stage(frame).to_dicts(),
                   "critical_path_by_kind": path.to_dicts() if path is not None else []})
    else:
        emit(frame.select("rank", "stage", "TOTAL_ms", "predicted_TOTAL_ms", "gain_ms", "error_bar_ms", "COMP_ms",
                          "predicted_COMP_ms"),
             title=f"{rid}: {which} after {' '.join(map(str, changes))} (ms; --json has every part)")
        emit(by_stage(frame), title="per stage, mean over its ranks (ms)")
        if path is not None:
            emit(path, title="critical path after the change, by kind")
        typer.echo(f"step (the median rank's TOTAL): measured {measured:,.3f} ms, predicted {interval}")
        from traceana.model.intervals import notes as interval_notes  # numpy: not at `traceana --help`

        for line in [*g.missing, *interval_notes(interval)]:
            typer.echo(f"note: {line}")
    if plot is not None:
        typer.echo(f"wrote {plot}", err=True)


def advise(
    run: RunArgument = None,
    step: OneStepOption = None,
    config: Annotated[Path | None, typer.Option("--config", help="The job's estimator YAML, for the changes only "
                                                "the estimator predicts (rebalanced layers, micro-batches, schedule, "
                                                "recompute, layout); default: inferred from the trace where it can "
                                                "be, as predict does.")] = None,
    roof_target: Annotated[float | None, typer.Option("--roof-target", help="Price kernels below their roof at "
                                                      "this percent of it (default: what the run's best op of "
                                                      "the same bound, compute or memory, reaches).")] = None,
    json: JsonOption = False,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """Ranked findings: what was measured (view and numbers), a concrete change, and the gain whatif (or, with
    --config, the estimator) predicts for it with its error bar."""
    import polars as pl

    from traceana.analyses.breakdown import named_step, resolve_step
    from traceana.model import advise as model

    with store.connect(db, read_only=True) as con:
        rid = store.open_run(con, run)
        chosen, found = model.findings(con, rid, resolve_step(con, rid, step), str(config) if config else None,
                                       roof_target)
    which = named_step(chosen, step)
    frame, checked = model.split(found)
    if json:
        emit_json({"run_id": rid, "step": chosen, "findings": frame.to_dicts(), "checked_no_gain": checked.to_dicts()})
        return
    for row in checked.iter_rows(named=True):
        typer.echo(f"checked, no gain: {row['finding']} ({row['change']}): predicted step "
                   f"{row['predicted_step_ms']:,.3f} ms [{row['low']:,.3f}, {row['high']:,.3f}] "
                   f"({100 * row['level']:.0f}%)", err=True)
    if frame.is_empty():
        typer.echo(f"{rid}: {which}: no finding above the thresholds (idle > 20%, a dim's wait > 5%, COMP > 5% "
                   "above the group's median)")
        return
    level = f"{100 * frame['level'][0]:.0f}%"
    shown = frame.select("finding", "change").with_columns(
        pl.Series(f"{value} [{level}]", with_intervals(*(frame[c].to_list() for c in (value, low, high))))
        for value, low, high in (("gain_ms", "gain_low_ms", "gain_high_ms"), ("predicted_step_ms", "low", "high")))
    emit(shown, title=f"{rid}: {which} ({float(frame['measured_step_ms'][0]):,.3f} ms), findings by the lower "
                      "end of their gain")
    for row in frame.iter_rows(named=True):
        typer.echo(f"- {row['finding']}: {row['evidence']} ({row['graph']})")


def predict(
    run: RunArgument = None,
    config: Annotated[Path | None, typer.Option("--config", help="The estimator YAML that describes RUN (its "
                                                "layout, micro-batches, schedule); default: inferred from the trace "
                                                "(layout, device, model from the recorded shapes), said in the "
                                                "notes.")] = None,
    to: Annotated[Path | None, typer.Option("--to", help="The estimator YAML of the configuration to predict.")]
    = None,
    changes: Annotated[list[str] | None, typer.Option("--set", help="KEY=VALUE: predict --config with this key "
                                                      "changed (parallel.micro_batch=8; repeat for several), or "
                                                      "--to's config with it.")] = None,
    json: JsonOption = False,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """Predict another configuration of the same job from the measured run: each measured part times the
    estimator's ratio, the pipeline by the target's schedule; per dim the run, the prediction with its error bar,
    and the estimator alone, with notes on what the trace could not inform."""
    import polars as pl

    from traceana.analyses.job import configs
    from traceana.model import predict as model
    from traceana.model.compare import NOISE_MS

    if to is None and not changes:
        raise TraceanaError("predict needs the target: --to CFG_B, or --set KEY=VALUE changes to the run's config")
    with store.connect(db, read_only=True) as con:
        rid = store.open_run(con, run)
        source, target, inferred = configs(con, rid, config, to, changes or [])
        with progress(None, "predicting") as advance:
            result = model.predict(con, rid, source, target)
            advance("done")
    notes = inferred + result.notes
    config = config or Path(f"{rid}'s inferred config")
    to = to or Path(f"{config.name} with {', '.join(changes or [])}")
    if json:
        emit_json({"run_id": rid, "config": str(config), "target": str(to), "step": result.step.to_dicts(),
                   "stages": result.stages.to_dicts(), "memory": result.memory, "schedule": result.schedule,
                   "interval": result.interval.to_json(), "notes": notes})
        return
    numbers = ("measured_A_ms", "predicted_B_ms", "estimated_B_ms")
    shown = (pl.col("dim").is_in(("COMP", "TOTAL"))
             | pl.any_horizontal(pl.col(numbers).fill_null(0).abs() > NOISE_MS))  # dims zero on every side left out
    columns = ("dim", *numbers[:2], "low", "high", "estimated_B_ms", "source")
    emit(result.step.filter(shown).select(columns),
         title=f"{rid} ({config.name}) → {to.name}: typical step, mean over stages (ms)")
    if target.parallel.pp > 1:
        emit(result.stages.filter(shown).select("stage", *numbers[:2], "error_bar_ms", "estimated_B_ms"),
             title="per pipeline stage (ms)")
    mem = result.memory
    bar = f" ± {mem['error_bar_MiB']:,.1f}" if mem["error_bar_MiB"] is not None else ""
    if mem["predicted_B_MiB"] is not None:
        alone = f", estimator {mem['estimated_B_MiB']:,.1f} MiB" if mem["estimated_B_MiB"] is not None else ""
        typer.echo(f"peak memory: predicted {mem['predicted_B_MiB']:,.1f}{bar} MiB ({mem['source']}){alone}")
    for line in notes:
        typer.echo(f"note: {line}")
