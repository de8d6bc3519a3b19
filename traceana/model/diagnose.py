"""Seed 000's diagnosis of an estimator, over one run or a sweep: the three kinds of error its P1-P4 were.

- **size bias** (P1: peak memory under-estimated about 25% at TP 1, over-estimated 5% at TP 2): over a sweep of at
  least 3 rows, a quantity's error % correlated with one parallel size (tp, pp, dp, ep, cp, as log2 of the size,
  so each doubling counts alike) of the rows' layouts. Said when |r| >= :data:`BIAS_R` and the mean error at the
  smallest and the largest size differ by at least :data:`BIAS_SPREAD_PCT` points (a constant bias that merely
  wobbles is not one that depends on the size). Sizes that vary together in the sweep (seed 000's tp and dp: the
  device count is fixed) cannot be told apart; the strongest is named and the others listed beside it.
- **rank-order inversion** (P3, P4: PP_WAIT r = -0.197, TOTAL r = -0.534): a negative Pearson r or Spearman ρ over
  at least 3 rows, i.e. runs the estimator ranks one way and the measurement the other.
- **units that cannot be right** (P4: EP_WAIT a byte count, ~1e7 times the measured time): the median of
  estimated / measured over a quantity's rows is 100x or more away from 1. For a time, 100x-10^4x says "looks like
  µs given as ms", 1/100-1/10^4 "looks like seconds" (the window is wide: an estimator 3x off in seconds is
  still 1/300); further off, not a time at all (a byte or element count).
"""

from __future__ import annotations

import math

import polars as pl

from traceana.model.sweep import Row

BIAS_R = 0.8
BIAS_SPREAD_PCT = 10.0
UNIT_DECADES = 2.0  # 100x: further off than any estimator that is merely wrong
SIZES = ("tp", "pp", "dp", "ep", "cp")
MIN_ROWS = 3


def findings(frame: pl.DataFrame, stats: pl.DataFrame | None = None, rows: list[Row] | None = None,
             estimator: str = "traceana") -> pl.DataFrame:
    """Findings over ``frame`` (columns row, quantity, measured, estimated, est_over_measured, error_pct, as
    sweep.rows_frame makes them; its reference estimate too where it has one), with ``stats`` (sweep.statistics)
    and the ``rows`` for their layouts where it is a sweep: one line each, columns estimator, kind, quantity,
    finding."""
    found = []
    sides = [(estimator, "estimated", "est_over_measured", "error_pct")]
    if "reference" in frame.columns:
        sides.append(("reference", "reference", "reference_over_measured", "reference_error_pct"))
    for name, *columns in sides:
        side = frame.select("row", "quantity", *(pl.col(c).alias(g) for c, g in zip(
            columns, ("estimated", "est_over_measured", "error_pct"), strict=True)))
        checks = [*_units(side)]
        if stats is not None:
            checks += _inversions(stats.filter(pl.col("estimator") == name))
        if rows is not None:
            checks += _size_bias(side, rows)
        found += [(name, *c) for c in checks]
    return pl.DataFrame(found, schema={"estimator": pl.String, "kind": pl.String, "quantity": pl.String,
                                       "finding": pl.String}, orient="row")


def _units(frame: pl.DataFrame) -> list[tuple[str, str, str]]:
    ratios = frame.filter(pl.col("est_over_measured") > 0).group_by("quantity", maintain_order=True).agg(
        median=pl.col("est_over_measured").median(), rows=pl.len())
    found = []
    for quantity, median, count in ratios.iter_rows():
        decades = math.log10(median)
        if abs(decades) < UNIT_DECADES:
            continue
        time = quantity.endswith("_ms")
        why = ("looks like µs given as ms" if time and 0 < decades < 4 else "looks like seconds given as ms"
               if time and -4 < decades < 0 else f"off by 10^{decades:.0f}: not this unit at all (a byte or element "
               f"count?)")
        found.append(("units", quantity, f"estimated / measured is {median:.3g} (median of {count} rows): {why}"))
    return found


def _inversions(stats: pl.DataFrame) -> list[tuple[str, str, str]]:
    found = []
    for s in stats.filter((pl.col("rows") >= MIN_ROWS) & ((pl.col("pearson_r") < 0) | (pl.col("spearman_rho") < 0))
                          ).iter_rows(named=True):
        r, rho = (f"{v:.3f}" if v is not None else "undefined" for v in (s["pearson_r"], s["spearman_rho"]))
        found.append(("rank order", s["quantity"], f"inverted over {s['rows']} rows: Pearson r {r}, Spearman ρ {rho}"))
    return found


def _size_bias(frame: pl.DataFrame, rows: list[Row]) -> list[tuple[str, str, str]]:
    sizes = pl.DataFrame([{"row": r.label, **{s: getattr(r.sizes, s) for s in SIZES}} for r in rows
                          if r.sizes is not None], schema={"row": pl.String, **dict.fromkeys(SIZES, pl.Int64)})
    scored = frame.filter(pl.col("error_pct").is_not_null()).join(sizes, on="row")
    found = []
    for (quantity,), part in scored.group_by("quantity", maintain_order=True):
        if part.height < MIN_ROWS:
            continue
        strong = []
        for size in SIZES:
            if part[size].n_unique() < 2:
                continue
            r = part.select(pl.corr(pl.col(size).log(2), "error_pct")).item()
            means = part.group_by(size).agg(pl.col("error_pct").mean()).sort(size)
            spread = means["error_pct"][-1] - means["error_pct"][0]
            if r is not None and not math.isnan(r) and abs(r) >= BIAS_R and abs(spread) >= BIAS_SPREAD_PCT:
                strong.append((abs(r), size, r, means))
        if not strong:
            continue
        _, size, r, means = max(strong, key=lambda s: s[0])
        by_value = ", ".join(f"{size}={v}: {e:+.1f}%" for v, e in means.iter_rows())
        also = [s[1] for s in strong if s[1] != size]
        beside = f" (so does {', '.join(also)}, which varies with it in this sweep)" if also else ""
        found.append(("size bias", quantity, f"error depends on {size}: r = {r:.2f} over {part.height} rows, mean "
                                             f"error {by_value}{beside}"))
    return found
