"""Sweeps: many configurations, each with measured numbers, scored the way seed 000's validation tables are.

A sweep row is a configuration and what was measured for it. Rows come from a config's ``runs:`` list (a run id
each, with the overrides that run used; measured from the store, or inline under ``measured:``) or from a
``--measured`` CSV of configuration columns and measured columns (../shared/validation/*.csv, seed 000's tables).

CSV columns, matched after lower-casing and turning every run of other characters into ``_`` ("# GPUs" -> gpus):
- configuration: :data:`_CONFIG_ALIASES` (parallel sizes, batch, model shapes, recompute), each overriding the
  base config. Derived: when ``hidden`` changes and ``ffn_hidden`` is not given, ffn_hidden keeps the base's
  ffn_hidden / hidden ratio; ``vpp`` > 1 turns a 1f1b schedule into interleaved (and vpp 1 the reverse); ``gpus``
  must equal tp x cp x dp x pp.
- measured: ``[measured_]<quantity>_<unit>``, quantity one of the breakdown dims (comp, mp_wait, ..., total; also
  iteration / iteration_time / step / step_time for total) with a time unit (ns, us, ms, s), or peak / peak_memory /
  peak_hbm with a size unit (bytes, kib, mib, gib, mb, gb). Empty cells are rows that did not measure it.
- ``estimated_<quantity>_<unit>``: another estimator's prediction, reported beside traceana's as the reference.
- a label: the first of name, config, run, label, model; other columns are listed as ignored.
Lines before the header that start with ``#`` and hold no comma are comments (a header may itself start with #).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import re
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import duckdb
import polars as pl

from traceana import store
from traceana.errors import TraceanaError, first_line
from traceana.estimator import config as cfgmod
from traceana.estimator.config import Config
from traceana.estimator.estimate import estimate
from traceana.estimator.memory import MIB
from traceana.layout import Layout
from traceana.model.compare import (
    DIMS,
    ESTIMATED,
    NOISE_MS,
    PEAK,
    check_matches,
    estimated_quantities,
    measured_quantities,
    ratio_columns,
)

_CONFIG_ALIASES: dict[tuple[str, ...], tuple[str, ...]] = {
    ("parallel", "tp"): ("tp", "tensor_parallelism", "tensor_parallel"),
    ("parallel", "pp"): ("pp", "pipeline_parallelism", "pipeline_parallel"),
    ("parallel", "dp"): ("dp", "data_parallelism", "data_parallel"),
    ("parallel", "ep"): ("ep", "expert_parallelism", "expert_parallel"),
    ("parallel", "cp"): ("cp", "context_parallelism", "context_parallel"),
    ("parallel", "etp"): ("etp",),
    ("parallel", "vpp"): ("vpp", "virtual_stages", "virtual_pipeline_stages"),
    ("parallel", "micro_batch"): ("micro_batch", "micro_batch_size"),
    ("parallel", "global_batch"): ("global_batch", "global_batch_size"),
    ("parallel", "sequence_parallel"): ("sequence_parallel",),
    ("parallel", "zero"): ("zero",),
    ("parallel", "expert_zero3_sharding"): ("expert_zero3_sharding",),
    ("model", "layers"): ("layers", "num_layers"),
    ("model", "hidden"): ("hidden", "hidden_size"),
    ("model", "ffn_hidden"): ("ffn_hidden", "ffn_hidden_size"),
    ("model", "heads"): ("heads", "attention_heads", "num_attention_heads"),
    ("model", "kv_heads"): ("kv_heads",),
    ("model", "seq_len"): ("seq_len", "sequence_length"),
    ("model", "vocab"): ("vocab", "vocab_size"),
    ("model", "experts"): ("experts", "num_experts"),
    ("model", "moe_topk"): ("moe_topk", "topk"),
    ("schedule", "kind"): ("schedule",),
    ("schedule", "recompute", "kind"): ("recompute",),
    ("hardware", "devices"): ("gpus", "devices"),
}
CONFIG_COLUMNS = {alias: path for path, aliases in _CONFIG_ALIASES.items() for alias in aliases}
LABEL_COLUMNS = ("name", "config", "run", "label", "model")
TIME_UNITS = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}  # -> ms
SIZE_UNITS = {"bytes": 1 / MIB, "kib": 1 / 1024, "mib": 1.0, "gib": 1024.0, "mb": 1e6 / MIB, "gb": 1e9 / MIB}  # -> MiB
_TOTAL_NAMES = ("total", "iteration", "iteration_time", "step", "step_time")
_QUANTITY = re.compile(
    rf"^(?P<side>measured_|estimated_)?(?:(?P<time>{'|'.join(d.lower() for d in ESTIMATED)}|"
    rf"{'|'.join(_TOTAL_NAMES)})_(?P<tunit>{'|'.join(TIME_UNITS)})|"
    rf"(?P<size>peak|peak_memory|peak_hbm)_(?P<sunit>{'|'.join(SIZE_UNITS)}))$")


@dataclass(frozen=True)
class Row:
    """One configuration of a sweep and its numbers: quantity ('COMP_ms' ... 'TOTAL_ms', 'peak_memory_MiB').
    A row of a predictions file (`compare --predicted`) has no config: ``predicted`` holds its estimate, and
    ``layout`` the run's parallel sizes."""

    label: str
    config: Config | None
    measured: dict[str, float]
    reference: dict[str, float] = field(default_factory=dict)  # another estimator's predictions, same keys
    run_id: str | None = None  # the traced run it was measured on
    predicted: dict[str, float] | None = None  # the estimate, when another estimator's file gives it
    layout: Layout | None = None  # the run's layout, when there is no config

    @property
    def sizes(self) -> Layout | None:
        """The parallel sizes of the row (tp, pp, dp, ep, cp)."""
        return self.config.parallel.layout if self.config is not None else self.layout


