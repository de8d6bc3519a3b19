"""Round trips synth -> ingest -> views: the breakdown, the stragglers view and host clock alignment recover what
the synthesizer injected (truth.json). The synthesizer is never the only evidence that an ingester reads real
files: tests on ../shared/traces stay the reference for that.

Tolerances, derived:
- per rank, step and dimension, 1 ns: the truth is measured on the same ns timeline with the same window rule; the
  views split an instant shared by two dims into integers (the remainder goes to one of them), the truth in halves;
- clock offsets per rank, 1 ns: a collective (and a Send with its Recv) ends at one instant on all its members in
  the synthesizer, the Kineto text states ns exactly, so host and rank alignment recover each rank's offset from rank
  0's (host plus device) to the ns; the 1 ns covers the rounding of a midpoint or a least-squares solution;
- a straggler's COMP excess, ±1 percentage point of the slowdown: jitter (3 %) averages out over thousands of
  kernels per step.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from tests.conftest import ROOT
from traceana import store
from traceana.cli.main import app
from traceana.synth import schedule

CONFIG = ROOT / "examples" / "synth_gpt_tp2pp2.yaml"
LAYOUT = "tp=2,dp=4,pp=2"
COLUMNS = ["TOTAL_ns", "COMP_ns", "MP_WAIT_ns", "CP_WAIT_ns", "EP_WAIT_ns", "DP_WAIT_ns", "PP_WAIT_ns", "IDLE_ns",
           "OVERLAPPED_ns"]


def invoke(*args: object) -> str:
    result = CliRunner().invoke(app, [str(a) for a in args], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    return result.output


def synth_and_ingest(tmp: Path, *options: object, fmt: str = "kineto", layout: str = LAYOUT) -> tuple[dict, Path]:
    out, db = tmp / "run", tmp / "run.duckdb"
    if db.exists():  # a shared run (slow_rank5), already made
        return json.loads((out / "truth.json").read_text()), db
    invoke("synth", CONFIG, out, "--ranks", 16, "--steps", 3, "--kernel-us", 50, "--format", fmt, *options)
    invoke("ingest", out / "traces", "--db", db, "--layout", layout, "--run-id", "synth")
    return json.loads((out / "truth.json").read_text()), db


def views(db: Path, sql: str) -> pl.DataFrame:
    with store.connect(db, read_only=True) as con:
        return con.sql(sql).pl()


def compare(truth: dict, db: Path) -> pl.DataFrame:
    """Per rank and step: |breakdown - truth| for every column."""
    got = views(db, f"SELECT rank, step, OTHER_WAIT_ns, {', '.join(COLUMNS)} FROM rank_step_breakdown")
    joined = pl.DataFrame(truth["steps"]).join(got, on=["rank", "step"], suffix="_got", how="full")
    assert joined.height == len(truth["steps"]["rank"]) and joined["rank"].null_count() == 0
    return joined.select("rank", "step", "OTHER_WAIT_ns",
                         *[(pl.col(f"{c}_got") - pl.col(c)).abs().alias(c) for c in COLUMNS])


# Nsight and Ascend steps are the CPU's ProfilerStep ranges (NVTX, STEP_TIME): they open 10 µs before the step's first
# launch, itself 5 µs before its kernel, and the last closes 10 µs after the last kernel (a final synchronize), so
# each step edge sits up to 25 µs from the device window the truth uses; Kineto projects steps onto the device.
EDGE_NS = {"kineto": 1, "nsys": 25_001, "ascend": 25_001}


SLOW_RANK5 = ("--straggler-rank", 5, "--slowdown", 1.3)


@pytest.fixture(scope="module")
def slow_rank5(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Per format, a folder for the 16-rank run with rank 5 at 1.3x, synthesized and ingested by the first test
    that reads it (two tests read each: one synth and ingest, not two)."""
    return {fmt: tmp_path_factory.mktemp(f"slow_rank5_{fmt}") for fmt in ("kineto", "nsys", "ascend")}


@pytest.mark.parametrize("straggler", [SLOW_RANK5, ("--straggler-stage", 0, "--slowdown", 1.5)],
                         ids=["rank", "stage"])
