"""Pipeline schedules: the simulator against the closed forms, plus what only an event simulation can show.

Second routes: the published bubble formulas (Narayanan et al. SC'21; Qi et al. ICLR'24; DeepSeek-V3's DualPipe
table), the flow-shop makespan for GPipe, the in-flight counts of Megatron's warm-up arithmetic, and hand algebra.
"""

from __future__ import annotations

import random
from dataclasses import replace
from itertools import pairwise
from pathlib import Path

import polars as pl
import pytest

from traceana.errors import TraceanaError
from traceana.estimator import config
from traceana.estimator.estimate import estimate
from traceana.estimator.pipeline import (
    BLOCKING_KINDS,
    KINDS,
    StageCost,
    bubble_fraction,
    bubble_time,
    in_flight,
    segment_cost_index,
    simulate,
)

CHUNKS = {"interleaved": None, "zb-v": 2}  # interleaved: vpp chunks; zb-v: always 2; others: 1
UNIT = StageCost(1.0, 1.0, 1.0)


def chunks(kind: str, vpp: int) -> int:
    return vpp if kind == "interleaved" else CHUNKS.get(kind) or 1


def equal(kind: str, p: int, cost: StageCost, vpp: int = 1) -> list[StageCost]:
    return [cost] * (p * chunks(kind, vpp))


ORACLE_CASES = [
    *[(k, p, m, 1) for k in ("gpipe", "1f1b", "zb-h1") for p, m in ((2, 4), (4, 8), (4, 5), (8, 16), (16, 64))],
    *[("interleaved", p, m, v) for p, m, v in ((2, 4, 2), (4, 4, 2), (4, 8, 2), (4, 12, 4), (8, 16, 3), (16, 64, 2))],
    *[("zb-v", p, m, 2) for p, m in ((2, 4), (4, 8), (4, 12), (8, 16), (16, 64))],
    *[("dualpipe", p, m, 1) for p, m in ((2, 4), (4, 8), (4, 12), (8, 16), (8, 32), (16, 64))],
]


@pytest.mark.parametrize(("kind", "p", "m", "vpp"), ORACLE_CASES)
def test_bubble_matches_closed_form_for_equal_stages(kind: str, p: int, m: int, vpp: int) -> None:
    # Oracle: (p-1)/m, (p-1)/(v·m), ZB-H1 (p-1)/(3m), DualPipe (PP/2-1)(F&B+B-3W), ZB-V's (p-1)·F_chunk floor.
    r = simulate(kind, equal(kind, p, UNIT, vpp), m, 0.0, vpp)
    work = 3.0 * m * chunks(kind, vpp)
    assert (r.makespan_s - work) / work == pytest.approx(bubble_fraction(kind, p, m, vpp), abs=1e-12)
    assert r.bubble_s == pytest.approx([bubble_time(kind, p, UNIT)] * p)


@pytest.mark.parametrize("kind", ["gpipe", "1f1b", "interleaved"])
@pytest.mark.parametrize("fbw", [(1.0, 2.0, 0.0), (2.0, 1.0, 1.0), (1.0, 1.5, 0.5), (0.3, 0.4, 0.6)])
def test_one_f_one_b_family_bubble_holds_for_any_f_b_w(kind: str, fbw: tuple[float, float, float]) -> None:
    # (p-1)(F+B+W) per stage, in chunk units for interleaved: the formula does not assume F = B = W.
    cost, vpp = StageCost(*fbw), 2 if kind == "interleaved" else 1
    r = simulate(kind, equal(kind, 4, cost, vpp), 8, 0.0, vpp)
    assert r.bubble_s == pytest.approx([3 * sum(fbw)] * 4)


@pytest.mark.parametrize("fbw", [(1.0, 1.5, 0.5), (2.0, 1.0, 1.0), (1.0, 2.0, 1.0), (1.0, 1.2, 0.9)])
def test_zb_h1_bubble_is_p_minus_1_times_f_plus_b_minus_w(fbw: tuple[float, float, float]) -> None:
    # Qi et al.: (p-1)(T_F + T_B - T_W) with B the input gradient, here for W <= B and m >= p.
    cost = StageCost(*fbw)
    for p, m in ((4, 8), (8, 24)):
        r = simulate("zb-h1", [cost] * p, m, 0.0)
        assert r.bubble_s == pytest.approx([bubble_time("zb-h1", p, cost)] * p)


