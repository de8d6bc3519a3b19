"""The rich tables every command prints: counts as integers, and a table wider than the terminal in parts that
keep every number whole."""

from __future__ import annotations

import io

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
    # `idle` printed its gaps (a mean over steps) as "960.000", `diff` its bytes as "8,388,608.0"
    console.emit(pl.DataFrame({"gaps": [960.0, 1054.0], "bytes": [8388608.0, 524288.0], "ms": [1.5, 2.0]}))
    text = screen.getvalue()
    assert "960 " in text and "1,054 " in text and "8,388,608 " in text and "524,288 " in text
    assert "960.000" not in text and "8,388,608.0" not in text
    assert "1.500" in text and "2.000" in text  # a column with a fraction keeps its decimals on every row


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
