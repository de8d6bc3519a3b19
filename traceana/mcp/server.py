"""`traceana mcp`: the Model Context Protocol server (the official SDK's MCPServer, over stdio) on one store.

Tools (traceana/mcp/tools.py) answer in compact JSON; a user mistake (TraceanaError, a DuckDB error) becomes an MCP
tool error carrying the one line the CLI would print, so a bad call never ends the server. Sync tools run on the
SDK's worker threads, each with its own read-only connection; at most CONCURRENT run at once (the rest queue), which
bounds memory on a large store. Resources give the schema and every view's documented columns for `sql`.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb
from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

from traceana.errors import TraceanaError
from traceana.mcp.tools import TOOLS, Tools
from traceana.store import schema

if TYPE_CHECKING:
    from traceana.api import Traces

CONCURRENT = 2
INSTRUCTIONS = """traceana's store of distributed-training traces: every rank of each run, with its parallel
coordinates (tp cp ep dp pp), process groups by dim, steps, device events, collectives matched across ranks. Every
tool is read-only. Call `runs` first (run ids), then `breakdown` (where step time went), then `stragglers`,
`critical_path`, `comm`, `kernels`, `idle`; `advise` ranks concrete changes by predicted gain, `whatif` checks one.
Ranks are GPUs (processes); steps are training iterations: never confuse the two. Times are ms where a field says
_ms, ns where _ns. Lists are cut to `top` rows with a note; use `sql` only for what no tool answers (resource
traceana://schema and traceana://views list its tables and views)."""
DIAGNOSE = """Diagnose run {run_id} of the traceana store, with numbers and units from the tools, in this order:
1. `breakdown` (run_id={run_id}, by="stage", then by="rank"): the typical step's TOTAL and its split into COMP,
   each dimension's exposed communication wait and IDLE; which part and which ranks or stages dominate.
2. `stragglers`: the straggler stage, ranks slower than their stage, and the ranks others waited for.
3. `critical_path`: what set the step's length (kinds, ranks, the longest segments), and how much communication on
   it was exposed.
4. `advise`: the ranked changes with predicted gain and error bar; check the best one with `whatif`.
Report the three most useful findings, each with its evidence (tool, numbers) and the change to try."""


def build_server(traces: Traces, output_dir: Path | None = None, configs: tuple[Path, ...] = ()) -> MCPServer:
    """The server over the store ``traces`` opened; files as Tools allows (``configs`` readable, ``output_dir`` for
    reports)."""
    server = MCPServer("traceana", version=version("traceana"), instructions=INSTRUCTIONS)
    tools = Tools(traces, output_dir, configs)
    slots = threading.BoundedSemaphore(CONCURRENT)
    writes = ("report",)
    for name in TOOLS:
        server.add_tool(_one_line_errors(getattr(tools, name), slots), name=name, structured_output=False,
                        annotations=ToolAnnotations(read_only_hint=name not in writes, destructive_hint=False,
                                                    open_world_hint=False))

    @server.resource("traceana://schema", mime_type="text/plain", description="The store's tables: schema.sql.")
    def tables() -> str:
        return schema.schema_sql()

    @server.resource("traceana://views", mime_type="text/plain",
                     description="Every view the `sql` tool can read, with its documented columns and meaning.")
    def views() -> str:
        return "\n\n".join(_view_header(text) for text in schema.view_sql())

    @server.prompt(name="diagnose", description="Walk a run: breakdown, stragglers, critical path, advise.")
    def diagnose(run_id: str) -> str:
        return DIAGNOSE.format(run_id=run_id)

    return server


def _view_header(sql: str) -> str:
    """A queries/*.sql file's header comment (its view's name, columns and meaning), without the SQL."""
    header = itertools.takewhile(lambda line: line.startswith("--"), sql.splitlines())
    return "\n".join(line.removeprefix("--").removeprefix(" ") for line in header)


def _one_line_errors(tool: Callable[..., str], slots: threading.BoundedSemaphore) -> Callable[..., str]:
    """``tool`` with its calls queued on ``slots`` and the user's mistakes as tool errors of one line (the CLI's);
    SystemExit too, since raised on a worker thread it would end the server. Anything else is a bug: the SDK
    logs its traceback on stderr and tells the model only that the tool failed."""

    @functools.wraps(tool)
    def call(*args: object, **kwargs: object) -> str:
        with slots:
            try:
                return tool(*args, **kwargs)
            except TraceanaError as exc:
                raise ToolError(str(exc)) from None
            except duckdb.Error as exc:
                raise ToolError(f"query failed: {next(iter(str(exc).splitlines()), type(exc).__name__)}") from None
            except SystemExit as exc:
                raise ToolError(f"stopped (exit {exc.code})") from None

    return call
