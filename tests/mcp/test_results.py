"""Results fit a model's context: every tool's default answer on a 64-rank synthesized run is under 20 kB, lists are
cut to ``top`` with a note that says so, and numbers are rounded, NaN as null (NaN is not JSON: json.dumps with
allow_nan=False would fail the call instead)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from tests.conftest import ROOT, ingested, run_main
from traceana.mcp.results import Result

CONFIG = ROOT / "examples" / "synth_gpt_tp2pp2.yaml"
LIMIT = 20_000  # bytes of a tool's text, the JSON the model reads


def test_rows_are_cut_to_top_with_a_note_and_keep_their_order() -> None:
    frame = pl.DataFrame({"rank": [0, 1, 2, 3], "TOTAL_ms": [1.0, 4.0, float("nan"), 3.0]})
    result = Result(run_id="r")
    result.rows("ranks", frame, 2, keep="TOTAL_ms")
    payload = json.loads(result.to_json())
    assert [r["rank"] for r in payload["ranks"]] == [1, 3]  # the two largest finite, in rank order
    assert payload["notes"] == ["ranks: 2 of 4 rows shown, the largest TOTAL_ms (pass a larger top)"]
    result = Result()
    result.rows("r", pl.DataFrame({"e": [-5.0, 1.0, 2.0]}), 1, keep="e", magnitude=True)
    assert json.loads(result.to_json())["r"] == [{"e": -5.0}]
    assert "the largest |e| (pass a larger top)" in json.loads(result.to_json())["notes"][0]


def test_floats_are_rounded_and_nan_is_null() -> None:
    result = Result(a=123456.789, b=float("nan"), c=[0.000123456, float("inf")], d={"e": 2.0 / 3}, n=7)
    result.rows("rows", pl.DataFrame({"x": [1.23456, float("nan")]}), 10)
    assert json.loads(result.to_json()) == {"a": 123500.0, "b": None, "c": [0.0001235, None], "d": {"e": 0.6667},
                                            "n": 7, "rows": [{"x": 1.235}, {"x": None}]}
    assert "notes" not in json.loads(result.to_json())


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"  # as the stdio server runs (tests/mcp/test_stdio.py); trio ran the same calls a second time


@pytest.fixture(scope="module")
def synth64(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A 64-rank synthesized run (TP2 x PP2 x DP16, two steps) in a store, and an --output-dir holding the
    estimator YAMLs that describe it (dp 16) and another layout (tp 4, dp 8) for predict."""
    root = tmp_path_factory.mktemp("synth64")
    code, _, err = run_main("synth", CONFIG, root / "traces", "--ranks", 64, "--steps", 2, "--kernel-us", 2000)
    assert code == 0, err
    db = ingested(root / "s.duckdb", {"synth64": (root / "traces" / "traces", None)})
    out = root / "out"
    out.mkdir()
    text = CONFIG.read_text()
    (out / "a.yaml").write_text(text.replace("dp: 2, zero: 1, micro_batch: 1, global_batch: 16",
                                             "dp: 16, zero: 1, micro_batch: 1, global_batch: 128"))
    (out / "b.yaml").write_text(text.replace("tp: 2, pp: 2, dp: 2, zero: 1, micro_batch: 1, global_batch: 16",
                                             "tp: 4, pp: 2, dp: 8, zero: 1, micro_batch: 1, global_batch: 128"))
    return db, out


@pytest.mark.anyio
async def test_every_tool_answers_64_ranks_in_under_20_kB(synth64: tuple[Path, Path]) -> None:
    pytest.importorskip("mcp", reason="the mcp extra is not installed (pip install 'traceana[mcp]')")
    from mcp import Client

    from traceana.api import Traces
    from traceana.mcp.tools import TOOLS

    db, out = synth64
    arguments: dict[str, dict[str, Any]] = {
        "diff": {"run_a": "synth64", "run_b": "synth64"}, "whatif": {"changes": ["dim=TP:0.5"]},
        "predict": {"config": str(out / "a.yaml"), "to": str(out / "b.yaml")}, "sql": {"query": "FROM device_events"},
        "report": {"file_name": "r.html"}}
    sizes, cut = {}, set()
    async with Client(Traces(db).mcp_server(out)) as client:  # the Python API's way in
        for tool in TOOLS:
            if tool == "report" and not _has("bokeh"):
                continue
            result = await client.call_tool(tool, arguments.get(tool, {}))
            text = result.content[0].text
            sizes[tool] = len(text.encode())
            if tool == "memory":  # the synthesizer samples no memory: the tool says so, in one line
                assert result.is_error and "no memory samples" in text
                continue
            assert not result.is_error, text
            payload = json.loads(text)
            assert payload.get("run_id", payload.get("run_a")) in ("synth64", None)
            cut.update(tool for note in payload.get("notes", []) if " shown" in note)
    assert max(sizes.values()) < LIMIT, sizes
    assert {"info", "breakdown", "critical_path", "comm", "idle", "replay", "whatif", "sql"} <= cut  # 64 rows > top


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None

