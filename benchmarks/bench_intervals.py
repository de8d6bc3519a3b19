"""Intervals against real one-knob pairs (issue 33): calibrate on the pairs that set widths, measure coverage on the
pairs that check them. Reads sample_traces/pairs/manifest.csv (group, kind, family, A, B, layout, layout_B, change,
config_A, config_B, split, notes; paths from the repository root) and recordings.csv (config, repeat, path, ...).
Per group and recording of A: the prediction of B (`whatif A --change ...` or `predict A --config config_A --to
config_B`) with its σ (the interval's sources), and B's truth, the median over B's recordings of its typical step
(whatif: the median rank's TOTAL, median over the steps after the first; predict: the mean TOTAL over ranks and
those steps, as compare reports). Score s = log(truth / prediction), r = s / σ, each row weighted 1 / rows of its
group; rows are calibrated under the kind of change traceana names at run time (whatif's key, predict's configs'
difference), so a lookup finds them.

    .venv/bin/python benchmarks/bench_intervals.py [--pairs DIR] [--write] [--rows CSV]

--write computes the conformal quantiles per kind, family and pooled from the calibrate split only (numpy,
traceana.model.intervals.conformal) and writes traceana/model/intervals.json with its provenance (commit, n per
kind). Then, per family and kind on the CHECK split: groups, stated level, coverage with its Clopper-Pearson 95%
band, median half-width (% of step), and the run-to-run floor (the `null` kind's median |s|) beside it.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import sys
import tempfile
from collections import defaultdict
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from traceana import store  # noqa: E402
from traceana.estimator.config import load  # noqa: E402
from traceana.model import intervals  # noqa: E402
from traceana.model.predict import kind_of  # noqa: E402


class Refused(Exception):
    """A command's one-line error (exit 2): counted per kind, never scored."""


def invoke(*args: object) -> str:
    """`traceana ARGS` in this process (no interpreter start per call: ~700 calls): its stdout; Refused on an error."""
    from traceana.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main([str(a) for a in args])
        except SystemExit as exc:
            if exc.code:
                raise Refused(err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else "") from None
    return out.getvalue()


def cli(*args: object) -> dict:
    return json.loads(invoke(*args))


def truth_ms(db: Path, run: str, family: str) -> float:
    """B's typical step in one recording (the module doc)."""
    with store.connect(db, read_only=True) as con:
        sql = ("SELECT median(t) FROM (SELECT step, median(TOTAL_ns) / 1e6 AS t FROM rank_step_breakdown "
               "WHERE run_id = $run AND step > (SELECT min(step) FROM rank_step_breakdown WHERE run_id = $run) "
               "GROUP BY step)") if family == "whatif" else (
               "SELECT avg(TOTAL_ns) / 1e6 FROM rank_step_breakdown WHERE run_id = $run "
               "AND step > (SELECT min(step) FROM rank_step_breakdown WHERE run_id = $run)")
        return float(con.execute(sql, {"run": run}).fetchall()[0][0])


def score(pairs: Path, work: Path) -> list[dict]:
    """One row per (group, recording of A): kind, family, split, prediction, σ, truth, s, r, weight."""
    manifest = list(csv.DictReader((pairs / "manifest.csv").open()))
    recordings = defaultdict(list)
    for row in csv.DictReader((pairs / "recordings.csv").open()):
        recordings[row["config"]].append(ROOT / row["path"])  # paths are the repository's
    db, ingested, rows, refused = work / "pairs.duckdb", {}, [], defaultdict(list)

    def ingest(path: Path, layout: str) -> str:
        if path not in ingested:
            ingested[path] = f"r{len(ingested)}"
            invoke("ingest", path, "--db", db, "--run-id", ingested[path], *(["--layout", layout] if layout else []))
        return ingested[path]

    for g in manifest:
        truths = [truth_ms(db, ingest(p, g.get("layout_B") or g["layout"]), g["family"]) for p in recordings[g["B"]]]
        truth = float(np.median(truths))
        a_runs = [ingest(p, g["layout"]) for p in recordings[g["A"]]]
        for run in a_runs:
            try:
                value, sources = predict_one(g, run, db)
            except Refused as exc:  # one line, exit 2: counted, never scored
                refused[(g["family"], g["kind"])].append(str(exc))
                continue
            s = float(np.log(truth / value))
            rows.append({"group": g["group"], "kind": sources["kind"], "pair_kind": g["kind"],
                         "family": g["family"], "split": g["split"],
                         "value": value, "sigma": sources["sigma_log"], "truth": truth, "s": s,
                         "r": s / sources["sigma_log"], "weight": 1 / len(a_runs)})
    for (family, kind), why in sorted(refused.items()):
        print(f"refused: {family} {kind}: {len(why)} predictions, e.g. {why[0]}")
    return rows


