"""Pipeline schedules simulated as events per stage, so unequal stages, p2p time and EP exposure change the step.

Each schedule is a fixed order of operations per stage (what Megatron, sail-sg's zero-bubble code and DeepSeek's
DualPipe run); the simulator plays those orders against the data dependencies of every micro-batch:
F of a micro-batch on a model chunk waits for F on the chunk before it, B for B on the chunk after it, plus
``p2p_s`` when the two chunks sit on different stages. The order depends only on (kind, stages, micro-batches,
vpp) and is compiled once and cached; a call with new costs is one pass over the operations.

The closed forms in ``bubble_time`` / ``bubble_fraction`` are the textbook results for equal stages; tests hold the
simulator to them, the simulator never uses them.

Conventions:
- ``costs[c * stages + s]`` is model chunk ``c`` on stage ``s`` (one micro-batch). ``segment_cost_index`` says
  which cost entry each model segment (in layer order) is, for zb-v's V placement and DualPipe's two directions.
- ``blocking`` (``schedule.p2p: blocking``): a transfer is a rendezvous, as PyTorch's ``dist.send`` ("sends a
  tensor synchronously"), gloo's pairs, and NCCL's ncclSend ("blocking for the GPU") waited on as Megatron's
  ``_communicate`` waits on its batch_isend_irecv: it starts once the sender has finished the producing op and the
  receiver has reached the consuming op in its order (finished the op before it: Megatron posts the recv with the
  send of the op before, send_forward_recv_backward, so paired sends never deadlock), lasts ``p2p_s``, and both
  sides wait for it; the sender's next op starts after it. Without it a send is fire-and-forget: the sender goes on
  at once and the receiver waits end[producer] + ``p2p_s``. Only gpipe and 1f1b: Megatron's interleaved schedule
  batches a step's forward and backward sends into one call after both ops (a rendezvous per op would deadlock
  it), zb-v and DualPipe likewise, and ZB-H1's W passes exist to run while a gradient is on its way (a rendezvous
  would make the sender wait for the receiver's W: bubble 3(p-1) instead of p-1 with equal stages and no p2p).
- gpipe / 1f1b / interleaved run W right after B as one backward (the gradient is sent when both are done);
  zb-h1 / zb-v / dualpipe split them where their implementations do, and send the gradient after B.
- ``ep_exposed_s`` is spread over F and B in proportion to their durations. When a stage waits for its input,
  up to ``ep_bubble_overlap_ratio`` of the next operation's EP exposure runs inside that wait (seed 000 §4.3.2:
  the all-to-all fills the pipeline bubble), so the stage's PP wait shrinks and its EP time stays. DualPipe's
  overlapped forward+backward pairs hide each chunk's EP under the other chunk's compute: DeepSeek-V3 §3.2.1
  splits both into attention, dispatch, MLP and combine and interleaves them, so a pair takes the longer of its
  compute and its all-to-alls, max(F + B + W - EP, EP) (``ep_overlapped_s``).
- Per stage, exactly: makespan_s == busy_s + bubble_s + p2p_exposed_s. ``busy_s`` is the time the stage runs
  F/B/W (EP exposure included, minus what DualPipe's pairs overlapped); ``p2p_exposed_s`` is waiting while an
  activation or gradient is on the wire; ``bubble_s`` is every other idle moment up to the step's end.
- ``in_flight`` is the peak number of micro-batches whose activations a stage holds (F done, B not yet), in
  units of that stage's full share of layers: chunk activations / chunks per stage. W's smaller stash is ignored.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import polars as pl

from traceana.errors import TraceanaError

KINDS = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipe")
BLOCKING_KINDS = ("gpipe", "1f1b")  # one op, then its sends; the others overlap or batch them (module doc)


@dataclass(frozen=True)
class StageCost:
    """One micro-batch on one stage (one model chunk when vpp > 1), seconds."""

    forward_s: float
    backward_s: float  # input-gradient part of backward
    wgrad_s: float  # weight-gradient part (non-zero-bubble schedules run it right after backward)
    ep_exposed_s: float = 0.0  # EP a2a exposure inside F/B that a bubble may hide (ep_bubble_overlap_ratio)


Event = tuple[int, str, int, int, float, float]  # (stage, kind F|B|W|EP|P2P, micro_batch, chunk, start_s, end_s)


@dataclass(frozen=True)
class _Plan:
    """A schedule compiled for (kind, stages, micro-batches, vpp): operations in an order that respects every
    dependency, so one pass computes all times. An op is (stage, op kind, cost index or pair, deps, labels)."""

    stages: int
    chunks: int  # model chunks per stage, for in-flight units (DualPipe's two directions are full stages)
    stage: list[int]
    kind: list[str]  # F, B (split), W, BW (backward then wgrad), FBW (DualPipe's overlapped pair)
    cost: list[tuple[int, ...]]  # cost index; (forward index, backward index) for FBW
    deps: list[tuple[tuple[int, bool, int], ...]]  # (producing op, crosses stages, which part of this op)
    sends: list[tuple[tuple[int, int], ...]]  # blocking: (producing op, op before its consumer or -1) this op awaits
    tail_sends: list[tuple[tuple[int, int], ...]]  # blocking: the same for each stage's last op, which ends the stage
    labels: list[tuple[tuple[int, int], ...]]  # (micro-batch, chunk) of each part: F / B / W / FBW's F and B
    in_flight_chunks: list[int]


@dataclass(frozen=True)
class PipelineResult:
    kind: str
    makespan_s: float
    busy_s: list[float]
    bubble_s: list[float]
    p2p_exposed_s: list[float]
    ep_overlapped_s: list[float]  # EP exposure hidden under another chunk's compute (DualPipe pairs)
    in_flight: list[float]  # peak micro-batches of activations held, in full-stage units
    in_flight_chunks: list[int]  # the same peak counted in model-chunk activations
    _plan: _Plan = field(repr=False, compare=False)
    _times: tuple[list[float], list[float], list[float], list[float], list[float], float] = field(
        repr=False, compare=False)
    _costs: Sequence[StageCost] = field(repr=False, compare=False)

    @property
    def stages(self) -> int:
        return self._plan.stages

    @cached_property
    def events(self) -> list[Event]:
        """Every F/B/W interval, the EP exposure a wait absorbed, and each transfer arriving at a stage."""
        plan, costs, (start, end, hidden, wire, arrive, p2p_s) = self._plan, self._costs, self._times
        out: list[Event] = []
        for i, kind in enumerate(plan.kind):
            s, t0, t1, labels, cost = plan.stage[i], start[i], end[i], plan.labels[i], plan.cost[i]
            if hidden[i] > 0:
                out.append((s, "EP", *labels[0], t0 - wire[i] - hidden[i], t0 - wire[i]))
            if kind == "BW":  # the EP a wait absorbed came off B; W keeps its length
                cut = t1 - costs[cost[0]].wgrad_s
                out += [(s, "B", *labels[0], t0, cut), (s, "W", *labels[0], cut, t1)]
            elif kind == "FBW":  # the overlapped pair's time, shared in proportion to F, B and W
                f, b, w = costs[cost[0]].forward_s, costs[cost[1]].backward_s, costs[cost[1]].wgrad_s
                scale = (t1 - t0) / (f + b + w) if f + b + w > 0 else 0.0
                t_f, t_b = t0 + f * scale, t0 + (f + b) * scale
                out += [(s, "F", *labels[0], t0, t_f), (s, "B", *labels[1], t_f, t_b), (s, "W", *labels[1], t_b, t1)]
            else:
                out.append((s, kind, *labels[0], t0, t1))
            if p2p_s > 0:
                for dep, crosses, part in plan.deps[i]:
                    if crosses:
                        t = max(end[dep], arrive[i])  # blocking: the receiver's arrival; async: 0
                        out.append((s, "P2P", *labels[part], t, t + p2p_s))
        return out

    def events_frame(self) -> pl.DataFrame:
        """The timeline as a table for Gantt plots and Chrome traces."""
        rows = [(s, kind, mb, chunk, t0 * 1e3, t1 * 1e3) for s, kind, mb, chunk, t0, t1 in self.events]
        return pl.DataFrame(rows, schema=["stage", "kind", "micro_batch", "chunk", "start_ms", "end_ms"], orient="row")

    def stage_frame(self) -> pl.DataFrame:
        """Per-stage load: busy, bubble and exposed p2p time (ms) and the activations held."""
        return pl.DataFrame({
            "stage": list(range(self.stages)),
            "busy_ms": [x * 1e3 for x in self.busy_s],
            "bubble_ms": [x * 1e3 for x in self.bubble_s],
            "p2p_exposed_ms": [x * 1e3 for x in self.p2p_exposed_s],
            "ep_overlapped_ms": [x * 1e3 for x in self.ep_overlapped_s],
            "in_flight_micro_batches": self.in_flight,
        })


def schedule_problem(kind: str, stages: int, micro_batches: int, vpp: int = 1) -> str | None:
    """Why (kind, stages, micro_batches, vpp) cannot run, as 'field: reason', or None when it can."""
    if kind not in KINDS:
        return f"schedule.kind: {kind!r} is not one of {', '.join(KINDS)}"
    if stages < 1:
        return f"parallel.pp: needs at least 1 stage, got {stages}"
    if micro_batches < 1:
        return f"micro_batches: needs at least 1, got {micro_batches}"
    if kind == "interleaved":
        if vpp < 2:
            return f"parallel.vpp: interleaved needs vpp >= 2, got {vpp}"
        if micro_batches % stages:
            return f"micro_batches: interleaved needs a multiple of pp={stages}, got {micro_batches}"
    elif kind == "zb-v":
        if vpp != 2:
            return f"parallel.vpp: zb-v places 2 model chunks per stage, set vpp 2 (got {vpp})"
    elif vpp != 1:
        return f"parallel.vpp: {kind} runs one model chunk per stage, set vpp 1 (got {vpp})"
    if kind == "dualpipe" and stages % 2:
        return f"parallel.pp: dualpipe needs an even number of stages, got {stages}"
    if kind == "dualpipe" and (micro_batches % 2 or micro_batches < 2 * stages):
        return f"micro_batches: dualpipe needs an even number >= 2*pp={2 * stages}, got {micro_batches}"
    return None


def segment_cost_index(kind: str, stages: int, vpp: int = 1) -> list[int]:
    """For each model segment in layer order, the index of its entry in ``costs``.

    interleaved: segment k is chunk k // stages on stage k % stages (index k). zb-v: the V, down stages 0..p-1 with
    chunk 0 and back up with chunk 1. dualpipe: one entry per model stage; both directions use it.
    """
    if kind == "zb-v":
        return list(range(stages)) + [stages + s for s in reversed(range(stages))]
    return list(range(stages * (vpp if kind == "interleaved" else 1)))


def simulate(kind: str, costs: Sequence[StageCost], micro_batches: int, p2p_s: float, vpp: int = 1,
             ep_bubble_overlap_ratio: float = 0.0, blocking: bool = False) -> PipelineResult:
    """Play ``kind``'s per-stage order for ``micro_batches`` micro-batches against the costs; ``blocking``: every
    transfer a rendezvous of sender and receiver (see the module doc)."""
    per_stage = max(1, 2 if kind == "zb-v" else vpp if kind == "interleaved" else 1)
    if not costs or len(costs) % per_stage:
        raise TraceanaError(f"costs: {len(costs)} entries do not fill stages of {per_stage} chunks ({kind})")
    stages = len(costs) // per_stage
    problem = schedule_problem(kind, stages, micro_batches, vpp)
    if problem:
        raise TraceanaError(problem)
    _check_costs(costs, p2p_s, ep_bubble_overlap_ratio)
    if blocking and kind not in BLOCKING_KINDS:
        raise TraceanaError(f"schedule.p2p: blocking is modelled for {', '.join(BLOCKING_KINDS)}, not {kind}")
    plan = _compile(kind, stages, micro_batches, vpp, _zb_v_lengths(costs) if kind == "zb-v" else None, blocking)

    # Per cost entry: F and B durations with their EP share, and how much of that share a wait may absorb.
    fwd, bwd, wgt, ep_f, ep_b = [], [], [], [], []
    for c in costs:
        share = c.ep_exposed_s / (c.forward_s + c.backward_s) if c.ep_exposed_s else 0.0
        fwd.append(c.forward_s)
        bwd.append(c.backward_s)
        wgt.append(c.wgrad_s)
        ep_f.append(c.forward_s * share)
        ep_b.append(c.backward_s * share)
    r = ep_bubble_overlap_ratio

    n = len(plan.kind)
    start, end, hidden, wire, arrive = [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n, [0.0] * n
    free = [0.0] * stages
    busy, bubble, p2p_wait, overlapped = [0.0] * stages, [0.0] * stages, [0.0] * stages, [0.0] * stages
    for i in range(n):
        s, kind_i, cost, deps = plan.stage[i], plan.kind[i], plan.cost[i], plan.deps[i]
        c = cost[0]
        if kind_i == "F":
            d, absorbable = fwd[c], r * ep_f[c]
        elif kind_i == "B":
            d, absorbable = bwd[c], r * ep_b[c]
        elif kind_i == "W":
            d, absorbable = wgt[c], 0.0
        elif kind_i == "BW":
            d, absorbable = bwd[c] + wgt[c], r * ep_b[c]
        else:  # FBW: F of one chunk overlapped with B+W of another; each one's EP hides under the other's compute
            b = cost[1]
            f_total, b_total, ep = fwd[c], bwd[b] + wgt[b], ep_f[c] + ep_b[b]
            d, absorbable = max(f_total + b_total - ep, ep), 0.0
            overlapped[s] += f_total + b_total - d
        if blocking:
            arrive[i] = free[s]
        ready, transfer = 0.0, 0.0
        for dep, crosses, _ in deps:
            t = max(end[dep], arrive[i]) + p2p_s if crosses else end[dep]
            if t > ready:
                ready, transfer = t, (p2p_s if crosses else 0.0)
        t = _sent(plan.sends[i], end, p2p_s)  # blocking: the previous op's sends hold this one
        if t > ready:
            ready, transfer = t, p2p_s
        t0 = free[s]
        gap = ready - t0
        if gap > 0:
            on_wire = transfer if transfer < gap else gap
            h = min(absorbable, gap - on_wire)
            p2p_wait[s] += on_wire
            bubble[s] += gap - on_wire - h
            hidden[i], wire[i] = h, on_wire
            t0, d = ready, d - h
            busy[s] += h
        start[i] = t0
        free[s] = end[i] = t0 + d
        busy[s] += d
    for s in range(stages):  # blocking: a stage's last sends end it
        gap = _sent(plan.tail_sends[s], end, p2p_s) - free[s]
        if gap > 0:
            p2p_wait[s] += min(p2p_s, gap)
            bubble[s] += gap - min(p2p_s, gap)
            free[s] += gap
    makespan = max(free)
    for s in range(stages):
        bubble[s] += makespan - free[s]
    return PipelineResult(kind, makespan, busy, bubble, p2p_wait, overlapped,
                          [x / plan.chunks for x in plan.in_flight_chunks], list(plan.in_flight_chunks),
                          plan, (start, end, hidden, wire, arrive, p2p_s), costs)


def _sent(sends: tuple[tuple[int, int], ...], end: list[float], p2p_s: float) -> float:
    """When the rendezvous transfers of ``sends`` end: each starts when both its producer (op index) and the op
    before its consumer (-1: the consumer is its stage's first op) have ended."""
    return max((max(end[d], end[q] if q >= 0 else 0.0) + p2p_s for d, q in sends), default=0.0)


def in_flight(kind: str, stages: int, micro_batches: int, vpp: int = 1) -> list[float]:
    """Peak micro-batches of activations each stage holds under ``kind`` (full-stage units); needs no costs
    (zb-v: its order for F = B = W, which fills the 2p-chunk limit like any other proportions with m >= 2p)."""
    problem = schedule_problem(kind, stages, micro_batches, vpp)
    if problem:
        raise TraceanaError(problem)
    plan = _compile(kind, stages, micro_batches, vpp, (1, 1, 1) if kind == "zb-v" else None, False)
    return [x / plan.chunks for x in plan.in_flight_chunks]


def bubble_time(kind: str, stages: int, cost: StageCost) -> float:
    """Closed-form bubble (seconds per stage) for equal stages, no p2p, no EP, m >= p: the tests' oracle.

    ``cost`` is one chunk's cost. 1F1B/GPipe (p-1)(F+B+W) and interleaved (p-1)(F+B+W)/v in stage terms
    (Narayanan et al. SC'21); ZB-H1 (p-1)(F+B-W) (Qi et al. ICLR'24); DualPipe (PP/2-1)(F&B+B-3W) from
    DeepSeek-V3's table, whose B is the full backward and F&B = F+B+W here (no compute overlap); zb-v the lower bound
    (p-1)·F_chunk: the last stage cannot start earlier, and ZB-V fills everything else (valid for F = B = W).
    """
    p, f, b, w = stages, cost.forward_s, cost.backward_s, cost.wgrad_s
    if kind in ("gpipe", "1f1b", "interleaved"):
        return (p - 1) * (f + b + w)
    if kind == "zb-h1":
        return (p - 1) * (f + b - w)
    if kind == "zb-v":
        return (p - 1) * f
    if kind == "dualpipe":
        return (p / 2 - 1) * ((f + b + w) + (b + w) - 3 * w)
    raise TraceanaError(f"schedule.kind: {kind!r} is not one of {', '.join(KINDS)}")


def bubble_fraction(kind: str, stages: int, micro_batches: int, vpp: int = 1) -> float:
    """Closed-form bubble / ideal compute for equal stages with F = B = W: (p-1)/m for gpipe and 1f1b,
    (p-1)/(v·m) interleaved, (p-1)/(3m) ZB-H1, (p-2)/(3m) DualPipe, (p-1)/(6m) zb-v."""
    chunks = 2 if kind == "zb-v" else vpp if kind == "interleaved" else 1
    unit = StageCost(1.0, 1.0, 1.0)
    return bubble_time(kind, stages, unit) / (3.0 * chunks * micro_batches)


def _check_costs(costs: Sequence[StageCost], p2p_s: float, ratio: float) -> None:
    for i, c in enumerate(costs):
        values = (c.forward_s, c.backward_s, c.wgrad_s, c.ep_exposed_s)
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise TraceanaError(f"costs[{i}]: times must be finite and >= 0, got {c}")
        if c.ep_exposed_s > c.forward_s + c.backward_s:
            raise TraceanaError(f"costs[{i}]: ep_exposed_s {c.ep_exposed_s} exceeds forward_s + backward_s")
    if not (math.isfinite(p2p_s) and p2p_s >= 0):
        raise TraceanaError(f"p2p_s: must be finite and >= 0, got {p2p_s}")
    if not 0.0 <= ratio <= 1.0:
        raise TraceanaError(f"calibration.ep_bubble_overlap_ratio: must lie in [0, 1], got {ratio}")


# --- schedules: per-stage operation orders -----------------------------------------------------------------------
# An order is a list of ops per stage: ("F"|"B"|"W"|"BW", micro_batch, position) or ("FBW", (mb, pos), (mb, pos)).
# `position` is the place along the micro-batch's path of model chunks; a path lists (stage, chunk, cost index).

Path = list[tuple[int, int, int]]


def _gpipe(p: int, m: int) -> list[list[tuple]]:
    return [[("F", j, s) for j in range(m)] + [("BW", j, s) for j in range(m)] for s in range(p)]


def _one_f_one_b(p: int, m: int) -> list[list[tuple]]:
    """Megatron's 1F1B: stage s runs p-1-s warm-up forwards, then F_x followed by B_{x-(p-1-s)}."""
    orders = []
    for s in range(p):
        lag, order = p - 1 - s, []
        for x in range(m + lag):
            if x < m:
                order.append(("F", x, s))
            if x >= lag:
                order.append(("BW", x - lag, s))
        orders.append(order)
    return orders


def _zb_h1(p: int, m: int) -> list[list[tuple]]:
    """ZB-H1 (Qi et al.): 1F1B's F/B order with B split from W; W_{x-(p-1)} follows each step, so every stage
    keeps 1F1B's in-flight count and the W passes fill the cool-down."""
    orders = []
    for s in range(p):
        order = []
        for x in range(m + p - 1):
            if x < m:
                order.append(("F", x, s))
            if 0 <= x - (p - 1 - s) < m:
                order.append(("B", x - (p - 1 - s), s))
            if 0 <= x - (p - 1) < m:
                order.append(("W", x - (p - 1), s))
        orders.append(order)
    return orders


def _interleaved(p: int, m: int, v: int) -> list[list[tuple]]:
    """Megatron's interleaved 1F1B: chunk c of stage s is position c*p + s; micro-batches go in groups of p."""
    total = m * v

    def op(kind: str, k: int, s: int) -> tuple:
        chunk = (k // p) % v
        if kind != "F":
            chunk = v - 1 - chunk
        return (kind, (k // (p * v)) * p + k % p, chunk * p + s)

    orders = []
    for s in range(p):
        warmup = total if m == p else min((p - s - 1) * 2 + (v - 1) * p, total)
        order = [op("F", k, s) for k in range(warmup)]
        for k in range(total - warmup):
            order += [op("F", warmup + k, s), op("BW", k, s)]
        order += [op("BW", k, s) for k in range(total - warmup, total)]
        orders.append(order)
    return orders


def _zb_v(p: int, m: int, lengths: tuple[int, int, int]) -> list[list[tuple]]:
    """ZB-V's order, made as the zero-bubble paper's heuristic makes it (Qi et al. §3.2) on the V path, from the
    F:B:W proportions in ``lengths``: stages take F while they hold fewer than 2p chunk activations (1F1B's memory),
    then alternate F and B, oldest micro-batch first, and fill every other moment with a pending W."""
    f_len, b_len, w_len = lengths
    k_max, never = 2 * p, math.inf
    f_done = [[never] * k_max for _ in range(m)]
    b_done = [[never] * k_max for _ in range(m)]
    next_f, next_b = [0] * k_max, [0] * k_max
    held, pending_w, last = [0] * p, [deque() for _ in range(p)], ["W"] * p
    free, orders = [0] * p, [[] for _ in range(p)]
    left, t = 3 * k_max * m, 0
    while left:
        for s in range(p):
            while free[s] <= t and left:
                mine = (s, k_max - 1 - s)
                ready_b = [(next_b[k], k) for k in mine if next_b[k] < m
                           and (b_done[next_b[k]][k + 1] if k + 1 < k_max else f_done[next_b[k]][k]) <= t]
                ready_f = [(next_f[k], -k) for k in mine if next_f[k] < m
                           and (k == 0 or f_done[next_f[k]][k - 1] <= t)] if held[s] < k_max else []
                if ready_f and (last[s] != "F" or not ready_b):
                    j, k = min(ready_f)
                    next_f[-k] += 1
                    f_done[j][-k] = free[s] = t + f_len
                    held[s] += 1
                    orders[s].append(("F", j, -k))
                elif ready_b:
                    j, k = min(ready_b)
                    next_b[k] += 1
                    b_done[j][k] = free[s] = t + b_len
                    held[s] -= 1
                    pending_w[s].append((j, k))
                    orders[s].append(("B", j, k))
                elif pending_w[s]:
                    free[s] = t + w_len
                    orders[s].append(("W", *pending_w[s].popleft()))
                else:
                    break
                last[s] = orders[s][-1][0]
                left -= 1
        t = min((x for x in free if x > t), default=t + 1)  # nothing changes before the next op ends
    return orders


def _zb_v_lengths(costs: Sequence[StageCost]) -> tuple[int, int, int]:
    """The mean F:B:W of all chunks in quarters of the largest, the shape ZB-V's order is built for (and cached by)."""
    mean = [sum(x) / len(costs) for x in zip(*((c.forward_s, c.backward_s, c.wgrad_s) for c in costs), strict=True)]
    top = max(mean) or 1.0
    f, b, w = (round(4 * x / top) for x in mean)
    return max(f, 1), max(b, 1), w


class _DualPipeStage:
    """One stage's order, written in the vocabulary of DeepSeek's dualpipe.py: phase 0 is the direction that enters
    at this half's end of the pipeline, phase 1 the other; split backwards queue their W (FIFO)."""

    def __init__(self, s: int, p: int, m: int) -> None:
        self.s, self.p, self.half_m, self.second_half = s, p, m // 2, s >= p // 2
        self.f_next, self.b_next, self.w_queue = [0, 0], [0, 0], deque()
        self.order: list[tuple] = []

    def _label(self, phase: int, counter: list[int]) -> tuple[int, int]:
        direction = phase ^ self.second_half
        j = counter[direction]
        counter[direction] += 1
        return direction * self.half_m + j, (self.s if direction == 0 else self.p - 1 - self.s)

    def forward(self, phase: int) -> None:
        self.order.append(("F", *self._label(phase, self.f_next)))

    def backward(self, phase: int, split: bool) -> None:
        j, pos = self._label(phase, self.b_next)
        self.order.append(("B" if split else "BW", j, pos))
        if split:
            self.w_queue.append((j, pos))

    def weight(self) -> None:
        self.order.append(("W", *self.w_queue.popleft()))

    def pair(self, phase_f: int, phase_b: int) -> None:
        self.order.append(("FBW", self._label(phase_f, self.f_next), self._label(phase_b, self.b_next)))


def _dualpipe(p: int, m: int) -> list[list[tuple]]:
    """DeepSeek's DualPipe (dualpipe.py `step`, steps 1-8): half the micro-batches enter at stage 0, half at stage
    p-1; stage s runs model stage s for the first direction and p-1-s for the second. Micro-batches 0..m/2-1 go
    down, m/2..m-1 go up; a micro-batch's position is the model stage."""
    half_p, half_m, orders = p // 2, m // 2, []
    for s in range(p):
        h, st = min(s, p - 1 - s), _DualPipeStage(s, p, m)
        for _ in range((half_p - h - 1) * 2):  # step 1: nF0
            st.forward(0)
        for _ in range(h + 1):  # step 2: nF0F1
            st.forward(0)
            st.forward(1)
        for _ in range(half_p - h - 1):  # step 3: nB1W1F1, zero-bubble split
            st.backward(1, split=True)
            st.weight()
            st.forward(1)
        for i in range(half_m - p + h + 1):  # step 4: nF0B1F1B0 as overlapped pairs; middle stages start unpaired
            if i == 0 and h == half_p - 1:
                st.forward(0)
                st.backward(1, split=False)
            else:
                st.pair(0, 1)
            st.pair(1, 0)
        for _ in range(half_p - h - 1):  # step 5: nB1F1B0
            st.backward(1, split=False)
            st.pair(1, 0)
        split = False
        for i in range(h + 1):  # step 6: nB1B0, the second half split
            if i == (h + 1) // 2 and h % 2 == 1:
                split = True
            st.backward(1, split)
            if i == (h + 1) // 2 and h % 2 == 0:
                split = True
            st.backward(0, split)
        for _ in range(half_p - h - 1):  # step 7: nWB0
            st.weight()
            st.backward(0, split=True)
        for _ in range(h + 1):  # step 8: nW
            st.weight()
        orders.append(st.order)
    return orders


def _paths(kind: str, p: int, m: int, vpp: int) -> tuple[list[Path], list[int]]:
    """The model-chunk paths and which path each micro-batch takes."""
    if kind == "zb-v":
        down = [(k, 0, k) for k in range(p)]
        return [down + [(s, 1, p + s) for s in reversed(range(p))]], [0] * m
    if kind == "dualpipe":
        return [[(k, 0, k) for k in range(p)], [(p - 1 - k, 1, k) for k in range(p)]], [j * 2 // m for j in range(m)]
    v = vpp if kind == "interleaved" else 1
    return [[(k % p, k // p, k) for k in range(p * v)]], [0] * m


@lru_cache(maxsize=256)  # a pp=16, m=64 plan takes 1-2 MB
def _compile(kind: str, p: int, m: int, vpp: int, zb_v_lengths: tuple[int, int, int] | None,
             blocking: bool) -> _Plan:
    """Order every op so that its dependencies come first (a round-robin Kahn pass over the stage orders); when
    ``blocking``, an op after a send also comes after the op before that send's consumer (its rendezvous)."""
    orders = {"gpipe": lambda: _gpipe(p, m), "1f1b": lambda: _one_f_one_b(p, m), "zb-h1": lambda: _zb_h1(p, m),
              "interleaved": lambda: _interleaved(p, m, vpp), "zb-v": lambda: _zb_v(p, m, zb_v_lengths),
              "dualpipe": lambda: _dualpipe(p, m)}[kind]()
    paths, path_of = _paths(kind, p, m, vpp)
    produced: dict[tuple[str, int, int], int] = {}  # ("F"|"B", mb, position) -> op index

    def needs(part: str, j: int, pos: int) -> list[tuple[str, int, int]]:
        """What must exist before F or B of micro-batch j at position pos: the cross-chunk input, and for B its F."""
        last = len(paths[path_of[j]]) - 1
        if part == "F":
            return [("F", j, pos - 1)] if pos > 0 else []
        return [("F", j, pos)] + ([("B", j, pos + 1)] if pos < last else [])

    def parts_of(op: tuple) -> list[tuple[str, int, int]]:
        parts = [("F", *op[1]), ("B", *op[2])] if op[0] == "FBW" else [(op[0][0], op[1], op[2])]
        return [(part, j, pos) for part, j, pos in parts if part != "W"]

    where = {key: (s, k) for s in range(p) for k, op in enumerate(orders[s]) for key in parts_of(op)} if blocking \
        else {}  # (stage, order position) of each F and B part

    def consumers(s: int, k: int) -> list[tuple[int, int]]:
        """(stage, order position) of each op on another stage that takes what op k of stage s sends."""
        if not blocking or k < 0:
            return []
        out = []
        for part, j, pos in parts_of(orders[s][k]):
            nxt = pos + (1 if part == "F" else -1)
            if 0 <= nxt < len(paths[path_of[j]]) and paths[path_of[j]][nxt][0] != s:
                out.append(where[(part, j, nxt)])
        return out

    plan = _Plan(p, {"interleaved": vpp, "zb-v": 2}.get(kind, 1), [], [], [], [], [], [], [], [0] * p)
    placed: list[list[int]] = [[] for _ in range(p)]  # plan index of each stage's ops, in order

    def sends_of(s: int, k: int) -> tuple[tuple[int, int], ...]:
        return tuple((placed[s][k], placed[cs][ck - 1] if ck else -1) for cs, ck in consumers(s, k))

    cursor, left = [0] * p, sum(map(len, orders))
    while left:
        progressed = False
        for s in range(p):
            while cursor[s] < len(orders[s]):
                op = orders[s][cursor[s]]
                work = parts_of(op)
                required = [key for part in work for key in needs(*part)]
                if not all(key in produced for key in required) or any(
                        cursor[cs] < ck for cs, ck in consumers(s, cursor[s] - 1)):
                    break
                i = len(plan.kind)
                deps = []
                for index, (part, j, pos) in enumerate(work):  # timing: the chunk before (F) or after (B)
                    step = -1 if part == "F" else 1
                    source = (part, j, pos + step)
                    if source in produced:
                        deps.append((produced[source], paths[path_of[j]][pos + step][0] != s, index))
                    produced[(part, j, pos)] = i
                plan.stage.append(s)
                plan.kind.append(op[0])
                if op[0] == "FBW":
                    (jf, pf), (jb, pb) = op[1], op[2]
                    plan.cost.append((paths[path_of[jf]][pf][2], paths[path_of[jb]][pb][2]))
                    plan.labels.append(((jf, paths[path_of[jf]][pf][1]), (jb, paths[path_of[jb]][pb][1])))
                else:
                    path = paths[path_of[op[1]]]
                    plan.cost.append((path[op[2]][2],))
                    plan.labels.append(((op[1], path[op[2]][1]),))
                plan.deps.append(tuple(deps))
                plan.sends.append(sends_of(s, cursor[s] - 1))
                placed[s].append(i)
                cursor[s] += 1
                left -= 1
                progressed = True
        if not progressed:
            raise RuntimeError(f"{kind} schedule deadlocks for pp={p}, micro_batches={m}, vpp={vpp}")
    plan.tail_sends.extend(sends_of(s, len(orders[s]) - 1) for s in range(p))
    _count_in_flight(plan)
    return plan


def _count_in_flight(plan: _Plan) -> None:
    """Peak chunk activations per stage: +1 at each F, -1 at each B (a pair's F counts before its B frees)."""
    held = [0] * plan.stages
    for s, kind in zip(plan.stage, plan.kind, strict=True):
        if kind in ("F", "FBW"):
            held[s] += 1
            plan.in_flight_chunks[s] = max(plan.in_flight_chunks[s], held[s])
        if kind in ("B", "BW", "FBW"):
            held[s] -= 1