def test_zero_bubble_schedules_beat_1f1b_on_realistic_costs() -> None:
    # B (input grad) a little slower than F, W a little faster: the ordering the ZB paper reports.
    stage = StageCost(1.0, 1.2, 0.9)
    chunk = StageCost(0.5, 0.6, 0.45)  # the same layers cut in two chunks
    p, m = 8, 32
    one_f_one_b = simulate("1f1b", [stage] * p, m, 0.0).makespan_s
    zb_h1 = simulate("zb-h1", [stage] * p, m, 0.0).makespan_s
    zb_v = simulate("zb-v", [chunk] * 2 * p, m, 0.0, vpp=2).makespan_s
    dualpipe = simulate("dualpipe", [stage] * p, m, 0.0).makespan_s
    ideal = m * 3.1
    assert ideal < zb_v < zb_h1 < one_f_one_b
    assert dualpipe < one_f_one_b
    # ZB-V stays within 2x its (p-1)·F_chunk floor even off the F = B = W point it is exact at.
    assert zb_v - ideal < 2 * (p - 1) * chunk.forward_s


def test_unequal_stages_gpipe_is_the_flow_shop_makespan() -> None:
    # GPipe is two permutation flow shops of identical jobs: sum(t) + (m-1)·max(t), forward then backward.
    rng = random.Random(7)
    for _ in range(5):
        p, m = rng.choice([2, 3, 5, 8]), rng.choice([1, 4, 9])
        costs = [StageCost(rng.uniform(0.5, 2), rng.uniform(0.5, 2), rng.uniform(0, 1)) for _ in range(p)]
        f = [c.forward_s for c in costs]
        bw = [c.backward_s + c.wgrad_s for c in costs]
        r = simulate("gpipe", costs, m, 0.0)
        assert r.makespan_s == pytest.approx(sum(f) + (m - 1) * max(f) + sum(bw) + (m - 1) * max(bw))


@pytest.mark.parametrize("kind", ["1f1b", "zb-h1", "interleaved", "zb-v", "dualpipe"])
def test_one_slow_stage_sets_the_pace(kind: str) -> None:
    p, m, vpp = 4, 16, 2 if kind in ("interleaved", "zb-v") else 1
    n = p * chunks(kind, vpp)
    base = simulate(kind, [UNIT] * n, m, 0.0, vpp)
    costs = [UNIT] * n
    costs[segment_cost_index(kind, p, vpp)[1]] = StageCost(1.5, 1.5, 1.5)  # model segment 1 (DualPipe: 2 stages)
    slow = simulate(kind, costs, m, 0.0, vpp)
    slowed = [s for s in range(p) if slow.busy_s[s] > base.busy_s[s]]
    others = [s for s in range(p) if s not in slowed]
    assert slowed == ([1, 2] if kind == "dualpipe" else [1])
    # The slow stage's own work is a floor; every other stage now waits more than before, and more than it.
    assert slow.makespan_s > base.makespan_s
    assert slow.makespan_s >= max(slow.busy_s)
    assert all(slow.bubble_s[s] > base.bubble_s[s] for s in others)
    assert max(slow.bubble_s[s] for s in slowed) < min(slow.bubble_s[s] for s in others)


def test_unequal_1f1b_lies_between_the_work_floor_and_seed_000s_formula() -> None:
    # Seed 000's estimator: sum(t) + (m-1)·max(t), an upper bound for 1F1B. Floor: the slow stage's m micro-batches
    # plus the forwards before it and the backwards after it returns.
    for p, slow in ((4, 2), (8, 4), (8, 7)):
        costs = [UNIT] * p
        costs[slow] = StageCost(1.5, 1.5, 1.5)
        t = [3.0] * p
        t[slow] = 4.5
        m = 4 * p
        r = simulate("1f1b", costs, m, 0.0)
        assert m * 4.5 + slow * 3.0 <= r.makespan_s + 1e-9
        assert r.makespan_s <= sum(t) + (m - 1) * max(t) + 1e-9


def test_p2p_time_adds_exactly_two_chains_of_links_to_gpipe() -> None:
    # GPipe: the forward wave crosses p-1 links and the backward wave p-1 links, nothing overlaps the last ones.
    for p, m in ((2, 4), (4, 8), (8, 3)):
        base = simulate("gpipe", [UNIT] * p, m, 0.0).makespan_s
        for c in (0.1, 0.7):
            assert simulate("gpipe", [UNIT] * p, m, c).makespan_s == pytest.approx(base + 2 * (p - 1) * c)


