"""The report's "Time by op, module and layer" section: an icicle from the module or NVTX path through the op to the
kernel that zooms into the node clicked (icicle.py), then `traceana ops` at each level the run has, as sortable
tables (every row kept), coarsest first, so a reader goes from a layer to its modules, ops and their top kernel."""

from __future__ import annotations

from typing import TYPE_CHECKING

from traceana import store
from traceana.analyses.ops import LEVELS

if TYPE_CHECKING:
    from traceana.render.report.run import Context

ORDER = ("layer", "module", "nvtx", "op")  # coarse to fine


def section(ctx: Context) -> str | None:
    """None where the run has no level (CPU-only runs, stores older than event_scopes). op_time is computed once
    for the section's reads (the levels, the icicle, a table per level: each two sweeps over every event) and
    dropped after."""
    import duckdb

    from traceana.analyses.ops import levels

    try:
        ctx.traces.read(ctx.run, lambda con, rid: store.materialize(con, "op_time", rid))
    except (duckdb.BinderException, duckdb.CatalogException):  # a store older than the columns op_time reads
        return None
    try:
        have = ctx.traces.read(ctx.run, levels)
        return _charts(ctx, have) if have else None
    finally:
        ctx.traces.read(ctx.run, lambda con, _: store.forget(con, "op_time"))


def _charts(ctx: Context, have: list[str]) -> str:
    from traceana.analyses.ops import tree
    from traceana.render.report import icicle

    leaves = ctx.traces.read(ctx.run, tree)
    path = "module" if "module" in have else "NVTX"
    chart = ctx.page.chart(icicle.chart(leaves, f"device time by where it was launched, {ctx.which}: click a node "
                                                "to zoom into it", path))
    rows = icicle.levels(leaves, path)
    paths = (f" {path} paths are cut after {icicle.PATH_LEVELS} ranges; \"{icicle.SELF}\" is time launched in a "
             "range and in none of the ranges inside it." if rows[0] != "op" and rows[0] != "kernel" else "")
    said = (f"<p class=note>Each row splits the one above: {', '.join(rows)}. A node keeps its {icicle.TOP} largest "
            f"children of at least {icicle.MIN_SHARE:.1%} of the whole, the rest summed into \"other (N)\".{paths} "
            "Colour: the part most of a node's time is.</p>")
    tables = [ctx.page.table(ctx.traces.ops(by=level, run=ctx.run),
                             f"device time by {level} (ms per rank-step, {ctx.which}); rows add up to COMP and the "
                             "waits, (none) is what no range claims; as `traceana ops --by " + level + "`")
              for level in ORDER if level in have and level in LEVELS]
    return chart + said + "".join(tables)
