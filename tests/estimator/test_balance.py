"""Stage partitions and PPB: seed 003's AP-PP tests, plus PPB against exhaustive search.

The model is DESIGN §5's example (DeepSeek-V3 shapes: 61 layers, 3 dense then 58 MoE, vocab 129280, H800 at
989 TFLOP/s with 0.75 efficiency, ep 64, dp 128, ZeRO-1). Per-layer numbers are derived below from those shapes
with the textbook formulas (Narayanan et al. FLOPs, Korthikanti et al. activations, ZeRO bytes per parameter), so
expected values are re-derived by plain arithmetic in each test, not read back from the code under test.
"""

from __future__ import annotations

import itertools
import random

import pytest

from traceana.errors import TraceanaError
from traceana.estimator import pipeline
from traceana.estimator.balance import (
    StageTerms,
    balance,
    check_stages,
    evaluate,
    from_layer_offset,
    from_stage_layers,
    recompute_mask,
    uniform,
)

H, FFN, SEQ, VOCAB, EXPERTS, TOPK, EXPERT_FFN, SHARED, EP, DP = 7168, 18432, 4096, 129280, 256, 8, 2048, 1, 64, 128
LAYERS, DENSE = 61, 3
ATTENTION = 8 * H * H + 4 * SEQ * H  # forward FLOPs per token: QKV+O projections, scores and values
DENSE_FLOPS = ATTENTION + 6 * H * FFN  # SwiGLU: three h x ffn matrices
MOE_FLOPS = ATTENTION + (TOPK + SHARED) * 6 * H * EXPERT_FFN + 2 * H * EXPERTS  # active experts + router
HEAD_FLOPS = 2 * H * VOCAB
BYTES_PER_PARAM = 4 + 12 / DP  # ZeRO-1: bf16 weights and grads, fp32 Adam states sharded over dp
DENSE_PARAMS = 4 * H * H + 3 * H * FFN
MOE_PARAMS = 4 * H * H + (EXPERTS // EP + SHARED) * 3 * H * EXPERT_FFN + H * EXPERTS  # routed experts split by EP
ACTIVATION = 34 * SEQ * H  # bytes per layer per micro-batch, flash attention, no TP (Korthikanti Table 2)
RECOMPUTED = 2 * SEQ * H  # full recompute keeps only the layer input


def seconds(flops_per_token: float) -> float:
    """Forward + backward + weight-gradient time of one micro-batch (micro_batch 1 x seq 4096) at 0.75 x 989 TF/s."""
    return 3 * flops_per_token * SEQ / (989e12 * 0.75)


COSTS = [seconds(DENSE_FLOPS)] * DENSE + [seconds(MOE_FLOPS)] * (LAYERS - DENSE)
STATIC = [DENSE_PARAMS * BYTES_PER_PARAM] * DENSE + [MOE_PARAMS * BYTES_PER_PARAM] * (LAYERS - DENSE)
EMBEDDING_BYTES = VOCAB * H * BYTES_PER_PARAM


def terms(p: int, m: int, **more: object) -> StageTerms:
    """Embedding on the first stage, output head (and its weights) on the last, 1F1B's in-flight micro-batches."""
    return StageTerms(layer_activation=[ACTIVATION] * LAYERS, in_flight=pipeline.in_flight("1f1b", p, m),
                      stage_cost=[0.0] * (p - 1) + [seconds(HEAD_FLOPS)],
                      stage_memory=[EMBEDDING_BYTES] + [0.0] * (p - 2) + [EMBEDDING_BYTES], **more)  # type: ignore


def by_hand(counts: list[int], p: int, m: int) -> tuple[list[float], list[float]]:
    """Stage time and memory by plain arithmetic: count dense and MoE layers per stage."""
    cost, memory, first = [], [], 0
    for j, n in enumerate(counts):
        dense = max(0, min(DENSE, first + n) - first)
        moe = n - dense
        held = min(p - j, m)
        cost.append(dense * seconds(DENSE_FLOPS) + moe * seconds(MOE_FLOPS) + (seconds(HEAD_FLOPS) if j == p - 1
                                                                                else 0.0))
        memory.append((dense * DENSE_PARAMS + moe * MOE_PARAMS) * BYTES_PER_PARAM + held * n * ACTIVATION
                      + (EMBEDDING_BYTES if j in (0, p - 1) else 0.0))
        first += n
    return cost, memory


@pytest.mark.parametrize("p", [2, 4])
def test_ap_pp_01_uniform_split_reports_every_stage(p: int) -> None:
    m = 8
    counts = uniform(LAYERS, p)
    assert sum(counts) == LAYERS and max(counts) - min(counts) <= 1
    part = evaluate(counts, COSTS, STATIC, None, terms(p, m))
    cost, memory = by_hand(list(counts), p, m)
    assert part.stage_cost == pytest.approx(cost)
    assert part.stage_memory == pytest.approx(memory)
    # The same stages as a pipeline: each stage is busy m x its cost, and the bubble is what the rest waits.
    stage_costs = [pipeline.StageCost(c / 3, c / 3, c / 3) for c in part.stage_cost]
    result = pipeline.simulate("1f1b", stage_costs, m, 0.0)
    assert result.busy_s == pytest.approx([m * c for c in part.stage_cost])
    assert result.makespan_s >= m * max(part.stage_cost) + sum(part.stage_cost) - max(part.stage_cost) - 1e-9


def test_ap_pp_02_ppb_is_more_balanced_than_the_uniform_split() -> None:
    p, m = 16, 32
    even = evaluate(uniform(LAYERS, p), COSTS, STATIC, None, terms(p, m))
    ppb = balance(COSTS, STATIC, p, None, terms(p, m))
    # Uniform: the last stage carries four MoE layers and the output head (2·h·V FLOPs/token, ~1.4 layers).
    assert even.imbalance_score == pytest.approx(max(by_hand(list(even.stage_partition), p, m)[0]) * p
                                                 / (sum(COSTS) + seconds(HEAD_FLOPS)))
    assert even.imbalance_score > 1.35
    # PPB: 61 layers on 16 stages force some stage to hold 4 layers; four MoE layers is the best possible bottleneck.
    assert max(ppb.stage_cost) == pytest.approx(4 * seconds(MOE_FLOPS))
    assert ppb.imbalance_score < 1.03
    assert ppb.stage_partition[-1] < even.stage_partition[-1]


def test_ppb_matches_exhaustive_search() -> None:
    # Second route for optimality: enumerate every contiguous partition of small random models.
    rng = random.Random(3)
    for _ in range(150):
        n = rng.randint(2, 9)
        p = rng.randint(1, n)
        costs = [rng.uniform(0.1, 3) for _ in range(n)]
        static = [rng.uniform(1, 3) for _ in range(n)]
        extra = [rng.uniform(0, 2) if j in (0, p - 1) else 0.0 for j in range(p)]
        t = StageTerms(layer_activation=[rng.uniform(0, 2) for _ in range(n)],
                       in_flight=pipeline.in_flight("1f1b", p, 8), stage_cost=extra, stage_memory=extra)
        limit = rng.choice([None, rng.uniform(5, 25)])
        fits = []
        for cuts in itertools.combinations(range(1, n), p - 1):
            counts = [b - a for a, b in itertools.pairwise((0, *cuts, n))]
            candidate = evaluate(counts, costs, static, limit, t)
            if candidate.is_feasible:
                fits.append(max(candidate.stage_cost))
        got = balance(costs, static, p, limit, t)
        assert got.is_feasible == bool(fits)
        if fits:
            assert max(got.stage_cost) == pytest.approx(min(fits))


def test_ap_pp_03_more_micro_batches_hold_more_activations_on_early_stages() -> None:
    # Seed 003 §3.1: the micro-batch count changes how many activations each stage keeps (1F1B: min(p - i, m)).
    p = 4
    counts = uniform(LAYERS, p)
    few = evaluate(counts, COSTS, STATIC, None, terms(p, 2))
    many = evaluate(counts, COSTS, STATIC, None, terms(p, 8))
    grown = [b - a for a, b in zip(few.stage_memory, many.stage_memory, strict=True)]
    assert grown == pytest.approx([(min(p - j, 8) - min(p - j, 2)) * n * ACTIVATION for j, n in enumerate(counts)])
    assert few.stage_cost == many.stage_cost


def test_ap_pp_04_stage_over_the_memory_limit_is_infeasible_and_named() -> None:
    p, m = 16, 32
    limit = 60e9
    even = evaluate(uniform(LAYERS, p), COSTS, STATIC, limit, terms(p, m))
    hand_memory = by_hand(list(even.stage_partition), p, m)[1]
    over = [j for j, mem in enumerate(hand_memory) if mem > limit]
    assert not even.is_feasible and even.offending_stage == over[0] == 1
    # PPB moves layers off the early stages (they hold the most micro-batches) until every stage fits.
    fitted = balance(COSTS, STATIC, p, limit, terms(p, m))
    assert fitted.is_feasible and max(fitted.stage_memory) <= limit
    assert fitted.stage_partition[:2] < even.stage_partition[:2]
    assert max(fitted.stage_cost) > max(balance(COSTS, STATIC, p, None, terms(p, m)).stage_cost)
    # Nothing fits 10 GB: the best-balanced partition comes back flagged, with its first offending stage.
    hopeless = balance(COSTS, STATIC, p, 10e9, terms(p, m))
    assert not hopeless.is_feasible and hopeless.offending_stage == 0
    assert hopeless.frame()["over_limit_bytes"][0] == pytest.approx(hopeless.stage_memory[0] - 10e9)


def test_ap_pp_05_incomplete_stage_partition_is_rejected() -> None:
    with pytest.raises(TraceanaError, match=r"schedule\.stage_layers: covers 60 layers, the model has 61"):
        from_stage_layers([15, 15, 15, 15], LAYERS, 4)
    with pytest.raises(TraceanaError, match=r"schedule\.stage_layers: covers 62 layers"):
        from_stage_layers([16, 16, 15, 15], LAYERS, 4)
    with pytest.raises(TraceanaError, match=r"schedule\.stage_layers: 3 entries for pp=4"):
        from_stage_layers([20, 20, 21], LAYERS, 4)
    with pytest.raises(TraceanaError, match=r"schedule\.stage_layers: stage 2 would get 0 layers"):
        from_stage_layers([30, 30, 0, 1], LAYERS, 4)
    with pytest.raises(TraceanaError, match=r"schedule\.stage_layers: must be a list of integers"):
        from_stage_layers([15.5, 15.5, 15, 15], LAYERS, 4)  # type: ignore[list-item]
    assert from_stage_layers([15, 15, 15, 16], LAYERS, 4) == (15, 15, 15, 16)
    assert from_stage_layers([31, 30, 0, 0], LAYERS, 4, allow_empty=True) == (31, 30, 0, 0)


def test_ap_pp_06_more_stages_than_layers_is_rejected() -> None:
    for call in (lambda: uniform(4, 8), lambda: balance([1.0] * 4, [1.0] * 4, 8),
                 lambda: from_stage_layers([1] * 8, 4, 8), lambda: check_stages(4, 0)):
        with pytest.raises(TraceanaError, match=r"parallel\.pp"):
            call()
    # Seed 003 §3.6: empty stages only where the configuration allows them.
    assert sum(balance([1.0] * 4, [1.0] * 4, 8, allow_empty=True).stage_partition) == 4


def test_ap_pp_07_ppb_moves_stage_boundaries_and_reports_the_offsets() -> None:
    p, m = 16, 32
    ppb = balance(COSTS, STATIC, p, None, terms(p, m))
    # 61 // 16 = 3 layers each plus the offsets; the last stage gives a layer up to make room for the head.
    assert ppb.layer_offset == tuple(n - 3 for n in ppb.stage_partition)
    assert sum(ppb.layer_offset) == LAYERS % p
    assert ppb.layer_offset[-1] < max(ppb.layer_offset)
    assert ppb.layer_offset != tuple(n - 3 for n in uniform(LAYERS, p))
    # Round trip: the offsets as a config give back the same partition and the same numbers.
    counts = from_layer_offset(list(ppb.layer_offset), LAYERS, p)
    assert counts == ppb.stage_partition
    again = evaluate(counts, COSTS, STATIC, None, terms(p, m))
    assert again.stage_cost == ppb.stage_cost and again.stage_memory == ppb.stage_memory
    assert [len(r) for r in ppb.layer_ranges] == list(ppb.stage_partition) and ppb.layer_ranges[-1].stop == LAYERS
    first = [sum(ppb.stage_partition[:j]) for j in range(p)]
    assert list(ppb.megatron_layer_offset) == first and list(ppb.frame()["first_layer"]) == first


def test_ap_pp_08_illegal_layer_offset_is_rejected() -> None:
    assert from_layer_offset([0, 0, 0, 1], LAYERS, 4) == (15, 15, 15, 16)
    assert from_layer_offset([2, -1, 0, 0], LAYERS, 4) == (17, 14, 15, 15)
    cases = [([0, 0, 0, 0], r"sums to 0, must be layers % pp = 61 % 4 = 1"),
             ([1, 0, 0], r"3 entries for pp=4"),
             ([16, -15, 0, 0], r"stage 1 would get 0 layers"),
             ([0, 0, 0, "1"], r"must be a list of integers")]
    for offsets, message in cases:
        with pytest.raises(TraceanaError, match=r"schedule\.layer_offset: " + message.replace("(", r"\(")):
            from_layer_offset(offsets, LAYERS, 4)  # type: ignore[arg-type]


def test_ap_pp_09_recompute_trades_activation_memory_for_compute() -> None:
    p, m = 4, 8
    counts = uniform(LAYERS, p)
    forward = [c / 3 for c in COSTS]  # full recompute runs each layer's forward again

    def recomputing(layer_ids: list[int] | None) -> StageTerms:
        return terms(p, m, recompute=recompute_mask(layer_ids, LAYERS), recompute_cost=forward,
                     recompute_activation=[RECOMPUTED] * LAYERS)

    plain = evaluate(counts, COSTS, STATIC, None, terms(p, m))
    full = evaluate(counts, COSTS, STATIC, None, recomputing(None))
    held = pipeline.in_flight("1f1b", p, m)
    saved = [a - b for a, b in zip(plain.stage_memory, full.stage_memory, strict=True)]
    assert saved == pytest.approx([held[j] * n * (ACTIVATION - RECOMPUTED) for j, n in enumerate(counts)])
    added = [b - a for a, b in zip(plain.stage_cost, full.stage_cost, strict=True)]
    assert added == pytest.approx([sum(forward[r.start:r.stop]) for r in plain.layer_ranges])
    # Recompute only the first five layers: only stage 0 changes.
    some = evaluate(counts, COSTS, STATIC, None, recomputing([0, 1, 2, 3, 4]))
    assert some.stage_memory[0] < plain.stage_memory[0] and some.stage_memory[1:] == plain.stage_memory[1:]
    assert some.recompute[:6] == (True,) * 5 + (False,)
    # 60 GB: no partition fits without recompute (PPB is exact, see the exhaustive test), one fits with it,
    # at the price of a slower bottleneck.
    limit = 60e9
    assert not balance(COSTS, STATIC, p, limit, terms(p, m)).is_feasible
    with_recompute = balance(COSTS, STATIC, p, limit, recomputing(None))
    assert with_recompute.is_feasible
    assert max(with_recompute.stage_cost) > max(balance(COSTS, STATIC, p, None, terms(p, m)).stage_cost)


def test_ap_pp_10_illegal_recompute_layers_are_rejected() -> None:
    cases = [([0, 61], r"layer 61 does not exist \(layers are 0\.\.60\)"),
             ([-1], r"layer -1 does not exist"),
             ([3, 4, 3], r"layer 3 is listed twice"),
             (["all"], r"must be a list of integers")]
    for ids, message in cases:
        with pytest.raises(TraceanaError, match=r"schedule\.recompute\.layers: " + message):
            recompute_mask(ids, LAYERS)  # type: ignore[arg-type]
    assert recompute_mask([], 3) == (False, False, False)


def test_ap_pp_11_partition_frame_for_plots() -> None:
    p, m = 16, 32
    ppb = balance(COSTS, STATIC, p, 80e9, terms(p, m))
    frame = ppb.frame()
    assert frame.columns == ["stage", "layers", "first_layer", "layer_offset", "cost_ms", "memory_bytes",
                             "over_limit_bytes"]
    assert frame["layers"].sum() == LAYERS
    assert frame["cost_ms"].to_list() == pytest.approx([c * 1e3 for c in by_hand(list(ppb.stage_partition), p, m)[0]])
    assert frame["over_limit_bytes"].sum() == 0.0
