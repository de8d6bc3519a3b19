"""The validation pairs' noise floor: how much one recording's step varies when nothing changed.

    .venv/bin/python sample_traces/pairs_noise.py

Per recording, the step is the median over ranks of each rank's median ProfilerStep duration over the active steps
(read from the raw JSON); per config, the log of that over its recordings. Prints the pooled SD of the log step
within configs (df = recordings - configs), per family and over all, and the 80% half-width a perfect predictor
would need against one recording of A and B's median of m = 3: exp(1.28 * sqrt(1 + 1/m) * SD) - 1. Then the
same for pairs recorded in one round (interleaved, same sitting): the SD of log(null / base) over the null groups'
rounds, the floor of one A against one B recorded minutes apart.
"""

from __future__ import annotations

import csv
import gzip
import json
import math
import statistics
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAIRS = ROOT / "sample_traces" / "pairs"


def step_ms(folder: Path) -> float:
    """The median rank's median step (ms) of one recording."""
    per_rank = []
    for path in sorted(folder.glob("rank*.json.gz")):
        events = json.loads(gzip.decompress(path.read_bytes()))["traceEvents"]
        per_rank.append(statistics.median(e["dur"] / 1e3 for e in events
                                          if e.get("name", "").startswith("ProfilerStep#")))
    return statistics.median(per_rank)


def pooled(logs: dict[str, list[float]]) -> tuple[float, int]:
    """Pooled within-config SD of the log step and its degrees of freedom."""
    squares = sum((x - statistics.fmean(v)) ** 2 for v in logs.values() for x in v)
    df = sum(len(v) - 1 for v in logs.values())
    return math.sqrt(squares / df), df


def main() -> None:
    with (PAIRS / "recordings.csv").open(newline="") as f:
        recordings = list(csv.DictReader(f))
    logs: dict[str, list[float]] = defaultdict(list)
    by_round: dict[tuple[str, str], float] = {}
    for r in recordings:
        by_round[r["config"], r["repeat"]] = math.log(step_ms(ROOT / r["path"]))
        logs[r["config"]].append(by_round[r["config"], r["repeat"]])
    loads = [float(r["load_avg_1m"]) for r in recordings]
    print(f"{len(recordings)} recordings of {len(logs)} configs; 1-min load average at their start: median "
          f"{statistics.median(loads):.1f}, range {min(loads):.1f}-{max(loads):.1f}")
    families = sorted({name.split("_")[0] for name in logs})
    print(f"{'configs':<10} {'n':>4} {'df':>4} {'log-SD':>7} {'80% floor (m=3)':>16}")
    for label, names in [*((f, [n for n in logs if n.startswith(f + "_")]) for f in families), ("all", list(logs))]:
        sd, df = pooled({n: logs[n] for n in names})
        print(f"{label:<10} {len(names):>4} {df:>4} {sd:>7.3f} {math.exp(1.28 * math.sqrt(1 + 1 / 3) * sd) - 1:>15.1%}")
    ratios = [by_round[null, k] - by_round[null.removesuffix("_null"), k] for null, k in by_round
              if null.endswith("_null") and (null.removesuffix("_null"), k) in by_round]
    sd = math.sqrt(sum(x * x for x in ratios) / len(ratios))  # the truth of a null pair's log ratio is 0
    print(f"same-round null pairs: {len(ratios)} log(null/base), RMS {sd:.3f} (df {len(ratios)}), "
          f"80% floor of one A against one B {math.exp(1.28 * sd) - 1:.1%}")


if __name__ == "__main__":
    main()
