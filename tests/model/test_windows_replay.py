"""A replay a window of steps at a time (traceana/model/replay.py, Windows), cut at every step a run allows, against the
run's whole graph replayed as one window (the path test_replay checks against the measured steps): the same
breakdown of every rank-step, edge counts, notes and holds, what-if and advise; and where a run allows no cut."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import SAMPLES, TRACES, add_run
from tests.test_sample_traces import EXPERIMENTS
from traceana import store
from traceana.model import advise, replay, whatif

RUNS = {  # run: (trace, format, layout, windows at one step each)
    "hta_rank3of8": ("kineto/hta_rank3of8_6steps.json.gz", 6),   # NCCL collectives, launches, syncs
    "h200_hostbound": ("kineto/h200_hostbound_h512_L12_s256_gb8.json.gz", 3),
    "mi300": ("kineto/tracelens_mi300_rank0of8_rccl.json.gz", 3),
    "hta_rank0of2": ("kineto/hta_rank0of2_pg_args.json.gz", 3),
    "hta_rank0of16": ("kineto/hta_rank0of16_a2a_rs_ag.json.gz", 1),
    "hta_sampled": ("kineto/hta_sampled_rank0of128.json.gz", 2),
}
SAMPLE = "toy8_tp2pp2dp2_1f1b"  # eight CPU ranks, PP sends across the steps' boundary
BUCKETED = "tp2dp2_mlp"  # DP gradients reduced in buckets
CHANGES = [  # (run, change): one of each kind that edits what a window's earlier events send (a roof= change is
    # left out: on hta_rank3of8 its prediction differs between processes, with the whole graph too, although the
    # roofline's shares and the edited weights do not: something after them resolves a tie differently)
    ("hta_sampled", "host=0"),  # the first step's kernels, launched at once, replay past the second's start
    ("h200_hostbound", "host=capturable:0"), ("h200_hostbound", "kernel=*:0.5"), ("hta_rank3of8", "dim=UNKNOWN:0.5"),
    (SAMPLE, "overlap=DP"), (BUCKETED, "overlap=DP:backward"), (SAMPLE, "rank=*:median"),
]


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("windows") / "runs.duckdb"
    with store.connect(path) as con:
        for run, (rel, _) in RUNS.items():
            add_run(con, run, [TRACES / rel], "kineto")
        for sample in (SAMPLE, BUCKETED):
            add_run(con, sample, [SAMPLES / sample], "kineto", EXPERIMENTS[sample][0])
    return path


def _cuts(con, run: str, folder: Path) -> list[tuple[int, int]]:
    events, _ = replay._spilled(con, run, folder / f"{run}.parquet")
    return replay.cuts(con, run, str(events), 1)


@pytest.mark.parametrize("run", [*RUNS, SAMPLE])
def test_a_run_replayed_a_step_at_a_time_is_its_whole_graph_replayed(db: Path, run: str, tmp_path: Path) -> None:
    with store.connect(db, read_only=True) as con:
        store.open_run(con, run)
        spans = _cuts(con, run, tmp_path)
        whole = replay.replayed(con, run, window_events=10 ** 12)  # one window: the whole graph
        got = replay.replayed(con, run, window_events=1)  # a window at every cut the run allows
    assert len(spans) == RUNS.get(run, (None, 2))[1]
    assert got.breakdown.equals(whole.breakdown) and got.breakdown.height > 0
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


@pytest.mark.parametrize(("run", "change"), CHANGES)
def test_a_whatif_a_step_at_a_time_is_the_whatif_of_the_whole_graph(db: Path, run: str, change: str,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Changes move events across a step's measured boundary (host=0 lets one step's kernels queue into the next;
    overlap=DP sends collectives to the background): the windows' results equal the one window's."""
    changes = [whatif.parse(change)]
    with store.connect(db, read_only=True) as con:
        store.open_run(con, run)
        one = whatif.whatif_interval(con, run, changes)
        monkeypatch.setattr(replay, "WINDOW_EVENTS", 1)
        cut = whatif.whatif_interval(con, run, changes)
    assert len(cut[1].spans) > 1 and len(one[1].spans) == 1
    assert cut[0] == one[0] and cut[2].equals(one[2]) and cut[3].equals(one[3])
    assert (cut[4].value, cut[4].low, cut[4].high) == (one[4].value, one[4].low, one[4].high)
    assert cut[1].counts == one[1].counts and cut[1].missing == one[1].missing


def test_advise_a_step_at_a_time_is_advise_of_the_whole_graph(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with store.connect(db, read_only=True) as con:
        one = advise.findings(con, SAMPLE)[1].drop("sources")
        monkeypatch.setattr(replay, "WINDOW_EVENTS", 1)
        cut = advise.findings(con, SAMPLE)[1].drop("sources")
    assert one.height > 1 and cut.equals(one)
