"""Read the breakdown views (queries/*.sql) for one run: per rank, per stage, a step's timeline, the stragglers.

The views hold integer ns; these helpers pick the rows a report needs and convert to ms and % of TOTAL, the
units users quote. `compare` reads the same frames.
"""

from __future__ import annotations

import duckdb
import polars as pl

from traceana.errors import TraceanaError

# Breakdown columns in report order: TOTAL = sum of PARTS exactly; OVERLAPPED is reported beside it.
WAITS = ("MP_WAIT", "CP_WAIT", "EP_WAIT", "DP_WAIT", "PP_WAIT", "OTHER_WAIT")
PARTS = ("COMP", *WAITS, "IDLE")
COORDS = ("tp", "cp", "ep", "dp", "pp")
# activity_intervals lanes: COMP, then one per communication dim (DIM_LANES[i] is charged to WAITS[i]).
DIM_LANES = ("TP", "CP", "EP", "DP", "PP", "OTHER")


def label(part: str) -> str:
    """A part's name where people read it: the column stays MP_WAIT (the mission's term), tables and plots add
    what it is, "MP_WAIT (TP)", so tensor parallel has one name everywhere."""
    return "MP_WAIT (TP)" if part == "MP_WAIT" else part


def steps(con: duckdb.DuckDBPyConnection, run_id: str) -> list[int]:
    """The step numbers of a run, sorted."""
    rows = con.execute("SELECT DISTINCT step FROM step_windows WHERE run_id = ? ORDER BY step", [run_id]).fetchall()
    return [r[0] for r in rows]


def first_analysed_step(con: duckdb.DuckDBPyConnection, run_id: str, known: list[int] | None = None) -> int:
    """The first step the typical step averages: the second one (the first is warm-up), or the only one. ``known``:
    :func:`steps`, where the caller has them already."""
    known = steps(con, run_id) if known is None else known
    if not known:
        raise TraceanaError(f"run {run_id!r} has no device events, so no breakdown")
    return known[1] if len(known) > 1 else known[0]


def which_step(con: duckdb.DuckDBPyConnection, run_id: str, step: int | None, asked: int | str | None = None,
               known: list[int] | None = None) -> str:
    """How a title names the step(s) a report covers: one step (``asked``: the --step given, so that a step
    'median' chose says so), the typical step (mean over steps after the first), or the run's only step, which is
    then all there is to average. ``known`` as for :func:`first_analysed_step`."""
    if step is not None:
        return named_step(step, asked)
    known = steps(con, run_id) if known is None else known
    if len(known) > 1:
        return "typical step (mean over steps after the first)"
    markers = con.execute("SELECT count(*) FROM steps WHERE run_id = ?", [run_id]).fetchall()[0][0]
    return f"step {known[0]}, the run's only step" if markers else "the whole trace as one step (no step markers)"


# A steady step is an outlier in a column when it differs from the median of the other steady steps by more than
# this share of that median and by more than OUTLIER_FLOOR of the median step's TOTAL (small waits jitter a lot).
OUTLIER_SHARE, OUTLIER_FLOOR = 0.5, 0.05


