"""Behind `traceana ops`: a step's device time by what launched it (view op_time, DESIGN §9) — the outermost CPU op,
the nn.Module path, the layer, the NVTX range (nsys) or the Ascend operator. Each row holds the COMP and the exposed
communication its events own (view event_time), so the rows of a rank-step add up to its breakdown's COMP and waits;
what no op claims is the "(none)" row, never left out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import duckdb
import polars as pl

from traceana import store
from traceana.analyses import breakdown as bd
from traceana.errors import TraceanaError

LEVELS = ("op", "module", "layer", "nvtx")
WAITS = ("MP_WAIT", "CP_WAIT", "EP_WAIT", "DP_WAIT", "PP_WAIT", "OTHER_WAIT")
NONE = "(none)"
# What a level needs in the trace, for the notes and the error of a level the run lacks.
NEEDS = {"op": "CPU op links (Kineto with its CPU side) or Ascend operators",
         "module": "nn.Module ranges (Kineto with with_stack / the Python tracer)",
         "layer": "module or NVTX names that carry a layer index",
         "nvtx": "NVTX ranges on the launching threads (nsys)"}


@dataclass
class Ops:
    """The rows (ms per rank-step, mean over the rank-steps covered), the step they cover and what the run lacks."""

    frame: pl.DataFrame
    by: str
    step: str
    rank_steps: int
    levels: list[str]
    notes: list[str] = field(default_factory=list)


def levels(con: duckdb.DuckDBPyConnection, run_id: str) -> list[str]:
    """The levels this run's events carry (some event of its steps has a value for it)."""
    return _levels(_events(con, run_id, "TRUE", {"run": run_id}))


def _events(con: duckdb.DuckDBPyConnection, run_id: str, where: str, params: dict) -> pl.DataFrame:
    """op_time's rows for the steps ``where`` picks, read once (the view repeats the breakdown's sweep)."""
    try:
        return con.sql(f"SELECT * FROM op_time WHERE run_id = $run AND {where}", params=params).pl()
    except duckdb.CatalogException:  # a store written before event_scopes existed has no op_time view
        raise TraceanaError(f"{store.OUTDATED} (traceana ops reads event_scopes)") from None


def _levels(events: pl.DataFrame) -> list[str]:
    return [level for level in LEVELS if events[level].null_count() < events.height]


def attribute(con: duckdb.DuckDBPyConnection, run_id: str, by: str = "op", step: int | str | None = None,
              top: int | None = None) -> Ops:
    """The rows of ``by``, largest first: ``top`` of them, then the rest as one row, then "(none)"."""
    if by not in LEVELS:
        raise TraceanaError(f"--by {by!r}: choose one of {', '.join(LEVELS)}")
    asked, step = step, bd.resolve_step(con, run_id, step)
    if step is not None:
        bd.check_step(con, run_id, step)
    where = "step = $step" if step is not None else "step >= $first"
    params = ({"run": run_id, "step": step} if step is not None
              else {"run": run_id, "first": bd.first_analysed_step(con, run_id)})
    events = _events(con, run_id, where, params)
    have = _levels(events)
    if by not in have:
        raise TraceanaError(f"--by {by}: run {run_id!r} has no {NEEDS[by]}; it supports --by "
                            f"{'|'.join(have) if have else '(nothing: no event has an op, module or range)'}")
    rank_steps, total = con.execute(f"SELECT count(*), sum(end_ns - start_ns) FROM step_windows "
                                    f"WHERE run_id = $run AND {where}", params).fetchall()[0]
    parts = ", ".join(f"sum({p}_ns) / {rank_steps} / 1e6 AS {p}_ms" for p in ("COMP", *WAITS))
    frame = con.sql(f"""
        SELECT coalesce({by}, '{NONE}') AS level, count(*) / {rank_steps} AS kernels, {parts},
               100 * (sum(COMP_ns) + {' + '.join(f'sum({w}_ns)' for w in WAITS)}) / {total} AS step_pct,
               arg_max(kernel, COMP_ns + {' + '.join(f'{w}_ns' for w in WAITS)}) AS top_kernel
        FROM events GROUP BY 1
        ORDER BY level = '{NONE}', COMP_ms + {' + '.join(f'{w}_ms' for w in WAITS)} DESC, level""").pl()
    frame = _top(frame.rename({"level": by}), by, top)
    notes = [f"no {NEEDS[level]}: --by {level} is not available" for level in LEVELS if level not in have]
    if (none := frame.filter(pl.col(by) == NONE)).height:
        notes.append(f"{NONE}: device time launched outside any {by} ({none['step_pct'][0]:.1f}% of the step)")
    return Ops(frame, by, bd.which_step(con, run_id, step, asked), rank_steps, have, notes)


def _top(frame: pl.DataFrame, by: str, top: int | None) -> pl.DataFrame:
    """The ``top`` largest rows, the others summed into one row (so the rows still add up), "(none)" last."""
    named = frame.filter(pl.col(by) != NONE)
    if top is None or named.height <= top + 1:
        return frame
    rest = named.slice(top)
    summed = rest.select(pl.lit(f"({rest.height} others)").alias(by),
                         *(pl.col(c).sum() for c in frame.columns if c not in (by, "top_kernel")),
                         pl.lit(None, pl.String).alias("top_kernel"))
    return pl.concat([named.head(top), summed, frame.filter(pl.col(by) == NONE)])
