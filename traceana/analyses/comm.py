"""Behind `traceana comm`: bandwidth per collective op and dim as nccl-tests reports it, the slowest instances, the
communication matrix between rank pairs, and the links or groups that run slower than their peers.

Bandwidths follow NVIDIA/nccl-tests doc/PERFORMANCE.md (algbw = size / time; busbw = algbw × an op's factor that
makes it comparable to the hardware's link bandwidth); the per-instance numbers are the view collective_bandwidth,
the pairs the view comm_matrix. Aggregates over many instances divide total size by total time, so long instances
weigh more, as a bandwidth over the whole run should.
"""

from __future__ import annotations

import duckdb
import polars as pl


def by_op(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame:
    """Per op, dim and link: instances, group size, total size and time, algbw and busbw over all instances."""
    return con.sql(
        "SELECT op, dim, link, any_value(n) AS n, count(*) AS instances, sum(size_bytes)::BIGINT AS size_bytes, "
        "sum(time_ns) / 1e6 AS time_ms, sum(size_bytes) / nullif(sum(time_ns), 0) AS algbw_GBps, "
        "sum(busbw_GBps * time_ns) / nullif(sum(time_ns) FILTER (WHERE busbw_GBps IS NOT NULL), 0) AS busbw_GBps "
        "FROM collective_bandwidth WHERE run_id = ? GROUP BY ALL ORDER BY time_ms DESC, op, dim",
        params=[run_id]).pl()


def slowest(con: duckdb.DuckDBPyConnection, run_id: str, top: int) -> pl.DataFrame:
    """The ``top`` instances that took longest once all members were there."""
    return con.sql(
        "SELECT instance, op, dim, ranks, size_bytes, time_ns / 1e6 AS time_ms, "
        "(last_start_ns - start_ns) / 1e6 AS arrival_spread_ms, algbw_GBps, busbw_GBps, link "
        "FROM collective_bandwidth WHERE run_id = ? ORDER BY time_ns DESC, instance LIMIT ?",
        params=[run_id, top]).pl()


def matrix(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame:
    """comm_matrix of one run: bytes and time per (src, dst, dim), and the bytes an all-to-all's even split assumes."""
    return con.sql("SELECT src, dst, dim, messages, bytes, time_ns / 1e6 AS time_ms, GBps, assumed_bytes "
                   "FROM comm_matrix "
                   "WHERE run_id = ? ORDER BY src, dst, dim", params=[run_id]).pl()


def slow_links(pairs: pl.DataFrame, groups: pl.DataFrame, threshold_pct: float) -> pl.DataFrame:
    """Rank pairs (per dim) and process groups (per dim and op) whose bandwidth is more than ``threshold_pct`` below
    the median of their peers (pairs of that dim, groups of that dim and op)."""
    cut = 1 - threshold_pct / 100
    pair_rows = (pairs.filter(pl.col("GBps").is_not_null())
                 .with_columns(pl.col("GBps").median().over("dim").alias("median_GBps"))
                 .select(pl.lit("pair").alias("what"), pl.format("{} -> {}", "src", "dst").alias("who"), "dim",
                         pl.lit(None, pl.String).alias("op"), pl.col("GBps").alias("bandwidth_GBps"), "median_GBps"))
    group_rows = (groups.filter(pl.col("busbw_GBps").is_not_null())
                  .with_columns(pl.col("busbw_GBps").median().over("dim", "op").alias("median_GBps"))
                  .select(pl.lit("group").alias("what"), pl.format("pg {} {}", "pg", "ranks").alias("who"), "dim",
                          "op", pl.col("busbw_GBps").alias("bandwidth_GBps"), "median_GBps"))
    both = pl.concat([pair_rows, group_rows])
    return (both.filter(pl.col("bandwidth_GBps") < cut * pl.col("median_GBps"))
            .with_columns((100 * (pl.col("bandwidth_GBps") / pl.col("median_GBps") - 1)).alias("vs_median_pct"))
            .sort("vs_median_pct"))


def by_group(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame:
    """busbw per process group and op (total size × factor over total time), for comparing groups of one dim."""
    return con.sql(
        "SELECT b.pg, b.dim, b.op, any_value(g.ranks)::VARCHAR AS ranks, count(*) AS instances, "
        "sum(b.busbw_GBps * b.time_ns) / nullif(sum(b.time_ns), 0) AS busbw_GBps "
        "FROM collective_bandwidth b LEFT JOIN process_groups g USING (run_id, pg) "
        "WHERE b.run_id = ? AND b.pg IS NOT NULL AND b.busbw_GBps IS NOT NULL GROUP BY ALL "
        "ORDER BY TRY_CAST(any_value(b.pg) AS HUGEINT) NULLS LAST, b.pg, b.op",
        params=[run_id]).pl()
