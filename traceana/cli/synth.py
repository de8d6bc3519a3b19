"""`traceana synth`: write a synthetic run's per-rank traces (OUT/traces/) and its ground truth (OUT/truth.json)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from traceana.errors import TraceanaError
from traceana.render.console import progress

if TYPE_CHECKING:
    import polars as pl

    from traceana.synth.schedule import Plan

FORMATS = ("kineto", "nsys", "ascend")
# Bytes one device op takes in each format's files (measured: the example config's 8 ranks, one step, 1,376 ops:
# 1.32 MB of Kineto JSON, 0.78 MB of nsys exports, 0.46 MB of Ascend output), and in memory while its stage's
# ranks are replayed (the plan's arrays and the frames built of them, generously).
FILE_BYTES_PER_OP = {"kineto": 960, "nsys": 570, "ascend": 340}
MEMORY_BYTES_PER_OP = 256


def synth(
    config: Annotated[Path, typer.Argument(help="Estimator job YAML (model, parallel, hardware, schedule ...).")],
    out: Annotated[Path, typer.Argument(help="Folder to write (created; must be empty or absent).")],
    ranks: Annotated[int | None, typer.Option(help="World size (scales dp; default: the config's).")] = None,
    steps: Annotated[int, typer.Option(help="Training steps per rank.")] = 3,
    fmt: Annotated[str, typer.Option("--format", help="kineto, nsys or ascend.")] = "kineto",
    seed: Annotated[int, typer.Option(help="RNG seed: the same seed writes the same files.")] = 0,
    jitter: Annotated[float, typer.Option(help="Relative std of kernel and transfer lengths.")] = 0.03,
    kernel_us: Annotated[float, typer.Option(help="Typical compute kernel length, µs (sets the event count).")] = 200.0,
    rounds: Annotated[int, typer.Option(help="Compute / communication alternations per pass.")] = 4,
    ranks_per_host: Annotated[int, typer.Option(help="GPUs per host (one clock per host).")] = 8,
    host_skew_us: Annotated[float, typer.Option(help="Host clock offsets drawn in ±this, µs (host 0: 0).")] = 2000.0,
    device_skew_us: Annotated[float, typer.Option(help="Per-device offsets within a host, ±µs.")] = 0.0,
    straggler_rank: Annotated[int | None, typer.Option(help="This rank's compute is slowed.")] = None,
    straggler_stage: Annotated[int | None, typer.Option(help="This pipeline stage's compute is slowed.")] = None,
    slowdown: Annotated[float, typer.Option(help="The straggler's compute-time factor.")] = 1.3,
    pg_metadata: Annotated[str, typer.Option(help="full (pg_config + PG args), args (PG args only) or none.")] = "full",
    compress: Annotated[bool, typer.Option("--gzip", help="Kineto: write .json.gz (slower).")] = False,
    comm_scale: Annotated[list[str] | None, typer.Option(
        help="DIM=FACTOR: that dim's transfers take FACTOR x as long (TP=2: half the TP bandwidth); repeat or "
             "comma-separate for several dims. The same seed draws the same compute jitter.")] = None,
) -> None:
    """Synthesize per-rank traces of the estimator's simulated schedule, with the ground truth beside them."""
    from traceana.synth import schedule, truth

    if fmt not in FORMATS:
        raise TraceanaError(f"--format {fmt!r}: choose {', '.join(FORMATS)}")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TraceanaError(f"{out}: exists and is not an empty folder")
    options = schedule.Options(
        ranks=ranks, steps=steps, seed=seed, jitter=jitter, kernel_us=kernel_us, rounds=rounds,
        ranks_per_host=ranks_per_host, host_skew_us=host_skew_us, device_skew_us=device_skew_us,
        straggler_rank=straggler_rank, straggler_stage=straggler_stage, slowdown=slowdown, pg_metadata=pg_metadata,
        comm_scale=schedule.comm_scale(comm_scale or []))
    from traceana.estimator import config as estimator_config

    cfg = estimator_config.load(str(config))
    _check_room(*schedule.expected_ops(cfg, options), out, fmt)
    plan = schedule.build(cfg, options)
    writer = _writer(fmt)
    traces = out / "traces"
    traces.mkdir(parents=True, exist_ok=True)
    began, rows, events, written = time.perf_counter(), [], 0, 0
    with progress(plan.world, "writing") as advance:
        for trace in plan.stage_traces():
            path = writer(plan, trace, traces, compress) if fmt == "kineto" else writer(plan, trace, traces)
            rows.append(truth.breakdown(trace))
            events += trace.ops.height
            written += sum(p.stat().st_size for p in (path.rglob("*") if path.is_dir() else [path]) if p.is_file())
            advance(f"rank {trace.rank}")
    _write_truth(plan, out / "truth.json", rows, fmt)
    seconds = time.perf_counter() - began
    typer.echo(f"{traces}: {fmt}, {plan.world} ranks x {steps} steps, {events:,} device ops, {written / 1e6:,.1f} MB "
               f"in {seconds:.1f} s; ground truth in {out / 'truth.json'}")