def predict_one(g: dict, run: str, db: Path) -> tuple[float, dict]:
    """(predicted step ms, its interval's sources) for one recording of A."""
    if g["kind"] == "null":  # A predicts itself
        return truth_ms(db, run, g["family"]), {"sigma_log": intervals.SIGMA_FLOOR, "kind": "null"}
    if g["family"] == "whatif":
        changes = [c for c in g["change"].split(";") if c]
        out = cli("whatif", run, *[x for c in changes for x in ("--change", c)], "--json", "--db", db)
        return out["predicted_step_ms"], out["sources"]
    out = cli("predict", run, "--config", ROOT / g["config_A"], "--to", ROOT / g["config_B"], "--json", "--db", db)
    total = next(r for r in out["step"] if r["dim"] == "TOTAL")
    return total["predicted_B_ms"], {"sigma_log": _sigma(out), "kind": kind_of(load(ROOT / g["config_A"]),
                                                                                load(ROOT / g["config_B"]))}


def _sigma(prediction: dict) -> float:
    total = next(r for r in prediction["step"] if r["dim"] == "TOTAL")
    return float(np.log(total["high"] / total["predicted_B_ms"]) / intervals.Z[intervals.LEVEL])


def calibrate(rows: list[dict]) -> dict:
    """Per family and kind, and pooled, the quantiles of r from the calibrate split."""
    out: dict = {"kind": {}, "family": {}, "pooled": {}}
    cal = [r for r in rows if r["split"] == "calibrate"]
    for level_name, key in (("kind", "kind"), ("family", "family"), ("pooled", None)):
        groups = defaultdict(list)
        for r in cal:
            groups[r[key] if key else "all"].append(r)
        for name, members in groups.items():
            q = intervals.conformal(np.array([m["r"] for m in members]), np.array([m["weight"] for m in members]))
            n = len({m["group"] for m in members})
            out[level_name][name] = {f"{intervals.LEVEL:g}": {"n_groups": n, "q_lo": q[0] if q else float("inf"),
                                                               "q_hi": q[1] if q else float("inf")}}
    return out


def report(rows: list[dict]) -> None:
    check = [r for r in rows if r["split"] == "check"]
    nulls = [abs(r["s"]) for r in rows if r["kind"] == "null"]
    floor = 100 * float(np.median(nulls)) if nulls else float("nan")
    print(f"{'family':<8}{'kind':<16}{'groups':>7}{'level':>7}{'covered':>9}{'coverage [95% CP]':>24}"
          f"{'median half-width % step':>26}{'noise floor %':>15}")
    by = defaultdict(list)
    for r in check:
        if r["kind"] != "null":  # the null kind is the floor printed beside each row, not a prediction
            by[(r["family"], r["kind"])].append(r)
    for (family, kind), members in sorted(by.items()):
        got = intervals.quantiles(members[0].get("platform", "cpu-gloo"), kind, family)
        q_lo, q_hi = (got[0], got[1]) if got else (-intervals.Z[intervals.LEVEL], intervals.Z[intervals.LEVEL])
        groups = defaultdict(list)
        for m in members:
            lo, hi = m["value"] * np.exp(q_lo * m["sigma"]), m["value"] * np.exp(q_hi * m["sigma"])
            groups[m["group"]].append((lo <= m["truth"] <= hi, 100 * (hi - lo) / 2 / m["value"]))
        covered = sum(np.mean([c for c, _ in v]) >= 0.5 for v in groups.values())
        band = intervals.clopper_pearson(covered, len(groups))
        width = float(np.median([w for v in groups.values() for _, w in v]))
        print(f"{family:<8}{kind:<16}{len(groups):>7}{intervals.LEVEL:>7.0%}{covered:>9}"
              f"{covered / len(groups):>10.0%} [{band[0]:.0%}, {band[1]:.0%}]{width:>26.1f}{floor:>15.1f}")


