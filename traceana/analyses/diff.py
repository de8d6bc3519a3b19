"""Behind `traceana diff`: what changed between two runs, A and B, in any formats and world sizes.

- The step breakdown per pipeline stage (stage_breakdown: the mean over the stage's ranks of their typical step),
  each part's A, B, delta and %, and how much of the change in TOTAL each part explains (its delta over TOTAL's).
  That share is left blank for a stage whose TOTAL changed less than one of its parts did: the parts then offset
  each other, and a share of a near-zero change (two captures of one job: -538,490%) says nothing the deltas do not.
- Kernels by short name (kernel_names: templates and argument lists cut, so versions of one kernel match), as time
  and calls per rank and step (kernel_totals): those whose time changed most, and the new and vanished ones.
- Collectives by op and dim, per rank and step (collective_totals): calls, bytes and time.

Runs of different sizes compare through means (per stage, per rank and step), never through sums.
"""

from __future__ import annotations

import duckdb
import polars as pl

from traceana.analyses.breakdown import PARTS, by_stage

BREAKDOWN = ("TOTAL", *PARTS, "OVERLAPPED")


def _delta(frame: pl.DataFrame, value: str) -> list[pl.Expr]:
    """``value``_delta and ``value``_delta_pct from the joined ``value``_A and ``value``_B (missing = 0)."""
    a, b = pl.col(f"{value}_A").fill_null(0), pl.col(f"{value}_B").fill_null(0)
    return [(b - a).alias(f"{value}_delta"), (100 * (b - a) / a).replace([float("inf"), float("-inf")], None)
            .fill_nan(None).alias(f"{value}_delta_pct")]


def _pair(a: pl.DataFrame, b: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """A and B side by side on ``keys`` (a full join: rows of one run only have nulls for the other)."""
    values = [c for c in a.columns if c not in keys]
    return a.rename({c: f"{c}_A" for c in values}).join(
        b.rename({c: f"{c}_B" for c in values}), on=keys, how="full", coalesce=True, nulls_equal=True)


def breakdown_diff(con: duckdb.DuckDBPyConnection, run_a: str, run_b: str) -> pl.DataFrame:
    """One row per stage and breakdown part: A and B in ms (stage means of typical steps), delta, %, and the share
    of the stage's TOTAL change the part explains."""
    def long(run: str) -> pl.DataFrame:
        frame = by_stage(con, run)
        return frame.select(pl.col("pp").alias("stage"), *[pl.col(f"{p}_mean_ms").alias(p) for p in BREAKDOWN]) \
            .unpivot(index="stage", variable_name="part", value_name="ms")

    joined = _pair(long(run_a), long(run_b), ["stage", "part"])
    joined = joined.with_columns(_delta(joined, "ms"))
    total = joined.filter(pl.col("part") == "TOTAL").select("stage", pl.col("ms_delta").alias("_total"))
    part = pl.col("part").is_in(PARTS)
    largest = pl.when(part).then(pl.col("ms_delta").abs()).max().over("stage")
    shares = part & (pl.col("_total") != 0) & (pl.col("_total").abs() >= largest)
    return (joined.join(total, on="stage", how="left", nulls_equal=True)
            .with_columns(pl.when(shares).then(100 * pl.col("ms_delta") / pl.col("_total")).alias("explains_pct"))
            .drop("_total")
            .sort(pl.col("stage"), pl.col("part").replace_strict(list(BREAKDOWN), list(range(len(BREAKDOWN)))),
                  nulls_last=False))


def occurring(parts: pl.DataFrame) -> pl.DataFrame:
    """:func:`breakdown_diff`'s rows of the parts that are nonzero in A or B on some stage (a dim neither run has
    is left out of every table and plot of the diff)."""
    return parts.filter((pl.col("ms_A").fill_null(0).abs() + pl.col("ms_B").fill_null(0).abs()).sum().over("part")
                        > 0)


def _per_rank_step(con: duckdb.DuckDBPyConnection, view: str, run: str, keys: str, sums: str) -> pl.DataFrame:
    """``sums`` of ``view`` grouped by ``keys``, each divided by the run's rank-steps (Σ steps over its ranks)."""
    return con.sql(f"""
        WITH t AS (SELECT * FROM {view} WHERE run_id = $run),
        n AS (SELECT sum(steps) AS rank_steps FROM (SELECT DISTINCT rank, steps FROM t))
        SELECT {keys}, {sums} FROM t, n GROUP BY ALL""", params={"run": run}).pl().drop("rank_steps", strict=False)


def kernel_diff(con: duckdb.DuckDBPyConnection, run_a: str, run_b: str) -> pl.DataFrame:
    """Per short name and category: ms and calls per rank and step in A and B, deltas, and new / vanished / both."""
    def side(run: str) -> pl.DataFrame:
        return _per_rank_step(con, "kernel_totals", run, "short_name, category",
                              "sum(total_ns) / any_value(n.rank_steps) / 1e6 AS ms, "
                              "sum(calls) / any_value(n.rank_steps) AS calls")

    joined = _pair(side(run_a), side(run_b), ["short_name", "category"])
    status = (pl.when(pl.col("ms_A").is_null()).then(pl.lit("new"))
              .when(pl.col("ms_B").is_null()).then(pl.lit("vanished")).otherwise(pl.lit("both")))
    return (joined.with_columns(*_delta(joined, "ms"), *_delta(joined, "calls"), status.alias("status"))
            .sort(pl.col("ms_delta").abs(), "short_name", descending=[True, False]))


def collective_diff(con: duckdb.DuckDBPyConnection, run_a: str, run_b: str) -> pl.DataFrame:
    """Per op and dim: calls, bytes and ms per rank and step in A and B, with deltas."""
    def side(run: str) -> pl.DataFrame:
        return _per_rank_step(con, "collective_totals", run, "op, dim",
                              "sum(calls) / any_value(n.rank_steps) AS calls, "
                              "sum(bytes) / any_value(n.rank_steps) AS bytes, "
                              "sum(total_ns) / any_value(n.rank_steps) / 1e6 AS ms")

    joined = _pair(side(run_a), side(run_b), ["op", "dim"])
    return (joined.with_columns(*_delta(joined, "calls"), *_delta(joined, "bytes"), *_delta(joined, "ms"))
            .sort(pl.col("ms_delta").abs(), "op", "dim", descending=[True, False, False]))
