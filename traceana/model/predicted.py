"""Another estimator's predictions (SAPP-ND, Calculon, vTrain, an in-house model) as the estimate `compare` joins.

A predictions file (``compare --predicted FILE``; CSV, JSON or Parquet by its suffix) has one row per (run, stage)
and these columns (DESIGN §6), matched case-insensitively; every column but ``run`` may be missing:

- ``run``: the store's run_id of the measured run the row predicts.
- ``stage``: its pipeline stage, 0 .. pp-1. A run's rows give every stage of the run once, or a single row without
  a stage (column missing or cell empty): the whole run as its one stage, for a run with one pipeline stage.
- ``COMP_ms MP_WAIT_ms CP_WAIT_ms EP_WAIT_ms DP_WAIT_ms PP_WAIT_ms IDLE_ms TOTAL_ms``: the DESIGN §4 times of that
  stage's typical step, in milliseconds (IDLE_ms, a §4 column too, is optional like the rest).
- ``peak_memory_mb`` (10^6 bytes, as sweep CSVs read ``_mb``) or ``peak_memory_mib`` (2^20 bytes): the stage's peak.

A JSON file is an array of such objects (or ``{"rows": [...]}``). In a CSV, lines before the header that start
with ``#`` and hold no comma are comments (where the example says how its numbers were made). Rows are numbered
from 1 in file order, not counting header and comments.

Bad input is one line naming the file, row and column: a column of another name, or a time in another unit
(``COMP_us``: the schema is in ms); a run the store lacks, a stage the run lacks, a stage given twice, a run with
some of its stages only; a value that is empty, not a number, NaN, infinite or negative (below -1e-6 ms, the
store's 1 ns: a float remainder such as -3e-15 is read as 0). Nothing is written then.

What the file gives is what is compared: a missing column is one note ("no PP_WAIT_ms in FILE: PP_WAIT not
compared"), never a zero; TOTAL is not derived from the parts when TOTAL_ms is missing (the parts need not tile
the step when some are missing). Rows whose parts sum to more than their TOTAL_ms (by over 0.1% + 1 µs, more than
rounding) are counted in a note: in §4's terms the parts are disjoint shares of the step, so such a row cannot be
right. The other unit checks (a TOTAL about 1000x or 1/1000 the measured step) compare with the measurement:
traceana/model/diagnose.py.

Loaded predictions go into ``estimate_runs`` / ``estimate_stages`` (estimator/record.py) under the id
``<file stem>:<run>``: config_path is the file, world size and layout come from the run, and everything a file
cannot know (schedule, micro-batches, config, fits, layers, memory components) is NULL. The run-level estimate a
sweep scores is each time's mean over the run's stages and the largest stage's peak, as for traceana's own.
"""

from __future__ import annotations

import dataclasses
import io
import json
from dataclasses import dataclass
from pathlib import Path

import duckdb
import polars as pl

from traceana import store
from traceana.errors import TraceanaError, first_line
from traceana.estimator import record
from traceana.estimator.memory import MIB
from traceana.layout import Layout
from traceana.model import sweep
from traceana.model.compare import ESTIMATED, NOISE_MS, PEAK, RunComparison, compare_stages, measured_quantities

TIMES = tuple(f"{d}_ms" for d in ESTIMATED)  # COMP_ms ... IDLE_ms, TOTAL_ms
PARTS = tuple(t for t in TIMES if t != "TOTAL_ms")
MEMORY = {"peak_memory_mb": 1e6 / MIB, "peak_memory_mib": 1.0}  # -> MiB
ROW = "__row"
SUM_SLACK = 1e-3  # parts may exceed TOTAL by 0.1% + 1 µs: a file's rounding, not an error


@dataclass(frozen=True)
class Predictions:
    """A validated predictions file: per run, its stages as :func:`compare.estimated_stages` shapes them (stage,
    ``<DIM>_ms``, peak_memory_MiB; a column the file lacks is all null)."""

    path: Path
    runs: dict[str, pl.DataFrame]
    notes: list[str]

    def estimate_id(self, run_id: str) -> str:
        return f"{self.path.stem}:{run_id}"


