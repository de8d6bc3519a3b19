"""Time the breakdown and straggler views on a scaled copy of a real trace: 8 to 1,024 ranks x 100k events.

One real Kineto rank (default ../shared/traces/kineto/hta_rank3of8_6steps.json.gz: 9,450 GPU events, 6 steps) is
repeated back to back until each rank has ``--events`` events, then copied to every rank with a per-rank clock
offset (up to 100 us) and a per-event jitter (up to 1 us), straight into DuckDB. Its collectives keep one instance
per (repetition, event) across ranks and get a dim from TP, DP, EP, PP in turn; ranks are split into 4 stages.

    .venv/bin/python benchmarks/bench_breakdown.py [--ranks 8,64,512,1024] [--events 100000] [--threads 2]
"""

from __future__ import annotations

import argparse
import math
import re
import tempfile
import time
from pathlib import Path

import duckdb

from traceana import store
from traceana.ingest.dispatch import IngestOptions, read_run
from traceana.store import database

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
DEFAULT_TRACE = SHARED / "traces" / "kineto" / "hta_rank3of8_6steps.json.gz"
RUN = "bench"
QUERIES = {  # what a user's commands run: every row of each view for the run
    "rank_step_breakdown": f"SELECT * FROM rank_step_breakdown WHERE run_id = '{RUN}'",
    "stage_breakdown": f"SELECT * FROM stage_breakdown WHERE run_id = '{RUN}'",
    "collective_instances": f"SELECT * FROM collective_instances WHERE run_id = '{RUN}'",
    "stragglers": f"SELECT * FROM stragglers WHERE run_id = '{RUN}'",
}


def load_base(con: duckdb.DuckDBPyConnection, trace: Path) -> None:
    """The real rank's events, collectives and steps as tables base_events / base_coll / base_steps."""
    data = read_run([trace], "auto", IngestOptions())
    # DuckDB reads the locals by name; store tables would shadow locals called like them
    frame_events = data.table("device_events")  # noqa: F841
    frame_coll = data.table("collectives")  # noqa: F841
    frame_steps = data.table("steps")  # noqa: F841
    con.execute("CREATE TEMP TABLE base_events AS SELECT * EXCLUDE (rank) FROM frame_events")
    con.execute("CREATE TEMP TABLE base_coll AS SELECT event_id, op FROM frame_coll")
    con.execute("CREATE TEMP TABLE base_steps AS SELECT step, start_ns, end_ns FROM frame_steps")


def scale(con: duckdb.DuckDBPyConnection, ranks: int, per_rank: int) -> None:
    """Replace run RUN with ``ranks`` jittered copies of the base rank, ``per_rank`` events each."""
    n, span = con.execute("SELECT count(*), max(end_ns) - min(start_ns) FROM base_events").fetchone()
    params = {"run": RUN, "ranks": ranks, "reps": math.ceil(per_rank / n), "n": n, "span": span, "per_rank": per_rank}

    def run(sql: str) -> None:  # DuckDB wants exactly the parameters a statement names
        con.execute(sql, {k: v for k, v in params.items() if re.search(rf"\${k}\b", sql)})

    for table in ("runs", "ranks", "device_events", "collectives", "steps", "process_groups", "annotations"):
        run(f"DELETE FROM {table} WHERE run_id = $run")
    run("INSERT INTO runs (run_id, source_format, sources, ingested_at, world_size, rank_source) "
        "VALUES ($run, 'kineto', [], now()::TIMESTAMP, $ranks, 'bench')")
    run("INSERT INTO ranks (run_id, rank, clock_offset_ns, pp) SELECT $run, r, 0, (r * 4 // $ranks)::INT "
        "FROM range($ranks) t(r)")
    shift = "rep * $span + hash(r) % 100000"  # repetition, then the rank's clock offset
    run(
        f"""INSERT INTO device_events (run_id, rank, event_id, stream, start_ns, end_ns, name, category)
        SELECT $run, r, rep * $n + e.event_id, e.stream,
               e.start_ns + {shift} + hash(r, rep, e.event_id) % 1000,
               e.end_ns + {shift} + hash(r, rep, e.event_id) % 1000, e.name, e.category
        FROM base_events e, range($reps) t(rep), range($ranks) u(r)
        WHERE rep * $n + e.event_id < $per_rank""")
    run(
        """INSERT INTO collectives (run_id, rank, event_id, op, dim, instance, evidence)
        SELECT $run, r, rep * $n + c.event_id, c.op, ['TP', 'DP', 'EP', 'PP'][(rep * $n + c.event_id) % 4 + 1],
               rep * $n + c.event_id, 'name-rule'
        FROM base_coll c, range($reps) t(rep), range($ranks) u(r)
        WHERE rep * $n + c.event_id < $per_rank""")
    run(
        f"""INSERT INTO steps
        SELECT $run, r, (rep * 100 + s.step)::INT, s.start_ns + {shift}, s.end_ns + {shift}
        FROM base_steps s, range($reps) t(rep), range($ranks) u(r)""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="8,64,512,1024", help="comma-separated rank counts")
    parser.add_argument("--events", type=int, default=100_000, help="device events per rank")
    parser.add_argument("--threads", type=int, default=2, help="DuckDB threads")
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="the real rank to scale")
    parser.add_argument("--db", type=Path, default=None, help="store file (default: a temporary one)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = args.db or Path(tmp) / "bench.duckdb"
        with store.connect(db) as con:
            con.execute(f"SET threads TO {args.threads}")
            con.execute(f"SET temp_directory = '{tmp}'")
            with database.transaction(con):  # the schema and views, in a fresh file
                pass
            load_base(con, args.trace)
            print(f"base: {args.trace.name}; {args.events:,} events per rank; DuckDB threads={args.threads}")
            print(f"{'ranks':>6} {'events':>12} {'load s':>8} " + " ".join(f"{q + ' s':>22}" for q in QUERIES)
                  + f" {'rows':>8}")
            for ranks in (int(r) for r in args.ranks.split(",")):
                t0 = time.perf_counter()
                scale(con, ranks, args.events)
                con.execute("CHECKPOINT")
                load = time.perf_counter() - t0
                times, rows = [], 0
                for sql in QUERIES.values():
                    t0 = time.perf_counter()
                    result = con.execute(sql).fetchall()
                    times.append(time.perf_counter() - t0)
                    rows = rows or len(result)
                events = con.execute("SELECT count(*) FROM device_events WHERE run_id = $run", {"run": RUN}).fetchone()
                print(f"{ranks:>6} {events[0]:>12,} {load:>8.1f} " + " ".join(f"{t:>22.2f}" for t in times)
                      + f" {rows:>8,}", flush=True)


if __name__ == "__main__":
    main()
