"""--comm-scale: one dim's transfers take a factor longer, the compute draws stay the same.

Tolerance, derived: a scaled transfer is within 3 ns of twice the unscaled one: both are ``rint(planned * c)`` with
the same jitter factor ``c`` in [0.5, 2], the scaled planned length itself rounded once more (``rint(2 p)``):
0.5 ns + 0.5 c ns + 1 ns at most.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
from typer.testing import CliRunner

from tests.conftest import ROOT
from traceana.cli.main import app
from traceana.synth import schedule

CONFIG = ROOT / "examples" / "synth_gpt_tp2pp2.yaml"


def test_comm_scale_doubles_tp_transfers_and_keeps_the_compute_draws() -> None:
    """--comm-scale TP=2 (half the TP bandwidth), same seed: every compute kernel is as long as without it, every TP
    all-reduce's transfer time (end less the last member's arrival) twice as long within the rounding above, DP
    reduce-scatters' unchanged; the step is longer."""
    def group_of(plan: schedule.Plan, dim: str) -> dict[int, int]:
        return {r: g for g, ranks in enumerate(plan.groups[dim]) for r in ranks}

    def ops(comm_scale: tuple[tuple[str, float], ...]) -> tuple[pl.DataFrame, int]:
        plan = schedule.load(str(CONFIG), schedule.Options(ranks=8, steps=2, comm_scale=comm_scale))
        tp, dp = group_of(plan, "TP"), group_of(plan, "DP")
        frame = pl.concat([t.ops.with_columns(rank=pl.lit(t.rank), stage=pl.lit(t.stage),
                                              group=pl.when(pl.col("dim") == 0).then(tp[t.rank]).otherwise(dp[t.rank]))
                           for t in plan.stage_traces()])
        arrival = pl.col("start_ns").max().over("stage", "step", "op", "group")
        frame = frame.with_columns(pl.when(pl.col("code") == schedule.COLLECTIVE).then(pl.col("end_ns") - arrival)
                                   .otherwise(pl.col("end_ns") - pl.col("start_ns")).alias("t"))
        return frame.select("rank", "step", "op", "code", "dim", "t"), int(plan.coupling.step_starts_ns[1])

    (base, step_base), (scaled, step_scaled) = ops(()), ops((("TP", 2.0),))
    both = base.join(scaled, on=["rank", "step", "op"], suffix="_2")
    assert both.height == base.height == scaled.height
    compute = both.filter(pl.col("code") == schedule.COMPUTE)
    assert compute.height > 1000 and (compute["t"] == compute["t_2"]).all()
    tp = both.filter((pl.col("code") == schedule.COLLECTIVE) & (pl.col("dim") == schedule.DIMS.index("TP")))
    assert tp.height > 100 and (tp["t_2"] - 2 * tp["t"]).abs().max() <= 3
    others = both.filter((pl.col("code") == schedule.COLLECTIVE) & (pl.col("dim") == schedule.DIMS.index("DP")))
    assert others.height > 10 and (others["t"] == others["t_2"]).all()
    assert step_scaled > step_base


def test_comm_scale_is_a_cli_option(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["synth", str(CONFIG), str(tmp_path / "run"), "--ranks", "8", "--steps", "1",
                                      "--comm-scale", "tp=2,PP=1.5"])
    assert result.exit_code == 0, result.output
    truth = json.loads((tmp_path / "run" / "truth.json").read_text())
    assert truth["options"]["comm_scale"] == [["TP", 2.0], ["PP", 1.5]]
    result = CliRunner().invoke(app, ["synth", str(CONFIG), str(tmp_path / "x"), "--comm-scale", "XP=2"])
    assert result.exit_code != 0 and "--comm-scale XP=2" in str(result.exception)