def _check_room(ops: int, stage_ops: int, out: Path, fmt: str) -> None:
    """Refuse, before any work, a run whose files would not fit on the disk ``out`` is on, or whose largest stage
    would not fit in this machine's memory (--ranks 4000000 ran 59 s into a MemoryError; --kernel-us 1e-9 and
    --steps 10^9 ran out of memory), with the estimate in the message."""
    import os
    import shutil

    files, memory = ops * FILE_BYTES_PER_OP[fmt], stage_ops * MEMORY_BYTES_PER_OP
    disk = next(p for p in (out.resolve(), *out.resolve().parents) if p.exists())
    free, ram = shutil.disk_usage(disk).free, os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    size = f"about {ops:,} device ops, {files / 1e9:,.1f} GB of {fmt} files"
    if files > free:
        raise TraceanaError(f"{out}: {size}, and {disk} has {free / 1e9:,.1f} GB free; fewer --ranks or --steps, "
                            "or a longer --kernel-us")
    if memory > ram:
        raise TraceanaError(f"{out}: {size}, {memory / 1e9:,.1f} GB in memory while a stage is written, and this "
                            f"machine has {ram / 1e9:,.1f} GB; fewer --ranks or --steps, or a longer --kernel-us")


def _writer(fmt: str) -> Callable[..., Path]:
    """The format module's write_rank."""
    from importlib import import_module

    return import_module(f"traceana.synth.{fmt}").write_rank


def _write_truth(plan: Plan, path: Path, rows: list[pl.DataFrame], fmt: str) -> None:
    """The ground truth: options, layout, hosts and clock offsets, process groups, straggler, step starts and per
    rank and step times (ns, DESIGN §4 columns, on the true timeline), and the estimator's per-stage figures (ms)."""
    import polars as pl

    from traceana.synth.schedule import DIMS

    steps = pl.concat(rows).sort("rank", "step")
    o = plan.options
    coords = plan.coords
    reference = plan.host_offsets_ns[plan.host_of(0)]
    data = {
        "format": fmt,
        "config": plan.cfg.source,
        "options": {k: getattr(o, k) for k in o.__dataclass_fields__},
        "world_size": plan.world,
        "layout": plan.layout.spec,
        "step_ns": plan.step_ns,
        "step_starts_ns": plan.coupling.step_starts_ns.tolist(),
        "straggler": {"rank": o.straggler_rank, "stage": o.straggler_stage, "slowdown": o.slowdown},
        "hosts": {f"node{h:04d}": off for h, off in enumerate(plan.host_offsets_ns)},
        "ranks": [{"rank": r, "host": f"node{plan.host_of(r):04d}", "device": r % o.ranks_per_host,
                   **{d: int(coords[r, i]) for i, d in enumerate(("tp", "cp", "ep", "dp", "pp"))},
                   "host_offset_ns": plan.host_offsets_ns[plan.host_of(r)],
                   "device_offset_ns": plan.device_offsets_ns[r],
                   # what an ingester should put in ranks.clock_offset_ns when it aligns hosts to rank 0's host
                   "expected_host_alignment_ns": reference - plan.host_offsets_ns[plan.host_of(r)]}
                  for r in range(plan.world)],
        "process_groups": plan.process_groups(),
        "dims": list(DIMS),
        "steps": steps.to_dict(as_series=False),
        "estimate_ms": plan.estimate_ms.to_dict(as_series=False),
    }
    path.write_text(json.dumps(data, indent=1))
