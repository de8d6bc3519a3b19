"""Host clock alignment on hand-built runs: offsets chained over the host graph by least squares (numbers solved by
hand below), Send/Recv pairs as links, and hosts without any link named and left alone. The synthesizer round trips
(tests/synth/test_synth.py) and the shared traces (test_kineto, test_ascend_step_trace) check it on whole runs."""

from __future__ import annotations

import polars as pl

from traceana.ingest.clocks import align_hosts, chain_offsets
from traceana.ingest.run_data import RunData


def test_least_squares_over_an_inconsistent_triangle() -> None:
    """Pairs say x1 - x0 = 10, x2 - x1 = 20 and x2 - x0 = 39: around the loop they disagree by 9 ns. By hand, with
    x0 = 0 and weights w (the pair counts), setting the gradient of sum w (x_b - x_a - offset)^2 to zero gives
    2 x1 - x2 = -10 and -x1 + (1 + w02) x2 = 20 + 39 w02: w02 = 1 gives x1 = 13, x2 = 36 (each pair off by 3);
    w02 = 4 gives x1 = 14, x2 = 38 (the well-observed pair off by 1, the others by 4). Node 4, linked only to node
    3, is not linked to node 0: it gets no offset."""
    pairs = pl.DataFrame({"anchor": [0, 1, 0, 3], "node": [1, 2, 2, 4], "offset": [10.0, 20.0, 39.0, 7.0],
                          "n": [1, 1, 1, 5]})
    assert chain_offsets(pairs) == {0: 0, 1: 13, 2: 36}
    assert chain_offsets(pairs.with_columns(n=pl.Series([1, 1, 4, 5]))) == {0: 0, 1: 14, 2: 38}


def run(ends: dict[int, list[int]], ops: dict[int, list[tuple[int, str, int | None]]], hosts: list[str]) -> RunData:
    """Ranks 0..n-1 on ``hosts``; per instance, its members' (rank, op, peer) and their end times in ``ends``."""
    events, colls = [], []
    for instance, members in ops.items():
        for (rank, op, peer), end in zip(members, ends[instance], strict=True):
            event_id = 10 * instance + rank
            events.append({"rank": rank, "event_id": event_id, "start_ns": end - 500, "end_ns": end})
            colls.append({"rank": rank, "event_id": event_id, "op": op, "instance": instance, "peer": peer})
    return RunData(source_format="kineto", sources=["hand-built"], world_size=len(hosts), frames={
        "ranks": pl.DataFrame({"rank": list(range(len(hosts))), "host": hosts, "clock_offset_ns": 0}),
        "device_events": pl.DataFrame(events), "collectives": pl.DataFrame(colls)})


def test_hosts_linked_by_a_send_recv_chain_and_one_not_linked() -> None:
    """Host b's clock reads 1,000 ns more than a's, and b meets a only through Send/Recv pairs: their ends read
    1,000, 1,000 and 1,040 ns apart (the last one a late receiver), median 1,000. Host c meets only b, by an
    all-reduce that ends at 20,000 on b (19,000 on a's clock) and 19,700 on c: c reads 700 more than a. Host d's one
    rank shares nothing: it keeps its clock and the notes name it. Every linked end then coincides but the late
    receiver's."""
    a_to_b, b_to_a = [(0, "Send", 1), (1, "Recv", 0)], [(1, "Send", 0), (0, "Recv", 1)]
    ops = {0: a_to_b, 1: b_to_a, 2: a_to_b, 3: [(1, "AllReduce", None), (2, "AllReduce", None)],
           4: [(3, "AllReduce", None)]}
    ends = {0: [5_000, 6_000], 1: [8_000, 7_000], 2: [9_000, 10_040], 3: [20_000, 19_700], 4: [1]}
    data = run(ends, ops, ["a", "b", "c", "d"])
    align_hosts(data)
    assert dict(data.table("ranks").select("rank", "clock_offset_ns").rows()) == {0: 0, 1: -1_000, 2: -700, 3: 0}
    assert data.notes[0] == ("hosts aligned onto a's clock by collective and send/recv end times (2 host pairs, "
                             "least squares): b -1.0 us, c -0.7 us")
    assert data.notes[1].startswith("host(s) d share no collective or send/recv")
    shifted = data.table("device_events").sort("event_id")["end_ns"].to_list()
    assert shifted == [5_000, 5_000, 7_000, 7_000, 9_000, 9_040, 19_000, 19_000, 1]
