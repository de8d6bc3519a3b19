"""Kineto ingest throughput on the largest shared trace: parse + link + finish, then the store write.

Prints MB/s (compressed file and uncompressed JSON) and trace events/s. Run: .venv/bin/python benchmarks/bench_kineto.py
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from ingest_timing import time_ingest

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces" / "kineto"


def main(repeats: int = 3) -> None:
    trace = max(SHARED.glob("*.json.gz"), key=lambda p: p.stat().st_size)
    raw = gzip.decompress(trace.read_bytes())
    events = len(json.loads(raw)["traceEvents"])
    best_parse, best_total, data = time_ingest([trace], "kineto", repeats)
    mb_gz, mb_raw = trace.stat().st_size / 1e6, len(raw) / 1e6
    print(f"trace: {trace.name}  ({mb_gz:.2f} MB gzipped, {mb_raw:.1f} MB JSON, {events:,} events, "
          f"{data.table('device_events').height:,} device events)")
    print(f"{'stage':<22}{'seconds':>9}{'MB/s gz':>10}{'MB/s JSON':>11}{'events/s':>12}")
    for label, seconds in (("parse+link+finish", best_parse), ("ingest incl. store", best_total)):
        print(f"{label:<22}{seconds:>9.2f}{mb_gz / seconds:>10.2f}{mb_raw / seconds:>11.1f}{events / seconds:>12,.0f}")


if __name__ == "__main__":
    main()
