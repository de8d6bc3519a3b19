"""`traceana calibrate`: the config's hardware profile updated by what a run's trace measured
(traceana.model.calibrate), shown or written as YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from traceana import store
from traceana.cli.options import DbOption, JsonOption
from traceana.render.console import emit, emit_json


def calibrate(
    run_id: Annotated[str, typer.Argument(help="Run id in the store (a Kineto trace; record_shapes=True adds "
                                               "GEMM times by shape).")],
    cfg_path: Annotated[Path, typer.Option("--config", help="The job's YAML (its model, batches and hardware "
                                                            "profile: the prior the trace updates).")],
    db: DbOption = Path(store.DEFAULT_DB),
    write: Annotated[Path | None, typer.Option("--write", help="Write the updated profile YAML here (use it as "
                                                                "hardware.profile: FILE).")] = None,
    json: JsonOption = False,
) -> None:
    """Update the config's hardware profile from a run's trace: GEMM time by shape (µs) where the trace measured
    it, memory-bound and optimizer efficiency, host time per layer and per step (µs), idle per layer, link
    bandwidth (GB/s) and overlap per dim, each with its spread and samples; --write saves it for `estimate`."""
    import polars as pl

    from traceana.estimator import config
    from traceana.model import calibrate as trace_profile

    cfg = config.load(cfg_path)
    result = trace_profile.measure(db, run_id, cfg)
    if write is not None:
        trace_profile.write(result, write, f"hardware profile updated by `traceana calibrate {run_id}` with "
                                           f"{cfg_path.name} from its prior "
                                           f"({cfg.profile.name if cfg.profile else 'no profile'})\n"
                                           f"sources: the run's traces in {db}")
        typer.echo(f"wrote {write}", err=True)
    fits = pl.DataFrame([{"name": f.name, "value": f.value, "unit": f.unit, "spread": f.spread,
                          "samples": f.samples, "from": f.source} for f in result.fits])
    if json:
        emit_json({"fits": fits.to_dicts(), "gemms": result.gemms.to_dicts(), "steps": result.steps.to_dicts(),
                   "links": result.links.to_dicts(), "dims": result.dims.to_dicts(), "notes": result.notes})
        return
    emit(fits, title=f"{run_id}: fitted values (spread: half the 10-90% range over the samples)")
    if not result.gemms.is_empty():
        emit(result.gemms, title=f"{run_id}: matrix products by shape (median kernel µs)")
    emit(result.steps, title=f"{run_id}: per step (ms)")
    if not result.dims.is_empty():
        emit(result.dims, title=f"{run_id}: communication per dim (bus GB/s, overlapped share)")
    if result.links.is_empty():
        typer.echo("no all-reduce of 1 MiB or more: link bandwidths left as configured")
    else:
        emit(result.links, title=f"{run_id}: all-reduce bus bandwidth (GB/s)")
    for note in result.notes:
        typer.echo(f"note: {note}")
