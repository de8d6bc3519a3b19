"""Estimates in the store, beside the measured runs, so `compare` can join them.

estimate_runs holds one row per estimate (its config, layout and step time); estimate_stages one row per pipeline
stage with the DESIGN §4 columns in integer nanoseconds and memory components in bytes. As in §4, the columns sum
exactly: pp_wait_ns takes the rounding remainder so comp + every wait + idle == total_ns.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
from pathlib import Path

from traceana import store
from traceana.estimator.estimate import DIMENSIONS, Estimate

SCHEMA = """
CREATE TABLE IF NOT EXISTS estimate_runs (
    estimate_id       VARCHAR PRIMARY KEY,
    config_path       VARCHAR NOT NULL,
    created_at        TIMESTAMP NOT NULL,
    world_size        INTEGER NOT NULL,
    layout            VARCHAR NOT NULL,      -- the parallel layout, as `ingest --layout` writes it
    schedule          VARCHAR NOT NULL,
    micro_batches     INTEGER NOT NULL,
    step_ns           BIGINT NOT NULL,
    peak_memory_bytes BIGINT NOT NULL,
    fits              BOOLEAN NOT NULL,      -- every stage's peak within hardware.hbm_gb
    config_json       VARCHAR NOT NULL       -- the validated config, all defaults filled in
);
CREATE TABLE IF NOT EXISTS estimate_stages (
    estimate_id        VARCHAR NOT NULL,
    stage              INTEGER NOT NULL,
    layers             INTEGER NOT NULL,
    comp_ns            BIGINT NOT NULL,
    mp_wait_ns         BIGINT NOT NULL,
    cp_wait_ns         BIGINT NOT NULL,
    ep_wait_ns         BIGINT NOT NULL,
    dp_wait_ns         BIGINT NOT NULL,
    pp_wait_ns         BIGINT NOT NULL,
    idle_ns            BIGINT NOT NULL,
    total_ns           BIGINT NOT NULL,      -- = comp + mp + cp + ep + dp + pp waits + idle, exactly
    params_bytes       BIGINT NOT NULL,
    grads_bytes        BIGINT NOT NULL,
    optimizer_bytes    BIGINT NOT NULL,
    activations_bytes  BIGINT NOT NULL,
    comm_buffers_bytes BIGINT NOT NULL,
    overheads_bytes    BIGINT NOT NULL,
    peak_bytes         BIGINT NOT NULL,
    memory_limit_bytes BIGINT NOT NULL,
    fits               BOOLEAN NOT NULL,
    PRIMARY KEY (estimate_id, stage)
);
"""


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
    with store.connect(db) as con, store.transaction(con, SCHEMA):
        con.execute("DELETE FROM estimate_stages WHERE estimate_id = ?", [estimate_id])
        con.execute("DELETE FROM estimate_runs WHERE estimate_id = ?", [estimate_id])
        con.execute("INSERT INTO estimate_runs VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [estimate_id, str(config_path.resolve()), dt.datetime.now(dt.UTC).replace(tzinfo=None),
                     cfg.parallel.world_size, cfg.parallel.layout.spec, cfg.schedule.kind, cfg.micro_batches,
                     rows[0]["total_ns"], max(int(r["peak_bytes"]) for r in rows), est.fits,
                     json.dumps(dataclasses.asdict(cfg), default=list)])
        columns = list(rows[0])
        con.executemany(f"INSERT INTO estimate_stages (estimate_id, {', '.join(columns)}) VALUES "
                        f"(?, {', '.join('?' for _ in columns)})", [[estimate_id, *r.values()] for r in rows])
