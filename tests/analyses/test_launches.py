"""`kernels --launch` and the overlap headline of `breakdown`. The H200 GPT trace against its raw JSON (kernels and
the runtime calls that launched them, by correlation id, read here with the standard library): every event's delay,
the launch cost onto an idle device, the short share and the quantiles; synthesized traces, whose launch latency is
known. The queue length of the 16-rank HTA trace (six streams) by brute force at sampled instants, and its mean by
the identity that the integral of a queue is the sum of its members' waits. The overlap share of a rank of an 8-rank
HTA trace from interval unions of the store's own events. A CPU-only sample has no launch records: one note, exit 0;
a plot of it, exit 2."""

from __future__ import annotations

import gzip
import json
import shutil
import sqlite3
import statistics
from collections import Counter
from pathlib import Path

import duckdb
import numpy as np
import polars as pl
import pytest

from tests.conftest import ROOT, SAMPLES, TRACES, ingested, one_line, run_main
from tests.test_sample_traces import EXPERIMENTS
from traceana import store
from traceana.api import Traces
from traceana.errors import TraceanaError
from traceana.ingest.dispatch import IngestOptions, read_run
from traceana.synth.schedule import LAUNCH_LEAD_NS

GPT = TRACES / "kineto" / "h200_gpt_h2048_L8_s1024_gb4.json.gz"
HTA16 = TRACES / "kineto" / "hta_rank0of16_a2a_rs_ag.json.gz"
HTA3 = TRACES / "kineto" / "hta_rank3of8_6steps.json.gz"
H100 = TRACES / "nsys" / "nsysai_h100_2proc_nsys2026.2.sqlite"


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ingested(tmp_path_factory.mktemp("launches") / "t.duckdb", {
        "gpt": (GPT, None), "hta16": (HTA16, None), "hta3": (HTA3, None),
        "cpu": (SAMPLES / "moe_skewed", EXPERIMENTS["moe_skewed"][0])})


@pytest.fixture(scope="module")
def nsys_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not H100.exists():
        pytest.skip(f"{H100} is not here")
    return ingested(tmp_path_factory.mktemp("nsys") / "n.duckdb", {"h100": (H100, None)})


def raw_nvtx_launchers(report: Path, kinds: tuple[str, ...] = ("KERNEL", "MEMCPY", "MEMSET")) -> Counter:
    """(start, end) of each device event of an nsys export whose runtime call is recorded, with the thread, start
    and end of the innermost NVTX range around that call (None where no range holds it), read from the raw tables
    with sqlite3: the event's correlationId -> the runtime record of that id in its process -> the NVTX ranges of
    the call's thread (globalTid) with start <= the call's start <= end, the latest to start (at a tie the
    shorter)."""
    events = " UNION ALL ".join(f"SELECT start, end, correlationId, globalPid FROM CUPTI_ACTIVITY_KIND_{k}"
                                for k in kinds)
    with sqlite3.connect(f"file:{report}?mode=ro", uri=True) as raw:
        rows = raw.execute(f"""
            SELECT e.start, e.end, (SELECT json_array(n.globalTid & 16777215, n.start, n.end) FROM NVTX_EVENTS n
                                    WHERE n.globalTid = r.globalTid AND n.eventType IN (59, 60) AND n.end IS NOT NULL
                                      AND n.start <= r.start AND r.start <= n.end
                                    ORDER BY n.start DESC, n.end LIMIT 1)
            FROM ({events}) e
            JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = e.correlationId
                                              AND r.globalTid >> 24 = e.globalPid >> 24""").fetchall()
    return Counter((start, end, tuple(json.loads(found)) if found else None) for start, end, found in rows)


