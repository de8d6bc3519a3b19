"""The validation pairs (sample_traces/pairs/): the manifest agrees with the files, and each knob is in the traces.

The knobs are read back from the raw JSON with the standard library, not through traceana: the straggler rank's
product FLOPs (aten::mm Input Dims), the DP all-reduce's elements (gloo:all_reduce Input Dims), the host sleep (the
main thread idle at each step's start), the pipeline's sends per step, the TP all-reduce's tokens, the MoE splits.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import importlib.util
import json
import math
import statistics
import sys
from collections import Counter, defaultdict
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAIRS = ROOT / "sample_traces" / "pairs"
_spec = importlib.util.spec_from_file_location("pairs_design", ROOT / "sample_traces" / "pairs_design.py")
design = sys.modules["pairs_design"] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(design)
CONFIGS = {c.name: c for c in design.configs_and_rows()[0]}


def _csv(name: str) -> list[dict[str, str]]:
    with (PAIRS / name).open(newline="") as f:
        return list(csv.DictReader(f))


MANIFEST, RECORDINGS = _csv("manifest.csv"), _csv("recordings.csv")


@cache
def _events(folder: str, rank: int) -> list[dict]:
    return json.loads(gzip.decompress((ROOT / folder / f"rank{rank}.json.gz").read_bytes()))["traceEvents"]


def _first(config: str) -> str:
    return next(r["path"] for r in RECORDINGS if r["config"] == config)


def _steps(events: list[dict]) -> list[dict]:
    return [e for e in events if e.get("name", "").startswith("ProfilerStep#")]


def _per_step(events: list[dict], name: str) -> list[list[dict]]:
    """The events called ``name`` inside each ProfilerStep (by start time)."""
    return [[e for e in events if e.get("name") == name and s["ts"] <= e["ts"] < s["ts"] + s["dur"]]
            for s in _steps(events)]


def test_every_recording_is_there_with_its_hash() -> None:
    assert RECORDINGS
    for r in RECORDINGS:
        files = dict(item.split("=") for item in r["sha256"].split(";"))
        assert sorted(files) == [f"rank{n}.json.gz" for n in range(int(r["ranks"]))], r["path"]
        for name, digest in files.items():
            assert hashlib.sha256((ROOT / r["path"] / name).read_bytes()).hexdigest() == digest, (r["path"], name)
        assert r["path"] == f"sample_traces/pairs/traces/{r['config']}/r{r['repeat']}"
    on_disk = {str(p.relative_to(ROOT)) for p in (PAIRS / "traces").glob("*/r*")}
    assert on_disk == {r["path"] for r in RECORDINGS}  # nothing recorded that the CSV leaves out


def test_every_group_has_three_recordings_a_side_and_one_split() -> None:
    repeats = Counter(r["config"] for r in RECORDINGS)
    splits: dict[str, set[str]] = defaultdict(set)
    for row in MANIFEST:
        assert repeats[row["A"]] >= 3 and repeats[row["B"]] >= 3, row["group"]
        assert row["layout"] == CONFIGS[row["A"]].layout and row["layout_B"] == CONFIGS[row["B"]].layout
        if row["family"] == "predict":
            assert (ROOT / row["config_A"]).is_file() and (ROOT / row["config_B"]).is_file(), row["group"]
            assert not row["change"]
        else:
            assert row["change"] and not row["config_A"]
        splits[row["group"]].add(row["split"])
        splits["base " + row["group"].split(":")[0]].add(row["split"])  # by base: a base's groups on one side
    assert all(len(s) == 1 for s in splits.values()), {g: s for g, s in splits.items() if len(s) > 1}
    sides = Counter(s.pop() for g, s in splits.items() if not g.startswith("base "))
    assert sides["calibrate"] and sides["check"]
    assert abs(sides["calibrate"] - sides["check"]) <= 0.2 * sum(sides.values())


def _mm_gflop(events: list[dict]) -> float:
    flop = 0
    for e in events:
        if e.get("name") == "aten::mm":
            (m, k), (_, n) = e["args"]["Input Dims"][:2]
            flop += 2 * m * k * n
    return flop / 1e9


@pytest.mark.parametrize("config", [n for n, c in CONFIGS.items() if c.straggler != 1])
def test_straggler_products_are_f_times_its_peers(config: str) -> None:
    folder, c = _first(config), CONFIGS[config]
    slow, peer = (_mm_gflop(_events(folder, r)) for r in (design.STRAGGLER_RANK, 1 - design.STRAGGLER_RANK))
    assert slow / peer == pytest.approx(c.straggler, rel=1e-9)
    # the peer does what the base's ranks do
    assert peer == pytest.approx(_mm_gflop(_events(_first(config.rsplit("_", 1)[0]), 0)), rel=1e-9)


@pytest.mark.parametrize("config", [n for n, c in CONFIGS.items() if c.family == "dp2" and c.straggler == 1
                                    and c.host_ms == 0])
def test_dp_all_reduce_carries_the_payload(config: str) -> None:
    c = CONFIGS[config]
    for rank in (0, 1):
        reduces = _per_step(_events(_first(config), rank), "gloo:all_reduce")
        assert [len(s) for s in reduces] == [1] * 8
        numel = {math.prod(s[0]["args"]["Input Dims"][0]) for s in reduces}
        assert numel == {round(4 * c.width**2 * c.payload)}  # W1 [2D, D] + W2 [D, 2D] as one bucket, a fraction


@pytest.mark.parametrize("config", [n for n, c in CONFIGS.items() if c.host_ms or n.endswith("_null")])
def test_host_delay_is_idle_at_each_step_start(config: str) -> None:
    c = CONFIGS[config]
    for rank in (0, 1):
        events = _events(_first(config), rank)
        ops = [e for e in events if e.get("cat") == "cpu_op" and e.get("tid") == _steps(events)[0]["tid"]]
        idle_ms = [(min(e["ts"] for e in ops if s["ts"] < e["ts"] < s["ts"] + s["dur"]) - s["ts"]) / 1e3
                   for s in _steps(events)]
        assert len(idle_ms) == 8
        if c.host_ms:
            assert min(idle_ms) >= c.host_ms  # a sleep never returns early
            assert statistics.median(idle_ms) < c.host_ms + 2
        else:
            assert max(idle_ms) < 1


@pytest.mark.parametrize("config", [n for n, c in CONFIGS.items() if c.family == "pp2"])
def test_pipeline_sends_per_step_are_the_micro_batches(config: str) -> None:
    m = CONFIGS[config].micro_batches
    for rank in (0, 1):
        events = _events(_first(config), rank)
        assert [len(s) for s in _per_step(events, "c10d::send")] == [m] * 8
        assert [len(s) for s in _per_step(events, "c10d::recv_")] == [m] * 8


@pytest.mark.parametrize("config", [n for n, c in CONFIGS.items() if c.family == "tp2"])
def test_tp_takes_the_tokens_of_both_dp_replicas(config: str) -> None:
    c = CONFIGS[config]
    dp = design.dp_base(c.width, c.tokens // 2)
    for rank in (0, 1):
        tp_dims = {str(e["args"]["Input Dims"]) for e in _events(_first(config), rank)
                   if e.get("name") == "gloo:all_reduce" and e["args"]["Input Dims"][0] == [c.tokens, c.width]}
        assert tp_dims  # the row-parallel output [2T, D], forward and backward
        x = [e for e in _events(_first(dp.name), rank) if e.get("name") == "aten::randn"]
        assert len(x) == 8 and all(e["args"]["Concrete Inputs"][0] == f"[{dp.tokens}, {dp.width}]" for e in x)


@pytest.mark.parametrize("config", [n for n, c in CONFIGS.items() if c.family == "ep2"])
def test_moe_splits_are_the_routing(config: str) -> None:
    c = CONFIGS[config]
    for rank in (0, 1):
        calls = [e for e in _events(_first(config), rank) if e.get("name") == "c10d::alltoall_base_"]
        dispatch = [e["args"]["Concrete Inputs"][4] for e in calls]
        assert len(calls) == 4 * 8 and f"[{c.splits[0]}, {c.splits[1]}]" in dispatch
