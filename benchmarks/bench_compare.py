"""Time `compare`'s sweep and fit on the largest real table: vTrain's 1,440 measured single-node runs.

Prints the CSV read (rows/s: parse, override and validate every row), the sweep (estimates/s), and --fit on every
other row (trial steps, estimates made, seconds) with its held-out MAPE.

    .venv/bin/python benchmarks/bench_compare.py
"""

from __future__ import annotations

import time
from pathlib import Path

from traceana.estimator import config
from traceana.model import compare_fit, sweep

ROOT = Path(__file__).resolve().parents[1]
CSV = ROOT.parent / "shared" / "validation" / "vtrain_ground_truth_single_node.csv"
BASE = ROOT / "examples" / "vtrain_single_node.yaml"


def main() -> None:
    started = time.perf_counter()
    rows, _ = sweep.read_csv(CSV, config.load(BASE))
    read_s = time.perf_counter() - started
    print(f"read {len(rows)} rows in {read_s:.2f} s ({len(rows) / read_s:,.0f} rows/s)")

    started = time.perf_counter()
    frame = sweep.rows_frame(rows)
    sweep_s = time.perf_counter() - started
    stats = sweep.statistics(frame).row(0, named=True)
    print(f"sweep: {len(rows)} estimates in {sweep_s:.2f} s ({len(rows) / sweep_s:,.0f} estimates/s); "
          f"Pearson r {stats['pearson_r']:.3f}, MAPE {stats['mape_pct']:.1f}%")

    calls = 0
    count = compare_fit.residuals

    def counted(fit_rows: list[sweep.Row], configs: list[config.Config]):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        return count(fit_rows, configs)

    compare_fit.residuals = counted  # type: ignore[assignment]
    started = time.perf_counter()
    fitted = compare_fit.fit(rows)
    fit_s = time.perf_counter() - started
    held = fitted.held_out.row(0, named=True)  # type: ignore[union-attr]
    estimates = calls * len(fitted.fit_rows) + 2 * len(rows)  # residual passes, then before and after on every row
    print(f"fit: {fitted.trials} trial steps, {calls} passes over {len(fitted.fit_rows)} rows, ~{estimates:,} "
          f"estimates in {fit_s:.1f} s ({estimates / fit_s:,.0f} estimates/s); held-out MAPE "
          f"{held['mape_pct_before']:.1f}% -> {held['mape_pct_after']:.1f}% on {held['rows']} rows")


if __name__ == "__main__":
    main()
