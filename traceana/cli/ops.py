"""`traceana ops`: a step's device time by what launched it (traceana/analyses/ops.py over view op_time)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from traceana import store
from traceana.cli.breakdown import MedianStepOption
from traceana.cli.options import DbOption, JsonOption, RunArgument, top_count
from traceana.errors import TraceanaError
from traceana.render.console import emit, emit_json, plot_path


def ops(
    run: RunArgument = None,
    by: Annotated[str, typer.Option("--by", help="op (outermost CPU op; Ascend: the operator), module (nn.Module "
                                    "path), layer (a module or NVTX range with a layer index) or nvtx (nsys).")]
    = "op",
    step: MedianStepOption = None,
    top: Annotated[int, typer.Option("--top", help="How many rows; the rest are summed into one row.",
                                     callback=top_count)] = 20,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write the rows as stacked bars to this PNG.",
                                              callback=plot_path)] = None,
    json: JsonOption = False,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """Device time by op, module, layer or NVTX range: each row's COMP and exposed communication by dim (ms per
    rank-step), its kernels and share of the step; the rows add up to the breakdown's COMP and waits, "(none)"
    holding what was launched outside any."""
    from traceana.analyses.ops import attribute

    if step is not None and step != "median" and not step.lstrip("-").isdigit():
        raise TraceanaError(f"--step {step!r}: give a step number or 'median'")
    with store.connect(db, read_only=True) as con:
        rid = store.open_run(con, run)
        result = attribute(con, rid, by, None if step is None else step if step == "median" else int(step), top)
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
