"""Estimates in the store, beside the measured runs, so `compare` can join them.

estimate_runs holds one row per estimate (its config, layout and step time); estimate_stages one row per pipeline
stage with the DESIGN §4 columns in integer nanoseconds and memory components in bytes. As in §4, the columns of a
traceana estimate sum exactly: pp_wait_ns takes the rounding remainder so comp + every wait + idle == total_ns.

Another estimator's predictions (`compare --predicted FILE`, traceana/model/predicted.py) go into the same tables,
so SQL treats both alike; what such a file cannot say is NULL, never a made-up value: the config (config_json, and
schedule, micro_batches, fits where the run does not say), layers, the memory components, and every time column the
file lacks (so the sum holds only where every column is given). Stores written before predictions existed declared
these columns NOT NULL: each write drops those constraints first (:data:`NULLABLE`), so older stores stay writable
and read as before.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path
from typing import TYPE_CHECKING

from traceana import store
from traceana.estimator.estimate import DIMENSIONS, Estimate

if TYPE_CHECKING:
    import duckdb

SCHEMA = """
CREATE TABLE IF NOT EXISTS estimate_runs (
    estimate_id       VARCHAR PRIMARY KEY,
    config_path       VARCHAR NOT NULL,      -- the job YAML, or the predictions file
    created_at        TIMESTAMP NOT NULL,
    world_size        INTEGER NOT NULL,
    layout            VARCHAR,               -- the parallel layout, as `ingest --layout` writes it
    schedule          VARCHAR,
    micro_batches     INTEGER,
    step_ns           BIGINT,
    peak_memory_bytes BIGINT,
    fits              BOOLEAN,               -- every stage's peak within hardware.hbm_gb
    config_json       VARCHAR                -- the validated config, all defaults filled in
);
CREATE TABLE IF NOT EXISTS estimate_stages (
    estimate_id        VARCHAR NOT NULL,
    stage              INTEGER NOT NULL,
    layers             INTEGER,
    comp_ns            BIGINT,
    mp_wait_ns         BIGINT,
    cp_wait_ns         BIGINT,
    ep_wait_ns         BIGINT,
    dp_wait_ns         BIGINT,
    pp_wait_ns         BIGINT,
    idle_ns            BIGINT,
    total_ns           BIGINT,               -- = comp + mp + cp + ep + dp + pp waits + idle, exactly
    params_bytes       BIGINT,
    grads_bytes        BIGINT,
    optimizer_bytes    BIGINT,
    activations_bytes  BIGINT,
    comm_buffers_bytes BIGINT,
    overheads_bytes    BIGINT,
    peak_bytes         BIGINT,
    memory_limit_bytes BIGINT,
    fits               BOOLEAN,
    PRIMARY KEY (estimate_id, stage)
);
"""
# Columns an older store declared NOT NULL that a predictions file may leave unknown.
NULLABLE = {
    "estimate_runs": ("layout", "schedule", "micro_batches", "step_ns", "peak_memory_bytes", "fits", "config_json"),
    "estimate_stages": ("layers", *(f"{d}_ns" for d in DIMENSIONS), "total_ns", "params_bytes", "grads_bytes",
                        "optimizer_bytes", "activations_bytes", "comm_buffers_bytes", "overheads_bytes",
                        "peak_bytes", "memory_limit_bytes", "fits"),
}
_UPGRADE = "".join(f"ALTER TABLE {table} ALTER COLUMN {column} DROP NOT NULL;\n"
                   for table, columns in NULLABLE.items() for column in columns)


def stage_rows(est: Estimate) -> list[dict[str, object]]:
    """The estimate_stages rows (minus estimate_id), sums exact in integer ns."""
    rows = []
    for s in est.stages:
        total = round(s.total * 1e9)
        times = {f"{d}_ns": round(getattr(s, d) * 1e9) for d in DIMENSIONS if d != "pp_wait"}
        times["pp_wait_ns"] = total - sum(times.values())
        mem = {f"{f.name}_bytes": round(getattr(s.memory, f.name)) for f in dataclasses.fields(s.memory)}
        rows.append({"stage": s.stage, "layers": s.layers, **times, "total_ns": total, **mem,
                     "peak_bytes": sum(mem.values()), "memory_limit_bytes": round(s.memory_limit), "fits": s.fits})
    return rows


def write(db: Path, estimate_id: str, config_path: Path, est: Estimate) -> None:
    """Replace estimate ``estimate_id`` in the store at ``db``, in one transaction."""
    cfg = est.config
    rows = stage_rows(est)
    run = {"config_path": str(config_path.resolve()), "world_size": cfg.parallel.world_size,
           "layout": cfg.parallel.layout.spec, "schedule": cfg.schedule.kind, "micro_batches": cfg.micro_batches,
           "step_ns": rows[0]["total_ns"], "peak_memory_bytes": max(int(r["peak_bytes"]) for r in rows),
           "fits": est.fits, "config_json": json.dumps(dataclasses.asdict(cfg), default=list)}
    write_rows(db, {estimate_id: (run, rows)})


def write_rows(db: Path, estimates: dict[str, tuple[dict[str, object], list[dict[str, object]]]]) -> None:
    """Replace each estimate (id -> its estimate_runs row and estimate_stages rows, both without estimate_id, the
    run row also without created_at) in the store at ``db``, all in one transaction."""
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    with store.connect(db) as con, store.transaction(con, SCHEMA + _UPGRADE):
        for estimate_id, (run, stages) in estimates.items():
            con.execute("DELETE FROM estimate_stages WHERE estimate_id = ?", [estimate_id])
            con.execute("DELETE FROM estimate_runs WHERE estimate_id = ?", [estimate_id])
            _insert(con, "estimate_runs", [{"estimate_id": estimate_id, "created_at": now, **run}])
            _insert(con, "estimate_stages", [{"estimate_id": estimate_id, **s} for s in stages])


def _insert(con: duckdb.DuckDBPyConnection, table: str, rows: list[dict[str, object]]) -> None:
    columns = list(rows[0])
    con.executemany(f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({', '.join('?' for _ in columns)})",
                    [list(r.values()) for r in rows])