def normalize(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", name.lower()).strip("_")


def quantity(name: str) -> tuple[str, float, bool] | None:
    """(quantity key, factor to its unit, is a reference estimate) for a measured/estimated column name, else None."""
    match = _QUANTITY.match(normalize(name))
    if not match:
        return None
    reference = match["side"] == "estimated_"
    if match["size"]:
        return PEAK, SIZE_UNITS[match["sunit"]], reference
    dim = "total" if match["time"] in _TOTAL_NAMES else match["time"]
    return f"{dim.upper()}_ms", TIME_UNITS[match["tunit"]], reference


def measured_values(values: dict[str, float], source: str) -> dict[str, float]:
    """A ``measured:`` mapping (keys as CSV column names, numbers checked by config.load_runs) in sweep units."""
    result = {}
    for name, value in values.items():
        found = quantity(str(name))
        if found is None or found[2]:
            raise TraceanaError(f"{source}: measured.{name}: not a measured quantity (e.g. TOTAL_ms, COMP_ms, "
                                f"iteration_time_s, peak_memory_mib)")
        result[found[0]] = value * found[1]
    return result


# ---------------------------------------------------------------------------------------------------------------
# Rows from a config's runs: list


def load_runs(path: Path) -> list[cfgmod.Run]:
    """A config's ``runs:`` list (:func:`config.load_runs`) with its measured values in the sweep's units."""
    return [cfgmod.Run(run.name, run.config, measured_values(run.measured, f"{path} runs[{run.name}]"))
            for run in cfgmod.load_runs(path)]


def has_runs(path: Path) -> bool:
    return bool(cfgmod.read_yaml(path).get("runs"))


def traced_rows(con: duckdb.DuckDBPyConnection | None, runs: list[cfgmod.Run]) -> list[Row]:
    """Sweep rows for ``runs:`` entries: inline ``measured:`` values, else the stored run of that name (which must
    exist and match its config; ``con`` may be None when every entry is measured inline)."""
    rows = []
    for run in runs:
        if run.measured or con is None:
            rows.append(Row(run.name, run.config, run.measured))
            continue
        run_id = store.resolve_run(con, run.name)
        check_matches(con, run_id, run.config)
        rows.append(Row(run.name, run.config, measured_quantities(con, run_id), run_id=run_id))
    return rows


# ---------------------------------------------------------------------------------------------------------------
# Rows from a --measured CSV


def read_csv(path: Path, base: Config) -> tuple[list[Row], list[str]]:
    """Sweep rows from a measured CSV over ``base``; also notes (ignored columns)."""
    frame = read_frame(path)
    labels = [c for c in frame.columns if normalize(c) in LABEL_COLUMNS]
    configs = {c: CONFIG_COLUMNS[normalize(c)] for c in frame.columns if normalize(c) in CONFIG_COLUMNS}
    values = {c: quantity(c) for c in frame.columns if quantity(c) is not None}
    measured_columns = [c for c, q in values.items() if not q[2]]
    for column in values:
        if not frame[column].dtype.is_numeric() and frame[column].null_count() < frame.height:
            raise TraceanaError(f"{path}: column {column!r} must hold numbers (it holds {frame[column].dtype})")
    if not measured_columns:
        raise TraceanaError(f"{path}: no measured column (name one like TOTAL_ms, iteration_time_ms, "
                            f"measured_iteration_s, COMP_ms or measured_peak_mib); columns: {', '.join(frame.columns)}")
    ignored = [c for c in frame.columns if c not in configs and c not in values and c not in labels[:1]]
    notes = [f"{path.name}: ignored columns: {', '.join(ignored)}"] if ignored else []
    rows = []
    for i, record in enumerate(frame.iter_rows(named=True), start=1):
        named = f" {record[labels[0]]}" if labels else ""
        where, label = f"{path}: row {i}", f"{i}{named}"
        overrides = {}
        for column, target in configs.items():
            if record[column] is None:
                raise TraceanaError(f"{where}: column {column!r} is empty")
            overrides[target] = record[column]
        cfg = with_overrides(base, overrides, f"{where} ({named.strip()})" if named else where)
        measured = {values[c][0]: record[c] * values[c][1] for c in measured_columns if record[c] is not None}
        reference = {q[0]: record[c] * q[1] for c, q in values.items() if q[2] and record[c] is not None}
        rows.append(Row(label, cfg, measured, reference))
    return rows, notes


def read_frame(path: Path) -> pl.DataFrame:
    """A CSV file as a frame; leading `#` lines without a comma are comments."""
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except OSError as exc:
        raise TraceanaError(f"{path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise TraceanaError(f"{path}: not a UTF-8 text file") from None
    while lines and lines[0].startswith("#") and "," not in lines[0]:
        lines.pop(0)
    try:
        frame = pl.read_csv(io.StringIO("\n".join(lines)), infer_schema_length=None)
    except (pl.exceptions.PolarsError, ValueError) as exc:
        raise TraceanaError(f"{path}: not a readable CSV ({first_line(exc)})") from None
    if frame.is_empty():
        raise TraceanaError(f"{path}: no data rows")
    return frame


def with_overrides(base: Config, overrides: dict[tuple[str, ...], Any], source: str) -> Config:
    """``base`` with the values at the given field paths replaced (typed by the config's own fields), the derived
    fields adjusted (see the module docstring) and validated; errors name ``source``."""
    cfg = replace_path(base, ("source",), source)
    for path, value in overrides.items():
        cfg = replace_path(cfg, path, _typed(cfg, path, value, source))
    changed = {path[-1] for path in overrides}
    m, s = cfg.model, cfg.schedule
    if "hidden" in changed and "ffn_hidden" not in changed:
        cfg = replace_path(cfg, ("model", "ffn_hidden"), round(base.model.ffn_hidden * m.hidden / base.model.hidden))
    if "vpp" in changed:
        if cfg.parallel.vpp > 1 and s.kind == "1f1b":
            cfg = replace_path(cfg, ("schedule", "kind"), "interleaved")
        elif cfg.parallel.vpp == 1 and s.kind == "interleaved":
            cfg = replace_path(cfg, ("schedule", "kind"), "1f1b")
    cfgmod.validate(cfg)
    return cfg


def replace_path(obj: Any, path: tuple[str, ...], value: Any) -> Any:
    """A copy of nested frozen dataclass ``obj`` with the field at ``path`` set to ``value``."""
    head, *rest = path
    return dataclasses.replace(obj, **{head: replace_path(getattr(obj, head), tuple(rest), value) if rest else value})


def get_path(obj: Any, path: tuple[str, ...]) -> Any:
    for name in path:
        obj = getattr(obj, name)
    return obj


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)  # slow (evaluates string annotations): once per config class


def _typed(cfg: Config, path: tuple[str, ...], value: Any, source: str) -> Any:
    """``value`` as the type the config field at ``path`` declares."""
    hint = _hints(type(get_path(cfg, path[:-1])))[path[-1]]
    kinds = [t for t in typing.get_args(hint) if t is not type(None)] or [hint]
    kind, where = kinds[0], f"{source}: {'.'.join(path)}"
    if kind is bool:
        text = str(value).lower()
        if text not in ("true", "false", "1", "0"):
            raise TraceanaError(f"{where}={value!r}: expected true or false")
        return text in ("true", "1")
    if kind is int:
        if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
            raise TraceanaError(f"{where}={value!r}: expected an integer")
        return int(value)
    if kind is float:
        return float(value)
    return str(value).lower()


# ---------------------------------------------------------------------------------------------------------------
# Scoring


def rows_frame(rows: list[Row], configs: list[Config] | None = None) -> pl.DataFrame:
    """One line per (row, quantity) it measured: measured, traceana's estimate (of ``configs`` when given, else of
    each row's config), ratio and error; the reference estimate and its error when some row has one. A quantity
    measured as 0 and estimated as 0 (or not at all) is left out."""
    records = []
    for i, row in enumerate(rows):
        est = row.predicted if row.predicted is not None else estimated_quantities(
            estimate(configs[i] if configs else row.config))  # type: ignore[arg-type]  (a config when not predicted)
        for key, value in row.measured.items():
            if value == 0 and abs(est.get(key) or 0.0) <= NOISE_MS:
                continue  # nothing measured, nothing predicted: no error to speak of
            records.append({"row": row.label, "quantity": key, "measured": value, "estimated": est.get(key),
                            "reference": row.reference.get(key)})
    frame = pl.DataFrame(records, schema={"row": pl.String, "quantity": pl.String, "measured": pl.Float64,
                                          "estimated": pl.Float64, "reference": pl.Float64}, orient="row")
    frame = frame.with_columns(**ratio_columns("measured", "estimated"))
    if frame["reference"].is_null().all():
        return frame.drop("reference")
    reference = ratio_columns("measured", "reference")
    return frame.with_columns(reference_over_measured=reference["est_over_measured"],
                              reference_error_pct=reference["error_pct"])


def statistics(frame: pl.DataFrame, estimator: str = "traceana") -> pl.DataFrame:
    """Per quantity and estimator (``estimator``'s estimated column, and reference where given): rows, Pearson r,
    Spearman ρ (null under 3 rows or for a constant side), MAPE % and the worst row by |error %|."""
    parts = []
    for name, column, error in ((estimator, "estimated", "error_pct"),
                                     ("reference", "reference", "reference_error_pct")):
        if column not in frame.columns:
            continue
        scored = frame.filter(pl.col(column).is_not_null() & pl.col(error).is_not_null())
        parts.append(scored.group_by("quantity", maintain_order=True).agg(
            estimator=pl.lit(name),
            rows=pl.len(),
            pearson_r=pl.when(pl.len() >= 3).then(pl.corr("measured", column)),
            spearman_rho=pl.when(pl.len() >= 3).then(pl.corr("measured", column, method="spearman")),
            mape_pct=pl.col(error).abs().mean(),
            worst_row=pl.col("row").sort_by(pl.col(error).abs()).last(),
            worst_error_pct=pl.col(error).sort_by(pl.col(error).abs()).last(),
        ))
    order = {q: i for i, q in enumerate([*(f"{d}_ms" for d in DIMS), PEAK])}
    return pl.concat(parts).with_columns(pl.col("pearson_r", "spearman_rho").fill_nan(None)).sort(
        pl.col("quantity").replace_strict(order, default=len(order)), "estimator", descending=[False, True])

