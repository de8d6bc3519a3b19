"""rank_step_breakdown on hand-built interval cases, each with numbers computed by hand in the comments, and on
random cases against a brute-force reference (every elementary interval checked event by event in Python)."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from pathlib import Path

import duckdb
import polars as pl
import pytest

from traceana import store
from traceana.analyses.breakdown import PARTS
from traceana.ingest.run_data import RunData

# (rank, start_ns, end_ns, category, dim): dim is the collectives row's dim for comm events, "-" for a comm event
# without a collectives row, None for everything else.
Event = tuple[int, int, int, str, str | None]
COLUMNS = ["TOTAL_ns", *(f"{p}_ns" for p in PARTS), "OVERLAPPED_ns"]


def run_data(events: list[Event], steps: list[tuple[int, int, int, int]] = (), world_size: int | None = None,
             pp: dict[int, int] | None = None, instances: dict[tuple[int, int], int] | None = None) -> RunData:
    """A RunData holding ``events`` (event_id = position), ``steps`` (rank, step, start, end) and, for comm events
    with a dim, collectives rows whose instance is ``instances[(rank, event_id)]``."""
    ranks = sorted({e[0] for e in events} | {s[0] for s in steps})
    frame = pl.DataFrame(
        [{"rank": r, "event_id": i, "stream": 7, "start_ns": s, "end_ns": e, "name": f"k{i}", "category": c}
         for i, (r, s, e, c, _) in enumerate(events)])
    collectives = pl.DataFrame(
        [{"rank": r, "event_id": i, "op": "AllReduce", "dim": d, "pg": d, "evidence": "name-rule",
          "instance": (instances or {}).get((r, i))}
         for i, (r, _, _, c, d) in enumerate(events) if c == "comm" and d not in (None, "-")],
        schema={"rank": pl.Int32, "event_id": pl.Int64, "op": pl.String, "dim": pl.String, "pg": pl.String,
                "evidence": pl.String, "instance": pl.Int64})
    return RunData(
        source_format="kineto", sources=["hand-built"], world_size=world_size or len(ranks),
        frames={
            "ranks": pl.DataFrame({"rank": ranks, "pp": [(pp or {}).get(r) for r in ranks], "clock_offset_ns": 0},
                                  schema={"rank": pl.Int32, "pp": pl.Int32, "clock_offset_ns": pl.Int64}),
            "device_events": frame,
            "collectives": collectives,
            "steps": pl.DataFrame(list(steps), schema=["rank", "step", "start_ns", "end_ns"], orient="row"),
        })


@pytest.fixture
def con(tmp_path: Path) -> Iterator[duckdb.DuckDBPyConnection]:
    with store.connect(tmp_path / "t.duckdb") as connection:
        yield connection


def breakdown(con: duckdb.DuckDBPyConnection, data: RunData) -> dict[tuple[int, int], dict[str, int]]:
    """(rank, step) -> the breakdown columns, after writing ``data`` as run 'r'."""
    store.write_run(con, "r", data)
    sql = f"SELECT rank, step, {', '.join(COLUMNS)} FROM rank_step_breakdown WHERE run_id = 'r'"
    rows = con.execute(sql).fetchall()
    return {(r[0], r[1]): dict(zip(COLUMNS, r[2:], strict=True)) for r in rows}


def expect(**parts: int) -> dict[str, int]:
    """All columns zero except ``parts`` (given without the _ns suffix)."""
    return {c: parts.get(c.removesuffix("_ns"), 0) for c in COLUMNS}


def test_nested_kernels_and_concurrent_streams(con: duckdb.DuckDBPyConnection) -> None:
    got = breakdown(con, run_data(
        [(0, 0, 100, "compute", None), (0, 20, 50, "compute", None),  # nested: union [0,100)
         (1, 0, 60, "compute", None), (1, 40, 100, "memcpy", None),   # two streams overlapping: [0,100)
         (1, 150, 170, "memset", None), (1, 170, 180, "compute", None)],  # touching: [150,180)
        steps=[(0, 0, 0, 200), (1, 0, 0, 200)]))
    assert got[(0, 0)] == expect(TOTAL=200, COMP=100, IDLE=100)
    assert got[(1, 0)] == expect(TOTAL=200, COMP=130, IDLE=70)


def test_communication_hidden_under_compute(con: duckdb.DuckDBPyConnection) -> None:
    got = breakdown(con, run_data(
        [(0, 0, 100, "compute", None),
         (0, 20, 80, "comm", "TP"),    # fully hidden: 60 overlapped
         (0, 90, 150, "comm", "DP")],  # [90,100) hidden, [100,150) exposed
        steps=[(0, 0, 0, 200)]))
    assert got[(0, 0)] == expect(TOTAL=200, COMP=100, DP_WAIT=50, IDLE=50, OVERLAPPED=70)


def test_two_dims_at_once_split_equally_with_remainders_in_order(con: duckdb.DuckDBPyConnection) -> None:
    got = breakdown(con, run_data(
        [(0, 0, 101, "comm", "TP"), (0, 50, 151, "comm", "EP"),
         # [0,50) TP 50; [50,101) both: 51 -> TP 26, EP 25; [101,151) EP 50
         (1, 0, 10, "comm", "DP"), (1, 0, 10, "comm", "PP"), (1, 0, 10, "comm", "TP-PP"),
         # three dims for 10 ns: 3 each, the 1 ns remainder to TP (first in order TP, CP, EP, DP, PP, OTHER)
         (2, 0, 11, "comm", "UNKNOWN"), (2, 0, 11, "comm", "DP-CP"), (2, 0, 11, "comm", "EP-TP"),
         # OTHER, DP, EP for 11 ns: 3 each, remainder 2 -> EP then DP
         (3, 0, 40, "comm", "TP"), (3, 10, 30, "comm", "TP-CP"), (3, 20, 50, "comm", "-"),
         # two TP collectives are one dim: [0,20) TP 20; [20,30) TP+OTHER 5/5; [30,40) 5/5; [40,50) OTHER 10
         (4, 0, 7, "comm", "CP"), (4, 0, 7, "comm", "DP-EP"), (4, 0, 7, "comm", "PP")],
        # CP, DP, PP for 7 ns: 2 each, remainder 1 -> CP
        steps=[(r, 0, 0, 200) for r in range(5)]))
    assert got[(0, 0)] == expect(TOTAL=200, MP_WAIT=76, EP_WAIT=75, IDLE=49)
    assert got[(1, 0)] == expect(TOTAL=200, MP_WAIT=4, DP_WAIT=3, PP_WAIT=3, IDLE=190)
    assert got[(2, 0)] == expect(TOTAL=200, EP_WAIT=4, DP_WAIT=4, OTHER_WAIT=3, IDLE=189)
    assert got[(3, 0)] == expect(TOTAL=200, MP_WAIT=30, OTHER_WAIT=20, IDLE=150)
    assert got[(4, 0)] == expect(TOTAL=200, CP_WAIT=3, DP_WAIT=2, PP_WAIT=2, IDLE=193)


def test_kernel_crossing_a_step_boundary_and_a_step_without_events(con: duckdb.DuckDBPyConnection) -> None:
    got = breakdown(con, run_data(
        [(0, 80, 130, "compute", None),  # 20 ns in step 0, 30 ns in step 1
         (0, 190, 260, "comm", "PP"),    # 10 ns in step 1, 60 ns in step 2 (step 2 is [200, 300))
         (0, 350, 360, "compute", None)],  # step 3
        steps=[(0, 0, 0, 100), (0, 1, 100, 200), (0, 2, 200, 300), (0, 3, 300, 400), (0, 4, 400, 450)]))
    assert got[(0, 0)] == expect(TOTAL=100, COMP=20, IDLE=80)
    assert got[(0, 1)] == expect(TOTAL=100, COMP=30, PP_WAIT=10, IDLE=60)
    assert got[(0, 2)] == expect(TOTAL=100, PP_WAIT=60, IDLE=40)
    assert got[(0, 3)] == expect(TOTAL=100, COMP=10, IDLE=90)
    assert got[(0, 4)] == expect(TOTAL=50, IDLE=50)  # no events in this step at all: a row, all idle


def test_rank_without_steps_is_one_step_over_its_events(con: duckdb.DuckDBPyConnection) -> None:
    got = breakdown(con, run_data(
        [(0, 1000, 1100, "compute", None), (0, 1300, 1400, "comm", "DP"),
         (0, 1050, 1500, "sync", None),   # sync and other are not work: their time is idle
         (0, 1450, 1480, "other", None),
         (1, 0, 10, "compute", None)],
        steps=[(1, 5, 0, 50)]))
    assert set(got) == {(0, 0), (1, 5)}
    assert got[(0, 0)] == expect(TOTAL=500, COMP=100, DP_WAIT=100, IDLE=300)  # window [1000, 1500)
    assert got[(1, 5)] == expect(TOTAL=50, COMP=10, IDLE=40)


def reference(events: list[Event], window: tuple[int, int]) -> dict[str, int]:
    """Brute force: cut the window at every boundary, look at each piece event by event, and split each set of
    dims' exposed time once."""
    w0, w1 = window
    live = [(max(s, w0), min(e, w1), c, d) for (_, s, e, c, d) in events if s < w1 and e > w0 and e > s]
    cuts = sorted({w0, w1} | {t for s, e, _, _ in live for t in (s, e)})
    order = ["TP", "CP", "EP", "DP", "PP", "OTHER"]
    column = dict(zip(order, ["MP_WAIT", "CP_WAIT", "EP_WAIT", "DP_WAIT", "PP_WAIT", "OTHER_WAIT"], strict=True))
    out = expect(TOTAL=w1 - w0)
    exposed: dict[tuple[str, ...], int] = {}
    for a, b in itertools.pairwise(cuts):
        running = [(c, d) for s, e, c, d in live if s <= a and b <= e]
        busy = any(c in ("compute", "memcpy", "memset") for c, _ in running)
        dims = {("OTHER" if d in (None, "-", "UNKNOWN") else d.split("-")[0]) for c, d in running if c == "comm"}
        if busy:
            out["COMP_ns"] += b - a
            out["OVERLAPPED_ns"] += (b - a) if dims else 0
        elif dims:
            key = tuple(d for d in order if d in dims)
            exposed[key] = exposed.get(key, 0) + b - a
        else:
            out["IDLE_ns"] += b - a
    for active, length in exposed.items():
        q, r = divmod(length, len(active))
        for i, d in enumerate(active):
            out[f"{column[d]}_ns"] += q + (i < r)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_random_cases_match_brute_force(con: duckdb.DuckDBPyConnection, seed: int) -> None:
    rng = random.Random(seed)
    cats = ["compute", "compute", "memcpy", "comm", "comm", "comm", "sync"]
    dims = ["TP", "CP", "EP", "DP", "PP", "UNKNOWN", "-", "DP-CP", "EP-TP"]
    events: list[Event] = []
    for rank in range(4):
        for _ in range(rng.randint(0, 60)):
            start = rng.randint(0, 900)
            cat = rng.choice(cats)
            events.append((rank, start, start + rng.randint(1, 120), cat, rng.choice(dims) if cat == "comm" else None))
    steps = [(r, s, 300 * s + rng.randint(0, 20), 300 * (s + 1) + rng.randint(0, 20))
             for r in range(3) for s in (0, 1, 2)]
    got = breakdown(con, run_data(events, steps, world_size=4))
    # steps overlap at random; a window is cut at the rank's next step's start
    windows = {(r, s): (a, min([b] + [a2 for r2, _, a2, _ in steps if r2 == r and a < a2])) for r, s, a, b in steps}
    last = [e for e in events if e[0] == 3]
    if last:
        windows[(3, 0)] = (min(e[1] for e in last), max(e[2] for e in last))
    assert set(got) == set(windows)
    for (rank, step), window in windows.items():
        assert got[(rank, step)] == reference([e for e in events if e[0] == rank], window), (rank, step)


