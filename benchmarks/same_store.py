"""Whether a change to the ingest left every stored number as it was: the same inputs ingested by a baseline
traceana (another checkout's `traceana` executable) and by this one, then every table of every run compared, as
sorted multisets of rows (``EXCEPT ALL`` both ways, NULLs equal), with the row counts.

Only ``runs.ingested_at`` (the clock) is left out. Inputs: by default the shared nsys exports, the bundled
sample_traces/nsys reports, and a synthetic 4-rank nsys run read with --jobs 2 (the worker path); or the paths given.
Exits 1 when a table differs.
Run: .venv/bin/python benchmarks/same_store.py --baseline ../main/.venv/bin/traceana [PATH ...]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import duckdb
from ingest_timing import synthesize

from traceana.ingest.run_data import TABLES

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces" / "nsys"
HERE = Path(sys.executable).with_name("traceana")


def ingest(traceana: Path, db: Path, run_id: str, paths: list[Path], jobs: int, cwd: Path) -> str:
    """Ingest ``paths`` as run ``run_id``; the command's last line (its error, when it refuses the input)."""
    command = [str(traceana), "ingest", *map(str, paths), "--db", str(db), "--run-id", run_id, "--jobs", str(jobs)]
    result = subprocess.run(command, capture_output=True, text=True, cwd=cwd, check=False)
    lines = (result.stdout + result.stderr).strip().splitlines()
    return f"exit {result.returncode}: {lines[-1].replace(str(db), 'STORE') if lines else ''}"


def differences(before: Path, after: Path) -> list[tuple[str, int, int, int, int]]:
    """(table, rows before, rows after, rows only before, rows only after) for every stored table."""
    con = duckdb.connect()
    con.execute(f"ATTACH '{before}' AS a (READ_ONLY)")
    con.execute(f"ATTACH '{after}' AS b (READ_ONLY)")
    out = []
    for table in ("runs", *TABLES):
        cols = "* EXCLUDE (ingested_at)" if table == "runs" else "*"
        a, b = f"SELECT {cols} FROM a.{table}", f"SELECT {cols} FROM b.{table}"
        counts = [con.execute(f"SELECT count(*) FROM ({q})").fetchone()[0] for q in (a, b)]  # type: ignore[index]
        only = [con.execute(f"SELECT count(*) FROM ({x} EXCEPT ALL {y})").fetchone()[0]  # type: ignore[index]
                for x, y in ((a, b), (b, a))]
        out.append((table, *counts, *only))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--baseline", type=Path, required=True, help="the baseline checkout's traceana executable")
    parser.add_argument("paths", type=Path, nargs="*")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.paths:
            inputs = [(p.name, [p.resolve()], 1) for p in args.paths]
        else:
            synthetic = synthesize("nsys", 4, work / "synth", steps=2)
            inputs = [(p.name, [p], 1) for p in sorted(SHARED.glob("*.sqlite"))]
            inputs += [("sample_traces/nsys", [ROOT / "sample_traces" / "nsys"], 1), ("synth4", [synthetic], 2)]
        for name, paths, jobs in inputs:
            said = {side: ingest(exe, work / f"{side}.duckdb", name, paths, jobs, work)
                    for side, exe in (("before", args.baseline.resolve()), ("after", HERE))}
            print(f"{name}: before {said['before']}" + ("" if said["after"] == said["before"]
                                                        else f"; after {said['after']}"))
        rows = differences(work / "before.duckdb", work / "after.duckdb")
    print(f"\n{'table':<16}{'rows before':>13}{'rows after':>12}{'only before':>13}{'only after':>12}")
    for table, *counts in rows:
        print(f"{table:<16}" + "".join(f"{n:>{w},}" for n, w in zip(counts, (13, 12, 13, 12), strict=True)))
    same = all(a == b and not x and not y for _, a, b, x, y in rows)
    print("identical" if same else "DIFFERENT")
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