def load(con: duckdb.DuckDBPyConnection, path: Path, only: list[str] | None = None) -> Predictions:
    """Read and check ``path`` against the runs of the store at ``con``; ``only``: these runs of the file."""
    frame = _read(path)
    columns = _columns(frame, path)
    frame = frame.rename(columns).with_row_index(ROW, offset=1)
    for column in (*TIMES, *MEMORY):
        if column in frame.columns:
            frame = _values(frame, column, path)
    frame = frame.with_columns(pl.col("run").cast(pl.String)) if frame["run"].dtype != pl.String else frame
    _check_cells(frame, "run", pl.col("run").is_null() | (pl.col("run").str.strip_chars() == ""), "empty", path)
    if only:
        missing = [r for r in only if r not in set(frame["run"])]
        if missing:
            raise TraceanaError(f"{path}: no row for run {missing[0]!r} (runs in the file: "
                                f"{', '.join(dict.fromkeys(frame['run']))})")
        frame = frame.filter(pl.col("run").is_in(only))
    if "stage" not in frame.columns:
        frame = frame.with_columns(stage=pl.lit(None, pl.Int64))
    frame = _stages(con, frame, path)
    runs = {run: _estimated(part) for (run,), part in frame.group_by("run", maintain_order=True)}
    return Predictions(path, runs, _notes(frame, path))


def write(db: Path, predictions: Predictions) -> None:
    """Replace the file's estimates in the store at ``db`` (one transaction for all its runs)."""
    with store.connect(db, read_only=True) as con:
        meta = {run: (world, layout) for run, world, layout in
                con.execute("SELECT run_id, world_size, layout FROM runs").fetchall()}
    estimates = {}
    for run_id, stages in predictions.runs.items():
        world, layout = meta[run_id]
        rows = [{"stage": s["stage"], **{f"{t.removesuffix('_ms').lower()}_ns": _ns(s[t]) for t in TIMES},
                 "peak_bytes": None if s[PEAK] is None else round(s[PEAK] * MIB)} for s in stages.to_dicts()]
        run = {"config_path": str(predictions.path.resolve()), "world_size": world, "layout": layout,
               "step_ns": max((r["total_ns"] for r in rows if r["total_ns"] is not None), default=None),
               "peak_memory_bytes": max((r["peak_bytes"] for r in rows if r["peak_bytes"] is not None),
                                        default=None)}
        estimates[predictions.estimate_id(run_id)] = (run, rows)
    record.write_rows(db, estimates)


def compare(con: duckdb.DuckDBPyConnection, predictions: Predictions, run_id: str) -> RunComparison:
    """One run of the file against its measured breakdown, through the same join as traceana's own estimate."""
    layout = con.execute("SELECT layout FROM runs WHERE run_id = ?", [run_id]).fetchall()[0][0]
    result = compare_stages(con, run_id, predictions.runs[run_id], layout)
    return dataclasses.replace(result, notes=[*predictions.notes, *result.notes])


def sweep_rows(con: duckdb.DuckDBPyConnection, predictions: Predictions) -> list[sweep.Row]:
    """One sweep row per run of the file: measured as for `compare --estimate`, estimated from the file."""
    layouts = dict(con.execute("SELECT run_id, layout FROM runs").fetchall())
    return [sweep.Row(run_id, None, measured_quantities(con, run_id), run_id=run_id, predicted=quantities(stages),
                      layout=Layout.parse(layouts[run_id]) if layouts[run_id] else None)
            for run_id, stages in predictions.runs.items()]


def quantities(stages: pl.DataFrame) -> dict[str, float]:
    """The run-level estimate: each given time's mean over stages, the largest stage's peak (MiB)."""
    given = [c for c in TIMES if stages[c].is_not_null().all()]
    result = {c: float(stages[c].mean()) for c in given}  # type: ignore[arg-type]
    if stages[PEAK].is_not_null().all():
        result[PEAK] = float(stages[PEAK].max())  # type: ignore[arg-type]
    return result


# ---------------------------------------------------------------------------------------------------------------


