"""`traceana export --parquet DIR` and `traceana import-parquet DIR`: a store as a Parquet dataset and back."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from traceana import store
from traceana.cli import DbOption
from traceana.output import progress


def export(
    parquet: Annotated[Path, typer.Option("--parquet", help="Dataset folder to write (Hive-partitioned by run and "
                                          "rank, one folder per table).")],
    db: DbOption = Path(store.DEFAULT_DB),
    replace: Annotated[bool, typer.Option("--replace", help="Overwrite an existing dataset folder.")] = False,
) -> None:
    """Write every table of the store as Parquet (all or nothing: a hidden folder renamed into place)."""
    from traceana import parquet as dataset

    with store.connect(db, read_only=True, views=False) as con, progress(None, "exporting") as advance:
        counts = dataset.export(con, parquet, replace, advance)
    typer.echo(f"{db} -> {parquet}: " + ", ".join(f"{t} {n:,}" for t, n in counts.items()))


def import_parquet(
    source: Annotated[Path, typer.Argument(help="Dataset folder written by `traceana export --parquet`.")],
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """Read a Parquet dataset into the store, replacing the runs and estimates it holds (one transaction)."""
    from traceana import parquet as dataset

    with store.connect(db) as con, progress(None, "importing") as advance:
        counts = dataset.import_dataset(con, source, advance)
    typer.echo(f"{source} -> {db}: " + ", ".join(f"{t} {n:,}" for t, n in counts.items()))
