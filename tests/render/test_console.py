"""The rich tables every command prints: counts as integers, one number of decimals per column, bytes in the unit
their magnitude calls for, and a table wider than the terminal in parts that keep every number whole."""

from __future__ import annotations

import io
import json

import polars as pl
import pytest
from rich.console import Console

from traceana.render import console


@pytest.fixture
def screen(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    """The module's console as an 80-column terminal writing into a buffer."""
    out = io.StringIO()
    monkeypatch.setattr(console, "console", Console(file=out, width=80, color_system=None))
    return out


def test_whole_floats_print_as_integers(screen: io.StringIO) -> None:
    # `idle` printed its gaps (a mean over steps) as "960.000"
    console.emit(pl.DataFrame({"gaps": [960.0, 1054.0], "ms": [1.5, 2.0]}))
    text = screen.getvalue()
    assert "960 " in text and "1,054 " in text and "960.0" not in text
    assert "1.5 " in text and "2.0 " in text  # a column with a fraction keeps its decimals on every row


def test_one_number_of_decimals_per_column(screen: io.StringIO) -> None:
    # a column printed 71.79, 126.0 and 7.655 (4 significant digits each); its smallest value sets the decimals
    console.emit(pl.DataFrame({"ms": [71.79, 126.0, 7.655], "big_ms": [1672.84, 3195.51, 100.07],
                               "tiny_ms": [0.0123, 512.0, 0.0], "half_ms": [1.5, 0.25, 3.0]}))
    rows = [line.split("│")[1:-1] for line in screen.getvalue().splitlines() if line.startswith("│")]
    assert [[c.strip() for c in row] for row in rows] == [["71.79", "1,672.8", "0.012", "1.50"],
                                                          ["126.00", "3,195.5", "512.000", "0.25"],
                                                          ["7.66", "100.1", "0.000", "3.00"]]


def test_whole_counts_print_as_integers_beside_fractions(screen: io.StringIO) -> None:
    # `diff` printed calls_A "1.000" beside calls_B "8": calls per rank-step are whole on most rows
    console.emit(pl.DataFrame({"calls_A": [1.0, 1.5, 0.5], "calls_B": [8.0, 6.0, 2.0],
                               "calls_delta_pct": [700.0, 300.5, 300.0]}))
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in screen.getvalue().splitlines()
            if line.startswith("│")]
    assert rows == [["1", "8", "700.0"], ["1.5", "6", "300.5"], ["0.5", "2", "300.0"]]


def test_bytes_in_the_unit_their_magnitude_calls_for(screen: io.StringIO, capsys: pytest.CaptureFixture) -> None:
    # `comm` and `info` printed 33554432: one binary unit for the table's byte columns, named in the header
    frame = pl.DataFrame({"op": ["AllReduce", "Send"], "size_bytes": [33554432, 8388608],
                          "assumed_bytes": [0, 4194304], "bytes_delta_pct": [12.5, 0.0]})
    console.emit(frame)
    text = screen.getvalue()
    header = next(line for line in text.splitlines() if line.startswith("┃"))
    assert "size_MiB" in header and "assumed_MiB" in header and "bytes_delta_pct" in header
    assert "bytes ┃" not in header and "size_bytes" not in header
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines() if line.startswith("│")]
    assert rows == [["AllReduce", "32", "0", "12.5"], ["Send", "8", "4", "0.0"]]
    console.emit(pl.DataFrame({"bytes": [1536, 512]}))
    assert screen.getvalue().splitlines()[-5:-1] == ["┃ KiB ┃", "┡━━━━━┩", "│ 1.5 │", "│ 0.5 │"]
    console.emit(frame, fmt="json")  # display only: JSON keeps raw bytes
    assert json.loads(capsys.readouterr().out)[0]["size_bytes"] == 33554432
    console.emit(pl.DataFrame({"bytes": [100, 12]}))  # under 1 KiB: bytes as they are
    assert screen.getvalue().splitlines()[-5:-1] == ["┃ bytes ┃", "┡━━━━━━━┩", "│   100 │", "│    12 │"]


def test_a_wide_table_prints_in_parts_with_its_keys(screen: io.StringIO) -> None:
    columns = {"rank": [0, 1], **{f"PART{i}_WAIT ms (%)": ["126.0 (34.7%)", "7.655 (2.1%)"] for i in range(8)}}
    console.emit(pl.DataFrame(columns), title="wide")
    lines = screen.getvalue().splitlines()
    assert max(map(len, lines)) <= 80
    headers = [line for line in lines if line.startswith("┃")]
    parts = [i for i, line in enumerate(lines) if line.startswith("┏")]
    # a cell of 13 characters costs 16, the key column and the table's edge 8: 4 parts' columns fit in 80
    assert len(parts) == 2 and all(line.count("WAIT") == 4 for line in headers if "WAIT" in line)
    assert sum("rank" in line for line in headers) == len(parts)  # the key column in every part
    body = [line for line in lines if line.startswith("│")]
    assert sum(line.count("126.0 (34.7%)") for line in body) == 8  # no number cut or wrapped
    assert sum(line.count("7.655 (2.1%)") for line in body) == 8
    assert "wide (continued)" in screen.getvalue()


def test_a_part_that_fits_only_with_wrapped_headers_wraps_them(monkeypatch: pytest.MonkeyPatch) -> None:
    # `kernels --roofline` at 100 columns cut "compute" to "comput": its part fitted only with "total ms" wrapped,
    # and rich shrank a cell rather than wrap the header
    screen = io.StringIO()
    monkeypatch.setattr(console, "console", Console(file=screen, width=100, color_system=None))
    row = {"op: shapes": ["aten::_cudnn_attention_backward: 5 x 2x16x1024x128, 2x16x1024x1"], "calls": [32],
           "total ms": [3.045], "FLOP/B": [319.4], "TFLOP/s": [225.7], "GB/s": [706.7], "bound": ["compute"],
           "roof %": [22.82]}
    console.emit(pl.DataFrame(row))
    lines = screen.getvalue().splitlines()
    assert max(map(len, lines)) <= 100
    assert any("│ compute │" in line for line in lines) and any("total" in line for line in lines)
