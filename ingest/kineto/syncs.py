"""One Kineto file's synchronizations (the store's ``syncs``), from the ``ev`` table (events.py) and the file's
device events (link.py), resolved by the shared rules of :mod:`traceana.ingest.syncs.edges`.

Two sources. The host's blocking runtime calls (``cuda_runtime`` / ``cuda_driver``: cudaStreamSynchronize,
cudaDeviceSynchronize, cudaEventSynchronize, blocking cudaMemcpy, their driver and HIP forms), which name no stream:
the wait covers any stream's work. And Kineto's ``cuda_sync`` events (CUPTI synchronization records, written with
``enable_cuda_sync_events``): "Stream Sync" / "Event Sync" / "Context Sync" with the ``stream`` waited on (an
Event Sync: the recorded
``wait_on_stream`` and the record call), and
"Stream Wait Event" (also seen as "Wait on Stream") with the waiting ``stream``, the recorded ``wait_on_stream`` and
``wait_on_cuda_event_record_corr_id``, the correlation of the cudaEventRecord call (host times). A runtime call that
a cuda_sync record describes (same correlation) is read once, from the record. A cudaStreamWaitEvent call without
such a record names neither stream: it is left out and counted.
"""

from __future__ import annotations

import duckdb
import polars as pl

from traceana.ingest.syncs.edges import SyncCounts, host_waits, stream_waits

_RUNTIME = "cat IN ('cuda_runtime', 'cuda_driver')"
_HOST_CALLS = (r"^((cuda|hip)(Stream|Device|Event)Synchronize|cu(Stream|Ctx|Event)Synchronize"
               r"|(cuda|hip)Memcpy(2D|3D|Peer|ToSymbol|FromSymbol)?|cuMemcpy(DtoH|HtoD|DtoD)?(_v2)?)$")
_MEMCPY = r"[Mm]emcpy"
_STREAM_WAIT_CALLS = r"^(cuda|hip)StreamWaitEvent$|^cuStreamWaitEvent$"
_WAIT_KINDS = ("Stream Wait Event", "Wait on Stream")

_SQL = f"""WITH sync AS (
    SELECT f, coalesce(sync_kind, name) AS name, start_ns, end_ns, corr,
           CASE WHEN stream >= 0 THEN stream END AS stream,
           CASE WHEN wait_stream >= 0 THEN wait_stream END AS wait_stream,
           record_corr FROM ev WHERE cat = 'cuda_sync'
), calls AS (
    SELECT f, name, start_ns, end_ns, corr FROM ev
    WHERE {_RUNTIME} AND regexp_matches(name, '{_HOST_CALLS}')
      AND (corr IS NULL OR corr NOT IN (SELECT corr FROM sync WHERE corr IS NOT NULL))
)
SELECT 'call' AS source, f, name, start_ns, end_ns, corr, NULL::BIGINT AS stream, NULL::BIGINT AS wait_stream,
       NULL::BIGINT AS record_ns FROM calls
UNION ALL
SELECT 'sync', s.f, s.name, s.start_ns, s.end_ns, s.corr, s.stream, s.wait_stream, r.start_ns FROM sync s
LEFT JOIN (SELECT f, corr, min(start_ns) AS start_ns FROM ev WHERE {_RUNTIME} AND corr IS NOT NULL GROUP BY ALL) r
    ON r.f = s.f AND r.corr = s.record_corr
"""


def file_syncs(con: duckdb.DuckDBPyConnection, events: pl.DataFrame) -> tuple[pl.DataFrame, SyncCounts]:
    """The file's syncs (rank 0, like its other rows until the run knows ranks) and the calls left out.
    ``events``: the file's device events with ``f``, event_id, stream, times, launch_ns, category and corr."""
    found = con.sql(_SQL).pl()
    events = events.rename({"f": "rank"})
    waits = found.filter((pl.col("source") == "sync") & pl.col("name").is_in(_WAIT_KINDS))
    hosts = found.filter((pl.col("source") != "sync") | ~pl.col("name").is_in(_WAIT_KINDS)).rename({"f": "rank"}) \
        .with_columns(pl.coalesce("stream", "wait_stream").alias("stream"), pl.col("record_ns").alias("before_ns"))
    copies = events.filter((pl.col("category") == "memcpy") & pl.col("corr").is_not_null()).group_by("rank", "corr") \
        .agg(pl.col("event_id").min().alias("own_event_id"))
    hosts = hosts.join(copies, on=["rank", "corr"], how="left").with_columns(
        pl.when(pl.col("name").str.contains(_MEMCPY)).then(pl.col("own_event_id")).alias("own_event_id"))
    waits, counts = stream_waits(waits.rename({"f": "rank", "wait_stream": "record_stream"}), events,
                                 device_times=False)
    rows = [host_waits(hosts.sort("start_ns"), events), waits]
    unnamed = con.sql(f"""SELECT name, count(*) FROM ev
        WHERE {_RUNTIME} AND regexp_matches(name, '{_STREAM_WAIT_CALLS}')
        AND (corr IS NULL OR corr NOT IN (SELECT corr FROM ev WHERE cat = 'cuda_sync' AND corr IS NOT NULL))
        GROUP BY name""").fetchall()
    left_out = {f"{{n}} {name} calls left out: the trace names no stream": count for name, count in unnamed}
    return pl.concat(rows).sort("start_ns", "end_ns", "name"), counts + SyncCounts(left_out)
