"""Time every analysis against the breakdown on the same real runs: the shared traces and the bundled samples.

Each run is ingested into one temporary store; then each analysis reads it through the Python API (what the
commands call), best of ``--repeat`` tries, and the table prints its seconds and its ratio to `breakdown` on the
same run. The aim (issue 23): every analysis within 2x the breakdown's time. ``--synth-ranks N`` adds a run of N
ranks written by `traceana synth` (3 steps, 200 µs kernels: ~500 launched device events per rank), the scale the
per-rank tables (launch statistics, queue length per stream) have to hold. The report, which shows them all, is
printed beside the sum of the analyses it runs, called one by one ("parts").

    .venv/bin/python benchmarks/bench_analyses.py [--repeat 3] [--only NAME ...] [--synth-ranks 1024]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ingest_timing import synthesize

from traceana.api import Traces
from traceana.errors import TraceanaError
from traceana.ingest.dispatch import IngestOptions, read_run
from traceana.layout import Layout
from traceana.store import connect, database

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces"
RUNS = {  # name -> (paths, layout)
    "h200_hostbound": ([TRACES / "kineto" / "h200_hostbound_h512_L12_s256_gb8.json.gz"], None),
    "h200_gpt": ([TRACES / "kineto" / "h200_gpt_h2048_L8_s1024_gb4.json.gz"], None),
    "hta_rank0of16": ([TRACES / "kineto" / "hta_rank0of16_a2a_rs_ag.json.gz"], None),
    "hta_rank3of8": ([TRACES / "kineto" / "hta_rank3of8_6steps.json.gz"], None),
    "nsys_h100_2proc": ([TRACES / "nsys" / "nsysai_h100_2proc_nsys2026.2.sqlite"], None),
    "ascend_level1": ([TRACES / "ascend" / "torch_npu_2rank_level1"], None),
    "toy8": ([ROOT / "sample_traces" / "traces" / "toy8_tp2pp2dp2_1f1b"], "tp=2,pp=2,dp=2,order=tp-cp-ep-dp-pp"),
}


REPORT = "report --html"


def analyses(api: Traces, run: str) -> dict[str, Callable[[], object]]:
    return {
        "breakdown": lambda: api.breakdown(run=run),
        "stragglers": lambda: api.stragglers(run=run),
        "critical_path": lambda: api.critical_path(run=run),
        "comm": lambda: api.comm(run=run),
        "kernels": lambda: api.kernels(run=run),
        "roofline": lambda: api.roofline(run=run),
        "idle": lambda: api.idle(run=run),
        "memory": lambda: api.memory(run=run),
        "launch_stats": lambda: [api.launch_stats(by=by, run=run) for by in ("kernel", "rank", "step", "time")],
        "queue_length": lambda: [api.queue_length(by=by, run=run) for by in ("stream", "time")],
        "replay": lambda: api.replay(run=run),
        "advise": lambda: api.advise(run=run),
        # the whole HTML report: every analysis above and advise's replays, on one connection, and the page
        # (imports warm); "parts" is the sum of the columns before it, the same analyses called one by one
        REPORT: lambda: api.report(Path(tempfile.gettempdir()) / f"bench_report_{run}.html", run=run),
    }


def best(call: Callable[[], object], repeat: int) -> float | None:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        try:
            call()
        except TraceanaError:  # e.g. a run without memory samples
            return None
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=list(RUNS))
    parser.add_argument("--synth-ranks", type=int, help="Add a synthesized run of this many ranks.")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.duckdb"
        runs = {name: RUNS[name] for name in args.only}
        if args.synth_ranks:
            traces = synthesize("kineto", args.synth_ranks, Path(tmp) / "synth", steps=3, kernel_us=200)
            runs[f"synth{args.synth_ranks}"] = ([traces], None)  # the traces name their groups: no layout needed
        for name, (paths, layout) in runs.items():
            options = IngestOptions(layout=Layout.parse(layout)) if layout else IngestOptions()
            data = read_run(paths, "auto", options)
            with connect(db) as con:
                database.write_run(con, name, data)
        api = Traces(db)
        names = list(analyses(api, next(iter(runs))))
        print(f"{'run':18s} {'events':>8s} " + " ".join(f"{n:>14s}" for n in names))
        for name in runs:
            (events,) = api.sql(f"SELECT count(*) AS n FROM device_events WHERE run_id = '{name}'")["n"]
            timed = {n: best(call, args.repeat) for n, call in analyses(api, name).items()}
            base = timed["breakdown"] or 1e-9
            cells = [f"{t:6.3f}s {t / base:4.1f}x" if t is not None else f"{'-':>14s}" for t in timed.values()]
            parts = sum(t for n, t in timed.items() if n != REPORT and t is not None)
            print(f"{name:18s} {events:8d} " + " ".join(f"{c:>14s}" for c in cells)
                  + f"  parts {parts:6.3f}s, report/parts {timed[REPORT] / parts:4.2f}")


if __name__ == "__main__":
    main()
