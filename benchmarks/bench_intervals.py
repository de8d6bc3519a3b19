"""Intervals against real one-knob pairs (issue 33): calibrate on the pairs that set widths, measure coverage on the
pairs that check them. Reads sample_traces/pairs/manifest.csv (group, kind, family, A, B, layout, layout_B, change,
config_A, config_B, split, notes; paths from the repository root) and recordings.csv (config, repeat, path, ...).
Per group and recording of A: the prediction of B (`whatif A --change ...` or `predict A --config config_A --to
config_B`) with its σ (the interval's sources), and B's truth, the median over B's recordings of its typical step
(whatif: the median rank's TOTAL, median over the steps after the first; predict: the mean TOTAL over ranks and
those steps, as compare reports). Score s = log(truth / prediction), r = s / σ, each row weighted 1 / rows of its
group; rows are calibrated under the kind of change traceana names at run time (whatif's key, predict's configs'
difference), so a lookup finds them.

    .venv/bin/python benchmarks/bench_intervals.py [--pairs DIR] [--write] [--rows CSV] [--synth]

--write computes the conformal quantiles per kind, family and pooled from the calibrate split only (numpy,
traceana.model.intervals.conformal) and writes traceana/model/intervals.json with its provenance (commit, n per
kind). Then, per family and kind on the CHECK split: groups, stated level, coverage with its Clopper-Pearson 95%
band, median half-width (% of step), and the run-to-run floor (the `null` kind's median |s|) beside it.

--synth checks instead the GPU-format what-if and predict intervals on the synthesizer's truth pairs (SYNTH_PAIRS,
SYNTH_PREDICT: `traceana synth` runs of examples/synth_gpt_tp2pp2.yaml, 8 ranks, launched kernels, one knob or one
config key changed, three seeds each): check only, they set no width, as a synthesized schedule is not a real GPU's
noise.
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
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from traceana import store  # noqa: E402
from traceana.estimator.config import load  # noqa: E402
from traceana.model import intervals  # noqa: E402


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


def slow_stage_1(factor: float) -> str:
    """Stage 1's ranks (4-7 in tp=2,pp=2,dp=2) scaled by ``factor``, rank by rank: what `stage=1:F` replays, scored
    under rank:factor."""
    return ";".join(f"rank={r}:{factor:g}" for r in (4, 5, 6, 7))


# (group, change whatif applies to A, A's synth options, B's synth options): one knob of the synthesizer's truth.
# A speed-up is predicted from the slowed run back to the base: the synthesizer keeps an op that follows a bubble
# at its planned time, and the plan is the unscaled estimator's, so a run synthesized with a factor below 1 is held
# by times a faster link would not keep (TP x0.5: IDLE 0.25 -> 5.3 ms on stage 0), not a run with a faster link.
SYNTH_PAIRS = [
    ("tp_x2", "dim=TP:2", [], ["--comm-scale", "TP=2"]),
    ("tp_x0.5", "dim=TP:0.5", ["--comm-scale", "TP=2"], []),
    ("dp_x2", "dim=DP:2", [], ["--comm-scale", "DP=2"]),
    ("dp_x0.5", "dim=DP:0.5", ["--comm-scale", "DP=2"], []),
    ("pp_x2", "dim=PP:2", [], ["--comm-scale", "PP=2"]),
    ("tp_dp_x2", "dim=TP:2;dim=DP:2", [], ["--comm-scale", "TP=2,DP=2"]),
    ("straggler3_x1.3", "rank=3:1.3", [], ["--straggler-rank", "3"]),
    ("straggler5_x1.6", "rank=5:1.6", [], ["--straggler-rank", "5", "--slowdown", "1.6"]),
    ("straggler3_median", "rank=3:median", ["--straggler-rank", "3"], []),
    ("straggler3_all_median", "rank=*:median", ["--straggler-rank", "3"], []),
    ("stage1_x1.3", slow_stage_1(1.3), [], ["--straggler-stage", "1"]),
    ("stage1_x1/1.3", slow_stage_1(1 / 1.3), ["--straggler-stage", "1"], []),
    ("null", "rank=*:1", [], []),
]
# (group, B's config: the base's sections with these keys changed): `predict A --config base --to B` against B run
# as synthesized from its own config; 16 sequences a step throughout but for seq_2048.
SYNTH_PREDICT = [
    ("micro_batches_8_to_16", {"parallel": {"global_batch": 32}}),
    ("micro_batches_8_to_4", {"parallel": {"global_batch": 8}}),
    ("micro_batch_size_2", {"parallel": {"micro_batch": 2}}),
    ("seq_len_2048", {"model": {"seq_len": 2048}}),
    ("layout_tp4_dp1", {"parallel": {"tp": 4, "dp": 1}}),
    ("layout_pp1_dp4", {"parallel": {"pp": 1, "dp": 4}}),
]
SYNTH_SEEDS = {"A": (0, 1, 2), "B": (10, 11, 12)}  # a recording's own jitter: A's and B's draws are independent


def synthesized_pairs(work: Path) -> Path:
    """SYNTH_PAIRS and SYNTH_PREDICT written as a pairs folder (manifest.csv, recordings.csv, B's configs) under
    ``work``, every split `check`."""
    base, made = ROOT / "examples" / "synth_gpt_tp2pp2.yaml", {}
    recordings, manifest = [], []

    def synthesize(options: list[str], side: str, config: Path = base) -> str:
        name = f"{side}:{config}:{' '.join(options)}"
        if name not in made:
            made[name] = f"s{len(made)}"
            for seed in SYNTH_SEEDS[side]:
                out = work / "synth" / f"{made[name]}_{seed}"
                invoke("synth", config, out, "--steps", 6, "--seed", seed, *options)
                recordings.append({"config": made[name], "repeat": seed, "path": out / "traces"})
        return made[name]

    row = {"layout": "tp=2,pp=2,dp=2", "layout_B": "", "change": "", "config_A": "", "config_B": "", "split": "check",
           "notes": "synthesized"}
    for group, change, a, b in SYNTH_PAIRS:
        manifest.append({**row, "group": f"synth:{group}", "kind": "null" if group == "null" else group,
                         "family": "whatif", "A": synthesize(a, "A"), "B": synthesize(b, "B"), "change": change})
    (work / "configs").mkdir()
    for group, changes in SYNTH_PREDICT:
        raw = yaml.safe_load(base.read_text())
        for section, keys in changes.items():
            raw[section] = {**raw[section], **keys}
        config = work / "configs" / f"{group}.yaml"
        config.write_text(yaml.safe_dump(raw, sort_keys=False))
        p = raw["parallel"]
        manifest.append({**row, "group": f"synth:{group}", "kind": group, "family": "predict",
                         "A": synthesize([], "A"), "B": synthesize([], "B", config),
                         "layout_B": f"tp={p['tp']},pp={p['pp']},dp={p['dp']}", "config_A": base, "config_B": config})
    folder = work / "synth_pairs"
    folder.mkdir()
    for name, rows in (("manifest.csv", manifest), ("recordings.csv", recordings)):
        with (folder / name).open("w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
            writer.writeheader()
            writer.writerows(rows)
    return folder


def predict_one(g: dict, run: str, db: Path) -> tuple[float, dict]:
    """(predicted step ms, its interval's sources) for one recording of A."""
    if g["kind"] == "null":  # A predicts itself
        return truth_ms(db, run, g["family"]), {"sigma_log": intervals.SIGMA_FLOOR, "kind": "null"}
    if g["family"] == "whatif":
        changes = [c for c in g["change"].split(";") if c]
        out = cli("whatif", run, *[x for c in changes for x in ("--change", c)], "--json", "--db", db)
        return out["predicted_step_ms"], out["sources"]
    out = cli("predict", run, "--config", ROOT / g["config_A"], "--to", ROOT / g["config_B"], "--json", "--db", db)
    return out["interval"]["value"], out["interval"]["sources"]


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


def quantiles(platform: str, kind: str, family: str) -> tuple[float, float]:
    """The (q_lo, q_hi) traceana applies: the platform's calibration for the kind, else the model-based ±z."""
    got = intervals.quantiles(platform, kind, family)
    return (got[0], got[1]) if got else (-intervals.Z[intervals.LEVEL], intervals.Z[intervals.LEVEL])


def report(rows: list[dict], platform: str = "cpu-gloo") -> None:
    """Per family and kind, the CHECK split's coverage of the intervals ``platform``'s calibration gives (its
    conformal quantiles, else the model-based ±z·σ traceana prints where a kind is uncalibrated)."""
    check = [r for r in rows if r["split"] == "check"]
    nulls = [abs(r["s"]) for r in rows if r["kind"] == "null"]
    floor = 100 * float(np.median(nulls)) if nulls else float("nan")
    print(f"{'family':<8}{'kind':<16}{'groups':>7}{'level':>7}{'covered':>9}{'coverage [95% CP]':>24}"
          f"{'median half-width % step':>26}{'noise floor %':>15}")
    by = defaultdict(lambda: defaultdict(list))  # (family, kind) -> group -> (covered, half-width %) per row
    for r in check:
        if r["kind"] == "null":  # the null kind is the floor printed beside each row, not a prediction
            continue
        q_lo, q_hi = quantiles(platform, r["kind"], r["family"])
        lo, hi = r["value"] * np.exp(q_lo * r["sigma"]), r["value"] * np.exp(q_hi * r["sigma"])
        for key in ((r["family"], r["kind"]), (r["family"], "(all kinds)")):
            by[key][r["group"]].append((lo <= r["truth"] <= hi, 100 * (hi - lo) / 2 / r["value"]))
    for (family, kind), groups in sorted(by.items()):
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
    parser.add_argument("--synth", action="store_true",
                        help="check GPU-format what-if intervals on synthesized pairs instead (SYNTH_PAIRS)")
    args = parser.parse_args()
    if args.synth:
        return check_synthesized()
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


def check_synthesized() -> None:
    """Each synthesized pair's prediction against its truth, then the coverage table of traceana's 'gpu' intervals."""
    with tempfile.TemporaryDirectory() as work:
        rows = score(synthesized_pairs(Path(work)), Path(work))
    print(f"synthesized GPU-format pairs ({len(SYNTH_PAIRS) + len(SYNTH_PREDICT)} groups x {len(SYNTH_SEEDS['A'])} "
          "recordings of A, check only):")
    for r in (r for r in rows if r["kind"] != "null"):  # null: the floor, A's truth against B's
        lo, hi = (r["value"] * np.exp(q * r["sigma"]) for q in quantiles("gpu", r["kind"], r["family"]))
        print(f"  {r['group']:<28}{r['kind']:<14} truth {r['truth']:8.3f} ms  predicted {r['value']:8.3f} "
              f"[{lo:.3f}, {hi:.3f}]  {'in' if lo <= r['truth'] <= hi else 'OUT'}")
    report(rows, "gpu")


if __name__ == "__main__":
    main()
