"""`traceana mcp`'s start: anything wrong before serving is one line on stderr and exit 2, with nothing on stdout
(the protocol's stream), whether the extra is missing, the store is, or a path given at start is not usable."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.conftest import one_line, run_main
from traceana import store


def test_without_the_extra_it_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delitem(sys.modules, "traceana.mcp.server", raising=False)
    monkeypatch.setitem(sys.modules, "mcp.server", None)  # what an environment without the SDK gives the import
    code, out, err = run_main("mcp", "--db", tmp_path / "none.duckdb")
    assert out == "" and "pip install 'traceana[mcp]'" in one_line(code, err)


@pytest.mark.parametrize(("args", "fragment"), [
    (("--db", "{tmp}/none.duckdb"), "none.duckdb: no such database"),
    ((), "s.duckdb: the database holds no runs yet"),
    (("--output-dir", "{tmp}/absent"), "--output-dir {tmp}/absent: not a folder"),
    (("--config", "{tmp}/absent.yaml"), "--config {tmp}/absent.yaml: no such file"),
])
def test_a_bad_start_is_one_line_and_exit_2(tmp_path: Path, args: tuple[str, ...], fragment: str) -> None:
    pytest.importorskip("mcp", reason="the mcp extra is not installed (pip install 'traceana[mcp]')")
    db = tmp_path / "s.duckdb"
    with store.connect(db):  # a store without runs: the paths are checked first, the store after them
        pass
    code, out, err = run_main("mcp", "--db", db, *[a.format(tmp=tmp_path) for a in args])
    assert out == "" and fragment.format(tmp=tmp_path) in one_line(code, err)