@pytest.mark.parametrize("fmt", ["kineto", "nsys", "ascend"])
def test_breakdown_recovers_every_dimension(tmp_path: Path, fmt: str, straggler: tuple,
                                            slow_rank5: dict[str, Path]) -> None:
    # a slow stage delays the other through the pipeline transfers: its waits are in the truth and the views alike
    truth, db = synth_and_ingest(slow_rank5[fmt] if straggler == SLOW_RANK5 else tmp_path, *straggler, fmt=fmt)
    diff = compare(truth, db)
    steps = pl.DataFrame(truth["steps"])
    # the run is not trivial: every dim this layout has is there, and waits are a real share of the step
    assert all(steps[c].sum() > 1e6 for c in ("COMP_ns", "MP_WAIT_ns", "DP_WAIT_ns", "PP_WAIT_ns", "IDLE_ns"))
    edges = diff.select(pl.max_horizontal("TOTAL_ns", "COMP_ns", "IDLE_ns", "OVERLAPPED_ns").max()).item()
    assert edges <= EDGE_NS[fmt]
    if fmt == "nsys":  # an export names no process groups: the waits are there, as OTHER (issue 10: dims)
        got = views(db, "SELECT rank, step, MP_WAIT_ns + CP_WAIT_ns + EP_WAIT_ns + DP_WAIT_ns + PP_WAIT_ns "
                        "+ OTHER_WAIT_ns AS waits FROM rank_step_breakdown")
        want = steps.select("rank", "step", pl.sum_horizontal("MP_WAIT_ns", "CP_WAIT_ns", "EP_WAIT_ns", "DP_WAIT_ns",
                                                              "PP_WAIT_ns").alias("want"))
        joined = got.join(want, on=["rank", "step"])
        assert (joined["waits"] - joined["want"]).abs().max() <= EDGE_NS[fmt]
    else:
        waits = ["MP_WAIT_ns", "CP_WAIT_ns", "EP_WAIT_ns", "DP_WAIT_ns", "PP_WAIT_ns"]
        assert diff.select(pl.max_horizontal(waits).max()).item() <= EDGE_NS[fmt]
        assert diff["OTHER_WAIT_ns"].max() == 0


@pytest.mark.parametrize("fmt", ["kineto", "nsys", "ascend"])
def test_stragglers_view_finds_the_injected_rank(slow_rank5: dict[str, Path], fmt: str) -> None:
    truth, db = synth_and_ingest(slow_rank5[fmt], *SLOW_RANK5, fmt=fmt)
    rows = views(db, "SELECT rank, COMP_excess_pct, last_arrivals FROM stragglers ORDER BY COMP_excess_pct DESC")
    assert rows["rank"][0] == truth["straggler"]["rank"] == 5
    assert rows["COMP_excess_pct"][0] == pytest.approx(30, abs=1)
    assert rows["COMP_excess_pct"][1:].abs().max() < 1
    # it arrives last at the collectives of its groups more than any other rank
    assert rows.sort("last_arrivals", descending=True)["rank"][0] == 5


def test_stragglers_view_finds_the_injected_stage(tmp_path: Path) -> None:
    # 2x: stage 1 carries the output layer and the loss, so stage 0 at 1.5x would still be the faster
    _, db = synth_and_ingest(tmp_path, "--straggler-stage", 0, "--slowdown", 2)
    rows = views(db, "SELECT rank, pp, straggler_stage FROM stragglers")
    assert rows.filter(pl.col("straggler_stage"))["pp"].unique().to_list() == [0]
    assert rows.filter(pl.col("pp") == 0).height == 8 and rows.filter(pl.col("pp") == 0)["straggler_stage"].all()


