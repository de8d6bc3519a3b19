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
    counts = _query(con, f"SELECT {', '.join(f'count({level})' for level in LEVELS)} FROM op_time WHERE run_id = $run",
                    {"run": run_id})[0]
    return [level for level, n in zip(LEVELS, counts, strict=True) if n]


def _query(con: duckdb.DuckDBPyConnection, sql: str, params: dict) -> list[tuple]:
    """The rows of one statement over op_time. `execute`, not `sql`: a relation binds its statement a second time,
    and planning the views is most of the cost on one rank."""
    try:
        return con.execute(sql, params).fetchall()
    except duckdb.CatalogException:  # a store written before event_scopes existed has no op_time view
        raise TraceanaError(f"{store.OUTDATED} (traceana ops reads event_scopes)") from None


# the mean over the rank-steps covered, in ms, of each part an event owns ($rank_steps: how many)
_PARTS = ", ".join(f"sum({p}_ns) / $rank_steps / 1e6 AS {p}_ms" for p in ("COMP", *WAITS))


@dataclass
class _Steps:
    """The rank-steps a statement over op_time covers: the condition on its step, the parameters (with how many
    rank-steps and their total length), and the run's steps."""

    where: str
    params: dict
    known: list[int]


def _steps(con: duckdb.DuckDBPyConnection, run_id: str, step: int | None) -> _Steps:
    """One step (checked), or the typical step's steps (all after the first). One statement reads the run's
    windows, summed here (a GROUP BY costs more than the few rows), so op_time's statement plans no second copy of
    step_windows and nothing else reads it again."""
    windows: dict[int, list[int]] = {}  # step -> its rank-steps' lengths
    for s, length in con.execute("SELECT step, end_ns - start_ns FROM step_windows WHERE run_id = ?",
                                 [run_id]).fetchall():
        windows.setdefault(s, []).append(length)
    known = sorted(windows)
    if step is not None:
        bd.check_step(con, run_id, step, known)
        where, covered = "step = $step", [step]
    else:
        where, first = "step >= $step", bd.first_analysed_step(con, run_id, known)
        covered = [s for s in known if s >= first]
    lengths = [length for s in covered for length in windows[s]]
    return _Steps(where, {"run": run_id, "step": covered[0], "rank_steps": len(lengths), "total": sum(lengths)}, known)


def attribute(con: duckdb.DuckDBPyConnection, run_id: str, by: str = "op", step: int | str | None = None,
              top: int | None = None) -> Ops:
    """The rows of ``by``, largest first: ``top`` of them, then the rest as one row, then "(none)". One pass over
    op_time groups by ``by`` and counts the other levels on the way."""
    if by not in LEVELS:
        raise TraceanaError(f"--by {by!r}: choose one of {', '.join(LEVELS)}")
    asked, step = step, bd.resolve_step(con, run_id, step)
    steps = _steps(con, run_id, step)
    owned = " + ".join(f"{p}_ns" for p in ("COMP", *WAITS))
    rows = _query(con, f"""
        SELECT coalesce({by}, '{NONE}') AS level, count(*) / $rank_steps AS kernels, {_PARTS},
               100 * ({' + '.join(f'sum({p}_ns)' for p in ('COMP', *WAITS))}) / $total AS step_pct,
               arg_max(kernel, ({owned}, kernel)) AS top_kernel,  -- ties: the last name, not the first found
               {', '.join(f'count({level})' for level in LEVELS)}
        FROM op_time
        WHERE run_id = $run AND {steps.where} GROUP BY level
        ORDER BY level = '{NONE}', COMP_ms + {' + '.join(f'{w}_ms' for w in WAITS)} DESC, level""", steps.params)
    schema = {by: pl.String, "kernels": pl.Float64, **{f"{p}_ms": pl.Float64 for p in ("COMP", *WAITS)},
              "step_pct": pl.Float64, "top_kernel": pl.String}
    counts = [sum(r[len(schema) + i] for r in rows) for i in range(len(LEVELS))]  # each level's events, all rows
    have = [level for level, n in zip(LEVELS, counts, strict=True) if n]
    if by not in have:
        raise TraceanaError(f"--by {by}: run {run_id!r} has no {NEEDS[by]}; it supports --by "
                            f"{'|'.join(have) if have else '(nothing: no event has an op, module or range)'}")
    frame = pl.DataFrame([r[:len(schema)] for r in rows], schema=schema, orient="row")
    frame = _top(frame, by, top)
    notes = [f"no {NEEDS[level]}: --by {level} is not available" for level in LEVELS if level not in have]
    if (none := frame.filter(pl.col(by) == NONE)).height:
        notes.append(f"{NONE}: device time launched outside any {by} ({none['step_pct'][0]:.1f}% of the step)")
    return Ops(frame, by, bd.which_step(con, run_id, step, asked, steps.known),
               steps.params["rank_steps"], have, notes)


def tree(con: duckdb.DuckDBPyConnection, run_id: str, step: int | str | None = None) -> pl.DataFrame:
    """The leaves of the report's icicle: device time by where it was launched, one row per (path, op, kernel) in
    ms per rank-step over the steps `attribute` covers, each part apart (COMP_ms, the waits), so the rows add up to
    the same COMP and waits. path: the nn.Module path, else the NVTX path (elements joined by " / "); NULL where
    the event has none, as op is."""
    steps = _steps(con, run_id, bd.resolve_step(con, run_id, step))
    rows = _query(con, f"""
        SELECT coalesce(module, nvtx) AS path, op, kernel, count(*) / $rank_steps AS kernels, {_PARTS}
        FROM op_time
        WHERE run_id = $run AND {steps.where} GROUP BY path, op, kernel""",
                  {k: v for k, v in steps.params.items() if k != "total"})
    schema = {"path": pl.String, "op": pl.String, "kernel": pl.String, "kernels": pl.Float64,
              **{f"{p}_ms": pl.Float64 for p in ("COMP", *WAITS)}}
    return pl.DataFrame([r[:len(schema)] for r in rows], schema=schema, orient="row")


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