@pytest.mark.parametrize("kind", KINDS)
def test_p2p_time_is_exposed_and_every_transfer_is_an_event(kind: str) -> None:
    p, m, vpp = 4, 8, 2 if kind in ("interleaved", "zb-v") else 1
    costs = equal(kind, p, UNIT, vpp)
    without = simulate(kind, costs, m, 0.0, vpp)
    r = simulate(kind, costs, m, 0.05, vpp)
    assert r.makespan_s > without.makespan_s
    assert all(x > 0 for x in r.p2p_exposed_s)
    transfers = [e for e in r.events if e[1] == "P2P"]
    assert all(e[5] - e[4] == pytest.approx(0.05) for e in transfers)
    # Each micro-batch crosses a stage boundary at every hop of its path except zb-v's turn, which stays on p-1.
    hops = {"interleaved": p * vpp - 1, "zb-v": 2 * p - 2}.get(kind, p - 1)
    assert len(transfers) == 2 * m * hops


@pytest.mark.parametrize("kind", KINDS)
def test_time_accounting_closes_and_events_respect_dependencies(kind: str) -> None:
    rng = random.Random(kind)
    p, m, vpp = 4, 8, 2 if kind in ("interleaved", "zb-v") else 1
    costs = []
    for _ in range(p * chunks(kind, vpp)):
        f, b = rng.uniform(0.5, 1.5), rng.uniform(0.5, 1.5)
        costs.append(StageCost(f, b, rng.uniform(0.2, 1.0), rng.uniform(0, 0.5) * (f + b)))
    p2p = 0.03
    r = simulate(kind, costs, m, p2p, vpp, ep_bubble_overlap_ratio=0.7)
    for s in range(p):
        assert r.busy_s[s] + r.bubble_s[s] + r.p2p_exposed_s[s] == pytest.approx(r.makespan_s)
        work = sorted((e[4], e[5]) for e in r.events if e[0] == s and e[1] != "P2P")
        assert sum(b - a for a, b in work) == pytest.approx(r.busy_s[s])
        assert all(a1 >= b0 - 1e-9 for (_, b0), (a1, _) in pairwise(work))  # no overlap
        assert work[-1][1] <= r.makespan_s + 1e-9

    # Every F starts after the chunk before it finished (plus p2p across stages); every B after the chunk after it.
    def position(stage: int, chunk: int, mb: int) -> int:
        if kind == "interleaved":
            return chunk * p + stage
        if kind == "zb-v":
            return stage if chunk == 0 else 2 * p - 1 - stage
        if kind == "dualpipe":
            return stage if mb < m // 2 else p - 1 - stage
        return stage

    spans: dict[tuple[str, int, int], tuple[int, float, float]] = {}
    for s, k, mb, chunk, t0, t1 in r.events:
        if k in ("F", "B"):
            spans[(k, mb, position(s, chunk, mb))] = (s, t0, t1)
    for (k, mb, pos), (s, t0, _) in spans.items():
        before = spans.get((k, mb, pos - 1 if k == "F" else pos + 1))
        if before is not None:
            assert t0 >= before[2] + (p2p if before[0] != s else 0.0) - 1e-9


@pytest.mark.parametrize("kind", BLOCKING_KINDS)
def test_blocking_p2p_keeps_the_closed_forms_without_transfer_time(kind: str) -> None:
    # Equal stages, no p2p: every receiver has reached its op before the sender finishes, so a rendezvous costs
    # nothing and the textbook bubble holds.
    for p, m in ((2, 4), (4, 8), (4, 5), (8, 16)):
        r = simulate(kind, [UNIT] * p, m, 0.0, blocking=True)
        assert r.bubble_s == pytest.approx([bubble_time(kind, p, UNIT)] * p)


@pytest.mark.parametrize(("f0", "b0", "f1", "b1"), [(1.0, 2.0, 1.0, 2.0), (0.5, 2.5, 1.5, 1.0), (2.0, 0.7, 0.4, 3.1)])
@pytest.mark.parametrize("m", [1, 2, 8])
def test_blocking_gpipe_on_two_stages_is_a_lockstep_flow_shop(f0: float, b0: float, f1: float, b1: float,
                                                              m: int) -> None:
    # Hand algebra: with rendezvous, stage 0's F_{j+1} and stage 1's F_j both start when transfer j ends, so the
    # forward wave advances max(F0, F1) + c a micro-batch and the backward wave max(B0, B1) + c; every one of the
    # 2m transfers is on the critical path: F0 + F1 + B0 + B1 + (m-1)(max(F0, F1) + max(B0, B1)) + 2mc.
    c, costs = 0.3, [StageCost(f0, b0, 0.0), StageCost(f1, b1, 0.0)]
    r = simulate("gpipe", costs, m, c, blocking=True)
    assert r.makespan_s == pytest.approx(f0 + f1 + b0 + b1 + (m - 1) * (max(f0, f1) + max(b0, b1)) + 2 * m * c)
    # Both sides wait for every transfer in full: stage 1 for its m inputs and m gradients sent, stage 0 likewise but
    # for its last forward send, whose wait lies inside its wait for the first gradient.
    assert r.p2p_exposed_s == pytest.approx([(2 * m - 1) * c, 2 * m * c])


