"""`traceana mcp`: serve the store to an assistant over the Model Context Protocol (stdio). The server
(traceana/mcp/server.py) and the SDK are imported here, on use: `traceana --help` pays for neither."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from traceana import store
from traceana.cli.options import DbOption
from traceana.errors import TraceanaError


def mcp(
    db: DbOption = Path(store.DEFAULT_DB),
    output_dir: Annotated[Path | None, typer.Option("--output-dir", help="Folder the report tool writes into; "
                                                    "estimator YAMLs under it are readable too.")] = None,
    config: Annotated[list[Path] | None, typer.Option("--config", help="An estimator YAML the advise, predict and "
                                                      "report tools may read. Repeat for more.")] = None,
) -> None:
    """Serve the store over the Model Context Protocol on stdin/stdout, read-only: one tool per analysis, SQL,
    the schema as resources, a "diagnose" prompt. Register it with an MCP client (docs/mcp.md)."""
    from traceana.api import Traces

    try:
        from traceana.mcp.server import build_server
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] not in ("mcp", "mcp_types", "pydantic"):
            raise
        raise TraceanaError("traceana mcp needs the MCP SDK: pip install 'traceana[mcp]'") from None
    if output_dir is not None and not output_dir.is_dir():
        raise TraceanaError(f"--output-dir {output_dir}: not a folder")
    for path in config or []:
        if not path.is_file():
            raise TraceanaError(f"--config {path}: no such file")
    Traces(db)  # a missing or empty store: one line now, not a server that fails every call
    build_server(db, output_dir, tuple(config or ())).run()  # stdio; nothing may reach stdout before this