def _raw_launches(trace: Path) -> list[tuple[int, int, int, int]]:
    """(stream, start_ns, end_ns, launch_ns) of each device event with a runtime call of its correlation id."""
    with gzip.open(trace) as handle:
        raw = json.load(handle)
    base = int(raw.get("baseTimeNanoseconds") or 0)
    ns = lambda us: base + round(us * 1000)  # noqa: E731
    launch: dict[int, int] = {}
    for e in raw["traceEvents"]:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            corr = e["args"]["correlation"]
            launch[corr] = min(launch.get(corr, ns(e["ts"])), ns(e["ts"]))
    return [(e["args"]["stream"], ns(e["ts"]), ns(e["ts"]) + round(e.get("dur", 0) * 1000),
             launch[e["args"]["correlation"]])
            for e in raw["traceEvents"]
            if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")
            and e["args"].get("correlation") in launch]


def test_gpt_delays_cost_and_short_share_against_the_raw_json(db: Path) -> None:
    events = _raw_launches(GPT)
    idle_delays, reach = [], None  # launched onto an idle device: every event that started before it had ended
    for _, start, end, launch in sorted(events, key=lambda e: (e[1], e[2])):
        if reach is None or reach <= launch:
            idle_delays.append(start - launch)
        reach = end if reach is None else max(reach, end)
    cost = statistics.median(idle_delays)
    delays = [start - launch for _, start, _, launch in events]
    short = sum(end - start < cost for _, start, end, _ in events)

    traces = Traces(db, run="gpt")
    got = traces.sql("SELECT start_ns, delay_ns FROM kernel_launches ORDER BY ALL")
    assert got.rows() == sorted((start, start - launch) for _, start, _, launch in events)
    assert len(events) == 1828 and min(delays) >= 0  # every kernel, memcpy and memset of the trace
    rank = traces.launch_stats(by="rank").row(0, named=True)
    assert rank["launch_cost_us"] == pytest.approx(cost / 1e3) == pytest.approx(7.188)
    assert rank["idle_device_events"] == len(idle_delays) == 79
    assert rank["short_pct"] == pytest.approx(100 * short / len(events)) == pytest.approx(37.8, abs=0.05)
    assert rank["p50_delay_us"] == pytest.approx(np.percentile(delays, 50) / 1e3)
    assert rank["p95_delay_us"] == pytest.approx(np.percentile(delays, 95) / 1e3)
    assert rank["max_delay_us"] == pytest.approx(max(delays) / 1e3)
    # the GPU runs ~1.5 ms behind its host: the delay is queueing, 200 times the launch cost
    assert rank["p50_delay_us"] > 200 * rank["launch_cost_us"]
    kernels = traces.launch_stats(by="kernel")
    assert kernels["events"].sum() == len(events)
    steps = traces.launch_stats(by="step")
    assert steps["events"].to_list() == [914, 914]
    buckets = traces.launch_stats(by="time", buckets=7)
    assert buckets.height <= 7 and buckets["events"].sum() == len(events)


@pytest.mark.parametrize("fmt", ["kineto", "nsys"])
def test_synthesized_launch_latency_is_the_launch_cost(fmt: str, tmp_path: Path) -> None:
    # Ground truth: `traceana synth` starts a kernel the host launched onto an idle device LAUNCH_LEAD_NS later.
    code, _, err = run_main("synth", ROOT / "examples" / "synth_gpt_tp2pp2.yaml", tmp_path / "run", "--ranks", 8,
                            "--steps", 2, "--format", fmt)
    assert code == 0, err
    with store.connect(tmp_path / "s.duckdb") as con:
        store.write_run(con, "s", read_run([tmp_path / "run" / "traces"], fmt, IngestOptions()))
    ranks = Traces(tmp_path / "s.duckdb").launch_stats(by="rank")
    assert ranks.height == 8 and ranks["launch_cost_us"].to_list() == [LAUNCH_LEAD_NS / 1e3] * 8
    # an idle stream alone would not do: the first kernel of a communication stream waits for other streams' work
    (stream_cost,) = Traces(tmp_path / "s.duckdb").sql(
        "WITH e AS (SELECT *, coalesce(lag(end_ns) OVER (PARTITION BY rank, stream ORDER BY start_ns) <= launch_ns, "
        "true) AS idle FROM device_events) SELECT median(start_ns - launch_ns) AS ns FROM e WHERE idle")["ns"]
    assert stream_cost > 10 * LAUNCH_LEAD_NS