@pytest.mark.parametrize("kind", BLOCKING_KINDS)
def test_blocking_p2p_accounting_closes_and_the_sender_waits_for_the_rendezvous(kind: str) -> None:
    rng = random.Random(kind)
    p, m, c = 4, 8, 0.04
    costs = []
    for _ in range(p):
        f, b = rng.uniform(0.5, 1.5), rng.uniform(0.5, 1.5)
        costs.append(StageCost(f, b, rng.uniform(0.2, 1.0), rng.uniform(0, 0.5) * (f + b)))
    r = simulate(kind, costs, m, c, ep_bubble_overlap_ratio=0.7, blocking=True)
    assert r.makespan_s > simulate(kind, costs, m, c, ep_bubble_overlap_ratio=0.7).makespan_s
    for s in range(p):
        assert r.busy_s[s] + r.bubble_s[s] + r.p2p_exposed_s[s] == pytest.approx(r.makespan_s)
    # Per stage, the ops in order (F, B and W of one op share an end: BW is B then W).
    ops: dict[int, list[tuple[str, int, float, float]]] = {s: [] for s in range(p)}
    for s, k, mb, _, t0, t1 in sorted(r.events, key=lambda e: (e[0], e[4])):
        if k in ("F", "B"):
            ops[s].append((k, mb, t0, t1))
        elif k == "W" and ops[s] and ops[s][-1][0] == "B" and abs(ops[s][-1][3] - t0) < 1e-12:
            ops[s][-1] = (*ops[s][-1][:3], t1)
    at = {(k, mb, s): (i, t0, t1) for s in ops for i, (k, mb, t0, t1) in enumerate(ops[s])}
    transfers = [e for e in r.events if e[1] == "P2P"]
    assert len(transfers) == 2 * m * (p - 1)
    for (k, mb, s), (i, t0, _) in at.items():
        sender = s - 1 if k == "F" else s + 1
        if not 0 <= sender < p:
            continue
        # Its transfer: the last to reach this stage for this micro-batch before the op starts (B's comes after F's).
        x0, x1 = max((e[4], e[5]) for e in transfers if e[0] == s and e[2] == mb and e[5] <= t0 + 1e-12)
        j, _, sent = at[(k, mb, sender)]
        # It starts when the sender has finished and the receiver finished the op before this one, lasts c,
        assert x0 == pytest.approx(max(sent, ops[s][i - 1][3] if i else 0.0))
        assert x1 - x0 == pytest.approx(c)
        # and the sender's next op starts only after it.
        if j + 1 < len(ops[sender]):
            assert ops[sender][j + 1][2] >= x1 - 1e-12