@pytest.mark.parametrize("device_skew_us", [0, 20])
def test_host_clock_offsets_are_recovered(tmp_path: Path, device_skew_us: int) -> None:
    """Four hosts of four GPUs; with pp outermost in the order, data-parallel groups span hosts, so every host
    shares collectives with rank 0's host. Each device also has its own clock (--device-skew-us): host alignment
    and then per-rank alignment put every rank on rank 0's clock, host and device offset both taken out."""
    layout = "tp=2,dp=4,pp=2,order=tp-cp-ep-pp-dp"
    config = tmp_path / "pp_dp.yaml"
    config.write_text(CONFIG.read_text().replace("global_batch: 16}", "global_batch: 16, order: tp-cp-ep-pp-dp}"))
    out, db = tmp_path / "run", tmp_path / "run.duckdb"
    invoke("synth", config, out, "--ranks", 16, "--steps", 2, "--kernel-us", 100, "--ranks-per-host", 4,
           "--host-skew-us", 3000, "--device-skew-us", device_skew_us)
    invoke("ingest", out / "traces", "--db", db, "--layout", layout)
    truth = json.loads((out / "truth.json").read_text())
    assert_offsets_recovered(truth, db)
    assert len(set(r["expected_host_alignment_ns"] for r in truth["ranks"])) == 4


def assert_offsets_recovered(truth: dict, db: Path) -> None:
    """Every rank's clock_offset_ns is rank 0's clock minus its own (host plus device offset), within 1 ns, and
    the offsets are not trivial (hosts 100 µs or more apart)."""
    clock = {r["rank"]: r["host_offset_ns"] + r["device_offset_ns"] for r in truth["ranks"]}
    expected = {rank: clock[0] - own for rank, own in clock.items()}
    assert max(map(abs, expected.values())) > 100_000
    got = dict(views(db, "SELECT rank, clock_offset_ns FROM ranks").rows())
    assert max(abs(got[r] - expected[r]) for r in expected) <= 1


def test_pg_args_without_pg_config_give_every_dim(tmp_path: Path) -> None:
    """No distributedInfo.pg_config, but each collective's args name its group (desc and ranks): the dims come from
    the args alone, with or without a layout."""
    out, db = tmp_path / "run", tmp_path / "run.duckdb"
    invoke("synth", CONFIG, out, "--ranks", 16, "--steps", 3, "--kernel-us", 50, "--pg-metadata", "args")
    invoke("ingest", out / "traces", "--db", db)
    truth = json.loads((out / "truth.json").read_text())
    assert compare(truth, db).select(pl.max_horizontal(COLUMNS).max()).item() <= 1


def test_without_process_group_metadata_dims_are_recovered_by_matching(tmp_path: Path) -> None:
    """No pg_config and no PG args (traces like hta_rank0of16): the op comes from the CPU op, and the groups from
    matching each rank's per-group streams across ranks against the layout (issue 10): every dim's exposed wait
    equals the ground truth's, as with full metadata."""
    truth, db = synth_and_ingest(tmp_path, "--pg-metadata", "none")  # Kineto
    assert compare(truth, db).select(pl.max_horizontal(COLUMNS).max()).item() <= 1
    evidence = views(db, "SELECT op, list(DISTINCT evidence) AS e FROM collectives GROUP BY op ORDER BY op")
    assert dict(evidence.rows()) == {"AllReduce": ["timing-match"], "ReduceScatter": ["timing-match"],
                                     "Recv": ["fingerprint"], "Send": ["fingerprint"]}


@pytest.mark.parametrize("slowdown", [1.0, 1.5])
def test_a_slow_stage_delays_the_next_through_the_pipeline_transfer(slowdown: float) -> None:
    """Stage 1's first forward needs stage 0's first activation. The estimator's plan (timeline.frame, no jitter):
    stage 0's forward of micro-batch 0 ends at 494,343 ns, its TP all-reduces at 689,200 ns, and the transfer takes
    16,651 ns. Stage 1 posts its Recv at the step's start and waits; the Send starts when stage 0's pass ends, and
    both end together, when stage 1's forward starts. With stage 0's compute 1.5x slower, the pass ends 0.5 x 494,343
    ns later (936,372 ns: each kernel's slowed length is rounded to the ns), and stage 1 is delayed as much."""
    straggler = {"straggler_stage": 0, "slowdown": slowdown} if slowdown > 1 else {}
    plan = schedule.load(str(CONFIG), schedule.Options(ranks=8, steps=1, jitter=0, **straggler))
    ops = {t.rank: t.ops for t in plan.stage_traces()}
    send = ops[0].filter(pl.col("code") == schedule.SEND).row(0, named=True)
    recv = ops[4].filter(pl.col("code") == schedule.RECV).row(0, named=True)
    first = ops[4].filter(pl.col("code") == schedule.COMPUTE).row(0, named=True)
    pass_end = {1.0: 689_200, 1.5: 936_372}[slowdown]
    assert (send["peer"], recv["peer"]) == (4, 0)
    assert (send["start_ns"], send["end_ns"]) == (pass_end, pass_end + 16_651)
    assert (recv["start_ns"], recv["end_ns"]) == (0, pass_end + 16_651)
    assert first["start_ns"] == pass_end + 16_651


