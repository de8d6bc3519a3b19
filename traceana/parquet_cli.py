"""`traceana import-parquet DIR`: a Parquet dataset written by `traceana export --parquet` back into a store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from traceana import store
from traceana.cli import DbOption
from traceana.output import progress


def import_parquet(
    source: Annotated[Path, typer.Argument(help="Dataset folder written by `traceana export --parquet`.")],
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """Read a Parquet dataset into the store, replacing the runs and estimates it holds (one transaction)."""
    from traceana import parquet as dataset

    with store.connect(db) as con, progress(None, "importing") as advance:
        counts = dataset.import_dataset(con, source, advance)
    typer.echo(f"{source} -> {db}: " + ", ".join(f"{t} {n:,}" for t, n in counts.items()))
