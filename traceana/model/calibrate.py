"""`traceana calibrate`: what a run's trace measured, merged into the config's hardware profile as an update.

Not to be confused with traceana.model.compare_fit, which fits calibration knobs to measured step times
(`compare --fit`): this reads the kernels themselves. The prior profile (the config's ``hardware.profile``) is the
starting point and stays whole: its measured GEMM grid, attention and memory tables are written back unchanged, and
each value below replaces the prior's only where the trace measured it. Every fitted value carries the half-width of
its 10-90% range over the samples behind it (steps, operators or ranks) and their count.

- Matrix products: every ``aten::mm`` / ``aten::addmm`` recorded with its input shapes (PyTorch profiler
  ``record_shapes=True``) is joined to the kernels it launched by their shared ``External id``; the median per
  (m, n, k) becomes a ``gemm_measured_us`` point, which overrides the grid at its shape and fades back to it within
  one doubling (estimator.hardware.gemm_seconds). A trace without shapes leaves the GEMM tables as they were.
- Memory-bound kernels and the optimizer: the step's kernels that are neither matrix products (by their operator)
  nor attention cores nor launched inside ``Optimizer.step#`` are the memory-bound ones; their time against the
  estimator's own memory-bound time for the config gives ``memory_efficiency`` (a scale on the data sheet's
  bandwidth; reported, not applied, where the profile has measured rates by kernel size, which it would all move); the
  optimizer's kernels against its optimizer time give an ``optimizer_measured`` point (parameters, fraction of HBM
  bandwidth) that overrides the prior's ``optimizer_efficiency`` near this model's size and fades back to it within
  one doubling (estimator.hardware.optimizer_efficiency): a small model's few, part-empty launches run faster.
- Host: a step's host is busy for the step's length less the time it blocks in CUDA synchronize calls. The
  optimizer's annotated ranges (``Optimizer.step#``, ``Optimizer.zero_grad#``) are ``host_us_per_step``; the rest,
  shared over the config's layer passes and micro-batches in the proportion its host times already have (the
  profile's, else forward : backward = 1 : 2 and nothing outside the layers), gives host_us_per_layer,
  host_us_per_backward_layer and host_us_per_micro_batch.
- Idle: on a device-bound run (IDLE under half the step), the measured IDLE the estimate with the values above does
  not explain, per layer and micro-batch, is ``idle_us_per_layer`` (the idle analysis' queued gaps and short host
  stalls); a host-bound run's idle is the host time already fitted.
- Links: each all-reduce of at least 1 MiB in the store gives a bus bandwidth, bytes x 2(n-1)/n / kernel time
  (nccl-tests' definition); the 90th percentile per level (NVLink inside a node, or across nodes, where the model's
  bandwidth is one NIC's: the group's bus bandwidth over its ranks per node) becomes bandwidth_gb_per_s. Per
  dimension, the median bus bandwidth of its collectives (the collective_bandwidth view) is reported beside it, and
  the fraction of each dimension's communication time that overlapped compute (1 - its WAIT / its kernels' time,
  per rank) becomes ``calibration.overlap``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import duckdb
import polars as pl
import yaml

from traceana import store
from traceana.analyses import idle as idle_analysis
from traceana.analyses.roofline import GEMMS
from traceana.errors import TraceanaError
from traceana.estimator import estimate as estimator
from traceana.estimator import hardware
from traceana.estimator.config import Config
from traceana.ingest.kineto import events as kineto
from traceana.model.compare import check_matches

SYNC = "%ynchronize%"     # cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize: the host waits
MIN_LINK_BYTES = 2**20    # smaller all-reduces measure latency, not bandwidth
GEMM_OPS = tuple(GEMMS)  # the roofline's matrix products
OVERLAP_DIMS = {"TP": ("tp", "MP_WAIT_ns"), "CP": ("cp", "CP_WAIT_ns"), "EP": ("ep", "EP_WAIT_ns"),
                "DP": ("dp", "DP_WAIT_ns")}
DEVICE_BOUND = 0.5        # a run whose IDLE is under this share of the step is limited by its device


@dataclass(frozen=True)
class Fit:
    """One value the trace measured: ``spread`` is half its 10-90% range over ``samples``."""

    name: str        # the profile field it sets (calibration.<name>, or overlap.<dim>)
    value: float
    unit: str
    spread: float
    samples: int
    source: str      # what it was measured from


@dataclass(frozen=True)
class TraceProfile:
    """What a trace says about its hardware, and the profile YAML that carries it."""

    gemms: pl.DataFrame       # m, n, k, kernels, us (median), spread_pct, tflops
    steps: pl.DataFrame       # step, step_ms, sync_ms, optimizer_host_ms, host_busy_ms (steps after the first)
    links: pl.DataFrame       # level, all_reduces, bus_gb_per_s (90th percentile), model_gb_per_s
    dims: pl.DataFrame        # dim, collectives, busbw_GBps (median), overlap (median over ranks), ranks
    fits: list[Fit]
    notes: list[str]
    profile: dict[str, Any]   # the profile file's content

    def fit(self, name: str) -> Fit | None:
        return next((f for f in self.fits if f.name == name), None)


def _events(sources: list[str]) -> duckdb.DuckDBPyConnection:
    files = [f for s in sources for f in kineto.trace_files(Path(s))]
    if not files:
        raise TraceanaError(f"{sources[0] if sources else 'run'}: no Kineto trace files to read "
                            "(calibrate reads PyTorch profiler traces)")
    con = duckdb.connect()
    con.execute(kineto.EVENT_TABLE)
    for index, file in enumerate(files):
        kineto.load(con, file, index)
    con.execute("""
        CREATE TEMP TABLE steps AS
        WITH s AS (SELECT f, name, start_ns, end_ns, row_number() OVER (PARTITION BY f ORDER BY start_ns) AS i
                   FROM ev WHERE cat = 'user_annotation' AND regexp_matches(name, '^ProfilerStep#\\d+$'))
        SELECT * FROM s WHERE i > 1 OR (SELECT count(*) FROM s) = 1""")  # the first step carries warm-up
    return con


def _spread(column: str) -> str:
    return f"(quantile_cont({column}, 0.9) - quantile_cont({column}, 0.1)) / 2"


def _gemms(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    frame = con.sql(f"""
        WITH ops AS (
            SELECT f, ext_id, CASE name WHEN 'aten::mm' THEN 0 ELSE 1 END AS a, input_dims AS d
            FROM ev WHERE cat = 'cpu_op' AND name IN ('aten::mm', 'aten::addmm') AND ext_id IS NOT NULL
              AND json_array_length(input_dims) >= 2),
        launched AS (
            SELECT f, ext_id, sum(end_ns - start_ns) AS ns FROM ev
            WHERE cat = 'kernel' AND ext_id IS NOT NULL GROUP BY ALL)
        SELECT (d->>('$[' || a || '][0]'))::BIGINT AS m, (d->>('$[' || (a + 1) || '][1]'))::BIGINT AS n,
               (d->>('$[' || a || '][1]'))::BIGINT AS k, count(*)::BIGINT AS kernels, median(ns) / 1e3 AS us,
               100 * {_spread('ns')} / median(ns) AS spread_pct
        FROM ops JOIN launched USING (f, ext_id)
        GROUP BY ALL HAVING m > 0 AND n > 0 AND k > 0 AND median(ns) > 0 ORDER BY m, n, k""").pl()
    return frame.with_columns((2 * pl.col("m") * pl.col("n") * pl.col("k") / pl.col("us") / 1e6).alias("tflops"))


def _steps(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    """Per profiled step after the first: its length, the host's synchronize time, the optimizer's annotated host
    time and the kernel time of each family (ms). Range joins against the few step and optimizer ranges; kernels
    find their launching operator by External id."""
    frame = con.sql(f"""
        WITH opt AS (
            SELECT f, start_ns, end_ns FROM ev WHERE cat = 'user_annotation'
              AND (name LIKE 'Optimizer.step#%' OR name LIKE 'Optimizer.zero_grad#%')),
        ops AS (
            SELECT o.f, o.ext_id, any_value(o.name) AS name, bool_or(opt.f IS NOT NULL) AS in_optimizer
            FROM ev o LEFT JOIN opt ON opt.f = o.f AND o.start_ns >= opt.start_ns AND o.start_ns < opt.end_ns
            WHERE o.cat = 'cpu_op' AND o.ext_id IS NOT NULL GROUP BY o.f, o.ext_id),
        kernels AS (
            SELECT k.f, k.start_ns, k.end_ns - k.start_ns AS ns,
                   CASE WHEN o.name IN {GEMM_OPS} THEN 'gemm'
                        WHEN o.name ILIKE '%attention%' OR o.name ILIKE '%flash%' THEN 'attention'
                        WHEN o.in_optimizer THEN 'optimizer' ELSE 'memory' END AS kind
            FROM ev k LEFT JOIN ops o ON o.f = k.f AND o.ext_id = k.ext_id
            WHERE k.cat IN ('kernel', 'gpu_memset', 'gpu_memcpy') AND k.name NOT ILIKE '%nccl%'),
        per_kind AS (
            SELECT s.f, s.start_ns, {", ".join(f"sum(k.ns) FILTER (WHERE k.kind = '{kind}' AND k.ns <= "
                                             f"s.end_ns - s.start_ns) AS {kind}_ns"
                                             for kind in ("gemm", "attention", "optimizer", "memory"))},
                   count(*) FILTER (WHERE k.ns > s.end_ns - s.start_ns) AS oversized
            FROM steps s JOIN kernels k ON k.f = s.f AND k.start_ns >= s.start_ns AND k.start_ns < s.end_ns
            GROUP BY s.f, s.start_ns),
        syncs AS (
            SELECT s.f, s.start_ns, sum(e.end_ns - e.start_ns) AS sync_ns
            FROM steps s JOIN ev e ON e.f = s.f AND e.cat = 'cuda_runtime' AND e.name LIKE '{SYNC}'
                 AND e.start_ns >= s.start_ns AND e.start_ns < s.end_ns
            GROUP BY s.f, s.start_ns),
        optimizer AS (
            SELECT s.f, s.start_ns, sum(least(o.end_ns, s.end_ns) - greatest(o.start_ns, s.start_ns)) AS host_ns
            FROM steps s JOIN opt o ON o.f = s.f AND o.start_ns < s.end_ns AND o.end_ns > s.start_ns
            GROUP BY s.f, s.start_ns)
        SELECT s.name AS step, (s.end_ns - s.start_ns) / 1e6 AS step_ms, coalesce(y.sync_ns, 0) / 1e6 AS sync_ms,
               coalesce(o.host_ns, 0) / 1e6 AS optimizer_host_ms,
               {", ".join(f"coalesce(k.{kind}_ns, 0) / 1e6 AS {kind}_ms"
                          for kind in ("gemm", "attention", "optimizer", "memory"))},
               coalesce(k.oversized, 0) AS oversized
        FROM steps s LEFT JOIN per_kind k USING (f, start_ns) LEFT JOIN syncs y USING (f, start_ns)
        LEFT JOIN optimizer o USING (f, start_ns)
        ORDER BY s.start_ns""").pl()
    if frame.is_empty():
        raise TraceanaError("no ProfilerStep#N ranges in the trace: calibrate needs profiled steps")
    return frame.with_columns((pl.col("step_ms") - pl.col("sync_ms") - pl.col("optimizer_host_ms"))
                              .alias("host_busy_ms"))


def _links(db: Path, run_id: str, per_node: int) -> pl.DataFrame:
    with store.connect(db, read_only=True) as con:
        frame = con.sql("""
            SELECT c.bytes * 2 * (len(g.ranks) - 1) / len(g.ranks) / (d.end_ns - d.start_ns) AS bus_gb_per_s,
                   len(list_distinct(list_transform(g.ranks, lambda r: r // ?))) AS nodes, len(g.ranks) AS size
            FROM collectives c JOIN device_events d USING (run_id, rank, event_id)
            JOIN process_groups g ON g.run_id = c.run_id AND g.pg = c.pg
            WHERE c.run_id = ? AND c.op = 'AllReduce' AND c.bytes >= ? AND d.end_ns > d.start_ns""",
                        params=[per_node, run_id, MIN_LINK_BYTES]).pl()
    return (frame.with_columns(pl.when(pl.col("nodes") > 1).then(pl.lit("inter")).otherwise(pl.lit("intra"))
                               .alias("level"),
                               (pl.col("size") / pl.col("nodes")).alias("per_node"))
            .group_by("level").agg(pl.len().alias("all_reduces"),
                                   pl.col("bus_gb_per_s").quantile(0.9).alias("bus_gb_per_s"),
                                   (pl.col("bus_gb_per_s") / pl.col("per_node")).quantile(0.9).alias("per_nic"))
            .with_columns(pl.when(pl.col("level") == "inter").then(pl.col("per_nic")).otherwise(
                pl.col("bus_gb_per_s")).alias("model_gb_per_s")).drop("per_nic").sort("level"))


def _dims(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame:
    """Per dimension: its collectives' median bus bandwidth and spread, and per rank the share of its
    communication time that did not show as that dimension's WAIT (overlapped compute)."""
    waits = " ".join(f"WHEN '{dim}' THEN b.{column}" for dim, (_, column) in OVERLAP_DIMS.items())
    return con.sql(f"""
        WITH bw AS (
            SELECT dim, count(*) AS collectives, median(busbw_GBps) AS busbw_GBps,
                   {_spread('busbw_GBps')} AS busbw_spread
            FROM collective_bandwidth WHERE run_id = $run AND busbw_GBps IS NOT NULL GROUP BY dim),
        share AS (
            SELECT t.dim, t.rank, 1 - (CASE t.dim {waits} END) / (sum(t.total_ns) / any_value(t.steps)) AS overlap
            FROM collective_totals t JOIN rank_breakdown b ON b.run_id = t.run_id AND b.rank = t.rank
                 AND b.step IS NULL
            WHERE t.run_id = $run AND t.dim IN {tuple(OVERLAP_DIMS)} GROUP BY t.dim, t.rank, b.MP_WAIT_ns,
                  b.CP_WAIT_ns, b.EP_WAIT_ns, b.DP_WAIT_ns HAVING sum(t.total_ns) > 0)
        SELECT dim, coalesce(bw.collectives, 0) AS collectives, bw.busbw_GBps, bw.busbw_spread,
               median(greatest(overlap, 0)) AS overlap, {_spread('greatest(overlap, 0)')} AS overlap_spread,
               count(share.rank) AS ranks
        FROM bw FULL JOIN share USING (dim) GROUP BY ALL ORDER BY dim""", params={"run": run_id}).pl()


def _mean_and_spread(series: pl.Series) -> tuple[float, float]:
    """(mean, half the 10-90% range) of a series of samples (steps, ranks)."""
    return float(series.mean()), float((series.quantile(0.9) - series.quantile(0.1)) / 2)  # type: ignore[operator]


def _with(cfg: Config, **calibration: Any) -> Config:
    return dataclasses.replace(cfg, calibration=dataclasses.replace(cfg.calibration, **calibration))


def measure(db: Path, run_id: str, cfg: Config) -> TraceProfile:
    """Read run ``run_id``'s traces (their paths as the store recorded them) and update ``cfg``'s profile."""
    with store.connect(db, read_only=True) as con:
        rows = con.execute("SELECT source_format, sources FROM runs WHERE run_id = ?", [run_id]).fetchall()
        if not rows:
            raise TraceanaError(f"{db}: no run {run_id!r} (see `traceana runs`)")
        row = rows[0]
        if row[0] != "kineto":
            raise TraceanaError(f"run {run_id!r} is {row[0]}: calibrate reads operators and their kernels from "
                                "PyTorch profiler (Kineto) traces")
        check_matches(con, run_id, cfg)  # the config's layers and micro-batches share out what the run measured
        idle = idle_analysis.idle_causes(con, run_id)
        (totals,) = con.execute("SELECT avg(TOTAL_ns) / 1e6 FROM rank_breakdown WHERE run_id = ? AND step IS NULL",
                                [run_id]).fetchall()
        dims = _dims(con, run_id)
    events = _events(list(row[1]))
    gemms, steps = _gemms(events), _steps(events)
    notes: list[str] = []
    if oversized := steps["oversized"].sum():  # a kernel longer than its whole step: a damaged or foreign time
        notes.append(f"{oversized:,} kernel(s) longer than the step they start in left out of the kernel times")
    steps = steps.drop("oversized")
    if gemms.is_empty():
        (kernels,) = events.execute("SELECT count(*) FROM ev WHERE cat = 'kernel'").fetchall()[0]
        notes.append("no device kernels (a CPU-only trace): the GEMM tables stay the prior's" if not kernels else
                     "no matrix products with their shapes (record with torch.profiler.profile(record_shapes=True)):"
                     " the GEMM tables stay the prior's")
    fits: list[Fit] = []
    n = steps.height
    cal = cfg.calibration
    updated = cfg
    if not gemms.is_empty():
        updated = dataclasses.replace(updated, profile=_profile_with_points(cfg, gemms))

    optimizer = cal.optimizer_efficiency or cal.memory_efficiency
    prior = estimator.estimate(_with(updated, optimizer_efficiency=optimizer))
    half = estimator.estimate(_with(updated, memory_efficiency=cal.memory_efficiency / 2,
                                    optimizer_efficiency=optimizer))
    memory_s = (half.stages[0].comp - prior.stages[0].comp)  # memory-bound time is linear in 1 / efficiency
    params = prior.stages[0].memory.optimizer / (cfg.precision.optimizer_bytes or 1)  # 0 bytes: no state, none
    for name, column, model_s, base in (
            ("memory_efficiency", "memory_ms", memory_s, cal.memory_efficiency),
            ("optimizer_efficiency", "optimizer_ms", prior.optimizer[0],
             hardware.optimizer_efficiency(updated.profile, params, optimizer))):
        measured, spread = _mean_and_spread(steps[column])
        if measured > 0 and model_s > 0:
            value = base * model_s * 1e3 / measured
            if value > 1:
                notes.append(f"{name}: the trace's kernels ran faster than the data sheet allows ({value:.2f}); "
                             "kept at 1")
            fits.append(Fit(name, min(value, 1.0), "of HBM bandwidth", value * spread / measured, n,
                            f"{column[:-3]} kernels, {measured:.3f} ms a step"))
    memory_fit = [f.value for f in fits if f.name == "memory_efficiency"]
    if memory_fit and updated.profile and updated.profile.memory_gb_per_s:
        notes.append(f"memory_efficiency {memory_fit[0]:.3f}, fitted over the step's memory-bound kernels, is not "
                     "applied: the profile's measured rates by kernel size stay (one step-wide ratio would move "
                     "every size)")
    elif memory_fit:
        updated = _with(updated, memory_efficiency=memory_fit[0])
    optimizer_fit = [f.value for f in fits if f.name == "optimizer_efficiency"]
    if optimizer_fit:  # a point at this model's size, not a new prior: hardware.optimizer_efficiency
        base = _base_profile(updated)
        kept = tuple(p for p in base.optimizer_measured if p[0] != params)
        updated = dataclasses.replace(updated, profile=dataclasses.replace(
            base, optimizer_measured=(*kept, (params, optimizer_fit[0])), _cache={}))

    busy, busy_spread = _mean_and_spread(steps["host_busy_ms"])
    optimizer_host, optimizer_spread = _mean_and_spread(steps["optimizer_host_ms"])
    forward, backward, outside = _host_per_layer(cfg, busy * 1e-3)
    scale = busy_spread / busy if busy else 0.0
    fits += [Fit("host_us_per_layer", forward, "µs", forward * scale, n, "step less synchronize and optimizer"),
             Fit("host_us_per_backward_layer", backward, "µs", backward * scale, n,
                 "step less synchronize and optimizer"),
             *([Fit("host_us_per_micro_batch", outside, "µs", outside * scale, n,
                    "step less synchronize and optimizer")] if outside else []),
             Fit("host_us_per_step", optimizer_host * 1e3, "µs", optimizer_spread * 1e3, n,
                 "Optimizer.step# and Optimizer.zero_grad# ranges")]
    updated = _with(updated, host_us_per_layer=forward, host_us_per_backward_layer=backward,
                    host_us_per_micro_batch=outside, host_us_per_step=optimizer_host * 1e3)

    idle_ms, idle_spread = _mean_and_spread(idle["IDLE_ms"]) if not idle.is_empty() else (0.0, 0.0)
    total_ms = float(totals[0]) if totals and totals[0] else 0.0
    if total_ms and idle_ms < DEVICE_BOUND * total_ms:
        explained = estimator.estimate(updated).stages[0].idle * 1e3
        passes = cfg.model.layers * cfg.micro_batches
        per_layer = max(0.0, idle_ms - explained) * 1e3 / passes
        fits.append(Fit("idle_us_per_layer", per_layer, "µs", idle_spread * 1e3 / passes, idle.height,
                        f"IDLE {idle_ms:.3f} ms a step, {explained:.3f} of it host-bound by the fit"))
    elif total_ms:
        notes.append(f"host-bound run (IDLE {idle_ms:.1f} of {total_ms:.1f} ms): its idle is the host time fitted "
                     "above, not per-layer dead time")

    for dim, (key, _) in OVERLAP_DIMS.items():
        row_ = dims.filter(pl.col("dim") == dim)
        if row_.height and row_["overlap"][0] is not None:
            fits.append(Fit(f"overlap.{key}", float(row_["overlap"][0]), "of its time",
                            float(row_["overlap_spread"][0]), int(row_["ranks"][0]),
                            f"{dim} collectives' time against {dim}'s WAIT, per rank"))
    links = _links(db, run_id, cfg.hardware.devices_per_node)
    return TraceProfile(gemms, steps, links, dims, fits, notes, _profile_yaml(cfg, updated, gemms, links, fits, run_id))


def _host_per_layer(cfg: Config, busy_s: float) -> tuple[float, float, float]:
    """(forward, backward) host µs of one layer and the µs outside the layers per micro-batch that make the config's
    host model add up to the host's busy time per step, keeping the ratios the config already has (its profile's,
    else 1 : 2 and nothing outside the layers)."""
    cal, m = cfg.calibration, cfg.micro_batches
    forward = cal.host_us_per_layer or 1.0
    backward = cal.host_us_per_backward_layer if cal.host_us_per_backward_layer is not None else 2 * forward
    recompute = sum(cfg.schedule.recompute.kind_of(i) == "full" for i in range(cfg.model.layers))
    outside = cal.host_us_per_micro_batch
    per_step = m * (cfg.model.layers * (forward + backward) + recompute * forward + outside)
    scale = busy_s * 1e6 / per_step
    return forward * scale, backward * scale, outside * scale


def _points(gemms: pl.DataFrame) -> list[list[float]]:
    return [[int(m), int(n), int(k), round(float(us), 3), int(kernels), round(float(spread or 0.0), 1)]
            for m, n, k, us, kernels, spread in gemms.select("m", "n", "k", "us", "kernels", "spread_pct").iter_rows()]


def _base_profile(cfg: Config) -> hardware.Profile:
    """The config's profile, or an empty one (data-sheet roofline) for the trace's measured points."""
    return cfg.profile or hardware.Profile(name=cfg.hardware.device, source="data sheet")


def _profile_with_points(cfg: Config, gemms: pl.DataFrame) -> Any:
    """The config's profile with the trace's products merged into its measured points (the prior's points at
    other shapes kept)."""
    base = _base_profile(cfg)
    fresh = {tuple(p[:3]) for p in _points(gemms)}
    kept = [tuple(p) for p in base.gemm_measured_us if tuple(p[:3]) not in fresh]
    return dataclasses.replace(base, gemm_measured_us=tuple(kept) + tuple(tuple(p) for p in _points(gemms)),
                               _cache={})


def _profile_yaml(cfg: Config, updated: Config, gemms: pl.DataFrame, links: pl.DataFrame, fits: list[Fit],
                  run_id: str) -> dict[str, Any]:
    base = updated.profile
    hardware = {f.name: getattr(cfg.hardware, f.name) for f in dataclasses.fields(cfg.hardware)
                if f.name not in ("profile", "devices") and getattr(cfg.hardware, f.name) is not None}
    for name in ("bandwidth_gb_per_s", "latency_us"):
        hardware[name] = dataclasses.asdict(hardware[name])
    for level, rate in links.select("level", "model_gb_per_s").iter_rows():
        hardware["bandwidth_gb_per_s"][level] = round(float(rate), 1)
    cal = updated.calibration
    calibration: dict[str, Any] = {
        "matmul_efficiency": base.matmul_efficiency if base else cal.matmul_efficiency,
        **{name: round(getattr(cal, name), 4) if isinstance(getattr(cal, name), float) else getattr(cal, name)
           for name in ("memory_efficiency", "optimizer_efficiency", "host_us_per_layer",
                        "host_us_per_backward_layer", "host_us_per_micro_batch", "host_us_per_step",
                        "idle_us_per_layer")
           if getattr(cal, name) is not None}}
    overlap = {f.name.split(".")[1]: round(f.value, 3) for f in fits if f.name.startswith("overlap.")}
    if overlap:
        calibration["overlap"] = overlap
    profile: dict[str, Any] = {
        "name": f"{base.name if base else cfg.hardware.device}, updated from trace {run_id}",
        "source": f"{base.source if base else 'the config'}; traceana calibrate {run_id}",
        "sms": base.sms if base else 108, "tile": list(base.tile) if base else [128, 128],
        "launch_us": base.launch_us if base else 5.0,
        "hardware": hardware,
        "calibration": calibration,
        "measured": {f.name: {"value": round(f.value, 4), "unit": f.unit, "spread": round(f.spread, 4),
                              "samples": f.samples, "from": f.source} for f in fits},
    }
    if base:
        profile["gemm_us"] = [list(r) for r in base.gemm_us]
        profile["gemm_measured_us"] = [list(r) for r in base.gemm_measured_us]
        profile["optimizer_measured"] = [[round(r[0]), round(r[1], 4)] for r in base.optimizer_measured]
        profile["attention_us"] = [list(r) for r in base.attention_us]
        profile["memory_gb_per_s"] = [list(r) for r in base.memory_gb_per_s]
    return profile


def write(result: TraceProfile, path: Path, header: str) -> None:
    """The profile as YAML under a comment ``header``; `hardware.profile: FILE` reads it back."""
    comment = "".join(f"# {line}\n" for line in header.splitlines())
    try:
        path.write_text(comment + yaml.safe_dump(result.profile, sort_keys=False, default_flow_style=None, width=120))
    except OSError as exc:
        raise TraceanaError(f"{path}: cannot write the profile ({exc.strerror})") from None
