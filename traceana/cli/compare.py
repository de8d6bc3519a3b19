"""`traceana compare`: estimate versus measured for one run, or a sweep of runs / measured CSV rows, and --fit; the
estimate is traceana's (--estimate CFG) or any estimator's predictions file (--predicted FILE), through the same
tables, statistics and seed 000 diagnosis."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from traceana import store
from traceana.cli.options import DbOption, JsonOption, plot_option
from traceana.errors import TraceanaError
from traceana.render.console import emit, emit_json, progress

if TYPE_CHECKING:  # imported where used: the CLI's fixed cost stays small (`traceana --help` loads no Polars)
    import polars as pl

    from traceana.estimator import config
    from traceana.estimator.estimate import Estimate
    from traceana.model import compare_fit, sweep
    from traceana.model.compare import RunComparison

BIG_SWEEP = 30  # rows: beyond this the text output lists only the worst rows (--json has them all)


def compare(
    estimate: Annotated[Path | None, typer.Option("--estimate", help="Job YAML to estimate; its `runs:` list, if "
                                                  "any, makes a sweep (a run id each, with the overrides that run "
                                                  "used).")] = None,
    predicted: Annotated[Path | None, typer.Option("--predicted", help="Another estimator's predictions instead "
                                                   "(CSV, JSON or Parquet: run, stage, COMP_ms ... TOTAL_ms, "
                                                   "peak_memory_mb), stored as estimates <file>:<run>.")] = None,
    runs: Annotated[list[str] | None, typer.Argument(help="Run ids (default: the config's runs:, the file's runs, "
                                                     "else the latest run). Several make a sweep.",
                                                     show_default=False)] = None,
    measured: Annotated[Path | None, typer.Option("--measured", help="CSV of configuration and measured columns "
                                                  "(e.g. ../shared/validation/*.csv): a sweep over its rows.")] = None,
    plot: Annotated[Path | None, plot_option("estimated vs measured")] = None,
    fit: Annotated[bool, typer.Option("--fit", help="Fit the calibration block on every other row, report the "
                                      "error on the rows held out.")] = False,
    write_calibration: Annotated[Path | None, typer.Option("--write-calibration", help="Write the fitted values as "
                                                           "YAML config sections (implies --fit).")] = None,
    json: JsonOption = False,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """Estimate versus measured: per dimension and pipeline stage for one run; Pearson r, Spearman ρ and MAPE per
    quantity over a sweep, and seed 000's diagnosis (a bias with one parallel size, inverted rank order, wrong
    units); --fit calibrates on half the rows and scores the other half."""
    from traceana.estimator import config
    from traceana.model import sweep

    fit = fit or write_calibration is not None
    if (estimate is None) == (predicted is None):
        raise TraceanaError("give --estimate CFG or --predicted FILE (one of them)")
    if predicted is not None:
        if measured is not None or fit:
            raise TraceanaError("--measured and --fit go with --estimate (they estimate configs); --predicted "
                                "compares a file's numbers with stored runs")
        _predicted(predicted, runs, db, plot, json)
        return
    assert estimate is not None
    if measured is not None and runs:
        raise TraceanaError("give run ids or --measured CSV, not both")
    if measured is not None:
        base = config.load(estimate)
        rows, notes = sweep.read_csv(measured, base)
        title = f"{measured.name} vs {estimate.name}"
    elif sweep.has_runs(estimate):
        entries = sweep.load_runs(estimate)
        if runs:
            known = {e.name for e in entries}
            unknown = [r for r in runs if r not in known]
            if unknown:
                raise TraceanaError(f"{estimate}: runs: has no entry {unknown[0]!r} (entries: {', '.join(known)})")
            entries = [e for e in entries if e.name in runs]
        rows, notes, base = _traced(entries, db), [], entries[0].config
        title = f"{estimate.name} runs"
    else:
        base = config.load(estimate)
        if not runs or len(runs) == 1:
            _one_run(base, estimate, runs[0] if runs else None, db, plot, fit, write_calibration, json)
            return
        rows, notes = _traced([config.Run(r, base, {}) for r in runs], db), []
        title = f"runs {', '.join(runs)} vs {estimate.name}"
    _sweep(rows, notes, base, title, plot, fit, write_calibration, json)


def _traced(entries: list[config.Run], db: Path) -> list[sweep.Row]:
    """Sweep rows of ``entries``, opening the store only when some entry is measured there."""
    from traceana.model import sweep

    if all(e.measured for e in entries):
        return sweep.traced_rows(None, entries)
    with store.connect(db, read_only=True) as con:
        return sweep.traced_rows(con, entries)


def _one_run(cfg: config.Config, cfg_path: Path, run: str | None, db: Path, plot: Path | None, fit: bool,
             write_calibration: Path | None, json: bool) -> None:
    from traceana.analyses import breakdown as bd
    from traceana.estimator import config
    from traceana.estimator.estimate import estimate as run_estimate
    from traceana.model import compare_fit, sweep
    from traceana.model.compare import compare_run

    est = run_estimate(cfg)
    with store.connect(db, read_only=True) as con:
        run_id = store.open_run(con, run)
        result = compare_run(con, run_id, est)
        which = bd.which_step(con, run_id, None)
        fitted = _fit(sweep.traced_rows(con, [config.Run(run_id, cfg, {})])) if fit else None
        after = compare_run(con, run_id, run_estimate(compare_fit.apply(fitted.values, cfg))) if fitted else None
    _show_run(result, cfg_path, "config", which, plot, json, fitted, after, _step(est, result))
    _finish(fitted, write_calibration, cfg, f"run {run_id}", plot)


def _predicted(path: Path, runs: list[str] | None, db: Path, plot: Path | None, json: bool) -> None:
    """--predicted: check the file against the store, store it as estimates, compare one run or sweep them all."""
    from traceana.analyses import breakdown as bd
    from traceana.model import predicted as pr

    with store.connect(db, read_only=True) as con:
        predictions = pr.load(con, path, runs)
    pr.write(db, predictions)
    typer.echo(f"stored {len(predictions.runs)} estimate(s) {predictions.estimate_id('RUN')} in {db} "
               f"(tables estimate_runs, estimate_stages)", err=True)
    with store.connect(db, read_only=True) as con:
        if len(predictions.runs) > 1:
            rows = pr.sweep_rows(con, predictions)
        else:
            (run_id,) = predictions.runs
            result, which = pr.compare(con, predictions, run_id), bd.which_step(con, run_id, None)
    if len(predictions.runs) > 1:
        _sweep(rows, predictions.notes, None, f"runs vs {path.name}", plot, False, None, json, estimator="predicted")
    else:
        _show_run(result, path, "predicted", which, plot, json)
        _finish(None, None, None, f"run {run_id}", plot)


def _step(est: Estimate, result: RunComparison) -> dict[str, Any]:
    """The estimated step with its interval (the estimator's own error on the published runs of the config's
    hardware profile) and whether the run's measured step (TOTAL, mean over ranks) lies inside; without such runs,
    why there is none."""
    import polars as pl

    from traceana.model.intervals import UNVALIDATED, from_scratch

    cfg = est.config
    measured = float(result.by_dimension.filter(pl.col("dim") == "TOTAL")["measured_ms"][0])
    interval = from_scratch(est.step_s * 1e3, cfg.profile.name if cfg.profile else None)
    if interval is None:
        return {"estimated_ms": est.step_s * 1e3, "measured_ms": measured,
                "interval": UNVALIDATED.format(device=cfg.hardware.device)}
    return {"estimated_ms": interval.value, "low": interval.low, "high": interval.high, "level": interval.level,
            "measured_ms": measured, "inside": interval.low <= measured <= interval.high, "sources": interval.sources}


def _show_run(result: RunComparison, source: Path, key: str, which: str, plot: Path | None, json: bool,
              fitted: compare_fit.Fit | None = None, after: RunComparison | None = None,
              step: dict[str, Any] | None = None) -> None:
    """One run's comparison with the estimate of ``source`` (named under ``key`` in --json): tables, plot, JSON;
    ``step``: traceana's estimate's step interval (:func:`_step`)."""
    import polars as pl

    from traceana.model import diagnose

    if plot is not None:
        from traceana.render.compare_plot import run_scatter

        what = "fitted estimate" if after else "estimate"
        run_scatter(after or result, plot, f"{result.run_id}: {what} ({source.name}) vs measured, per stage",
                    before=result if after else None)
    diagnosis = diagnose.findings(result.by_dimension.select(
        row=pl.lit(result.run_id), quantity=pl.col("dim") + "_ms", measured="measured_ms", estimated="estimated_ms",
        est_over_measured="est_over_measured", error_pct="error_pct"))
    if json:
        emit_json({"run_id": result.run_id, key: str(source), **({"step": step} if step else {}), **_frames(result),
                   "notes": result.notes, "diagnosis": diagnosis.to_dicts(),
                   **({"fit": _fit_json(fitted)} if fitted else {})})
    else:
        _print_run(result, source, which)
        if step and "low" in step:
            typer.echo(f"step: estimated {step['estimated_ms']:,.3f} ms [{step['low']:,.3f}, {step['high']:,.3f}] "
                       f"({100 * step['level']:.0f}%, the estimator's error on {step['sources']['set_by']}), measured "
                       f"{step['measured_ms']:,.3f} ms: {'inside' if step['inside'] else 'OUTSIDE'}")
        elif step:
            typer.echo(f"step: estimated {step['estimated_ms']:,.3f} ms, measured {step['measured_ms']:,.3f} ms; "
                       f"interval {step['interval']}")
        _print_diagnosis(diagnosis)
        if fitted:
            _print_fit(fitted)


def _frames(result: RunComparison) -> dict[str, Any]:
    stages = result.straggler_stages
    return {
        "by_dimension": result.by_dimension.to_dicts(),
        "by_stage": None if result.by_stage is None else result.by_stage.to_dicts(),
        "straggler": None if stages is None else {"measured_stage": stages[0], "predicted_stage": stages[1],
                                                  "agree": stages[0] == stages[1],
                                                  "stages": result.straggler.to_dicts()},  # type: ignore[union-attr]
        "memory": None if result.memory is None else result.memory.to_dicts(),
    }


def _print_run(result: RunComparison, source: Path, which: str) -> None:
    what = f"{which}; measured mean over ranks, max the worst rank"
    emit(_labelled(result.by_dimension), title=f"{result.run_id} vs {source.name}: per dimension ({what})")
    if result.by_stage is not None:
        emit(_labelled(result.by_stage), title="per pipeline stage (measured: mean and max over the stage's ranks)")
    if result.straggler is not None:
        measured, predicted = result.straggler_stages  # type: ignore[misc]
        verdict = "agree" if measured == predicted else "DISAGREE"
        emit(result.straggler, title=f"straggler stage (largest COMP): measured {measured}, predicted {predicted} "
                                     f"- {verdict}")
    if result.memory is not None:
        emit(result.memory, title="peak memory per stage (measured: largest allocated bytes of each rank)")
    for note in result.notes:
        typer.echo(f"note: {note}", err=True)


def _labelled(frame: pl.DataFrame) -> pl.DataFrame:
    import polars as pl

    from traceana.analyses import breakdown as bd

    return frame.with_columns(pl.col("dim").replace("MP_WAIT", bd.label("MP_WAIT")))


def _fit(rows: list[sweep.Row]) -> compare_fit.Fit:
    from traceana.model import compare_fit

    with progress(None, "fitting") as advance:
        return compare_fit.fit(rows, advance)


def _sweep(rows: list[sweep.Row], notes: list[str], base: config.Config | None, title: str, plot: Path | None,
           fit: bool, write_calibration: Path | None, json: bool, estimator: str = "traceana") -> None:
    import polars as pl

    from traceana.model import compare_fit, diagnose, sweep

    frame = sweep.rows_frame(rows)
    stats = sweep.statistics(frame, estimator)
    diagnosis = diagnose.findings(frame, stats, rows, estimator)
    fitted = _fit(rows) if fit else None
    if plot is not None:
        from traceana.render.compare_plot import sweep_scatter

        if fitted:
            refit = sweep.rows_frame(rows, [compare_fit.apply(fitted.values, r.config) for r in rows])
            sweep_scatter(refit, plot, f"{title}: {len(rows)} rows, fitted estimates", before=frame)
        else:
            sweep_scatter(frame, plot, f"{title}: {len(rows)} rows")
    if json:
        emit_json({"title": title, "rows": frame.to_dicts(), "statistics": stats.to_dicts(), "notes": notes,
                   "diagnosis": diagnosis.to_dicts(), **({"fit": _fit_json(fitted)} if fitted else {})})
    else:
        shown = frame if len(rows) <= BIG_SWEEP else frame.sort(pl.col("error_pct").abs(), descending=True,
                                                                nulls_last=True).head(15)
        which = "" if shown is frame else f" (the 15 worst of {frame.height}; --json lists all)"
        emit(shown, title=f"{title}: estimated vs measured per row{which}")
        emit(stats, title="per quantity: Pearson r, Spearman ρ, mean absolute % error, worst row")
        _print_diagnosis(diagnosis)
        if fitted:
            _print_fit(fitted)
        for note in notes:
            typer.echo(f"note: {note}", err=True)
    _finish(fitted, write_calibration, base, title, plot)


def _print_diagnosis(diagnosis: pl.DataFrame) -> None:
    """Findings as lines, not a table: each is a sentence."""
    if diagnosis.height:
        typer.echo("diagnosis (seed 000's checks: a bias with one parallel size, inverted rank order, units):")
        for d in diagnosis.iter_rows(named=True):
            typer.echo(f"  {d['estimator']} {d['quantity']}, {d['kind']}: {d['finding']}")


def _print_fit(fitted: compare_fit.Fit) -> None:
    emit(fitted.knobs, title=f"--fit: knobs by least squares ({fitted.trials} trial steps, squared residuals "
                             f"{fitted.cost_before:.4g} -> {fitted.cost_after:.4g})")
    emit(fitted.in_sample, title=f"in-sample residuals on the {len(fitted.fit_rows)} fit rows (not accuracy): "
                                 f"{_listing(fitted.fit_rows)}")
    if fitted.held_out is None:
        typer.echo("no held-out rows (a single row was fitted), so no accuracy can be claimed")
    else:
        emit(fitted.held_out, title=f"held-out accuracy on the {len(fitted.held_out_rows)} rows not fitted: "
                                    f"{_listing(fitted.held_out_rows)}")


def _listing(labels: list[str]) -> str:
    return ", ".join(labels) if len(labels) <= 12 else f"{', '.join(labels[:6])}, ... {labels[-1]} (every other row)"


def _fit_json(fitted: compare_fit.Fit) -> dict[str, Any]:
    return {"fit_rows": fitted.fit_rows, "held_out_rows": fitted.held_out_rows, "trial_steps": fitted.trials,
            "squared_residuals_before": fitted.cost_before, "squared_residuals_after": fitted.cost_after,
            "knobs": fitted.knobs.to_dicts(), "in_sample": fitted.in_sample.to_dicts(),
            "held_out": None if fitted.held_out is None else fitted.held_out.to_dicts()}


def _finish(fitted: compare_fit.Fit | None, write_calibration: Path | None, base: config.Config | None,
            source: str, plot: Path | None) -> None:
    from traceana.model import compare_fit

    if fitted is not None and write_calibration is not None and base is not None:
        header = (f"calibration fitted by `traceana compare --fit` on {source}\nfit rows: "
                  f"{_listing(fitted.fit_rows)}\nheld out: {_listing(fitted.held_out_rows) or 'none'}")
        try:
            write_calibration.write_text(compare_fit.calibration_yaml(fitted, base, header))
        except OSError as exc:
            raise TraceanaError(f"--write-calibration {write_calibration}: cannot write ({exc.strerror})") from None
        typer.echo(f"wrote {write_calibration}", err=True)
    if plot is not None:
        typer.echo(f"wrote {plot}", err=True)
