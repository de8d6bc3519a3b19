"""Ascend ingest throughput: the shared 2-rank runs (text timeline and database export), a scaled copy of a real
timeline (its events repeated with shifted timestamps, as a long profile would hold them), and a synthetic run of N
ranks' database exports (`traceana synth --format ascend`) read with --jobs 1 and 2.

Prints seconds, MB/s and events/s for parse + link + finish (read_run) and for the whole ingest including the store
write; for the synthetic run, the reading of the databases apart from the whole read_run.
Run: .venv/bin/python benchmarks/bench_ascend.py [--copies 50] [--ranks 16] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import sqlite3
import tempfile
from decimal import Decimal
from pathlib import Path

from ingest_timing import load, print_phases, sqlite_reader, synthesize, time_ingest

ASCEND = Path(__file__).resolve().parents[2] / "shared" / "traces" / "ascend"


def _inputs(run: Path) -> tuple[float, int]:
    """(MB read, events or rows) of a run's timeline JSON or database files."""
    megabytes, events = 0.0, 0
    for trace in run.rglob("trace_view.json"):
        megabytes += trace.stat().st_size / 1e6
        events += len(json.loads(trace.read_text()))
    for db in run.rglob("ascend_pytorch_profiler_*.db"):
        megabytes += db.stat().st_size / 1e6
        with sqlite3.connect(f"file:{db}?mode=ro&immutable=1", uri=True) as con:
            tables = {name for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            events += sum(con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in
                          ("TASK", "COMMUNICATION_OP", "PYTORCH_API") if t in tables)
    return megabytes, events


def _scaled(copies: int, folder: Path) -> Path:
    """A rank folder whose trace_view.json holds ``copies`` back-to-back copies of a real rank's events."""
    source = ASCEND / "torch_npu_2rank_level1" / "rank0_ascend_pt"
    events = json.loads((source / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").read_text())
    meta = [e for e in events if e["ph"] == "M"]
    timed = [e for e in events if e["ph"] != "M"]
    starts = [Decimal(e["ts"]) for e in timed]
    span = max(starts) - min(starts) + 1000
    out = []
    for copy in range(copies):
        shift = span * copy
        out.extend({**e, "ts": f"{start + shift:.3f}"} for e, start in zip(timed, starts, strict=True))
    target = folder / "scaled_ascend_pt"
    (target / "ASCEND_PROFILER_OUTPUT").mkdir(parents=True)
    (target / "ASCEND_PROFILER_OUTPUT" / "trace_view.json").write_text(json.dumps(meta + out))
    (target / "profiler_info_0.json").write_text((source / "profiler_info_0.json").read_text())
    return target


def _measure(path: Path, repeats: int) -> tuple[float, float, int]:
    """Best seconds of read_run and of read_run + store write, and the device events ingested."""
    best_parse, best_total, data = time_ingest([path], "ascend", repeats)
    return best_parse, best_total, data.table("device_events").height


def synthetic(ranks: int, repeats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        folder = synthesize("ascend", ranks, Path(tmp) / "run")
        megabytes, events = _inputs(folder)
        print(f"\nsynthetic: {ranks} database exports, {megabytes:.1f} MB, {events:,} TASK + HCCL op + PyTorch rows "
              f"(best of {repeats})")
        print_phases(folder, "ascend", repeats, megabytes, events, "rows")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--copies", type=int, default=50)
    parser.add_argument("--ranks", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"SQLite reader: {sqlite_reader()}; {load()}")
    print(f"{'input':<34}{'MB':>8}{'events':>10}{'stage':>12}{'seconds':>9}{'MB/s':>8}{'events/s':>12}")
    with tempfile.TemporaryDirectory() as tmp:
        cases = [(ASCEND / "torch_npu_2rank_level1", "level1 text, 2 ranks"),
                 (ASCEND / "torch_npu_2rank_level1_db", "level1 database, 2 ranks"),
                 (_scaled(args.copies, Path(tmp)), f"level1 text x{args.copies}, 1 rank")]
        for path, label in cases:
            megabytes, events = _inputs(path)
            parse, total, _ = _measure(path, args.repeats)
            for stage, seconds in (("read_run", parse), ("+store", total)):
                print(f"{label:<34}{megabytes:>8.1f}{events:>10,}{stage:>12}{seconds:>9.2f}"
                      f"{megabytes / seconds:>8.1f}{events / seconds:>12,.0f}")
    synthetic(args.ranks, args.repeats)
    print(load())


if __name__ == "__main__":
    main()
