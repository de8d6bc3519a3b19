"""nsys ingest throughput on the largest shared SQLite export: read + finish, then the store write.

Prints seconds, MB/s of export file and kernels/s (and all device events + NVTX ranges per second).
Run: .venv/bin/python benchmarks/bench_nsys.py
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from ingest_timing import time_ingest

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces" / "nsys"


def main(repeats: int = 5) -> None:
    export = max(SHARED.glob("*.sqlite"), key=lambda p: p.stat().st_size)
    con = sqlite3.connect(f"file:{export}?mode=ro", uri=True)
    (kernels,) = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    con.close()
    best_read, best_total, data = time_ingest([export], "nsys", repeats)
    mb = export.stat().st_size / 1e6
    rows = data.table("device_events").height + data.table("annotations").height
    print(f"export: {export.name}  ({mb:.2f} MB, {kernels:,} kernels, {data.table('device_events').height:,} device "
          f"events, {data.table('annotations').height:,} NVTX ranges; best of {repeats})")
    print(f"{'stage':<22}{'seconds':>9}{'MB/s':>9}{'kernels/s':>12}{'rows/s':>12}")
    for label, seconds in (("read+finish", best_read), ("ingest incl. store", best_total)):
        print(f"{label:<22}{seconds:>9.3f}{mb / seconds:>9.1f}{kernels / seconds:>12,.0f}{rows / seconds:>12,.0f}")


if __name__ == "__main__":
    main()
