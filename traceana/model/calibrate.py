"""A hardware profile measured from a run's own trace (`traceana calibrate`), for `estimate` and `compare` to use.

Not to be confused with traceana.model.compare_fit, which fits calibration knobs to measured step times
(`compare --fit`): this reads the kernels themselves.

- Matrix products: every ``aten::mm`` / ``aten::addmm`` operator recorded with its input shapes (PyTorch profiler
  ``record_shapes=True``) is joined to the kernels it launched through their shared ``External id``; the median
  kernel time per (m, n, k) becomes a point of the profile's GEMM table (estimator.hardware reads scattered points
  by the nearest measured shape, carried by the roofline's ratio).
- Host time: a step's host is busy for the step's length less the time it blocks in CUDA synchronize calls; that
  busy time, shared over the config's layer passes in the proportion its host times already have (the hardware
  profile's, else forward : backward = 1 : 2), gives host_us_per_layer and host_us_per_backward_layer.
- Links: each all-reduce of at least 1 MiB in the store gives a bus bandwidth, bytes x 2(n-1)/n / kernel time
  (nccl-tests' definition); the 90th percentile per level (NVLink inside a node, or across nodes, where the model's
  bandwidth is one NIC's: the group's bus bandwidth over its ranks per node) becomes bandwidth_gb_per_s.
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
from traceana.errors import TraceanaError
from traceana.estimator.config import Config
from traceana.ingest.kineto import events as kineto

SYNC = "%ynchronize%"     # cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize: the host waits
MIN_LINK_BYTES = 2**20    # smaller all-reduces measure latency, not bandwidth


@dataclass(frozen=True)
class TraceProfile:
    """What a trace says about its hardware, and the profile YAML that carries it."""

    gemms: pl.DataFrame       # m, n, k, kernels, us (median), tflops
    host: pl.DataFrame        # step, step_ms, sync_ms, host_busy_ms (steps after the first)
    links: pl.DataFrame       # level, all_reduces, bus_gb_per_s (90th percentile), model_gb_per_s
    host_us_per_layer: float
    host_us_per_backward_layer: float
    profile: dict[str, Any]   # the profile file's content


def _events(sources: list[str]) -> duckdb.DuckDBPyConnection:
    files = [f for s in sources for f in kineto.trace_files(Path(s))]
    if not files:
        raise TraceanaError(f"{sources[0] if sources else 'run'}: no Kineto trace files to read shapes from "
                            "(calibrate reads PyTorch profiler traces recorded with record_shapes=True)")
    con = duckdb.connect()
    con.execute(kineto.EVENT_TABLE)
    for index, file in enumerate(files):
        kineto.load(con, file, index)
    return con


def _gemms(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    frame = con.sql("""
        WITH ops AS (
            SELECT f, ext_id, CASE name WHEN 'aten::mm' THEN 0 ELSE 1 END AS a, input_dims AS d
            FROM ev WHERE cat = 'cpu_op' AND name IN ('aten::mm', 'aten::addmm') AND ext_id IS NOT NULL
              AND json_array_length(input_dims) >= 2),
        launched AS (
            SELECT f, ext_id, sum(end_ns - start_ns) AS ns FROM ev
            WHERE cat = 'kernel' AND ext_id IS NOT NULL GROUP BY ALL)
        SELECT (d->>('$[' || a || '][0]'))::BIGINT AS m, (d->>('$[' || (a + 1) || '][1]'))::BIGINT AS n,
               (d->>('$[' || a || '][1]'))::BIGINT AS k, count(*)::BIGINT AS kernels, median(ns) / 1e3 AS us
        FROM ops JOIN launched USING (f, ext_id)
        GROUP BY ALL HAVING m > 0 AND n > 0 AND k > 0 ORDER BY m, n, k""").pl()
    return frame.with_columns((2 * pl.col("m") * pl.col("n") * pl.col("k") / pl.col("us") / 1e6).alias("tflops"))


def _host(con: duckdb.DuckDBPyConnection) -> pl.DataFrame:
    frame = con.sql(f"""
        WITH steps AS (
            SELECT f, name AS step, start_ns, end_ns FROM ev
            WHERE cat = 'user_annotation' AND regexp_matches(name, '^ProfilerStep#\\d+$'))
        SELECT s.step, (s.end_ns - s.start_ns) / 1e6 AS step_ms,
               coalesce(sum(e.end_ns - e.start_ns) FILTER (WHERE e.name LIKE '{SYNC}'), 0) / 1e6 AS sync_ms
        FROM steps s LEFT JOIN ev e ON e.f = s.f AND e.cat = 'cuda_runtime' AND e.start_ns >= s.start_ns
             AND e.start_ns < s.end_ns
        GROUP BY s.f, s.step, s.start_ns, s.end_ns ORDER BY s.start_ns""").pl()
    if frame.is_empty():
        raise TraceanaError("no ProfilerStep#N ranges in the trace: calibrate needs profiled steps")
    steady = frame.slice(1) if frame.height > 1 else frame  # the first step carries warm-up
    return steady.with_columns((pl.col("step_ms") - pl.col("sync_ms")).alias("host_busy_ms"))


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


def measure(db: Path, run_id: str, cfg: Config) -> TraceProfile:
    """Read run ``run_id``'s traces (their paths as the store recorded them) and derive a profile for ``cfg``."""
    with store.connect(db, read_only=True) as con:
        row = con.execute("SELECT source_format, sources FROM runs WHERE run_id = ?", [run_id]).fetchone()
    if row is None:
        raise TraceanaError(f"{db}: no run {run_id!r} (see `traceana runs`)")
    if row[0] != "kineto":
        raise TraceanaError(f"run {run_id!r} is {row[0]}: calibrate reads operator shapes from PyTorch profiler "
                            "(Kineto) traces")
    events = _events(list(row[1]))
    gemms = _gemms(events)
    if gemms.is_empty():
        raise TraceanaError(f"run {run_id!r}: no matrix products with their shapes; record the trace with "
                            "torch.profiler.profile(record_shapes=True)")
    host = _host(events)
    links = _links(db, run_id, cfg.hardware.devices_per_node)
    forward, backward = _host_per_layer(cfg, float(host["host_busy_ms"].mean()) * 1e-3)
    return TraceProfile(gemms, host, links, forward, backward, _profile_yaml(cfg, gemms, links, forward, backward))


