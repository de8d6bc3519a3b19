"""One run, estimate versus measured: per dimension, per pipeline stage, the straggler stage and peak memory.

Measured numbers are the breakdown views' typical step (rank_breakdown: mean over steps after the first), averaged
over ranks (``measured_ms``) with the worst rank beside it (``measured_max_ms``); per stage the same over the stage's
ranks (stage_breakdown). The estimate has one row per pipeline stage, which stands for every rank of that stage, so
its run-level value is the mean over stages (every stage has the same number of ranks) and its max the worst stage.
The config must describe the run: a different world size, layout or pipeline size is an error, never a silent join.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import duckdb
import polars as pl

from traceana.analyses import breakdown as bd
from traceana.errors import TraceanaError
from traceana.estimator.config import Config
from traceana.estimator.estimate import Estimate
from traceana.estimator.memory import MIB
from traceana.layout import Layout

# Breakdown column -> the estimate's attribute (StageEstimate). OTHER_WAIT (communication of unknown dim) has none.
ESTIMATED = {"COMP": "comp", "MP_WAIT": "mp_wait", "CP_WAIT": "cp_wait", "EP_WAIT": "ep_wait", "DP_WAIT": "dp_wait",
             "PP_WAIT": "pp_wait", "IDLE": "idle", "TOTAL": "total"}
DIMS = ("COMP", "MP_WAIT", "CP_WAIT", "EP_WAIT", "DP_WAIT", "PP_WAIT", "OTHER_WAIT", "IDLE", "TOTAL")
ALWAYS_SHOWN = ("COMP", "TOTAL")
NOISE_MS = 1e-6  # below the store's 1 ns resolution: the estimator's float remainders (PP_WAIT = TOTAL - rest)
PEAK = "peak_memory_MiB"


@dataclass(frozen=True)
class RunComparison:
    """Frames of one run's comparison (ms, MiB); ``by_stage`` / ``memory`` are None when the run cannot say."""

    run_id: str
    by_dimension: pl.DataFrame   # dim, measured_ms, measured_max_ms, estimated_ms, estimated_max_ms, ratio, errors
    by_stage: pl.DataFrame | None  # stage, dim, the same columns but estimated_max_ms (one estimate per stage)
    straggler: pl.DataFrame | None  # stage, COMP measured / estimated, % of each side's straggler, flags
    memory: pl.DataFrame | None  # stage, measured / estimated peak MiB, ratio, error
    notes: list[str]

    @property
    def straggler_stages(self) -> tuple[int, int] | None:
        """(measured, predicted) straggler stage."""
        if self.straggler is None:
            return None
        pick = self.straggler.filter
        return (pick(pl.col("measured_straggler"))["stage"][0], pick(pl.col("predicted_straggler"))["stage"][0])


def check_matches(con: duckdb.DuckDBPyConnection, run_id: str, cfg: Config) -> None:
    """One-line error when ``cfg`` cannot describe run ``run_id``: world size, layout (sizes and rank order) or
    pipeline size differ."""
    p = cfg.parallel
    world, layout = con.execute("SELECT world_size, layout FROM runs WHERE run_id = ?", [run_id]).fetchall()[0]
    if world != p.world_size:
        raise TraceanaError(f"{cfg.source}: parallel tp x cp x dp x pp = {p.world_size} but run {run_id!r} has "
                            f"{world} ranks")
    if layout is not None:
        measured, estimated = Layout.parse(layout), p.layout
        for dim in ("pp", "tp", "cp", "ep", "dp", "expert_tp"):
            if getattr(measured, dim) != getattr(estimated, dim):
                raise TraceanaError(f"{cfg.source}: parallel.{dim.replace('expert_tp', 'etp')}="
                                    f"{getattr(estimated, dim)} but run {run_id!r} was ingested with layout {layout}")
        for rank in range(world):
            if measured.coords(rank) != estimated.coords(rank):
                raise TraceanaError(f"{cfg.source}: parallel.order={p.order} puts rank {rank} at "
                                    f"{estimated.coords(rank)} but run {run_id!r} (layout {layout}) at "
                                    f"{measured.coords(rank)}")
    stages = con.execute("SELECT count(DISTINCT pp) FROM ranks WHERE run_id = ? AND pp IS NOT NULL",
                         [run_id]).fetchall()[0][0]
    if stages and stages != p.pp:
        raise TraceanaError(f"{cfg.source}: parallel.pp={p.pp} but run {run_id!r} has {stages} pipeline stages")
    sends = _first_stage_sends(con, run_id) if stages and p.pp > 1 and p.vpp == 1 else None
    if sends is not None and sends != cfg.micro_batches:
        raise TraceanaError(f"{cfg.source}: {cfg.micro_batches} micro-batches (global_batch / (dp x micro_batch)) "
                            f"but run {run_id!r}'s first stage sends {sends} activations per step")


