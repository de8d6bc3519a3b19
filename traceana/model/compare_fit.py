"""Fit the calibration block to measured rows by least squares, and say how well it does on rows it never saw.

The rows are split before anything is fitted: every other row (1st, 3rd, ...) is fitted, the others are held out;
with a single row there is nothing to hold out and only in-sample residuals are reported, never as accuracy.

The model is the estimator itself, so the fit is Levenberg–Marquardt with a finite-difference Jacobian, bounded to
each knob's valid range. A residual is the estimate's error on one measured quantity of one row, relative to the
row's measured TOTAL for the breakdown dims (a dim measured as 0 still counts, in proportion to the step) and to
the measured value itself for TOTAL and peak memory. Knobs no measured quantity depends on, and knobs that move the
residuals exactly as an earlier knob does (safety_buffer_mb and tp_shardable_overhead_mb both scale as 1/tp), are
left as they were and reported as such.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import polars as pl
import yaml

from traceana.estimator.config import Config
from traceana.estimator.estimate import estimate
from traceana.model.compare import PEAK, estimated_quantities
from traceana.model.sweep import Row, get_path, replace_path, rows_frame, statistics


@dataclass(frozen=True)
class Knob:
    """A fitted config field, its valid range, the smallest step scale (so a knob at 0 can still move), for a rate,
    how far a fit may move it (see MAX_FACTOR), and for a link figure, how far from the configured value (the
    datasheet's or a probe's) a fitted one stays physical: beyond it the value is kept (it is what least squares
    found) but flagged, since the model is then compensating for something it lacks."""

    path: tuple[str, ...]
    lo: float
    hi: float
    floor: float
    rate: bool = False
    physical_factor: float | None = None

    @property
    def name(self) -> str:
        return ".".join(self.path)


# A link's latency is the fixed cost of one collective on it, a few µs on NVLink and InfiniBand, ~165 µs for gloo
# over loopback (sample_traces/hardware_cpu.yaml); the configured value is that figure for the job's hardware, and a
# fit that needs 10x more (vTrain's A100 rows: 629 µs for a 10 µs NVLink) is charging the link for other time.
# Bandwidths cannot leave that factor at all (MAX_FACTOR).
KNOBS = (
    Knob(("calibration", "matmul_efficiency"), 1e-3, 1.0, 0.05),
    Knob(("hardware", "bandwidth_gb_per_s", "intra"), 1e-3, 1e5, 1.0, rate=True),
    Knob(("hardware", "bandwidth_gb_per_s", "inter"), 1e-3, 1e5, 1.0, rate=True),
    Knob(("hardware", "latency_us", "intra"), 0.0, 1e6, 1.0, physical_factor=10.0),
    Knob(("hardware", "latency_us", "inter"), 0.0, 1e6, 1.0, physical_factor=10.0),
    *(Knob(("calibration", "overlap", dim), 0.0, 1.0, 0.1) for dim in ("tp", "cp", "ep", "dp")),
    Knob(("calibration", "step_overhead_ms"), 0.0, 1e6, 1.0),
    Knob(("calibration", "host_us_per_layer"), 0.0, 1e6, 10.0),
    Knob(("calibration", "safety_buffer_mb"), 0.0, 1e7, 256.0),
    Knob(("calibration", "tp_shardable_overhead_mb"), 0.0, 1e7, 256.0),
)
FD_STEP = 1e-3       # finite-difference step, in units of a knob's scale
LADDER = (10.0, 100.0, 1000.0, 10000.0)  # probes for knobs flat where they start, in units of their scale
MAX_TRIALS = 60      # trial steps (one estimate per row each)
TOLERANCE = 1e-2     # stop when an accepted step lowers the squared residuals by less than 1%: further
                     # crawling along the model's kinks costs many estimates for little (vTrain: held-out MAPE
                     # 20.5% here, 20.3% at 0.1%, for twice the estimates)
# A fit moves a rate (bandwidth) at most this factor away from its configured value: beyond that the model is
# compensating for something it lacks (a 10^5 GB/s link), which is not a calibration.
MAX_FACTOR = 10.0


@dataclass(frozen=True)
class Fit:
    """What was fitted on which rows, and how it scores in-sample (fit rows) and held out (the other rows)."""

    fit_rows: list[str]
    held_out_rows: list[str]
    knobs: pl.DataFrame           # knob, before (the first fit row's value), fitted, status
    values: dict[tuple[str, ...], float]  # the fitted knobs
    in_sample: pl.DataFrame       # quantity, rows, mape_pct_before, mape_pct_after (residuals, not accuracy)
    held_out: pl.DataFrame | None  # quantity, rows, MAPE and Pearson r before and after (None: no held-out rows)
    cost_before: float
    cost_after: float
    trials: int                   # Levenberg–Marquardt trial steps


def _current(cfg: Config, path: tuple[str, ...]) -> float:
    """A knob's value in force: an unset overlap fraction is the default it stands for (Overlap.of)."""
    value = get_path(cfg, path)
    return cfg.calibration.overlap.of(path[-1]) if value is None and path[:2] == ("calibration", "overlap") else value


