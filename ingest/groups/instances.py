"""Collective instances: the same ``instance`` number on every rank that took part in one collective (or one
Send/Recv pair), by the trace's sequence number where it has one, else by order of issue within the group."""

from __future__ import annotations

import polars as pl


def number_instances(coll: pl.DataFrame, starts: pl.DataFrame | None = None) -> pl.DataFrame:
    """Give ``instance`` the same value on every rank of one collective.

    With a trace sequence number (``seq``) the key is (pg, seq). Without it, the k-th collective a rank issues
    in a group is the k-th of every member: key (pg, k). Point-to-point ops pair the k-th Send a->b with the k-th
    Recv at b from a: key (pg, src, dst, k). Order of issue is ``event_id`` order, which ingesters assign by
    start time per rank. Rows already carrying an instance keep it.
    """
    if coll.is_empty():
        return coll
    p2p = pl.col("op").is_in(["Send", "Recv"]) & pl.col("peer").is_not_null()
    src = pl.when(pl.col("op") == "Send").then(pl.col("rank")).otherwise(pl.col("peer"))
    dst = pl.when(pl.col("op") == "Send").then(pl.col("peer")).otherwise(pl.col("rank"))
    keyed = coll.with_row_index("_row").sort("rank", "event_id").with_columns(
        pl.when(p2p).then(src).otherwise(-1).alias("_src"),
        pl.when(p2p).then(dst).otherwise(-1).alias("_dst"),
        pl.coalesce("pg", pl.lit("?")).alias("_pg"),
    )
    keyed = keyed.with_columns(
        pl.when(pl.col("seq").is_not_null()).then(pl.col("seq"))
        .otherwise(pl.int_range(pl.len()).over("rank", "_pg", "_src", "_dst", pl.col("seq").is_null()))
        .alias("_k"),
        pl.col("seq").is_not_null().alias("_has_seq"),
    )
    ids = keyed.select("_pg", "_src", "_dst", "_has_seq", "_k").unique().sort(pl.all())
    ids = ids.with_row_index("_instance")
    out = keyed.join(ids, on=["_pg", "_src", "_dst", "_has_seq", "_k"], how="left")
    out = out.with_columns(pl.coalesce("instance", pl.col("_instance").cast(pl.Int64)).alias("instance"))
    return out.sort("_row").select(coll.columns)
