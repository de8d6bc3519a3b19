"""The report's "Time by op, module and layer" section: `traceana ops` at each level the run has, as sortable
tables (every row kept), coarsest first, so a reader goes from a layer to its modules, ops and their top kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING

from traceana.analyses.ops import LEVELS
from traceana.errors import TraceanaError

if TYPE_CHECKING:
    from traceana.render.report.run import Context

ORDER = ("layer", "module", "nvtx", "op")  # coarse to fine


def section(ctx: Context) -> str | None:
    """None where the run has no level (CPU-only runs, stores older than event_scopes)."""
    from traceana.analyses.ops import levels

    try:
        have = ctx.traces.read(ctx.run, levels)
    except TraceanaError:
        return None
    tables = [ctx.page.table(ctx.traces.ops(by=level, run=ctx.run),
                             f"device time by {level} (ms per rank-step, {ctx.which}); rows add up to COMP and the "
                             "waits, (none) is what no range claims; as `traceana ops --by " + level + "`")
              for level in ORDER if level in have and level in LEVELS]
    return "".join(tables) or None