def split(rows: list[Row]) -> tuple[list[Row], list[Row]]:
    """(fit, held out): the 1st, 3rd, 5th ... rows and the 2nd, 4th ...; a single row is fitted and nothing held."""
    return (rows, []) if len(rows) < 2 else (rows[0::2], rows[1::2])


def residuals(rows: list[Row], configs: list[Config]) -> np.ndarray:
    """Every (row, quantity) error, relative as the module docstring says."""
    out = []
    for row, cfg in zip(rows, configs, strict=True):
        est = estimated_quantities(estimate(cfg))
        total = row.measured.get("TOTAL_ms")
        for key, measured in sorted(row.measured.items()):
            scale = measured if key in (PEAK, "TOTAL_ms") or not total else total
            if key in est and scale:
                out.append((est[key] - measured) / scale)
    return np.asarray(out)


def fit(rows: list[Row], progress: Callable[[str], None] = lambda _: None) -> Fit:
    """Fit the knobs on the fit half of ``rows`` and evaluate them on the held-out half; ``progress`` is called
    once per pass of estimates over the fit rows."""
    train, held = split(rows)
    start = np.array([float(_current(train[0].config, k.path)) for k in KNOBS])
    scale = np.maximum(np.abs(start), [k.floor for k in KNOBS])
    rate = np.array([k.rate for k in KNOBS])
    lo = (np.where(rate, np.maximum([k.lo for k in KNOBS], start / MAX_FACTOR), [k.lo for k in KNOBS]) - start) / scale
    hi = (np.where(rate, np.minimum([k.hi for k in KNOBS], start * MAX_FACTOR), [k.hi for k in KNOBS]) - start) / scale

    passes = 0

    def configs(z: np.ndarray, active: list[int]) -> list[Config]:
        nonlocal passes
        passes += 1
        progress(f"{passes} passes over {len(train)} rows")
        x = start + scale * z
        result = []
        for row in train:
            cfg = row.config
            for i in active:
                cfg = replace_path(cfg, KNOBS[i].path, float(x[i]))
            result.append(cfg)
        return result

    def jacobian(z: np.ndarray, r: np.ndarray, active: list[int]) -> np.ndarray:
        columns = []
        for i in active:
            dz = FD_STEP if z[i] + FD_STEP <= hi[i] else -FD_STEP
            moved = z.copy()
            moved[i] += dz
            columns.append((residuals(train, configs(moved, active)) - r) / dz)
        return np.column_stack(columns)

    everything = list(range(len(KNOBS)))
    z = np.zeros(len(KNOBS))
    r0 = residuals(train, configs(z, everything))
    full = jacobian(z, r0, everything)
    z, r = _unflatten(z, r0, full, hi, lambda q: residuals(train, configs(q, everything)))
    if r is not r0:
        full = jacobian(z, r, everything)
    active, status = _identifiable(full)
    z, r, trials = _levenberg_marquardt(z, r, full[:, active], active, lo, hi,
                                            lambda q: residuals(train, configs(q, active)),
                                            lambda q, rq: jacobian(q, rq, active))
    fitted = start + scale * z
    values = {KNOBS[i].path: float(fitted[i]) for i in active}
    bound = np.isclose(z, lo, rtol=0, atol=1e-9) | np.isclose(z, hi, rtol=0, atol=1e-9)
    status = [f"{s} (at the bound of its range)" if i in active and bound[i] else s for i, s in enumerate(status)]
    for i, knob in enumerate(KNOBS):
        factor = knob.physical_factor
        if i in active and factor and start[i] > 0 and not start[i] / factor <= fitted[i] <= start[i] * factor:
            status[i] += (f"; NOT PHYSICAL: {fitted[i] / start[i]:.3g}x the configured value (beyond {factor:g}x the "
                          "model is compensating for something it lacks)")
    knobs = pl.DataFrame({"knob": [k.name for k in KNOBS], "before": start.tolist(),
                          "fitted": [float(fitted[i]) if i in active else None for i in everything],
                          "status": status})
    return Fit([r.label for r in train], [r.label for r in held], knobs, values,
               _before_after(train, values, ("mape_pct",)),
               _before_after(held, values, ("mape_pct", "pearson_r")) if held else None,
               float(r0 @ r0), float(r @ r), trials)


def apply(values: dict[tuple[str, ...], float], cfg: Config) -> Config:
    """``cfg`` with the fitted knob values."""
    for path, value in values.items():
        cfg = replace_path(cfg, path, value)
    return cfg


