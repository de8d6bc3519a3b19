"""`traceana report`: one self-contained HTML file about a measured run (traceana/render/html_report.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from traceana import store
from traceana.cli.options import DbOption, RunArgument


def report(
    html: Annotated[Path, typer.Option("--html", help="HTML file to write (self-contained: plots inline).")],
    run: RunArgument = None,
    estimate: Annotated[Path | None, typer.Option("--estimate", help="Job YAML: add estimate vs measured.")] = None,
    db: DbOption = Path(store.DEFAULT_DB),
) -> None:
    """Write a run's summary, stage and rank breakdowns with plots, stragglers, communication and, with
    --estimate, estimate vs measured into one HTML file to share."""
    from traceana.api import Traces
    from traceana.render.html_report import write

    traces = Traces(db, run)
    rid = traces.read(None, lambda _con, rid: rid)
    write(Traces(db, rid), rid, html, estimate)
    typer.echo(f"wrote {html} ({rid}; {html.stat().st_size / 1e6:.1f} MB)")