def _host_per_layer(cfg: Config, busy_s: float) -> tuple[float, float]:
    """(forward, backward) host µs of one layer that make the config's layer passes add up to the host's busy time
    per step, keeping the ratio the config already has (its profile's, else 1 : 2)."""
    cal, m = cfg.calibration, cfg.micro_batches
    forward = cal.host_us_per_layer or 1.0
    backward = cal.host_us_per_backward_layer if cal.host_us_per_backward_layer is not None else 2 * forward
    recompute = sum(cfg.schedule.recompute.kind_of(i) == "full" for i in range(cfg.model.layers))
    per_step = m * (cfg.model.layers * (forward + backward) + recompute * forward)
    scale = busy_s * 1e6 / per_step
    return forward * scale, backward * scale


def _profile_yaml(cfg: Config, gemms: pl.DataFrame, links: pl.DataFrame, forward: float,
                  backward: float) -> dict[str, Any]:
    base = cfg.profile
    hardware = {f.name: getattr(cfg.hardware, f.name) for f in dataclasses.fields(cfg.hardware)
                if f.name not in ("profile", "devices") and getattr(cfg.hardware, f.name) is not None}
    for name in ("bandwidth_gb_per_s", "latency_us"):
        hardware[name] = dataclasses.asdict(hardware[name])
    for level, rate in links.select("level", "model_gb_per_s").iter_rows():
        hardware["bandwidth_gb_per_s"][level] = round(float(rate), 1)
    top = float(gemms["tflops"].max()) / cfg.hardware.peak_tflops_bf16
    profile: dict[str, Any] = {
        "name": f"{base.name if base else cfg.hardware.device}, calibrated from a trace",
        "source": "traceana calibrate",
        "sms": base.sms if base else 108, "tile": list(base.tile) if base else [128, 128],
        "launch_us": base.launch_us if base else 5.0,
        "hardware": hardware,
        "calibration": {"matmul_efficiency": round(min(top, 1.0), 4),
                        "memory_efficiency": cfg.calibration.memory_efficiency,
                        "host_us_per_layer": round(forward, 1), "host_us_per_backward_layer": round(backward, 1)},
        "gemm_us": [[int(m), int(n), int(k), round(float(us), 3)] for m, n, k, us in
                    gemms.select("m", "n", "k", "us").iter_rows()],
    }
    if base:
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