def _queue_at(view: pl.DataFrame, events: pl.DataFrame, instants: np.ndarray) -> list[tuple[int, int, int]]:
    """(stream, view's queue length, brute-force count) at each instant: events with launch <= t < start."""
    found = []
    for stream in events["stream"].unique().sort().to_list():
        mine = events.filter(pl.col("stream") == stream)
        launch, start = mine["launch_ns"].to_numpy(), mine["start_ns"].to_numpy()
        brute = ((launch[None, :] <= instants[:, None]) & (instants[:, None] < start[None, :])).sum(axis=1)
        series = view.filter(pl.col("stream") == stream).sort("ts_ns")
        index = np.searchsorted(series["ts_ns"].to_numpy(), instants, side="right") - 1
        values = np.where(index >= 0, series["queue_length"].to_numpy()[np.maximum(index, 0)], 0)
        found += [(stream, int(v), int(b)) for v, b in zip(values, brute, strict=True)]
    return found


def test_queue_length_by_brute_force_and_its_integral(db: Path) -> None:
    traces = Traces(db, run="hta16")
    events = traces.sql("SELECT stream, launch_ns, start_ns FROM device_events WHERE launch_ns IS NOT NULL")
    view = traces.sql("SELECT stream, ts_ns, until_ns, queue_length FROM queue_length")
    rng = np.random.default_rng(24)
    instants = np.sort(rng.integers(events["launch_ns"].min(), events["start_ns"].max(), 400))
    instants = np.concatenate([instants, events["start_ns"].to_numpy()[:50], events["launch_ns"].to_numpy()[:50]])
    checked = _queue_at(view, events, instants)
    assert all(v == b for _, v, b in checked) and max(b for *_, b in checked) > 900
    summary = traces.queue_length()
    assert summary.height == 6 and summary["events"].sum() == events.height == 6875
    waits = events.group_by("stream").agg((pl.col("start_ns") - pl.col("launch_ns")).sum().alias("wait_ns"),
                                          (pl.col("start_ns").max() - pl.col("launch_ns").min()).alias("span_ns"))
    joined = summary.join(waits, on="stream")
    # the integral of a queue is the sum of its members' waits; over the span that is the time-weighted mean
    assert joined.select((pl.col("mean_queue") * pl.col("span_ns") - pl.col("wait_ns")).abs().max()).item() < 1e-3
    assert (joined["span_ms"] * 1e6 - joined["span_ns"]).abs().max() < 1e-3
    series = traces.queue_length(by="time", buckets=50)
    width_ns = (series["end_ms"] - series["start_ms"]).max() * 1e6
    decimated = series.group_by("stream").agg((pl.col("mean_queue").sum() * width_ns).alias("integral"),
                                              pl.col("max_queue").max())
    check = decimated.join(joined, on="stream", suffix="_summary")
    assert (check["integral"] - check["wait_ns"]).abs().max() < 1e-6 * check["wait_ns"].max()
    assert check["max_queue"].to_list() == check["max_queue_summary"].to_list()


