"""Stage partitions: explicit ones from the config (stage_layers, layer_offset) and PPB, seed 003's balancer.

A partition cuts the model's layers, in order, into contiguous stages. A stage's time is its layers' cost (plus
recompute, where on) plus what only that stage runs (embedding on the first, output head and loss on the last); its
memory is its layers' static bytes, plus the activations of every micro-batch it holds in flight (1F1B stage i holds
min(p - i, m): pass ``pipeline.in_flight``), plus its own extras.

PPB minimises the slowest stage under the memory limit: a bisection on the bottleneck time, each probe a greedy
pass that gives every stage as many layers as fit. For limits that only grow with a stage's layers the greedy pass
is exact (a stage that ends earlier never leaves the next one less room), so the bisection finds the optimum.

``layer_offset`` is seed 003's boundary shift, MindFormers' pipeline ``offset`` (the lineage seed 003 comes from):
stage i gets layers // pp + offset[i] layers, so the offsets sum to layers % pp. Megatron's "layer offset" (the
index of a stage's first layer) is ``Partition.megatron_layer_offset``.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import polars as pl

from traceana.errors import TraceanaError


@dataclass(frozen=True)
class StageTerms:
    """What besides the layers' own cost and static memory decides a stage's time and memory."""

    layer_activation: Sequence[float] | None = None  # bytes per in-flight micro-batch, per layer
    in_flight: Sequence[float] | None = None  # micro-batches each stage holds (pipeline.in_flight)
    stage_cost: Sequence[float] | None = None  # seconds only that stage spends: embedding, output head, loss
    stage_memory: Sequence[float] | None = None  # bytes only that stage holds
    recompute: Sequence[bool] | None = None  # per layer: recompute its activations in backward
    recompute_cost: Sequence[float] | None = None  # seconds a recomputed layer adds
    recompute_activation: Sequence[float] | None = None  # bytes per micro-batch a recomputed layer still holds


@dataclass(frozen=True)
class Partition:
    stage_partition: tuple[int, ...]  # layers per stage, in model order
    stage_cost: tuple[float, ...]  # seconds per micro-batch (F + B + W, recompute and stage extras included)
    stage_memory: tuple[float, ...]  # bytes at the stage's peak
    recompute: tuple[bool, ...]  # per layer, as applied
    memory_limit: float | None

    @property
    def layers(self) -> int:
        return sum(self.stage_partition)

    @property
    def imbalance_score(self) -> float:
        """Slowest stage over the mean stage: 1.0 is perfectly balanced."""
        mean = sum(self.stage_cost) / len(self.stage_cost)
        return max(self.stage_cost) / mean if mean > 0 else 1.0

    @property
    def offending_stage(self) -> int | None:
        """The first stage whose memory exceeds the limit, or None."""
        if self.memory_limit is None:
            return None
        return next((i for i, mem in enumerate(self.stage_memory) if mem > self.memory_limit), None)

    @property
    def is_feasible(self) -> bool:
        return self.offending_stage is None

    @property
    def layer_offset(self) -> tuple[int, ...]:
        """The partition as MindFormers-style offsets from layers // pp."""
        base = self.layers // len(self.stage_partition)
        return tuple(n - base for n in self.stage_partition)

    @property
    def megatron_layer_offset(self) -> tuple[int, ...]:
        """Megatron's layer offset of each stage (get_transformer_layer_offset): the index of its first layer."""
        return tuple(r.start for r in self.layer_ranges)

    @property
    def layer_ranges(self) -> list[range]:
        """The layers of each stage, to sum per-layer F/B/W into pipeline.StageCost."""
        ends = list(accumulate(self.stage_partition))
        return [range(end - n, end) for n, end in zip(self.stage_partition, ends, strict=True)]

    def frame(self) -> pl.DataFrame:
        """Per-stage load for reports and plots."""
        limit = self.memory_limit
        return pl.DataFrame({
            "stage": list(range(len(self.stage_partition))),
            "layers": list(self.stage_partition),
            "first_layer": list(self.megatron_layer_offset),
            "layer_offset": list(self.layer_offset),
            "cost_ms": [c * 1e3 for c in self.stage_cost],
            "memory_bytes": list(self.stage_memory),
            "over_limit_bytes": [max(0.0, m - limit) if limit is not None else 0.0 for m in self.stage_memory],
        })


def check_stages(layers: int, stages: int, allow_empty: bool = False) -> None:
    """pp must be at least 1 and, unless empty stages are allowed, no larger than the layer count (AP-PP-06)."""
    if stages < 1:
        raise TraceanaError(f"parallel.pp: needs at least 1 stage, got {stages}")
    if stages > layers and not allow_empty:
        raise TraceanaError(f"parallel.pp: {stages} stages but the model has only {layers} layers")


