"""The interactive report's weight and speed at 8, 64 and 256 ranks (issue 24: small enough to mail).

8 ranks is the bundled TP2·PP2·DP2 sample; 64 and 256 are `traceana synth` runs of examples/synth_gpt_tp2pp2.yaml
(TP2·PP2·DP16 / DP64, 3 steps). Each is ingested into a temporary store, then `report --html` is written (seconds,
MB, and how much of it is BokehJS) and opened in headless Chromium: the render time is from the page request until
every Bokeh document is idle (all charts drawn), best of ``--repeat``.

    .venv/bin/python benchmarks/bench_report.py [--ranks 8 64 256] [--repeat 3]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.render.browser import MISSING, chromium  # noqa: E402

CONFIG = ROOT / "examples" / "synth_gpt_tp2pp2.yaml"
SAMPLE = ROOT / "sample_traces" / "traces" / "toy8_tp2pp2dp2_1f1b"


def traceana(*args: object) -> float:
    """Run the CLI; its wall seconds."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "traceana", *map(str, args)], check=True, capture_output=True, cwd=ROOT)
    return time.perf_counter() - start


def store(ranks: int, tmp: Path) -> Path:
    db = tmp / f"r{ranks}.duckdb"
    if ranks == 8:
        traceana("ingest", SAMPLE, "--layout", "tp=2,pp=2,dp=2", "--db", db)
    else:
        traceana("synth", CONFIG, tmp / f"run{ranks}", "--ranks", ranks, "--steps", 3)
        traceana("ingest", tmp / f"run{ranks}" / "traces", "--db", db, "--layout", f"tp=2,pp=2,dp={ranks // 4}")
    return db


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from bokeh.resources import Resources

    bokeh_mb = sum(len(js.encode()) for js in Resources(mode="inline", components=["bokeh"]).js_raw) / 1e6
    print(f"{'ranks':>6} {'write s':>8} {'MB':>6} {'of it BokehJS MB':>17} {'render s':>9}")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for ranks in args.ranks:
            db, out = store(ranks, tmp), tmp / f"r{ranks}.html"
            write_s = min(traceana("report", "--html", out, "--db", db) for _ in range(args.repeat))
            render_s = float("nan")
            if MISSING is None:
                with chromium(tmp) as page:
                    times = []
                    for _ in range(args.repeat):
                        start = time.perf_counter()
                        page.open(out)
                        times.append(time.perf_counter() - start)
                    assert page.console() == [] and page.requests() == []
                render_s = min(times)
            print(f"{ranks:>6} {write_s:>8.2f} {out.stat().st_size / 1e6:>6.2f} {bokeh_mb:>17.2f} {render_s:>9.2f}")
    if MISSING is not None:
        print(f"render times not measured: {MISSING}")


if __name__ == "__main__":
    main()
