"""`traceana calibrate`: a hardware profile from a run's trace (traceana.model.calibrate), shown or written as YAML."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from traceana import store
from traceana.cli.options import DbOption, JsonOption
from traceana.render.console import emit, emit_json


def calibrate(
    run_id: Annotated[str, typer.Argument(help="Run id in the store (a Kineto trace recorded with record_shapes).")],
    cfg_path: Annotated[Path, typer.Option("--config", help="The job's YAML (its model, batches and hardware).")],
    db: DbOption = Path(store.DEFAULT_DB),
    write: Annotated[Path | None, typer.Option("--write", help="Write the profile YAML here (use it as "
                                                                "hardware.profile: FILE).")] = None,
    json: JsonOption = False,
) -> None:
    """Measure a hardware profile from a run's trace: GEMM time by shape (µs), host time per layer, link
    bandwidth (GB/s); --write saves it for `estimate` and `compare`."""
    import polars as pl

    from traceana.estimator import config
    from traceana.model import calibrate as trace_profile

    cfg = config.load(cfg_path)
    result = trace_profile.measure(db, run_id, cfg)
    if write is not None:
        trace_profile.write(result, write, f"hardware profile measured by `traceana calibrate {run_id}` with "
                                           f"{cfg_path.name}\nsources: the run's traces in {db}")
        typer.echo(f"wrote {write}", err=True)
    host = pl.DataFrame({"host_us_per_layer": [result.host_us_per_layer],
                         "host_us_per_backward_layer": [result.host_us_per_backward_layer],
                         "host_busy_ms_per_step": [float(result.host["host_busy_ms"].mean())]})
    if json:
        emit_json({"gemms": result.gemms.to_dicts(), "host": host.to_dicts()[0], "steps": result.host.to_dicts(),
                   "links": result.links.to_dicts()})
        return
    emit(result.gemms, title=f"{run_id}: matrix products by shape (median kernel µs)")
    emit(result.host, title=f"{run_id}: host time per step (ms)")
    emit(host, title=f"{run_id}: host time per layer (µs)")
    if result.links.is_empty():
        typer.echo("no all-reduce of 1 MiB or more: link bandwidths left as configured")
    else:
        emit(result.links, title=f"{run_id}: all-reduce bus bandwidth (GB/s)")