def test_same_seed_same_files_other_seed_other_files(tmp_path: Path) -> None:
    def digest(folder: Path) -> str:
        return hashlib.sha256(b"".join(p.read_bytes() for p in sorted((folder / "traces").iterdir()))).hexdigest()

    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        invoke("synth", CONFIG, tmp_path / name, "--ranks", 8, "--steps", 1, "--seed", seed)
    assert digest(tmp_path / "a") == digest(tmp_path / "b") != digest(tmp_path / "c")


def test_bad_options_are_one_line_errors(tmp_path: Path) -> None:
    for args, message in ((["--ranks", 6], "not a multiple of tp*cp*pp"),
                          (["--straggler-rank", 99], "--straggler-rank 99"),
                          (["--format", "xla"], "--format 'xla'"),
                          (["--pg-metadata", "some"], "--pg-metadata 'some'")):
        result = CliRunner().invoke(app, ["synth", str(CONFIG), str(tmp_path / "x"), *map(str, args)])
        assert result.exit_code != 0 and message in str(result.exception), (args, result.output)


def test_moe_all_to_all_runs_as_sendrecv_and_is_ep(tmp_path: Path) -> None:
    """DeepSeek-V3 reduced (EP2 x DP16 x PP2): all-to-all is ncclDevKernel_SendRecv under nccl:all_to_all, and the
    breakdown charges it to EP, exactly as the truth does."""
    out, db = tmp_path / "moe", tmp_path / "moe.duckdb"
    invoke("synth", ROOT / "examples" / "deepseek_v3_reduced.yaml", out, "--steps", 2, "--kernel-us", 500)
    invoke("ingest", out / "traces", "--db", db, "--layout", "tp=1,dp=16,ep=2,pp=2")
    truth = json.loads((out / "truth.json").read_text())
    ops = views(db, "SELECT DISTINCT dim, op, split_part(e.name, '(', 1) AS kernel FROM collectives c "
                    "JOIN device_events e USING (run_id, rank, event_id) WHERE dim = 'EP'")
    assert ops.rows() == [("EP", "AllToAll", "ncclDevKernel_SendRecv")]
    diff = compare(truth, db)
    assert diff.select(pl.max_horizontal(COLUMNS).max()).item() <= 1
    assert pl.DataFrame(truth["steps"])["EP_WAIT_ns"].sum() > 1e9


@pytest.mark.parametrize("ranks_per_host", [8, 4])
def test_hosts_linked_through_other_hosts_or_the_pipeline_are_aligned(tmp_path: Path, ranks_per_host: int) -> None:
    """Megatron's default order puts pp outermost: stage 1 (ranks 8-15) shares no collective with stage 0, and
    reaches rank 0's host only through pipeline sends and receives; with 4 GPUs per host, host 3 meets rank 0's host
    only through hosts 1 and 2. Before Send/Recv pairs and chains of hosts were used, these hosts kept Kineto's coarse
    offset: ranks off by 18 µs (2 hosts of 8 GPUs) and 5.5 µs (4 hosts of 4) without device skew, 8.6 µs with
    it (61 µs and 2.3 ms before per-rank alignment existed)."""
    out, db = tmp_path / "run", tmp_path / "run.duckdb"
    invoke("synth", CONFIG, out, "--ranks", 16, "--steps", 2, "--kernel-us", 100, "--ranks-per-host", ranks_per_host,
           "--host-skew-us", 3000, "--device-skew-us", 20)
    output = invoke("ingest", out / "traces", "--db", db, "--layout", LAYOUT)
    assert "hosts aligned onto node0000's clock by collective and send/recv end times" in output
    assert_offsets_recovered(json.loads((out / "truth.json").read_text()), db)