def steady_steps(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame:
    """The steps the typical step averages, one row each: step, and TOTAL_ns and each wait as the mean over ranks."""
    first = first_analysed_step(con, run_id)
    means = ", ".join(f"avg({c}_ns) AS {c}_ns" for c in ("TOTAL", *WAITS))
    return con.sql(f"SELECT step, {means} FROM rank_breakdown WHERE run_id = ? AND step >= ? GROUP BY step "
                   "ORDER BY step", params=[run_id, first]).pl()


def outliers(frame: pl.DataFrame) -> list[tuple[int, str, float, float]]:
    """(step, column, its value, median of the other steps) for each outlier of :func:`steady_steps`' frame; needs
    three steps or more (with two, neither is the odd one)."""
    if frame.height < 3:
        return []
    floor = OUTLIER_FLOOR * float(frame["TOTAL_ns"].median())  # type: ignore[arg-type]
    found = []
    for index, step in enumerate(frame["step"].to_list()):
        others = frame.filter(pl.int_range(pl.len()) != index)
        for column in ("TOTAL", *WAITS):
            value, usual = frame[f"{column}_ns"][index], float(others[f"{column}_ns"].median())  # type: ignore[arg-type]
            if abs(value - usual) > max(OUTLIER_SHARE * usual, floor):
                found.append((step, column, value, usual))
    return found


def median_step(con: duckdb.DuckDBPyConnection, run_id: str) -> int:
    """The steady step whose TOTAL (mean over ranks) is the median one (the lower middle of an even count): a real
    step, so its parts add up to its TOTAL as every step's do, and one outlier cannot move it."""
    frame = steady_steps(con, run_id).sort("TOTAL_ns", "step")
    return int(frame["step"][(frame.height - 1) // 2])


# The words --step takes besides a step number; "all" only where the command answers per step (replay).
STEP_WORDS = ("median", "all")


def step_form(step: int | str, every: bool = False) -> int | str:
    """``step`` as a step number or a word (:data:`STEP_WORDS`; "all" only with ``every``), or the one-line error
    naming the forms: --step's parser and the Python API check one spelling."""
    words = STEP_WORDS if every else STEP_WORDS[:1]
    if isinstance(step, int) or step in words:
        return step
    try:
        return int(step)
    except ValueError:
        forms = "a step number, 'median' or 'all'" if every else "a step number or 'median'"
        raise TraceanaError(f"--step {step!r}: give {forms}") from None


def resolve_step(con: duckdb.DuckDBPyConnection, run_id: str, step: int | str | None,
                 every: bool = False) -> int | None:
    """The step number a report covers, for every command and API method that takes a step: "median" is
    :func:`median_step`; None (the command's default) and "all" (with ``every``: every step) stay None."""
    if step is None:
        return None
    form = step_form(step, every)
    if form == "median":
        return median_step(con, run_id)
    return None if form == "all" else int(form)


def named_step(step: int, asked: int | str | None) -> str:
    """How output names one step: "step N", and that it is the median step when --step median chose it."""
    return f"step {step}, the median step" if asked == "median" else f"step {step}"


def outlier_notes(con: duckdb.DuckDBPyConnection, run_id: str) -> list[str]:
    """One line per outlier step of the typical step's mean, with the median step to use instead."""
    found = outliers(steady_steps(con, run_id))
    if not found:
        return []
    alternative = f"--step median (step {median_step(con, run_id)}) is a step without it"
    return [f"step {step} is an outlier in the typical step's mean: {label(column)} {value / 1e6:,.3f} ms against "
            f"{usual / 1e6:,.3f} ms, the median of the other steps; {alternative}"
            for step, column, value, usual in found]


def check_step(con: duckdb.DuckDBPyConnection, run_id: str, step: int, known: list[int] | None = None) -> None:
    """A one-line error when ``step`` is not one of the run's steps (``known`` as for :func:`first_analysed_step`)."""
    known = steps(con, run_id) if known is None else known
    if not known:
        raise TraceanaError(f"run {run_id!r} has no device events, so no breakdown")
    if step not in known:
        listing = ", ".join(map(str, known)) if len(known) <= 12 else f"{known[0]}..{known[-1]}"
        raise TraceanaError(f"--step {step}: run {run_id!r} has no such step (steps: {listing})")


def by_rank(con: duckdb.DuckDBPyConnection, run_id: str, step: int | None = None) -> pl.DataFrame:
    """One row per rank in ms: step ``step``, or the rank's typical step (mean over steps after the first), and
    its OVERLAP_pct (:func:`overlap_pct`)."""
    if step is not None:
        check_step(con, run_id, step)
    frame = con.sql(
        "SELECT * EXCLUDE (run_id) FROM rank_breakdown WHERE run_id = ? AND step IS NOT DISTINCT FROM ? "
        "ORDER BY rank", params=[run_id, step]).pl()
    return _ns_to_ms(frame).with_columns(overlap_pct())


def rank_steps(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame:
    """Every rank-step's breakdown in ms (rank_breakdown's rows with a step), by rank and step."""
    return _ns_to_ms(con.sql("SELECT * EXCLUDE (run_id, steps) FROM rank_breakdown WHERE run_id = ? AND step IS NOT "
                             "NULL ORDER BY rank, step", params=[run_id]).pl())


def by_stage(con: duckdb.DuckDBPyConnection, run_id: str, step: int | None = None) -> pl.DataFrame:
    """One row per pipeline stage in ms: mean and max over the stage's ranks (step ``step`` or typical steps), and
    the stage's OVERLAP_pct (:func:`overlap_pct` of its ranks together)."""
    if step is not None:
        check_step(con, run_id, step)
    frame = con.sql(
        "SELECT * EXCLUDE (run_id, step) FROM stage_breakdown WHERE run_id = ? AND step IS NOT DISTINCT FROM ? "
        "ORDER BY pp", params=[run_id, step]).pl()
    return _ns_to_ms(frame).with_columns(overlap_pct("_mean_ms"))  # ratio of means = of sums


def overlap_pct(suffix: str = "_ms") -> pl.Expr:
    """HTA's communication / computation overlap: the share of communication time that ran under compute,
    OVERLAPPED / (OVERLAPPED + Σ *_WAIT), in %. The waits are the exposed rest of union(comm) (DESIGN §4), so the
    denominator is all of it; null without communication. Over rows (ranks of a run), sum the columns first."""
    comm = pl.col(f"OVERLAPPED{suffix}") + pl.sum_horizontal(pl.col(f"{w}{suffix}") for w in WAITS)
    return pl.when(comm > 0).then(100 * pl.col(f"OVERLAPPED{suffix}") / comm).alias("OVERLAP_pct")


def run_overlap_pct(ranks: pl.DataFrame) -> float | None:
    """The run's overlap from :func:`by_rank`'s frame: its ranks' OVERLAPPED over their communication, summed."""
    sums = ranks.select(pl.col("OVERLAPPED_ms", *(f"{w}_ms" for w in WAITS)).sum())
    return sums.select(overlap_pct())["OVERLAP_pct"][0]


def percent_of_total(frame: pl.DataFrame, suffix: str = "_ms") -> pl.DataFrame:
    """Add ``<PART>_pct``: each part's share of TOTAL (the row's own TOTAL, so shares add up to 100)."""
    total = pl.col(f"TOTAL{suffix}")
    return frame.with_columns(
        [(100 * pl.col(f"{p}{suffix}") / total).fill_nan(None).alias(f"{p}_pct") for p in PARTS]
    )


def timeline(con: duckdb.DuckDBPyConnection, run_id: str, step: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(windows, intervals) of one step: each rank's window and its COMP / per-dim communication unions, in ns."""
    check_step(con, run_id, step)
    windows = con.sql(
        "SELECT w.rank, r.pp, w.start_ns, w.end_ns FROM step_windows w LEFT JOIN ranks r USING (run_id, rank) "
        "WHERE w.run_id = ? AND w.step = ? ORDER BY r.pp NULLS FIRST, w.rank", params=[run_id, step]).pl()
    intervals = con.sql(
        "SELECT rank, lane, start_ns, end_ns FROM activity_intervals WHERE run_id = ? AND step = ?",
        params=[run_id, step]).pl()
    return windows, intervals


def stragglers(con: duckdb.DuckDBPyConnection, run_id: str) -> pl.DataFrame:
    """Per rank in ms: typical COMP vs its stage's median, straggler-stage flag, and the lateness it caused."""
    frame = con.sql(
        "SELECT * EXCLUDE (run_id) FROM stragglers WHERE run_id = ? ORDER BY COMP_excess_pct DESC NULLS LAST, rank",
        params=[run_id]).pl()
    return _ns_to_ms(frame)


def late_ranks(con: duckdb.DuckDBPyConnection, run_id: str, top: int = 10) -> pl.DataFrame:
    """The ranks most often last to arrive at a collective (≥ 2 traced ranks), by dim, with the wait they caused."""
    return con.sql(
        "SELECT last_rank AS rank, dim, count(*) AS last_arrivals, "
        "sum(total_wait_ns) / 1e6 AS caused_wait_ms, max(max_wait_ns) / 1e6 AS max_wait_ms "
        "FROM collective_instances WHERE run_id = ? AND ranks_seen > 1 GROUP BY ALL "
        "ORDER BY caused_wait_ms DESC, rank LIMIT ?", params=[run_id, top]).pl()


def _ns_to_ms(frame: pl.DataFrame) -> pl.DataFrame:
    """Every ``*_ns`` column as ``*_ms`` (float)."""
    return frame.select(
        [(pl.col(c) / 1e6).alias(c.removesuffix("_ns") + "_ms") if c.endswith("_ns") else pl.col(c)
         for c in frame.columns]
    )