def _unflatten(z: np.ndarray, r: np.ndarray, jac: np.ndarray, hi: np.ndarray,
               residual: Callable[[np.ndarray], np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Start each knob that is flat where it starts from the best point of a coarse ladder further out.

    Some knobs enter through a max(): host time per layer only matters once it exceeds the device time, so at 0 its
    derivative is zero and least squares would never move it. Probing 10, 100, 1000 and 10000 steps of its scale
    (one estimate per row each) finds where it bites; knobs nothing depends on stay where they are."""
    z = z.copy()
    for i in np.flatnonzero(np.linalg.norm(jac, axis=0) < 1e-9):
        best = float(r @ r)
        for step in LADDER:
            if z[i] + step > hi[i]:
                break
            trial = z.copy()
            trial[i] += step
            moved = residual(trial)
            if float(moved @ moved) < best:
                best, z, r = float(moved @ moved), trial, moved
    return z, r


def _identifiable(jac: np.ndarray) -> tuple[list[int], list[str]]:
    """Knobs worth fitting: a column that is zero (nothing measured depends on it) or lies in the span of the
    columns kept before it (indistinguishable on these rows) is left out."""
    active: list[int] = []
    status = []
    basis: list[np.ndarray] = []
    for i in range(jac.shape[1]):
        column = jac[:, i]
        norm = float(np.linalg.norm(column))
        if norm < 1e-9:
            status.append("kept: no measured quantity depends on it")
            continue
        rest = column.copy()
        for b in basis:
            rest -= (rest @ b) * b
        if np.linalg.norm(rest) < 1e-6 * norm:
            twin = max(active, key=lambda j: abs(jac[:, j] @ column) / np.linalg.norm(jac[:, j]))
            status.append(f"kept: moves the estimate exactly as {KNOBS[twin].name} does on these rows")
            continue
        basis.append(rest / np.linalg.norm(rest))
        active.append(i)
        status.append("fitted")
    return active, status


def _levenberg_marquardt(z: np.ndarray, r: np.ndarray, jac: np.ndarray, active: list[int], lo: np.ndarray,
                         hi: np.ndarray, evaluate: Any, jacobian: Any) -> tuple[np.ndarray, np.ndarray, int]:
    """Minimize |r|² over z[active] within [lo, hi] (steps clipped to the box), with Marquardt-scaled damping.

    Every trial step costs one estimate per row, a finite-difference Jacobian one per row and knob; so after an
    accepted step the Jacobian is updated by Broyden's rank-one rule, and recomputed only when a step fails on an
    updated one (Madsen, Nielsen & Tingleff 2004, "Methods for non-linear least squares problems", §3.4).
    """
    damping, fresh, trials = 1e-3, True, 0
    while active and trials < MAX_TRIALS:
        trials += 1
        normal = jac.T @ jac
        step = np.linalg.solve(normal + damping * np.diag(np.diag(normal) + 1e-12), -(jac.T @ r))
        trial = z.copy()
        trial[active] = np.clip(z[active] + step, lo[active], hi[active])
        r_trial = evaluate(trial)
        if r_trial @ r_trial < r @ r:
            moved = trial[active] - z[active]
            jac = jac + np.outer(r_trial - r - jac @ moved, moved) / (moved @ moved)
            converged = r @ r - r_trial @ r_trial <= TOLERANCE * (r @ r)
            z, r, damping, fresh = trial, r_trial, damping / 3, False
            if converged:
                break
        elif not fresh:
            jac, fresh = jacobian(z, r), True
        elif damping < 1e10:
            damping *= 4
        else:
            break
    return z, r, trials


def _before_after(rows: list[Row], values: dict[tuple[str, ...], float], stats: tuple[str, ...]) -> pl.DataFrame:
    """Per quantity: ``stats`` of ``rows`` with their own configs (``<stat>_before``) and fitted (``<stat>_after``)."""
    def scored(configs: list[Config] | None, suffix: str) -> pl.DataFrame:
        frame = statistics(rows_frame(rows, configs)).filter(pl.col("estimator") == "traceana")
        return frame.select("quantity", "rows", *[pl.col(s).name.suffix(suffix) for s in stats])

    before = scored(None, "_before")
    after = scored([apply(values, r.config) for r in rows], "_after").drop("rows")
    return before.join(after, on="quantity", how="left")


def calibration_yaml(result: Fit, base: Config, header: str) -> str:
    """The fitted knobs as config sections (a partly fitted link or overlap block is written whole, its other
    fields from ``base``), under a comment ``header``."""
    sections: dict[str, Any] = {}
    for path in result.values:
        parent = path[:-1]
        block = get_path(apply(result.values, base), parent)
        target = sections
        for name in parent[:-1]:
            target = target.setdefault(name, {})
        if len(parent) == 1:
            target.setdefault(parent[0], {})[path[-1]] = result.values[path]
        else:
            target[parent[-1]] = {k: float(v) for k, v in vars(block).items() if v is not None}
    comment = "".join(f"# {line}\n" for line in header.splitlines())
    return comment + yaml.safe_dump(sections, sort_keys=False)