def _first_stage_sends(con: duckdb.DuckDBPyConnection, run_id: str) -> int | None:
    """The median over the first pipeline stage's rank-steps of its PP sends (one per micro-batch in a
    non-interleaved schedule); None when the run records none."""
    got = con.execute("""
        SELECT median(n)::BIGINT FROM (
            SELECT w.rank, w.step, count(*) AS n FROM collectives c
            JOIN ranks r ON r.run_id = c.run_id AND r.rank = c.rank AND r.pp = 0
            JOIN device_events e ON e.run_id = c.run_id AND e.rank = c.rank AND e.event_id = c.event_id
            JOIN step_windows w ON w.run_id = c.run_id AND w.rank = c.rank AND e.start_ns >= w.start_ns
                               AND e.start_ns < w.end_ns
            WHERE c.run_id = ? AND c.dim = 'PP' AND c.op ILIKE '%send%' GROUP BY ALL)""", [run_id]).fetchall()
    return got[0][0] if got and got[0][0] is not None else None


def estimated_stages(est: Estimate) -> pl.DataFrame:
    """Per stage: ``<DIM>_ms`` for every estimated dim and the peak memory (MiB)."""
    return pl.DataFrame({
        "stage": [s.stage for s in est.stages],
        **{f"{dim}_ms": [getattr(s, attr) * 1e3 for s in est.stages] for dim, attr in ESTIMATED.items()},
        PEAK: [s.memory.peak / MIB for s in est.stages],
    })


def estimated_quantities(est: Estimate) -> dict[str, float]:
    """The step as a sweep compares it: each dim's mean over stages (ms) and the largest stage's peak (MiB)."""
    stages = est.stages  # plain Python: calibrate evaluates this thousands of times per fit
    return {**{f"{dim}_ms": sum(getattr(s, attr) for s in stages) * 1e3 / len(stages)
               for dim, attr in ESTIMATED.items()},
            PEAK: max(s.memory.peak for s in stages) / MIB}


def measured_quantities(con: duckdb.DuckDBPyConnection, run_id: str) -> dict[str, float]:
    """A run's typical step as a sweep compares it: each dim's mean over ranks (ms), the largest rank peak (MiB)."""
    ranks = _by_rank(con, run_id)
    result = {f"{dim}_ms": ranks[f"{dim}_ms"].mean() for dim in DIMS}
    peaks = _rank_peaks(con, run_id)
    if not peaks.is_empty():
        result[PEAK] = peaks[PEAK].max()
    return result


def compare_run(con: duckdb.DuckDBPyConnection, run_id: str, est: Estimate) -> RunComparison:
    """Join estimate ``est`` with run ``run_id``'s measured breakdown (after :func:`check_matches`)."""
    check_matches(con, run_id, est.config)
    return compare_stages(con, run_id, estimated_stages(est), est.config.parallel.layout.spec)


def compare_stages(con: duckdb.DuckDBPyConnection, run_id: str, estimated: pl.DataFrame,
                   layout: str | None = None) -> RunComparison:
    """Join per-stage estimates (the frame of :func:`estimated_stages`, from any estimator: a column that is all
    null was not estimated) with run ``run_id``'s measured breakdown; ``layout`` is the `--layout` spec to suggest
    when the run has none."""
    notes: list[str] = []
    ranks = _by_rank(con, run_id)
    over_ranks = ranks.select(stage=pl.lit(None, pl.Int32), **_mean_and_max(DIMS))
    over_stages = estimated.select(stage=pl.lit(None, pl.Int32), **_mean_and_max(ESTIMATED))
    by_dimension = _join(_long(over_ranks, "measured", DIMS, "{}_mean_ms", "{}_max_ms"),
                         _long(over_stages, "estimated", ESTIMATED, "{}_mean_ms", "{}_max_ms")).drop("stage")

    stages = bd.by_stage(con, run_id).rename({"pp": "stage"})
    if stages["stage"].null_count():
        if estimated.height > 1:
            notes.append(f"run {run_id!r} has no layout, so its ranks have no pipeline stage: per-stage comparison "
                         f"needs `traceana ingest --layout {layout or 'SPEC'}`")
            stages = None
        else:
            stages = stages.with_columns(stage=pl.lit(0, pl.Int32))
    by_stage = straggler = None
    if stages is not None:
        by_stage = _join(_long(stages, "measured", DIMS, "{}_mean_ms", "{}_max_ms"),
                         _long(estimated, "estimated", ESTIMATED, "{}_ms")).drop("estimated_max_ms")  # one per stage
        if estimated["COMP_ms"].is_not_null().all():
            straggler = _straggler(stages, estimated)
    return RunComparison(run_id, by_dimension, by_stage, straggler, _memory(con, run_id, estimated), notes)


