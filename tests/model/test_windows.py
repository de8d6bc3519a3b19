"""A replay a window of steps at a time (traceana/model/windows.py) against the run's whole graph replayed at once
(graph.py, replay.simulate: the path test_replay checks against the measured steps): the same breakdown of every
rank-step, edge counts, notes and holds, on real runs cut at every step they allow; and where a run allows no cut."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import SAMPLES, TRACES, add_run
from tests.test_sample_traces import EXPERIMENTS
from traceana import store
from traceana.model import graph as dependency
from traceana.model import replay, windows

RUNS = {  # run: (trace, format, layout, windows at one step each)
    "hta_rank3of8": ("kineto/hta_rank3of8_6steps.json.gz", 6),   # NCCL collectives, launches, syncs
    "h200_hostbound": ("kineto/h200_hostbound_h512_L12_s256_gb8.json.gz", 3),
    "mi300": ("kineto/tracelens_mi300_rank0of8_rccl.json.gz", 3),
    "hta_rank0of2": ("kineto/hta_rank0of2_pg_args.json.gz", 3),
    "hta_rank0of16": ("kineto/hta_rank0of16_a2a_rs_ag.json.gz", 1),
}
SAMPLE = "toy8_tp2pp2dp2_1f1b"  # eight CPU ranks, PP sends across the steps' boundary


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("windows") / "runs.duckdb"
    with store.connect(path) as con:
        for run, (rel, _) in RUNS.items():
            add_run(con, run, [TRACES / rel], "kineto")
        add_run(con, SAMPLE, [SAMPLES / SAMPLE], "kineto", EXPERIMENTS[SAMPLE][0])
    return path


def _cuts(con, run: str, folder: Path) -> list[tuple[int, int]]:
    events, _ = windows._spilled(con, run, folder / f"{run}.parquet")
    return windows.cuts(con, run, str(events), 1)


@pytest.mark.parametrize("run", [*RUNS, SAMPLE])
def test_a_run_replayed_a_step_at_a_time_is_its_whole_graph_replayed(db: Path, run: str, tmp_path: Path) -> None:
    with store.connect(db, read_only=True) as con:
        store.open_run(con, run)
        spans = _cuts(con, run, tmp_path)
        whole = dependency.build(con, run)
        (expected,), _ = replay.simulate(con, whole)
        got = windows.replayed(con, run, window_events=1)  # a window at every cut the run allows
    assert len(spans) == RUNS.get(run, (None, 2))[1]
    assert got.breakdown.equals(expected)
    assert list(got.counts.items()) == list(whole.counts.items())  # the same counts, in the same order
    assert got.missing == whole.missing
    held = ["rank", "step", "held_ns", "external_ns", "tail_ns", "lead_ns"]
    assert got.windows.select(held).sort("rank", "step").equals(whole.windows.select(held).sort("rank", "step"))


def test_a_host_that_runs_ahead_across_a_step_boundary_keeps_the_steps_in_one_window(db: Path,
                                                                                     tmp_path: Path) -> None:
    """hta_rank0of16's host launches each step's first kernels before the step before has launched its last (the
    CPU runs ahead of the device): a cut there would chain an earlier window's host point after a later one's."""
    run = "hta_rank0of16"
    with store.connect(db, read_only=True) as con:
        store.open_run(con, run)
        ahead = con.sql("""
            WITH s AS (SELECT w.step, min(e.launch_ns) AS first_launch, max(e.launch_ns) AS last_launch
                       FROM device_events e JOIN step_windows w ON w.run_id = e.run_id AND w.rank = e.rank
                        AND e.start_ns >= w.start_ns AND e.start_ns < w.end_ns
                       WHERE e.run_id = $run AND e.launch_ns IS NOT NULL GROUP BY w.step)
            SELECT count(*) FROM s a JOIN s b ON b.step = a.step + 1 WHERE b.first_launch < a.last_launch""",
                        params={"run": run}).fetchall()[0][0]
        spans = _cuts(con, run, tmp_path)
    assert ahead == 4  # every boundary of its five steps
    assert spans == [(550, 554)]
