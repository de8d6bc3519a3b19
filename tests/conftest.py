"""Shared test helpers: where the shared real traces live, and running the CLI as a user does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
TRACES = SHARED / "traces"
SAMPLES = ROOT / "sample_traces" / "traces"


def run_cli(*args: object, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run `python -m traceana ARGS` in a subprocess; with check, fail the test on a non-zero exit."""
    result = subprocess.run([sys.executable, "-m", "traceana", *map(str, args)], capture_output=True, text=True,
                            cwd=ROOT, timeout=600)
    if check and result.returncode != 0:
        pytest.fail(f"traceana {' '.join(map(str, args))} exited {result.returncode}:\n{result.stderr}")
    return result


@pytest.fixture
def cli():
    return run_cli
