"""`comm`: nccl-tests bandwidths on a hand-built 4-rank run (numbers by hand), on a real NCCL trace against its raw
JSON, and the pipeline samples' rank-pair matrix against the sample programs' message sizes."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import duckdb
import polars as pl
import pytest
from rich.console import Console
from typer.testing import CliRunner

from tests.conftest import SAMPLES, TRACES, add_run
from tests.test_sample_traces import EXPERIMENTS
from traceana import store
from traceana.analyses.comm import slow_links
from traceana.cli.main import app
from traceana.ingest.run_data import RunData
from traceana.render import console
from traceana.render.units import BINARY_BYTES, unit_for

ASCEND = TRACES / "ascend" / "torch_npu_2rank_level1"

# 4 ranks, one group; per instance (op, bytes per rank, start of each rank, end of every rank):
# 1 AllReduce 1e6 B, last arrival 100, end 1100: t = 1000 ns, S = 1e6, algbw 1000 GB/s, busbw 1000·2·3/4 = 1500
# 2 AllGather 250 kB in: S = 4 × 250 kB = 1e6, t = 1000, algbw 1000, busbw 1000·3/4 = 750
# 3 AllToAll 4e6 B: S = 4e6, t = 2000, algbw 2000, busbw 1500; each rank sends 1e6 to each other rank
HAND = [("AllReduce", 1_000_000, [0, 0, 50, 100], 1100), ("AllGather", 250_000, [2000] * 4, 3000),
        ("AllToAll", 4_000_000, [4000, 4000, 4000, 4000], 6000)]


def hand_run() -> RunData:
    events, colls = [], []
    for instance, (op, nbytes, starts, end) in enumerate(HAND, start=1):
        for rank, start in enumerate(starts):
            event_id = 10 * instance + rank
            events.append({"rank": rank, "event_id": event_id, "stream": 7, "start_ns": start, "end_ns": end,
                           "name": f"nccl {op}", "category": "comm"})
            colls.append({"rank": rank, "event_id": event_id, "op": op, "bytes": nbytes, "pg": "g", "dim": "DP",
                          "instance": instance, "evidence": "pg-args"})
    return RunData(source_format="kineto", sources=["hand-built"], world_size=4, frames={
        "ranks": pl.DataFrame({"rank": [0, 1, 2, 3], "host": ["a", "a", "b", "b"], "clock_offset_ns": 0}),
        "process_groups": pl.DataFrame({"pg": ["g"], "dim": ["DP"], "ranks": [[0, 1, 2, 3]], "source": ["trace"]}),
        "device_events": pl.DataFrame(events), "collectives": pl.DataFrame(colls)})


@pytest.fixture(scope="module")
def con(tmp_path_factory: pytest.TempPathFactory) -> Iterator[duckdb.DuckDBPyConnection]:
    folder = tmp_path_factory.mktemp("comm")
    with store.connect(folder / "t.duckdb") as connection:
        store.write_run(connection, "hand", hand_run())
        for name in ("pp2_mb1", "pp2_mb8"):
            add_run(connection, name, [SAMPLES / name], "kineto", EXPERIMENTS[name][0])
        add_run(connection, "pg_args", [TRACES / "kineto" / "hta_rank0of2_pg_args.json.gz"], "kineto")
        add_run(connection, "npu", [ASCEND], "ascend")
        yield connection


def test_hand_built_bandwidths_and_matrix(con: duckdb.DuckDBPyConnection) -> None:
    got = con.execute("SELECT instance, op, n, size_bytes, time_ns, algbw_GBps, busbw_GBps, hosts, link "
                      "FROM collective_bandwidth WHERE run_id = 'hand' ORDER BY instance").fetchall()
    assert got == [(1, "AllReduce", 4, 1_000_000, 1000, 1000.0, 1500.0, 2, "inter-node"),
                   (2, "AllGather", 4, 1_000_000, 1000, 1000.0, 750.0, 2, "inter-node"),
                   (3, "AllToAll", 4, 4_000_000, 2000, 2000.0, 1500.0, 2, "inter-node")]
    pairs = con.execute("SELECT src, dst, messages, bytes, time_ns FROM comm_matrix WHERE run_id = 'hand' "
                        "ORDER BY src, dst").fetchall()
    assert pairs == [(s, d, 1, 1_000_000, 2000) for s in range(4) for d in range(4) if s != d]


def test_real_nccl_trace_against_its_json(con: duckdb.DuckDBPyConnection) -> None:
    # One traced rank of a 2-rank group: each kernel's own time; busbw factor 2(n-1)/n = 1 (AllReduce) and 1
    # (Broadcast) for n = 2 (the kernels' 'Group size' arg).
    with gzip.open(TRACES / "kineto" / "hta_rank0of2_pg_args.json.gz") as handle:
        raw = json.load(handle)
    itemsize = {"Float": 4, "Long": 8, "Byte": 1}  # c10 scalar type names
    expected = sorted(
        ({"allreduce": "AllReduce", "broadcast": "Broadcast"}[e["args"]["Collective name"]],
         e["args"]["In msg nelems"] * itemsize[e["args"]["dtype"]], round(e["dur"] * 1000), e["args"]["Group size"])
        for e in raw["traceEvents"] if e.get("cat") == "kernel" and "Collective name" in e.get("args", {}))
    got = con.execute("SELECT op, size_bytes, time_ns, n, algbw_GBps, busbw_GBps FROM collective_bandwidth "
                      "WHERE run_id = 'pg_args' ORDER BY ALL").fetchall()
    assert [row[:4] for row in got] == expected and len(got) == 21
    assert all(busbw == pytest.approx(size / time) == algbw for _, size, time, _, algbw, busbw in got)


def test_ascend_transfer_times_against_the_profilers_own_analysis(con: duckdb.DuckDBPyConnection) -> None:
    # msprof's communication.json per rank and op: Elapse Time less Wait Time (its notify waits) is the op's time
    # once the peer is there. Ours runs from the last arrival to the last end, so it is the longest rank's figure
    # or a little more (waits msprof counts inside the op): measured 0.02 to 0.10 ms more, on 2.2 to 73 ms.
    own: dict[int, float] = {}
    for rank in (0, 1):
        path = ASCEND / f"rank{rank}_ascend_pt" / "ASCEND_PROFILER_OUTPUT" / "communication.json"
        for name, info in json.loads(path.read_text())["step50"]["collective"].items():
            if name != "Total Op Info":
                seq = int(name.split("@")[0].split("_")[-2])  # hcom_allReduce__586_<seq>_1
                times = info["Communication Time Info"]
                own[seq] = max(own.get(seq, 0.0), times["Elapse Time(ms)"] - times["Wait Time(ms)"])
    got = dict(con.execute("SELECT c.seq, b.time_ns / 1e6 FROM collective_bandwidth b JOIN collectives c "
                           "USING (run_id, instance) WHERE run_id = 'npu' AND c.rank = 0").fetchall())
    assert got.keys() == own.keys() and len(got) == 4
    assert all(0 <= got[seq] - own[seq] < 0.15 for seq in own), (got, own)
    links = con.execute("SELECT DISTINCT n, link FROM collective_bandwidth WHERE run_id = 'npu'").fetchall()
    assert links == [(2, "intra-node")]  # both ranks' clocks read one host (ingest note: wall-minus-monotonic)


@pytest.mark.parametrize(("name", "messages", "message_bytes"), [("pp2_mb1", 2, 64 * 1024 * 4),
                                                                  ("pp2_mb8", 16, 8 * 1024 * 4)])
def test_pipeline_matrix(con: duckdb.DuckDBPyConnection, name: str, messages: int, message_bytes: int) -> None:
    # sample_traces/pipeline.py: each micro-batch sends H [mb, 1024] fp32 forward and dH back, 64 samples per step
    # in 1 or 8 micro-batches; 2 profiled steps. Layout pp=2,dp=2 with pp fastest: pipelines are ranks 0-1 and 2-3.
    got = con.execute("SELECT src, dst, dim, messages, bytes FROM comm_matrix WHERE run_id = ? ORDER BY src, dst",
                      [name]).fetchall()
    assert got == [(s, d, "PP", messages, messages * message_bytes) for s, d in ((0, 1), (1, 0), (2, 3), (3, 2))]


def test_command(con: duckdb.DuckDBPyConnection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "h.duckdb"
    with store.connect(db) as writer:
        store.write_run(writer, "hand", hand_run())
    runner = CliRunner()
    png = tmp_path / "m.png"
    result = runner.invoke(app, ["comm", "--db", str(db), "--json", "--plot", str(png), "--top", "1"])
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)  # "wrote m.png" goes to stderr
    assert [r["instance"] for r in payload["slowest"]] == [3]
    ops = {r["op"]: r for r in payload["by_op"]}
    assert ops["AllReduce"]["busbw_GBps"] == 1500.0 and ops["AllGather"]["link"] == "inter-node"
    assert png.stat().st_size > 10_000
    # the table: sizes in the binary unit the largest calls for, named in the header (the JSON keeps bytes)
    unit, factor, _ = unit_for(max(r["size_bytes"] for r in payload["by_op"]), BINARY_BYTES)
    assert unit != "B"
    monkeypatch.setattr(console, "console", Console(width=250, color_system=None))  # xdist's COLUMNS is 80
    table = runner.invoke(app, ["comm", "--db", str(db)]).output.splitlines()
    header = [c.strip() for c in next(line for line in table if "┃ op " in line).split("┃")[1:-1]]
    assert "size_bytes" not in header and f"size_{unit}" in header
    column = header.index(f"size_{unit}")
    rows = [line.split("│")[1:-1] for line in table[table.index(next(line for line in table if "┃ op " in line)):]
            if line.startswith("│")][:len(payload["by_op"])]
    assert sorted(float(r[column]) for r in rows) == pytest.approx(
        sorted(r["size_bytes"] / factor for r in payload["by_op"]), rel=1e-2)
    result = runner.invoke(app, ["comm", "--db", str(db), "--threshold", "150"])
    assert result.exit_code != 0 and "--threshold" in str(result.exception)


def test_slow_links_are_those_below_their_peers_median() -> None:
    # four PP pairs: median (0.9 + 1.0) / 2 = 0.95 GB/s; 0.5 is 47.4% below it, 0.9 only 5.3%. TP groups 2.0 and 1.0,
    # median 1.5: 1.0 is 33% below.
    pairs = pl.DataFrame({"src": [0, 1, 2, 3], "dst": [1, 0, 3, 2], "dim": "PP", "GBps": [1.0, 1.1, 0.9, 0.5]})
    groups = pl.DataFrame({"pg": ["a", "b"], "dim": "TP", "op": "AllReduce", "ranks": ["[0, 1]", "[2, 3]"],
                           "busbw_GBps": [2.0, 1.0]})
    got = slow_links(pairs, groups, 20).select("what", "who", "vs_median_pct").rows()
    assert got == [("pair", "3 -> 2", pytest.approx(100 * (0.5 / 0.95 - 1))),
                   ("group", "pg b [2, 3]", pytest.approx(-100 / 3))]
    assert slow_links(pairs, groups, 60).is_empty()
