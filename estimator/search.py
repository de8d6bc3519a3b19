"""Strategy search: every layout of the job's devices that the config allows, those that fit, ranked by step time.

Enumerated: tp (within a node, dividing the heads), cp (dividing the sequence into shards of >= 1024 tokens), pp
(at most the layers), dp (the rest, dividing the global batch), ep (dividing the experts and tp·cp·dp / etp),
micro-batch size, recompute (none / selective / full), schedule (1f1b, zb-h1, interleaved with vpp 2 and 4, zb-v,
dualpipe) and, for one-chunk schedules, the even partition and PPB's. GPipe is left out: it has 1F1B's bubble and
more activation memory, so it never ranks above it. Each candidate is validated like a config file, then its peak
memory is checked before the pipeline is simulated, so what does not fit costs no simulation, and once the top list
is full a candidate whose busiest stage alone (estimate.lower_bound) is slower than the list's slowest is not
simulated either: the list is still exact.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

import polars as pl

from traceana.errors import TraceanaError
from traceana.estimator import memory
from traceana.estimator.config import Config, validate
from traceana.estimator.estimate import estimate, lower_bound, model_flops, peak_memory, ppb

MAX_MICRO_BATCH = 16
MIN_CP_TOKENS = 1024  # a context-parallel shard shorter than this starves the attention kernels


@dataclass(frozen=True)
class Found:
    config: Config
    step_s: float
    peak_bytes: float
    mfu: float


@dataclass(frozen=True)
class SearchResult:
    best: list[Found]  # fastest first
    candidates: int  # valid layouts enumerated
    fitting: int  # of those, the ones that fit in memory
    simulated: int  # of those, the ones whose step was simulated (the rest provably slower than the top list)
    seconds: float

    def frame(self) -> pl.DataFrame:
        rows = []
        for rank, f in enumerate(self.best, 1):
            p, s = f.config.parallel, f.config.schedule
            rows.append({"rank": rank, "tp": p.tp, "cp": p.cp, "pp": p.pp, "dp": p.dp, "ep": p.ep, "vpp": p.vpp,
                         "micro_batch": p.micro_batch, "recompute": s.recompute.kind, "schedule": s.kind,
                         "partition": "ppb" if s.stage_layers == "ppb" else "even", "step_ms": f.step_s * 1e3,
                         "mfu_pct": 100 * f.mfu, "peak_gib": f.peak_bytes / memory.GIB})
        return pl.DataFrame(rows)


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _schedules(cfg: Config, pp: int) -> Iterator[tuple[str, int, str | None]]:
    """(kind, vpp, stage_layers) options for pp stages."""
    yield "1f1b", 1, None
    if pp == 1:
        return
    yield "1f1b", 1, "ppb"
    yield "zb-h1", 1, None
    yield "zb-h1", 1, "ppb"
    for vpp in (2, 4):
        if cfg.model.layers >= pp * vpp:
            yield "interleaved", vpp, None
    yield "zb-v", 1, None
    yield "dualpipe", 1, None


def candidates(cfg: Config) -> Iterator[Config]:
    """Every valid variation of ``cfg``'s layout on its device count (hardware.devices, else its world size)."""
    m, hw = cfg.model, cfg.hardware
    devices = hw.devices or cfg.parallel.world_size
    for tp in _divisors(devices):
        if tp > hw.devices_per_node or m.heads % tp:
            continue
        for cp in _divisors(devices // tp):
            if m.seq_len % cp or (m.seq_len // cp < MIN_CP_TOKENS and cp != cfg.parallel.cp):
                continue
            for pp in _divisors(devices // (tp * cp)):
                if pp > m.layers:
                    continue
                dp = devices // (tp * cp * pp)
                if cfg.parallel.global_batch % dp:
                    continue
                etp = min(cfg.parallel.etp, tp) if cfg.parallel.etp else tp
                eps = [e for e in _divisors(m.experts) if (tp * cp * dp) % (etp * e) == 0] if m.experts else [1]
                per_replica = cfg.parallel.global_batch // dp
                for ep in eps:
                    for mb in (b for b in _divisors(per_replica) if b <= MAX_MICRO_BATCH):
                        parallel = replace(cfg.parallel, tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, micro_batch=mb,
                                           etp=cfg.parallel.etp and etp)
                        for recompute in ("none", "selective", "full"):
                            for kind, vpp, partition in _schedules(cfg, pp):
                                schedule = replace(cfg.schedule, kind=kind, stage_layers=partition, layer_offset=None,
                                                   recompute=replace(cfg.schedule.recompute, kind=recompute))
                                candidate = replace(cfg, parallel=replace(parallel, vpp=vpp), schedule=schedule)
                                try:
                                    validate(candidate)
                                except TraceanaError:
                                    continue
                                yield candidate


def search(cfg: Config, top: int = 10, progress: Callable[[str], None] = lambda _: None) -> SearchResult:
    """The ``top`` fastest candidates that fit in memory; ``progress`` is called once per candidate."""
    if top < 1:
        raise TraceanaError(f"--top {top}: must be at least 1")
    started = time.perf_counter()
    limit = cfg.hardware.hbm_gb * memory.GIB
    heap: list[tuple[float, int, Found]] = []
    enumerated = fitting = simulated = 0
    for candidate in candidates(cfg):
        enumerated += 1
        progress(f"{simulated:,} simulated")
        if candidate.schedule.stage_layers == "ppb":
            partition = ppb(candidate)
            if not partition.is_feasible:
                continue
            per_device: list[int] | None = list(partition.stage_partition)
        else:
            per_device = None
            if peak_memory(candidate) > limit:
                continue
        fitting += 1
        if len(heap) == top and lower_bound(candidate, per_device) >= -heap[0][0]:
            continue
        simulated += 1
        est = estimate(candidate, per_device)
        found = Found(candidate, est.step_s, est.peak_memory, model_flops(candidate) / (
            est.step_s * candidate.parallel.world_size * candidate.hardware.peak_tflops_bf16 * 1e12))
        entry = (-found.step_s, enumerated, found)
        if len(heap) < top:
            heapq.heappush(heap, entry)
        elif entry > heap[0]:
            heapq.heapreplace(heap, entry)
    best = [f for _, _, f in sorted(heap, key=lambda e: (-e[0], e[1]))]
    return SearchResult(best, enumerated, fitting, simulated, time.perf_counter() - started)
