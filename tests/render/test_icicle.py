"""The report's icicle (traceana/render/report/icicle.py): every node's children tile it exactly, so the widths are
the ops rows' times; a node keeps its largest children and says how many the "other" node holds."""

from __future__ import annotations

import itertools

import polars as pl
import pytest

from traceana.render.report import icicle

PARTS = [f"{p}_ms" for p in icicle.PARTS]


def leaves(rows: list[tuple[str | None, str | None, str, float, float]]) -> pl.DataFrame:
    """(path, op, kernel, COMP ms, DP wait ms) rows as analyses/ops.py ``tree`` gives them."""
    return pl.DataFrame([{"path": p, "op": o, "kernel": k, "kernels": 1.0, **dict.fromkeys(PARTS, 0.0),
                          "COMP_ms": comp, "DP_WAIT_ms": dp} for p, o, k, comp, dp in rows])


def test_children_tile_their_node_and_the_root_is_the_whole() -> None:
    frame = leaves([("GPT_0 / Block_0 / MLP_0", "aten::mm", "gemm", 3.0, 0.0),
                    ("GPT_0 / Block_0", "aten::add", "add", 1.0, 0.0),
                    ("GPT_0 / Block_1 / MLP_1", "aten::mm", "gemm", 2.5, 0.5),
                    (None, "c10d::allreduce_", "nccl", 0.0, 4.0),
                    (None, None, "memcpy", 0.25, 0.0)])
    assert icicle.levels(frame, "module") == ["module 1", "module 2", "module 3", "op", "kernel"]
    nodes = icicle.nodes(frame)
    root = nodes.row(0, named=True)
    assert (root["level"], root["x0"], root["x1"]) == (0, 0.0, pytest.approx(11.25))
    for level in range(5):
        parents = nodes.filter(pl.col("level") == level).iter_rows(named=True)
        kids = nodes.filter(pl.col("level") == level + 1)
        for parent in parents:
            inside = kids.filter((pl.col("x0") >= parent["x0"] - 1e-12) & (pl.col("x1") <= parent["x1"] + 1e-12))
            spans = sorted(zip(inside["x0"], inside["x1"], strict=True))
            assert spans[0][0] == pytest.approx(parent["x0"]) and spans[-1][1] == pytest.approx(parent["x1"])
            assert all(a[1] == pytest.approx(b[0]) for a, b in itertools.pairwise(spans))
    named = {r["where"]: r for r in nodes.iter_rows(named=True)}
    # largest first; a path shorter than the rows goes on as "(self)"; no path at all is "(none)"
    assert [r["name"] for r in nodes.filter(pl.col("level") == 1).iter_rows(named=True)] == ["GPT_0", "(none)"]
    assert named["GPT_0 › Block_0"]["ms"] == 4.0 and named["GPT_0 › Block_0 › (self)"]["ms"] == 1.0
    # the colour is the part most of the node's time is: the all-reduce's exposed DP wait
    allreduce = named["(none) › (self) › (self) › c10d::allreduce_"]
    assert allreduce["part"] == "DP_WAIT" and allreduce["color"] == icicle.PART_COLORS["DP_WAIT"]
    assert named["(none) › (self) › (self) › (none)"]["part"] == "COMP"  # the memcpy


def test_a_node_keeps_its_largest_children_and_sums_the_rest() -> None:
    frame = leaves([(f"layers.{i}", "aten::mm", "gemm", 1.0 + i / 100, 0.0) for i in range(icicle.TOP + 6)]
                   + [("tiny", "aten::mm", "gemm", 1e-4, 0.0)])
    level = icicle.nodes(frame).filter(pl.col("level") == 1)
    assert level.height == icicle.TOP + 1 and level["name"][-1] == "other (7)"
    assert level["name"][0] == f"layers.{icicle.TOP + 5}"  # the largest
    assert level["ms"].sum() == pytest.approx(frame["COMP_ms"].sum())
    assert not icicle.nodes(frame).filter(pl.col("name").str.starts_with("other") & (pl.col("level") > 1)).height