def test_stage_view_means_and_max_over_steps_after_the_first(con: duckdb.DuckDBPyConnection) -> None:
    # Stage 0 = ranks 0,1; stage 1 = rank 2. Step 0 is warm-up and left out of the typical (step NULL) rows.
    data = run_data(
        [(0, 0, 500, "compute", None), (0, 1000, 1040, "compute", None), (0, 2000, 2060, "compute", None),
         (1, 1000, 1020, "compute", None), (1, 2000, 2020, "compute", None),
         (2, 1000, 1090, "comm", "PP")],
        steps=[(r, s, 1000 * s, 1000 * (s + 1)) for r in range(3) for s in range(3)], pp={0: 0, 1: 0, 2: 1})
    breakdown(con, data)
    rows = con.execute("SELECT pp, step, ranks, COMP_mean_ns, COMP_max_ns, PP_WAIT_mean_ns, IDLE_mean_ns "
                       "FROM stage_breakdown WHERE run_id = 'r' ORDER BY pp, step NULLS FIRST").fetchall()
    assert rows[0] == (0, None, 2, 35.0, 50.0, 0.0, 965.0)   # rank 0 mean (40+60)/2=50, rank 1 20 -> mean 35, max 50
    assert rows[1] == (0, 0, 2, 250.0, 500.0, 0.0, 750.0)    # step 0: 500 and 0
    assert rows[4] == (1, None, 1, 0.0, 0.0, 45.0, 955.0)    # rank 2: PP wait 90 in step 1, 0 in step 2
    assert len(rows) == 8


def test_many_events_at_once(con: duckdb.DuckDBPyConnection) -> None:
    # The sweep packs the open events per class into one sum (7 bits a dim, compute from bit 42). Rank 0: 120 TP and
    # 120 DP collectives all running over [0, 101) stay in their own bits: 101 ns split 51 TP / 50 DP. Rank 1: 2000
    # compute events at once over [0, 50) under 100 PP collectives over [0, 80): COMP 50, PP_WAIT 30, overlap 50.
    events = [(0, 0, 101, "comm", d) for d in ["TP"] * 120 + ["DP"] * 120]
    events += [(1, 0, 50, "compute", None)] * 2000 + [(1, 0, 80, "comm", "PP")] * 100
    got = breakdown(con, run_data(events, steps=[(0, 0, 0, 101), (1, 0, 0, 101)]))
    assert got[(0, 0)] == expect(TOTAL=101, MP_WAIT=51, DP_WAIT=50)
    assert got[(1, 0)] == expect(TOTAL=101, COMP=50, PP_WAIT=30, IDLE=21, OVERLAPPED=50)
