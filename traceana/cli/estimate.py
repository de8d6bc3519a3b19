"""`traceana estimate` and `traceana search`: thin commands over estimator.estimate and estimator.search."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from traceana.cli.options import JsonOption, plot_option, top_count
from traceana.render.console import emit, emit_json, progress

if TYPE_CHECKING:  # imported where used: the CLI's fixed cost stays small
    from traceana.estimator.estimate import Estimate

ConfigArgument = Annotated[Path, typer.Argument(help="Job YAML (model, parallel, schedule, hardware, calibration).")]


def _summary(est: Estimate) -> dict[str, object]:
    from traceana.estimator import memory
    from traceana.estimator.estimate import model_flops, utilization
    from traceana.model.intervals import UNVALIDATED, from_scratch

    cfg = est.config
    worst = max(est.stages, key=lambda s: s.memory.peak)
    reserved, used = memory.reserved_and_used(cfg, est.chunks, [s.memory.peak for s in est.stages])[worst.stage]
    interval = from_scratch(est.step_s * 1e3, cfg.profile.name if cfg.profile else None)
    return {
        "step_ms": est.step_s * 1e3,
        **({"low": interval.low, "high": interval.high, "level": interval.level, "sources": interval.sources}
           if interval else {"interval": UNVALIDATED.format(device=cfg.hardware.device)}),
        "mfu": model_flops(cfg) / (est.step_s * cfg.parallel.world_size * cfg.hardware.peak_tflops_bf16 * 1e12),
        "utilization": utilization(est),
        "hardware_profile": None if cfg.profile is None else {"name": cfg.profile.name, "source": cfg.profile.source},
        "tokens_per_s": cfg.parallel.global_batch * cfg.model.seq_len / est.step_s,
        "world_size": cfg.parallel.world_size,
        "layout": cfg.parallel.layout.spec,
        "schedule": cfg.schedule.kind,
        "micro_batches": cfg.micro_batches,
        "stage_layers": [s.layers for s in est.stages],
        "peak_memory_gib": worst.memory.peak / memory.GIB,  # allocated (torch.cuda.max_memory_allocated)
        "peak_reserved_gib": reserved / memory.GIB,
        "peak_used_gib": used / memory.GIB,
        "peak_stage": worst.stage,
        "fits": est.fits,
    }


def estimate(
    cfg_path: ConfigArgument,
    plot: Annotated[Path | None, plot_option("a Gantt chart of the simulated step")] = None,
    trace: Annotated[Path | None, typer.Option(help="Write the simulated step as Chrome-trace JSON (Perfetto).")]
    = None,
    json: JsonOption = False,
    db: Annotated[Path | None, typer.Option("--db", help="Also store the estimate in this DuckDB file.")] = None,
    estimate_id: Annotated[str | None, typer.Option(help="Id in the store (default: the config file's name).")]
    = None,
) -> None:
    """Predict one training step: per-stage time by dimension (ms) and memory by component (GiB)."""
    from traceana.estimator import config, record, timeline
    from traceana.estimator.estimate import estimate as run_estimate

    cfg = config.load(cfg_path)
    est = run_estimate(cfg)
    summary = _summary(est)
    if plot is not None:
        timeline.plot(est, plot)
    if trace is not None:
        timeline.chrome_trace(est, trace)
    if db is not None:
        record.write(db, estimate_id or re.sub(r"\.ya?ml$", "", cfg_path.name), cfg_path, est)
    if json:
        emit_json({**summary, "stages": est.time_frame.to_dicts(), "memory": est.memory_frame.to_dicts()})
    else:
        _print(cfg_path, est, summary)
    for written in (plot, trace):
        if written is not None:
            typer.echo(f"wrote {written}", err=True)


def _print(cfg_path: Path, est: Estimate, summary: dict[str, object]) -> None:
    cfg = est.config
    emit(est.time_frame.rename({"mp_wait_ms": "mp_wait_ms (TP)"}), title=f"{cfg_path.name}: time per stage (ms)")
    emit(est.memory_frame, title=f"{cfg_path.name}: memory per stage (GiB)")
    fits = "fits" if est.fits else f"does NOT fit {cfg.hardware.hbm_gb:g} GiB"
    bounds = (f" [{summary['low']:,.1f}, {summary['high']:,.1f}] ({100 * summary['level']:.0f}%: the estimator's "
              f"error on {summary['sources']['n_groups']} published {summary['sources']['profile']} runs)"
              if "low" in summary else "")
    typer.echo(f"step {summary['step_ms']:,.1f} ms{bounds}, MFU {summary['mfu']:.1%}, {summary['tokens_per_s']:,.0f} "
               f"tokens/s; peak {summary['peak_memory_gib']:.1f} GiB allocated ({summary['peak_reserved_gib']:.1f} "
               f"reserved, {summary['peak_used_gib']:.1f} used) on stage {summary['peak_stage']} ({fits})")


def search(
    cfg_path: ConfigArgument,
    top: Annotated[int, typer.Option("--top", help="How many of the fastest layouts to show.",
                                     callback=top_count)] = 10,
    json: JsonOption = False,
) -> None:
    """Rank the layouts (tp, cp, pp, dp, ep, vpp, micro-batch, recompute, schedule, partition) of the config's
    device count that fit in memory, by estimated step time."""
    from traceana.estimator import config
    from traceana.estimator import search as searching

    cfg = config.load(cfg_path)
    with progress(None, "searching") as advance:
        result = searching.search(cfg, top, advance)
    table = result.frame()
    if json:
        emit_json({"candidates": result.candidates, "fitting": result.fitting, "simulated": result.simulated,
                   "seconds": result.seconds, "top": table.to_dicts()})
        return
    emit(table, title=f"{cfg_path.name}: fastest of {result.fitting:,} fitting layouts "
                      f"({result.candidates:,} candidates, {result.simulated:,} simulated, {result.seconds:.1f} s)")