def _union(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        elif end > start:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def test_overlap_share_against_interval_unions(db: Path) -> None:
    traces = Traces(db, run="hta3")
    windows = traces.steps()
    events = traces.sql("SELECT category, start_ns, end_ns FROM device_events")
    for step, w0, w1 in windows.select("step", "start_ns", "end_ns").rows():
        def clipped(categories: tuple[str, ...], w0: int = w0, w1: int = w1) -> list[tuple[int, int]]:
            part = events.filter(pl.col("category").is_in(categories))
            return _union([(max(a, w0), min(b, w1)) for a, b in part.select("start_ns", "end_ns").rows()
                           if a < w1 and b > w0])
        comm, work = clipped(("comm",)), clipped(("compute", "memcpy", "memset"))
        under = sum(max(0, min(b, d) - max(a, c)) for a, b in comm for c, d in work)
        share = 100 * under / sum(b - a for a, b in comm)
        row = traces.breakdown(step=step).row(0, named=True)
        assert row["OVERLAP_pct"] == pytest.approx(share, rel=1e-9)
        assert row["OVERLAPPED_ms"] == pytest.approx(under / 1e6)
    typical = traces.breakdown().row(0, named=True)
    code, out, _ = run_main("breakdown", "hta3", "--db", db)
    assert code == 0 and f"comm/compute overlap: {typical['OVERLAP_pct']:.1f}% of communication" in out
    assert f"({typical['OVERLAP_pct']:.1f}%)" in out and round(typical["OVERLAP_pct"], 1) == 47.8
    stages = traces.breakdown(by="stage").row(0, named=True)
    assert stages["OVERLAP_pct"] == pytest.approx(typical["OVERLAP_pct"])  # one rank: its stage's share is its own


def test_cli_json_plot_and_a_run_without_launches(db: Path, tmp_path: Path) -> None:
    png = tmp_path / "launch.png"
    code, out, err = run_main("kernels", "gpt", "--launch", "--json", "--plot", png, "--db", db)
    assert code == 0 and png.stat().st_size > 20_000, err
    payload = json.loads(out)
    assert payload["by_rank"] == Traces(db, run="gpt").launch_stats(by="rank").to_dicts()
    assert payload["queue"][0]["max_queue"] == 85 and payload["notes"] == []
    code, out, _ = run_main("kernels", "gpt", "--launch", "--top", "3", "--db", db)
    assert code == 0 and "7.19 us" in out and "37.8% of events ran shorter than it" in out
    code, out, err = run_main("kernels", "cpu", "--launch", "--db", db)
    assert code == 0 and out.count("\n") == 1 and "has no launch records" in out, err
    assert "no launch records" in one_line(*run_main("kernels", "cpu", "--launch", "--plot", png, "--db", db)[::2])
    assert "add --launch" in one_line(*run_main("kernels", "gpt", "--plot", png, "--db", db)[::2])
    assert Traces(db, run="cpu").launch_stats().is_empty() and Traces(db, run="cpu").queue_length().is_empty()


def test_a_store_written_before_launch_records_asks_for_an_ingest(db: Path, tmp_path: Path) -> None:
    old = tmp_path / "old.duckdb"
    shutil.copy(db, old)
    with duckdb.connect(str(old)) as con:
        con.execute("ALTER TABLE device_events DROP COLUMN launch_ns")
    for args in (("--launch",), ("--launch", "--json"), ("--launch", "--plot", tmp_path / "x.png")):
        assert "ingest the run again" in one_line(*run_main("kernels", "gpt", *args, "--db", old)[::2])
    with pytest.raises(TraceanaError, match="ingest the run again"):
        Traces(old, run="gpt").queue_length(by="time")


def test_a_timelines_host_lanes_and_the_ops_that_launched_its_longest_kernels(db: Path) -> None:
    """host_lanes, what the report's timeline draws above a rank: its host ranges in the step down to three levels
    of each thread's tree, and its 12 longest kernels, each with the CPU op whose External id the raw JSON gives
    the kernel, the launch inside that op."""
    from traceana import store
    from traceana.analyses.launches import HOST_LEVELS, LONGEST, host_lanes

    with store.connect(db, read_only=True) as con:
        host, launches = host_lanes(con, "gpt", 2, [0])
        lo, hi = con.execute("SELECT start_ns, end_ns FROM step_windows WHERE run_id = 'gpt' AND step = 2"
                             ).fetchall()[0]
        longest = [r[0] for r in con.execute(
            "SELECT start_ns FROM device_events WHERE run_id = 'gpt' AND end_ns > ? AND start_ns < ? "
            "ORDER BY end_ns - start_ns DESC, event_id LIMIT ?", [lo, hi, LONGEST]).fetchall()]
    assert host["depth"].max() == HOST_LEVELS and host.height > 1000
    assert (host["end_ns"] > lo).all() and (host["start_ns"] < hi).all()
    with gzip.open(GPT) as handle:
        raw = json.load(handle)
    base = int(raw["baseTimeNanoseconds"])
    ns = lambda us: base + round(us * 1000)  # noqa: E731
    ops = {e["args"]["External id"]: (e["name"], ns(e["ts"]), ns(e["ts"]) + round(e["dur"] * 1000))
           for e in raw["traceEvents"] if e.get("cat") == "cpu_op"}
    by_start = {ns(e["ts"]): ops[e["args"]["External id"]] for e in raw["traceEvents"]
                if e.get("cat") == "kernel" and ns(e["ts"]) in longest}
    assert sorted(launches["start_ns"]) == sorted(longest) and len(by_start) == LONGEST
    for launch in launches.iter_rows(named=True):
        name, start, end = by_start[launch["start_ns"]]
        assert launch["op"] == name and start <= launch["launch_ns"] <= end


def test_nsys_events_are_linked_to_the_innermost_nvtx_range_on_their_launching_thread(nsys_db: Path) -> None:
    """Issue 34 item 2 for nsys: every device event of the shared 2xH100 export whose runtime call is recorded (1,046
    of 2,184 a rank; the capture window cut off the others' calls) is linked by event_launchers to the innermost
    NVTX range open on the call's thread at its start, the same range, for every one of them, that the raw export
    gives by a second route (correlationId -> runtime record -> NVTX ranges of its globalTid, in SQLite)."""
    with store.connect(nsys_db, read_only=True) as con:
        counts = con.execute("""SELECT count(*), count(l.event_id), count(l.event_id) FILTER (e.category = 'compute'),
                                       count(*) FILTER (e.category = 'compute'), count(l.op_id),
                                       count(*) FILTER (l.launch_ns NOT BETWEEN l.op_start_ns AND l.op_end_ns)
                                FROM device_events e LEFT JOIN event_launchers l USING (run_id, rank, event_id)
                                WHERE e.launch_ns IS NOT NULL OR e.category = 'compute'""").fetchall()[0]
        ours = Counter(con.execute("SELECT e.start_ns, e.end_ns, (l.thread, l.op_start_ns, l.op_end_ns) "
                                   "FROM event_launchers l JOIN device_events e USING (run_id, rank, event_id)"
                                   ).fetchall())
    linked, kernels_linked, kernels = counts[1:4]
    assert (linked, kernels_linked, kernels) == (2092, 1632, 3442) and counts[4:] == (0, 0)
    assert counts[0] == kernels + linked - kernels_linked  # every event with a launch record is linked
    raw = raw_nvtx_launchers(H100)
    assert sum(raw.values()) == 2092 and None not in {found for _, _, found in raw}
    assert Counter({(s, e, tuple(found)): n for (s, e, found), n in ours.items()}) == raw
    assert sum(raw_nvtx_launchers(H100, ("KERNEL",)).values()) == 1632


def test_an_nsys_timeline_traces_its_longest_kernels_to_their_nvtx_ranges(nsys_db: Path) -> None:
    """The report's timeline of the 2xH100 export: each rank's 12 longest linked events (150 ms and 7 ms host-to-
    device copies) with the NVTX range they were launched in (aten::copy_, four levels down), the launch inside it."""
    from traceana.analyses.launches import LONGEST, host_lanes

    with store.connect(nsys_db, read_only=True) as con:
        host, launches = host_lanes(con, "h100", 0, [0, 1])
        found = con.execute("SELECT rank, e.start_ns, op, op_start_ns, op_end_ns FROM event_launchers "
                            "JOIN device_events e USING (run_id, rank, event_id)").fetchall()
    assert launches.height == 2 * LONGEST and launches["rank"].value_counts()["count"].to_list() == [LONGEST] * 2
    assert set(launches["op"]) == {"aten::copy_"} and set(launches["depth"]) == {4} and set(host["kind"]) == {"nvtx"}
    ranges = {(rank, start): (op, lo, hi) for rank, start, op, lo, hi in found}
    for launch in launches.iter_rows(named=True):
        op, lo, hi = ranges[launch["rank"], launch["start_ns"]]
        assert launch["op"] == op and lo <= launch["launch_ns"] <= hi