def from_scratch(write: bool) -> None:
    """`estimate`'s interval: plain split conformal on log(measured / estimated) of vTrain's single-node A100 runs
    (examples/vtrain_a100_profile.yaml, the built-in a100 profile), checked on its multi-node runs, which set
    nothing."""
    from tests.estimator.test_estimator_validation import _vtrain_predictions, _vtrain_rows

    base = load(ROOT / "examples" / "vtrain_a100_profile.yaml")
    pred, meas = _vtrain_predictions(base)
    scores = np.log(np.array(meas) / np.array(pred))
    q_lo, q_hi = intervals.conformal(scores)
    if write:
        data = json.loads((ROOT / "traceana" / "model" / "intervals.json").read_text())
        data["estimate"] = {"a100": {f"{intervals.LEVEL:g}": {
            "n_groups": len(scores), "q_lo": q_lo, "q_hi": q_hi,
            "set_by": "vTrain single-node measured runs (../shared/validation/vtrain_ground_truth_single_node.csv)"
                      " with examples/vtrain_a100_profile.yaml"}}}
        (ROOT / "traceana" / "model" / "intervals.json").write_text(json.dumps(data, indent=1) + "\n")
    pred, meas = _vtrain_predictions(base, _vtrain_rows(ROOT / "tests" / "data" / "vtrain_ground_truth_multi_node.csv"))
    inside = [p * np.exp(q_lo) <= m <= p * np.exp(q_hi) for p, m in zip(pred, meas, strict=True)]
    band = intervals.clopper_pearson(sum(inside), len(inside))
    half = 100 * (np.exp(q_hi) - np.exp(q_lo)) / 2
    print(f"estimate (a100): set on {len(scores)} single-node runs, q = [{q_lo:+.4f}, {q_hi:+.4f}] (log), half-width "
          f"{half:.1f}% of the step; check on {len(inside)} multi-node runs: covered {sum(inside)} = "
          f"{sum(inside) / len(inside):.0%} [{band[0]:.0%}, {band[1]:.0%}] (95% Clopper-Pearson) at "
          f"{intervals.LEVEL:.0%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=Path, default=ROOT / "sample_traces" / "pairs")
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--rows", type=Path, help="also write every scored row (group, kind, split, s, ...) as CSV")
    args = parser.parse_args()
    from_scratch(args.write)
    if not (args.pairs / "manifest.csv").exists():
        sys.exit(f"{args.pairs / 'manifest.csv'}: no validation pairs recorded (issue 33 item 2)")
    with tempfile.TemporaryDirectory() as work:
        rows = score(args.pairs, Path(work))
    if args.rows:
        with args.rows.open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
    if args.write:
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
        data = json.loads((ROOT / "traceana" / "model" / "intervals.json").read_text())  # keeps `estimate`
        data |= {"level": intervals.LEVEL, "provenance": {
            "pairs": str(args.pairs.relative_to(ROOT)), "commit": commit, "split": "calibrate",
            "n_groups_per_kind": {k: len({r["group"] for r in rows if r["kind"] == k and r["split"] == "calibrate"})
                                  for k in {r["kind"] for r in rows}}},
            "platforms": {"cpu-gloo": calibrate(rows)}}
        (ROOT / "traceana" / "model" / "intervals.json").write_text(json.dumps(data, indent=1) + "\n")
        intervals.calibration.cache_clear()
    report(rows)


if __name__ == "__main__":
    main()