def _by_rank(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame:
    ranks = bd.by_rank(con, run_id)
    if ranks.is_empty():
        raise TraceanaError(f"run {run_id!r} has no device events, so nothing measured to compare")
    return ranks


def _mean_and_max(dims: Iterable[str]) -> dict[str, pl.Expr]:
    """``<DIM>_mean_ms`` and ``<DIM>_max_ms`` over the rows of a frame with ``<DIM>_ms`` columns."""
    return {key: expr for d in dims for key, expr in ((f"{d}_mean_ms", pl.col(f"{d}_ms").mean()),
                                                      (f"{d}_max_ms", pl.col(f"{d}_ms").max()))}


def _long(frame: pl.DataFrame, side: str, dims: Iterable[str], mean: str, worst: str | None = None) -> pl.DataFrame:
    """Rows (stage, dim, <side>_ms, <side>_max_ms) from per-dim columns named by the ``mean`` / ``worst``
    templates ('{}_mean_ms' -> COMP_mean_ms)."""
    return pl.concat([frame.select(
        "stage", dim=pl.lit(d), **{f"{side}_ms": pl.col(mean.format(d)),
                                   f"{side}_max_ms": pl.col(worst.format(d)) if worst else pl.lit(None, pl.Float64)})
        for d in dims])


def _join(measured: pl.DataFrame, estimated: pl.DataFrame) -> pl.DataFrame:
    """Measured and estimated rows side by side, in DIMS order, with ratio and errors; dims that are zero on both
    sides (below NOISE_MS) are left out (COMP and TOTAL always stay)."""
    order = pl.col("dim").replace_strict({d: i for i, d in enumerate(DIMS)}, return_dtype=pl.Int32)
    joined = measured.join(estimated, on=["stage", "dim"], how="left", nulls_equal=True)
    return (
        joined.filter(pl.col("dim").is_in(ALWAYS_SHOWN) | (pl.col("measured_ms") != 0)
                      | (pl.col("estimated_ms").fill_null(0).abs() > NOISE_MS))
        .with_columns(**ratio_columns("measured_ms", "estimated_ms"), error_ms=pl.col("estimated_ms")
                      - pl.col("measured_ms"))
        .sort(pl.col("stage"), order, nulls_last=False)
        .select("stage", "dim", "measured_ms", "measured_max_ms", "estimated_ms", "estimated_max_ms",
                "est_over_measured", "error_ms", "error_pct")
    )


def ratio_columns(measured: str, estimated: str) -> dict[str, pl.Expr]:
    """est_over_measured and error_pct = 100 (estimated - measured) / measured; null where measured is 0."""
    base = pl.when(pl.col(measured) != 0).then(pl.col(measured))
    return {"est_over_measured": pl.col(estimated) / base,
            "error_pct": 100 * (pl.col(estimated) - pl.col(measured)) / base}


def _straggler(stages: pl.DataFrame, estimated: pl.DataFrame) -> pl.DataFrame:
    """Per stage, COMP measured and estimated and as % of that side's straggler (largest COMP; ties: lower stage)."""
    frame = stages.select("stage", measured_COMP_ms="COMP_mean_ms").join(
        estimated.select("stage", estimated_COMP_ms="COMP_ms"), on="stage", how="left").sort("stage")
    result = frame.with_columns(
        measured_pct_of_straggler=100 * pl.col("measured_COMP_ms") / pl.col("measured_COMP_ms").max(),
        estimated_pct_of_straggler=100 * pl.col("estimated_COMP_ms") / pl.col("estimated_COMP_ms").max(),
        measured_straggler=pl.int_range(pl.len()) == pl.col("measured_COMP_ms").arg_max(),
        predicted_straggler=pl.int_range(pl.len()) == pl.col("estimated_COMP_ms").arg_max(),
    )
    return result.select("stage", "measured_COMP_ms", "measured_pct_of_straggler", "estimated_COMP_ms",
                         "estimated_pct_of_straggler", "measured_straggler", "predicted_straggler")


def _rank_peaks(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame:
    """Per rank that has memory samples: its pipeline stage and its largest allocated bytes, in MiB."""
    return con.sql(
        f"SELECT m.rank, k.pp AS stage, max(m.allocated_bytes) / {MIB} AS {PEAK} FROM memory m "
        "LEFT JOIN ranks k ON k.run_id = m.run_id AND k.rank = m.rank WHERE m.run_id = ? "
        "AND m.allocated_bytes IS NOT NULL GROUP BY ALL", params=[run_id]).pl()


def _memory(con: duckdb.DuckDBPyConnection, run_id: str, estimated: pl.DataFrame) -> pl.DataFrame | None:
    """Peak allocated memory per stage (mean and max over its ranks' peaks) against the estimated peak."""
    peaks = _rank_peaks(con, run_id)
    if peaks.is_empty() or estimated[PEAK].is_null().all():
        return None
    per_stage = peaks.with_columns(pl.col("stage").fill_null(0)).group_by("stage").agg(
        measured_peak_MiB=pl.col(PEAK).mean(), measured_peak_max_MiB=pl.col(PEAK).max())
    return (per_stage.join(estimated.select("stage", estimated_peak_MiB=PEAK), on="stage", how="left")
            .with_columns(**ratio_columns("measured_peak_MiB", "estimated_peak_MiB"),
                          error_MiB=pl.col("estimated_peak_MiB") - pl.col("measured_peak_MiB"))
            .sort("stage"))
