"""traceana: trace-driven analysis of distributed LLM training. ``traceana.open(db)`` is the Python API
(traceana/api.py); importing the package loads nothing else, so the CLI and notebooks start fast."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from traceana.api import Traces


def open(db: str | Path = "traceana.duckdb", run: str | None = None) -> Traces:
    """The store ``db`` opened read-only; methods give polars DataFrames (:class:`traceana.api.Traces`). The
    default is store.DEFAULT_DB, spelled out so that this import stays cheap."""
    from traceana.api import Traces

    return Traces(db, run)


def __getattr__(name: str) -> str:
    """``traceana.__version__``: the installed distribution's version, read from its metadata when first asked for
    (traceana/about.py)."""
    if name == "__version__":
        from traceana.about import version

        return version()
    raise AttributeError(f"module 'traceana' has no attribute {name!r}")