def _read(path: Path) -> pl.DataFrame:
    suffix = path.suffix.lower()
    if suffix not in (".csv", ".json", ".parquet"):
        raise TraceanaError(f"{path}: a predictions file is .csv, .json or .parquet")
    if suffix == ".csv":
        return sweep.read_frame(path)
    try:
        if suffix == ".parquet":
            frame = pl.read_parquet(path)
        else:
            data = json.loads(path.read_text(encoding="utf-8"))
            records = data.get("rows") if isinstance(data, dict) else data
            if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
                raise TraceanaError(f"{path}: expected a JSON array of objects, one per (run, stage)")
            frame = pl.read_json(io.BytesIO(json.dumps(records).encode()), infer_schema_length=None)
    except OSError as exc:
        raise TraceanaError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except (ValueError, pl.exceptions.PolarsError) as exc:  # JSONDecodeError is a ValueError
        raise TraceanaError(f"{path}: not a readable {suffix[1:]} file ({first_line(exc)})") from None
    if frame.is_empty():
        raise TraceanaError(f"{path}: no data rows")
    return frame


def _columns(frame: pl.DataFrame, path: Path) -> dict[str, str]:
    """Each column's schema name; an unknown column or a time in another unit is an error."""
    known = {c.lower(): c for c in ("run", "stage", *TIMES, *MEMORY)}
    names: dict[str, str] = {}
    for column in frame.columns:
        name = known.get(column.strip().lower())
        if name is None:
            found = sweep.quantity(column)
            if found is not None and found[0] != PEAK and not found[2]:
                raise TraceanaError(f"{path}: column {column!r}: times are in ms (name it {found[0]}, values in ms)")
            raise TraceanaError(f"{path}: column {column!r}: not a predictions column (run, stage, "
                                f"{', '.join(TIMES)}, peak_memory_mb or peak_memory_mib)")
        if name in names.values():
            raise TraceanaError(f"{path}: column {column!r}: {name} given twice")
        names[column] = name
    if "run" not in names.values():
        raise TraceanaError(f"{path}: no run column (each row names the store's run_id it predicts)")
    if {"peak_memory_mb", "peak_memory_mib"} <= set(names.values()):
        raise TraceanaError(f"{path}: column 'peak_memory_mib': peak_memory_mb given too; keep one")
    return names


def _check_cells(frame: pl.DataFrame, column: str, bad: pl.Expr, problem: str, path: Path) -> None:
    hit = frame.filter(bad)
    if hit.height:
        value = hit[column][0]
        shown = "" if value is None or problem == "empty" else f"{value!r} "
        raise TraceanaError(f"{path}: row {hit[ROW][0]}, column {column}: {shown}{problem}")


def _values(frame: pl.DataFrame, column: str, path: Path) -> pl.DataFrame:
    """``frame`` with ``column`` as floats, every cell a finite number >= 0 (text cells must read as numbers)."""
    kind = frame[column].dtype
    if kind == pl.String:
        number = pl.col(column).str.strip_chars().cast(pl.Float64, strict=False)
        _check_cells(frame, column, pl.col(column).is_not_null() & number.is_null(), "is not a number", path)
        frame = frame.with_columns(number.alias(column))
    elif not kind.is_numeric() and kind != pl.Null:
        raise TraceanaError(f"{path}: column {column}: holds {kind}, not numbers")
    frame = frame.with_columns(pl.col(column).cast(pl.Float64))
    for bad, problem in ((pl.col(column).is_null(), "empty"), (pl.col(column).is_nan(), "is NaN"),
                         (pl.col(column).is_infinite(), "is not finite"), (pl.col(column) < -NOISE_MS,
                                                                            "is negative")):
        _check_cells(frame, column, bad, problem, path)
    return frame.with_columns(pl.col(column).clip(0))  # -1e-15: an estimator's float remainder, not a time


