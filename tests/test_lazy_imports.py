"""A command's fixed cost: `traceana --help` loads neither DuckDB, Polars, Matplotlib nor the estimator, and
`traceana runs` no Polars (they are imported where used; each is a tenth of a second or more to import)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT
from traceana import store

HEAVY = ("polars", "duckdb", "matplotlib", "numpy", "pyarrow", "traceana.estimator.estimate",
         "traceana.analyses.breakdown")
PROBE = """
import json, runpy, sys
sys.argv = ["traceana", *json.loads(sys.argv[1])]
try:
    runpy.run_module("traceana", run_name="__main__")
except SystemExit:
    pass
print(json.dumps(sorted(m for m in {heavy} if m in sys.modules)), file=sys.stderr)
"""


def loaded(*args: str) -> list[str]:
    """The heavy modules a command imported."""
    result = subprocess.run([sys.executable, "-c", PROBE.format(heavy=HEAVY), json.dumps(args)], cwd=ROOT,
                            capture_output=True, text=True, timeout=120)
    return json.loads(result.stderr.strip().splitlines()[-1])


def test_help_imports_nothing_heavy() -> None:
    assert loaded("--help") == []
    assert loaded("breakdown", "--help") == []


def test_runs_needs_duckdb_only(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    with store.connect(db) as con, store.transaction(con):  # an empty store
        pass
    assert loaded("runs", "--db", str(db)) == ["duckdb"]