def test_ep_bubble_overlap_ratio() -> None:
    # Seed 000 §4.3.2 (P3-01..03): EP exposure inside F/B may run in the pipeline bubble.
    p, m = 4, 8

    def pp_wait(e: float, ratio: float, declared: bool = True) -> tuple[float, list[float]]:
        costs = [StageCost(1 + e / 2, 1 + e / 2, 1.0, e if declared else 0.0)] * p
        r = simulate("1f1b", costs, m, 0.0, ep_bubble_overlap_ratio=ratio)
        return r.makespan_s, [b + w for b, w in zip(r.bubble_s, r.p2p_exposed_s, strict=True)]

    # P3-02: ratio 0 is the old behaviour, EP as serial work: the bubble grows with it, (p-1)(F+B+W).
    assert pp_wait(0.8, 0.0)[1] == pytest.approx([(p - 1) * 3.8] * p)
    assert pp_wait(0.8, 0.0) == pp_wait(0.8, 0.0, declared=False)
    # P3-03: without EP exposure the ratio changes nothing.
    assert pp_wait(0.0, 1.0) == pp_wait(0.0, 0.0)
    # P3-01: at ratio 1 the bubble no longer grows with EP (only the compute part fills the warm-up/cool-down)
    # while the step still pays the EP work; halfway lands halfway.
    assert pp_wait(0.8, 1.0)[1] == pytest.approx([(p - 1) * 3.0] * p)
    assert pp_wait(0.4, 1.0)[1] == pytest.approx(pp_wait(0.8, 1.0)[1])
    assert pp_wait(0.8, 0.5)[1] == pytest.approx([(p - 1) * 3.4] * p)
    makespans = [pp_wait(0.8, r)[0] for r in (0.0, 0.5, 1.0)]
    assert makespans[0] > makespans[1] > makespans[2] > pp_wait(0.0, 0.0)[0]
    # The hidden part is EP time inside the wait, drawn as EP events before the operation it belongs to.
    r = simulate("1f1b", [StageCost(1.4, 1.4, 1.0, 0.8)] * p, m, 0.0, ep_bubble_overlap_ratio=1.0)
    assert sum(e[5] - e[4] for e in r.events if e[1] == "EP") > 0
    # EP never makes the bubble negative: only real waits absorb it.
    assert min(r.bubble_s) >= 0


def test_dualpipe_pairs_hide_ep_under_the_other_chunks_compute() -> None:
    p, m = 4, 16
    plain = simulate("dualpipe", [StageCost(1.2, 1.2, 1.0)] * p, m, 0.0)
    with_ep = simulate("dualpipe", [StageCost(1.2, 1.2, 1.0, 0.8)] * p, m, 0.0)
    assert with_ep.makespan_s < plain.makespan_s
    assert all(x > 0 for x in with_ep.ep_overlapped_s)
    # Busy time is what the stage ran: the same work minus what the overlapped pairs hid.
    assert [a - b for a, b in zip(plain.busy_s, with_ep.busy_s, strict=True)] == pytest.approx(
        with_ep.ep_overlapped_s)
    assert simulate("1f1b", [StageCost(1.2, 1.2, 1.0, 0.8)] * p, m, 0.0).ep_overlapped_s == [0.0] * p


def test_in_flight_micro_batches() -> None:
    for p, m in ((4, 8), (4, 2), (8, 8), (8, 5)):
        expected = [float(min(p - i, m)) for i in range(p)]
        assert in_flight("1f1b", p, m) == expected  # Narayanan SC'21: stage i holds min(p - i, m)
        assert in_flight("zb-h1", p, m) == expected  # ZB-H1 keeps 1F1B's memory
        assert in_flight("gpipe", p, m) == [float(m)] * p
    for p, v in ((4, 2), (8, 4)):
        # Megatron's warm-up: (p-i-1)·2 + (v-1)·p chunk forwards, then one more; stage 0 = p·(1 + (p-1)/(p·v)).
        got = in_flight("interleaved", p, 2 * p, v)
        assert got == pytest.approx([((p - i - 1) * 2 + (v - 1) * p + 1) / v for i in range(p)])
        assert got[0] == pytest.approx(p * (1 + (p - 1) / (p * v)))
    assert in_flight("dualpipe", 8, 32) == [9.0] * 8  # DeepSeek-V3: PP + 1
    assert in_flight("zb-v", 8, 32, 2) == [8.0] * 8  # ZB-V: 1F1B's peak on every stage
    r = simulate("1f1b", [UNIT] * 4, 8, 0.0)
    assert r.in_flight == in_flight("1f1b", 4, 8) and r.in_flight_chunks == [4, 3, 2, 1]


def test_ap_pp_03_micro_batches_shrink_the_bubble() -> None:
    # A fixed global batch cut into m micro-batches: per-micro-batch time T/m, so the step is T·(1 + (p-1)/m).
    p, total = 4, 24.0
    steps, fractions = [], []
    for m in (4, 8, 16, 32):
        r = simulate("1f1b", [StageCost(total / m / 3, total / m / 3, total / m / 3)] * p, m, 0.0)
        steps.append(r.makespan_s)
        fractions.append(r.bubble_s[0] / (r.makespan_s - r.bubble_s[0]))
        assert r.makespan_s == pytest.approx(total * (1 + (p - 1) / m))
    assert steps == sorted(steps, reverse=True)
    assert fractions == pytest.approx([(p - 1) / m for m in (4, 8, 16, 32)])
    # ...while the first stage holds more micro-batches, up to p.
    assert [in_flight("1f1b", p, m)[0] for m in (1, 2, 4, 8)] == [1.0, 2.0, 4.0, 4.0]