def uniform(layers: int, stages: int) -> tuple[int, ...]:
    """The default even split; the remainder is spread over the stages (10 layers on 4 stages: 2, 3, 2, 3)."""
    check_stages(layers, stages)
    return tuple((i + 1) * layers // stages - i * layers // stages for i in range(stages))


def from_stage_layers(stage_layers: Sequence[int], layers: int, stages: int,
                      allow_empty: bool = False) -> tuple[int, ...]:
    """Validate ``schedule.stage_layers``: one count per stage, covering every layer once."""
    check_stages(layers, stages, allow_empty)
    counts = _counts(stage_layers, "schedule.stage_layers")
    if len(counts) != stages:
        raise TraceanaError(f"schedule.stage_layers: {len(counts)} entries for pp={stages}")
    if sum(counts) != layers:
        raise TraceanaError(f"schedule.stage_layers: covers {sum(counts)} layers, the model has {layers}")
    _check_counts(counts, allow_empty, "schedule.stage_layers", counts)
    return counts


def from_layer_offset(layer_offset: Sequence[int], layers: int, stages: int,
                      allow_empty: bool = False) -> tuple[int, ...]:
    """Validate ``schedule.layer_offset`` and turn it into layers per stage (layers // pp + offset)."""
    check_stages(layers, stages, allow_empty)
    offsets = _counts(layer_offset, "schedule.layer_offset")
    if len(offsets) != stages:
        raise TraceanaError(f"schedule.layer_offset: {len(offsets)} entries for pp={stages}")
    if sum(offsets) != layers % stages:
        raise TraceanaError(f"schedule.layer_offset: sums to {sum(offsets)}, must be layers % pp = "
                            f"{layers} % {stages} = {layers % stages}")
    counts = tuple(layers // stages + o for o in offsets)
    _check_counts(counts, allow_empty, "schedule.layer_offset", offsets)
    return counts


def recompute_mask(layer_ids: Sequence[int] | None, layers: int) -> tuple[bool, ...]:
    """Validate ``schedule.recompute.layers`` (None: every layer) and turn it into one flag per layer."""
    if layer_ids is None:
        return (True,) * layers
    ids = _counts(layer_ids, "schedule.recompute.layers")
    bad = [i for i in ids if not 0 <= i < layers]
    if bad:
        raise TraceanaError(f"schedule.recompute.layers: layer {bad[0]} does not exist (layers are 0..{layers - 1})")
    if len(set(ids)) != len(ids):
        raise TraceanaError(f"schedule.recompute.layers: layer {next(i for i in ids if ids.count(i) > 1)} "
                            "is listed twice")
    chosen = set(ids)
    return tuple(i in chosen for i in range(layers))


def evaluate(stage_layers: Sequence[int], layer_costs: Sequence[float], layer_memory: Sequence[float],
             memory_limit: float | None = None, terms: StageTerms = StageTerms()) -> Partition:
    """Time and memory of every stage of an explicit partition (validated against the layer count)."""
    model = _Model(layer_costs, layer_memory, len(stage_layers), terms)
    counts = from_stage_layers(stage_layers, model.layers, len(stage_layers), allow_empty=True)
    return model.partition(counts, memory_limit)


def balance(layer_costs: Sequence[float], layer_memory: Sequence[float], stages: int,
            memory_limit: float | None = None, terms: StageTerms = StageTerms(),
            allow_empty: bool = False) -> Partition:
    """PPB: the contiguous partition with the fastest slowest stage that fits ``memory_limit`` on every stage.

    When no partition fits, the fastest one ignoring memory comes back with ``is_feasible`` False and the first
    stage over the limit in ``offending_stage``.
    """
    model = _Model(layer_costs, layer_memory, stages, terms)
    check_stages(model.layers, stages, allow_empty)
    counts = model.bottleneck_partition(memory_limit, allow_empty)
    if counts is None:
        counts = model.bottleneck_partition(None, allow_empty)
    assert counts is not None  # without a memory limit the probe at the total cost always succeeds
    return model.partition(counts, memory_limit)


class _Model:
    """Prefix sums of the per-layer terms, so any stage's cost and memory is O(1)."""

    def __init__(self, layer_costs: Sequence[float], layer_memory: Sequence[float], stages: int,
                 terms: StageTerms) -> None:
        n = len(layer_costs)
        per_layer = {"layer_memory": layer_memory, "terms.layer_activation": terms.layer_activation,
                     "terms.recompute": terms.recompute, "terms.recompute_cost": terms.recompute_cost,
                     "terms.recompute_activation": terms.recompute_activation}
        per_stage = {"terms.in_flight": terms.in_flight, "terms.stage_cost": terms.stage_cost,
                     "terms.stage_memory": terms.stage_memory}
        for name, values in per_layer.items():
            if values is not None and len(values) != n:
                raise ValueError(f"{name}: {len(values)} entries for {n} layers")
        for name, values in per_stage.items():
            if values is not None and len(values) != stages:
                raise ValueError(f"{name}: {len(values)} entries for {stages} stages")
        if terms.layer_activation is not None and terms.in_flight is None:
            raise ValueError("terms.in_flight: needed to count layer_activation")
        recompute = tuple(bool(x) for x in terms.recompute) if terms.recompute is not None else (False,) * n
        if any(recompute) and (terms.recompute_cost is None
                               or (terms.layer_activation is not None and terms.recompute_activation is None)):
            raise ValueError("terms.recompute: needs recompute_cost (and recompute_activation with activations)")
        values = [*layer_costs, *layer_memory, *(terms.layer_activation or ()), *(terms.recompute_cost or ()),
                  *(terms.recompute_activation or ()), *(terms.stage_cost or ()), *(terms.stage_memory or ()),
                  *(terms.in_flight or ())]
        if not all(math.isfinite(v) and v >= 0 for v in values):
            raise ValueError("layer and stage terms must be finite and >= 0")

        added = terms.recompute_cost or [0.0] * n
        kept = terms.recompute_activation or [0.0] * n
        cost = [c + added[i] if recompute[i] else c for i, c in enumerate(layer_costs)]
        activation = [kept[i] if recompute[i] else a for i, a in enumerate(terms.layer_activation or [0.0] * n)]
        self.layers, self.stages, self.recompute = n, stages, recompute
        self.cost = [0.0, *accumulate(cost)]
        self.static = [0.0, *accumulate(layer_memory)]
        self.activation = [0.0, *accumulate(activation)]
        self.in_flight = list(terms.in_flight or [0.0] * stages)
        self.extra_cost = list(terms.stage_cost or [0.0] * stages)
        self.extra_memory = list(terms.stage_memory or [0.0] * stages)

    def stage_cost(self, j: int, a: int, b: int) -> float:
        return self.extra_cost[j] + self.cost[b] - self.cost[a]

    def stage_memory(self, j: int, a: int, b: int) -> float:
        held = self.activation[b] - self.activation[a]
        return self.extra_memory[j] + self.static[b] - self.static[a] + self.in_flight[j] * held

    def partition(self, counts: Sequence[int], memory_limit: float | None) -> Partition:
        ends = list(accumulate(counts))
        spans = [(j, end - n, end) for j, (n, end) in enumerate(zip(counts, ends, strict=True))]
        return Partition(tuple(counts), tuple(self.stage_cost(*s) for s in spans),
                         tuple(self.stage_memory(*s) for s in spans), self.recompute, memory_limit)

    def greedy(self, bottleneck: float, memory_limit: float | None, allow_empty: bool) -> list[int] | None:
        """Give each stage as many layers as keep it within ``bottleneck`` and the memory limit, or None."""
        least = 0 if allow_empty else 1
        counts, a = [], 0
        for j in range(self.stages):
            room = bottleneck - self.extra_cost[j] + self.cost[a]
            b = bisect_right(self.cost, room * (1 + 1e-12), lo=a) - 1
            if memory_limit is not None:
                n_j, limit = self.in_flight[j], memory_limit - self.extra_memory[j]
                base = self.static[a] + n_j * self.activation[a]
                fits = bisect_right(range(self.layers + 1), limit + base, lo=a,
                                    key=lambda k, n=n_j: self.static[k] + n * self.activation[k]) - 1
                b = min(b, fits)
            b = min(b, self.layers - (self.stages - 1 - j) * least)
            if b < a + least or (j == self.stages - 1 and b < self.layers):
                return None
            counts.append(b - a)
            a = b
        return counts

    def bottleneck_partition(self, memory_limit: float | None, allow_empty: bool) -> list[int] | None:
        """Bisect on the slowest stage's time; None when nothing fits the memory limit."""
        hi = self.cost[-1] + max(self.extra_cost)
        best = self.greedy(hi, memory_limit, allow_empty)
        if best is None:
            return None
        lo = max(self.cost[-1] / self.stages, max(self.extra_cost))
        for _ in range(100):
            if hi - lo <= 1e-12 * hi:
                break
            mid = (lo + hi) / 2
            found = self.greedy(mid, memory_limit, allow_empty)
            if found is None:
                lo = mid
            else:
                hi, best = mid, found
        return best


def _counts(values: Sequence[int], name: str) -> tuple[int, ...]:
    if isinstance(values, str | bytes) or not all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        raise TraceanaError(f"{name}: must be a list of integers, got {values!r}")
    return tuple(values)


def _check_counts(counts: Sequence[int], allow_empty: bool, name: str, shown: Sequence[int]) -> None:
    least = 0 if allow_empty else 1
    for i, n in enumerate(counts):
        if n < least:
            raise TraceanaError(f"{name}: stage {i} would get {n} layers ({list(shown)}); every stage needs at "
                                f"least {least}")