def _stages(con: duckdb.DuckDBPyConnection, frame: pl.DataFrame, path: Path) -> pl.DataFrame:
    """``frame`` with integer stages checked against each run's pipeline stages (a whole-run row becomes stage 0)."""
    stage = frame["stage"]
    if stage.dtype == pl.String:
        _check_cells(frame, "stage", stage.is_not_null() & stage.str.strip_chars().cast(pl.Int64, strict=False)
                     .is_null(), "is not an integer", path)
        frame = frame.with_columns(pl.col("stage").str.strip_chars().cast(pl.Int64))
    elif stage.dtype.is_float():
        _check_cells(frame, "stage", stage.is_not_null() & (stage != stage.round()), "is not an integer", path)
    elif not stage.dtype.is_integer() and stage.dtype != pl.Null:
        raise TraceanaError(f"{path}: column stage: holds {stage.dtype}, not integers")
    frame = frame.with_columns(pl.col("stage").cast(pl.Int64))
    _check_cells(frame, "stage", pl.col("stage") < 0, "is negative", path)
    known = {r for (r,) in con.execute("SELECT run_id FROM runs").fetchall()}
    _check_cells(frame, "run", ~pl.col("run").is_in(list(known)), f"is not a run of the store (known: "
                 f"{', '.join(sorted(known)) or 'none'})", path)
    counts = dict(con.execute("SELECT run_id, count(DISTINCT pp) FROM ranks GROUP BY run_id").fetchall())
    frame = frame.with_columns(stages=pl.col("run").replace_strict(counts, default=0).clip(1))
    _check_cells(frame, "stage", pl.col("stage") >= pl.col("stages"), "is a stage the run lacks", path)
    whole = frame.filter(pl.col("stage").is_null() & (pl.col("stages") > 1))
    if whole.height:
        raise TraceanaError(f"{path}: row {whole[ROW][0]}, column stage: empty, but run {whole['run'][0]!r} has "
                            f"{whole['stages'][0]} pipeline stages (give one row per stage)")
    frame = frame.with_columns(pl.col("stage").fill_null(0))
    _check_cells(frame, "stage", ~pl.struct("run", "stage").is_first_distinct(),
                 "is given twice for this run", path)
    short = frame.group_by("run", maintain_order=True).agg(
        pl.col(ROW).first(), pl.col("stages").first(), given=pl.len()).filter(pl.col("given") < pl.col("stages"))
    if short.height:
        run = short.row(0, named=True)
        raise TraceanaError(f"{path}: row {run[ROW]}, column stage: run {run['run']!r} has {run['stages']} "
                            f"pipeline stages, the file gives {run['given']} (give every stage)")
    return frame


def _estimated(part: pl.DataFrame) -> pl.DataFrame:
    """One run's rows as :func:`compare.estimated_stages` shapes an estimate (MiB for memory)."""
    memory = next((pl.col(c) * f for c, f in MEMORY.items() if c in part.columns), pl.lit(None, pl.Float64))
    return part.sort("stage").select(
        pl.col("stage").cast(pl.Int32),
        *(pl.col(c).cast(pl.Float64) if c in part.columns else pl.lit(None, pl.Float64).alias(c) for c in TIMES),
        memory.cast(pl.Float64).alias(PEAK))


def _notes(frame: pl.DataFrame, path: Path) -> list[str]:
    """What the file leaves out, and rows whose parts cannot fit in their TOTAL."""
    notes = []
    missing = [c for c in TIMES if c not in frame.columns]
    if not any(c in frame.columns for c in MEMORY):
        missing.append("peak_memory_mb")
    if missing:
        what = [c.removesuffix("_ms") if c in TIMES else "peak memory" for c in missing]
        derived = " (not derived from the parts)" if "TOTAL_ms" in missing and set(PARTS) & set(frame.columns) else ""
        notes.append(f"no {', '.join(missing)} in {path.name}: {', '.join(what)} not compared{derived}")
    parts = [c for c in PARTS if c in frame.columns]
    if parts and "TOTAL_ms" in frame.columns:
        over = frame.with_columns(parts_ms=pl.sum_horizontal(parts)).filter(
            pl.col("parts_ms") > pl.col("TOTAL_ms") * (1 + SUM_SLACK) + 1e-3)
        if over.height:
            first = over.row(0, named=True)
            notes.append(f"{path.name}: in {over.height} of {frame.height} rows the parts ({', '.join(parts)}) sum "
                         f"to more than TOTAL_ms (row {first[ROW]}, run {first['run']} stage {first['stage']}: "
                         f"{first['parts_ms']:.4g} > {first['TOTAL_ms']:.4g} ms): disjoint shares of one step "
                         f"cannot, so some part or the TOTAL is wrong")
    return notes


def _ns(ms: float | None) -> int | None:
    return None if ms is None else round(ms * 1e6)