def test_ap_pp_11_visualisation_data() -> None:
    p, m = 4, 8
    r = simulate("zb-h1", [UNIT, UNIT, StageCost(1.3, 1.3, 1.3), UNIT], m, 0.01)
    events = r.events_frame()
    assert events.columns == ["stage", "kind", "micro_batch", "chunk", "start_ms", "end_ms"]
    assert set(events["kind"]) == {"F", "B", "W", "P2P"}
    assert events.filter(pl.col("kind") == "F").height == p * m
    stages = r.stage_frame()
    assert stages["stage"].to_list() == list(range(p))
    totals = stages["busy_ms"] + stages["bubble_ms"] + stages["p2p_exposed_ms"]
    assert totals.to_list() == pytest.approx([r.makespan_s * 1e3] * p)
    work = events.filter(pl.col("kind") != "P2P").group_by("stage").agg(
        (pl.col("end_ms") - pl.col("start_ms")).sum().alias("ms")).sort("stage")
    assert work["ms"].to_list() == pytest.approx(stages["busy_ms"].to_list())


def test_segment_cost_index_places_model_chunks() -> None:
    assert segment_cost_index("1f1b", 4) == [0, 1, 2, 3]
    assert segment_cost_index("interleaved", 2, 3) == [0, 1, 2, 3, 4, 5]
    assert segment_cost_index("zb-v", 3, 2) == [0, 1, 2, 5, 4, 3]  # down stages 0..2 as chunk 0, back as chunk 1


@pytest.mark.parametrize(("call", "field"), [
    (lambda: simulate("pipedream", [UNIT] * 2, 4, 0.0), "schedule.kind"),
    (lambda: simulate("interleaved", [UNIT] * 8, 6, 0.0, vpp=2), "micro_batches"),
    (lambda: simulate("interleaved", [UNIT] * 4, 4, 0.0, vpp=1), "parallel.vpp"),
    (lambda: simulate("1f1b", [UNIT] * 4, 4, 0.0, vpp=2), "parallel.vpp"),
    (lambda: simulate("zb-v", [UNIT] * 4, 4, 0.0, vpp=1), "parallel.vpp"),
    (lambda: simulate("dualpipe", [UNIT] * 3, 6, 0.0), "parallel.pp"),
    (lambda: simulate("dualpipe", [UNIT] * 4, 6, 0.0), "micro_batches"),
    (lambda: simulate("1f1b", [UNIT] * 2, 0, 0.0), "micro_batches"),
    (lambda: simulate("1f1b", [StageCost(-1.0, 1.0, 1.0)], 2, 0.0), "costs[0]"),
    (lambda: simulate("1f1b", [StageCost(1.0, 1.0, 1.0, 3.0)], 2, 0.0), "costs[0]"),
    (lambda: simulate("interleaved", [UNIT] * 7, 4, 0.0, vpp=2), "costs"),
    (lambda: simulate("1f1b", [UNIT] * 2, 2, -1.0), "p2p_s"),
    (lambda: simulate("1f1b", [UNIT] * 2, 2, 0.0, ep_bubble_overlap_ratio=1.5), "ep_bubble_overlap_ratio"),
    (lambda: simulate("interleaved", [UNIT] * 4, 2, 0.0, vpp=2, blocking=True), "schedule.p2p"),
    (lambda: simulate("dualpipe", [UNIT] * 2, 4, 0.0, blocking=True), "schedule.p2p"),
])
def test_bad_input_names_the_field(call, field: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(TraceanaError, match=field.replace("[", r"\[").replace(".", r"\.")):
        call()


def test_estimate_plays_gloo_transfers_as_rendezvous_unless_the_config_says_otherwise() -> None:
    # schedule.p2p auto: blocking where the collectives are gloo's (its send is synchronous), else fire-and-forget.
    cfg = config.load(Path(__file__).parents[2] / "sample_traces" / "configs" / "pp2_mb8.yaml")

    def step(collectives: str, p2p: str) -> float:
        return estimate(replace(cfg, hardware=replace(cfg.hardware, collectives=collectives),
                                schedule=replace(cfg.schedule, p2p=p2p))).step_s

    assert step("gloo", "auto") == step("gloo", "blocking") == step("nccl", "blocking")
    assert step("nccl", "auto") == step("nccl", "async") == step("gloo", "async") < step("gloo", "auto")
