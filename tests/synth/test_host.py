"""The synthesizer's host side: launches run ahead of the device at a fixed pace and block only at each step's
cudaDeviceSynchronize, written as Kineto and Nsight Systems write it. Launches and syncs are checked exactly (ns):
the writers state ns exactly (Kineto's µs with three decimals)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from typer.testing import CliRunner

from tests.conftest import ROOT
from traceana.cli.main import app
from traceana.errors import TraceanaError
from traceana.synth import schedule

CONFIG = ROOT / "examples" / "synth_gpt_tp2pp2.yaml"
US = 1_000


def synth(out: Path, *args: object) -> None:
    result = CliRunner().invoke(app, ["synth", str(CONFIG), str(out), "--ranks", "8", "--steps", "3",
                                      *map(str, args)])
    assert result.exit_code == 0, result.output


def ns(us: float) -> int:
    return round(us * 1000)


def test_kineto_host_runs_ahead_and_syncs_at_each_step_end(tmp_path: Path) -> None:
    """Rank 4 (stage 1, which waits for its first activation each step): every launch at least 5 µs before its
    kernel; the main thread's launches 10 µs apart within a step, whatever the device does (none late at the
    default options); one cudaDeviceSynchronize per step after its last launch, returning 2 µs after the device
    work launched before it ends, inside its ProfilerStep and before the next one opens."""
    synth(tmp_path / "run")
    path = next((tmp_path / "run" / "traces").glob("*_100004.*.json"))
    events = pl.DataFrame([e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"],
                          infer_schema_length=None)
    events = events.with_columns(pl.col("ts").map_elements(ns, return_dtype=pl.Int64),
                                 pl.col("dur").map_elements(ns, return_dtype=pl.Int64),
                                 pl.col("args").struct.field("correlation").alias("corr"))
    kernels = events.filter(pl.col("cat") == "kernel")
    launches = events.filter(pl.col("name") == "cudaLaunchKernel")
    syncs = events.filter(pl.col("name") == "cudaDeviceSynchronize").sort("ts")
    steps = events.filter(pl.col("name").str.starts_with("ProfilerStep#")).sort("ts")
    linked = kernels.join(launches, on="corr", suffix="_launch")
    ahead = linked["ts"] - linked["ts_launch"]  # the host runs milliseconds ahead, never less than 5 µs
    assert linked.height == kernels.height and ahead.min() >= 5 * US and ahead.max() > 1_000 * US

    main = launches.filter(pl.col("tid") == 100_004).sort("ts")
    step_of = main["ts"].search_sorted(steps["ts"], side="left")  # each step's first launch
    gaps = [np.diff(part) for part in np.split(main["ts"].to_numpy(), step_of.to_numpy()[1:])]
    assert all((g == 10 * US).all() for g in gaps) and len(gaps) == 3

    assert syncs.height == 3 and syncs["args"].struct.field("cbid").to_list() == [165] * 3
    assert syncs["tid"].unique().to_list() == [100_004]
    assert syncs["corr"].n_unique() == 3 and not syncs["corr"].is_in(kernels["corr"].implode()).any()
    sync_end = syncs["ts"] + syncs["dur"]
    for sync, end in zip(syncs["ts"], sync_end, strict=True):  # it waits for all the work launched before it
        before = linked.filter(pl.col("ts_launch") < sync)
        assert end - (before["ts"] + before["dur"]).max() == 2 * US
        assert sync - main.filter(pl.col("ts") < sync)["ts"].max() == 2 * US  # the last cudaLaunchKernel returned
    assert ((syncs["ts"] >= steps["ts"]) & (sync_end <= steps["ts"] + steps["dur"])).all()
    assert (steps["ts"][1:] >= sync_end[:-1]).all()


def test_nsys_writes_the_sync_as_runtime_and_synchronization_rows(tmp_path: Path) -> None:
    """cudaDeviceSynchronize_v3020 in CUPTI_ACTIVITY_KIND_RUNTIME on the main thread and its context-synchronize
    record (syncType 4, no stream, no event) inside the call, sharing a correlation id no kernel has."""
    synth(tmp_path / "run", "--format", "nsys")
    with sqlite3.connect(next((tmp_path / "run" / "traces").glob("report_rank0004_*.sqlite"))) as con:
        calls = con.execute(
            "SELECT r.start, r.end, r.globalTid & 16777215, r.correlationId, y.start, y.end, y.syncType, y.streamId, "
            "y.eventId, y.deviceId, y.globalPid = r.globalTid - (r.globalTid & 16777215) FROM "
            "CUPTI_ACTIVITY_KIND_RUNTIME r JOIN StringIds s ON s.id = r.nameId "
            "JOIN CUPTI_ACTIVITY_KIND_SYNCHRONIZATION y USING (correlationId) "
            "WHERE s.value = 'cudaDeviceSynchronize_v3020' ORDER BY r.start").fetchall()
        kernels = {c for (c,) in con.execute("SELECT correlationId FROM CUPTI_ACTIVITY_KIND_KERNEL")}
        device_end = con.execute("SELECT max(end) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()[0]
    assert len(calls) == 3 and not {c[3] for c in calls} & kernels
    for start, end, tid, _, s_start, s_end, sync_type, stream, event, device, same_process in calls:
        assert tid == 100_004 and start < s_start < s_end <= end and end - s_end == 2 * US
        assert (sync_type, stream, event, device, same_process) == (4, 4294967295, 4294967295, 4, 1)
    assert calls[-1][5] == device_end


def test_no_launch_is_late_at_the_default_options() -> None:
    """At --kernel-us 200 the host's 10 µs pace stays ahead of every kernel: the cap that keeps a launch 5 µs
    before its kernel never binds (at --kernel-us 3 it does: there the planned timeline assumes a faster host)."""
    plan = schedule.load(str(CONFIG), schedule.Options(ranks=16, steps=2))
    assert sum(schedule.late_launches(t) for t in plan.stage_traces()) == 0
    plan = schedule.load(str(CONFIG), schedule.Options(ranks=8, steps=1, kernel_us=3))
    assert sum(schedule.late_launches(t) for t in plan.stage_traces()) > 0


def test_a_step_gap_too_short_for_the_sync_is_refused() -> None:
    with pytest.raises(TraceanaError, match="step_gap_us 10: must be at least 17"):
        schedule.Options(step_gap_us=10)


def test_the_running_minimum_restarts_each_step_and_holds_long_runs() -> None:
    """The host pacing's one-pass running minimum per step: it never carries a minimum into the next step, and a
    run whose steps x span outgrows int32 (160 steps of a 3 µs-kernel job overflowed) stays exact in int64."""
    values = np.array([5, 3, 4, 9, 7, 8], dtype=np.int64) + 4_000_000_000
    steps = np.array([0, 0, 0, 1, 1, 1], dtype=np.int32)
    assert (schedule._running_min_per_step(values, steps) - 4_000_000_000).tolist() == [5, 3, 3, 9, 7, 7]
    many = np.repeat(np.arange(200, dtype=np.int32), 2)
    spread = np.tile(np.array([30_000_000, 10_000_000], dtype=np.int64), 200)
    assert schedule._running_min_per_step(spread, many).tolist() == [30_000_000, 10_000_000] * 200
