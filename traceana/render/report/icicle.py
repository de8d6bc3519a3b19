"""The report's icicle of device time (analyses/ops.py ``tree``): all of it on top, then where it was launched, the
nn.Module or NVTX path element by element and the CPU op, down to the kernel; each node as wide as its time (COMP and
exposed waits, ms per rank-step) and coloured by the part most of it is, as every chart colours parts. Click a node
to zoom into it, so its descendants fill the width; click the top row (or reset) to see everything again.

Light on purpose: a node keeps its TOP largest children of at least MIN_SHARE of the whole, the rest summed into one
"other (N)" node without children, and paths are cut after PATH_LEVELS elements; the caption says so.
"""

from __future__ import annotations

import polars as pl
from bokeh.models import ColumnDataSource, CustomJS, HoverTool, TapTool
from bokeh.plotting import figure

from traceana.analyses.breakdown import WAITS, label
from traceana.analyses.ops import NONE
from traceana.render.colours import PART_COLORS

TOP, MIN_SHARE, PATH_LEVELS = 24, 0.002, 4
PARTS = ("COMP", *WAITS)
SELF = "(self)"  # under a path element: the time launched in it and in none of its children
CHAR_PX, WIDTH_PX = 7, 1100  # a label's character, and the chart's width before the page lays it out

# Zoom to the tapped node; on every change of the visible range, label the nodes wide enough to hold a few
# characters, cut to the room they have and placed at the visible part's left edge.
_TAP = """
const i = source.selected.indices[0];
source.selected.indices = [];
if (i === undefined) return;
fig.x_range.start = source.data.x0[i];
fig.x_range.end = source.data.x1[i];
"""
_LABELS = """
const d = source.data, start = fig.x_range.start, end = fig.x_range.end;
const px = (fig.inner_width || width) / Math.max(end - start, 1e-12);
const text = [], x = [];
for (let i = 0; i < d.name.length; i++) {
  const left = Math.max(d.x0[i], start), room = Math.floor((Math.min(d.x1[i], end) - left) * px / char) - 1;
  text.push(room < 3 ? "" : d.name[i].length <= room ? d.name[i] : d.name[i].slice(0, room - 1) + "…");
  x.push(left);
}
d.text = text; d.tx = x;
source.change.emit();
"""


def levels(leaves: pl.DataFrame, path: str = "path") -> list[str]:
    """The rows below the top one: ``path`` elements (as many as the longest path has, at most PATH_LEVELS) where
    some event has a path, the op where some event has one, the kernel."""
    depth = min(int(leaves["path"].str.split(" / ").list.len().max() or 0), PATH_LEVELS)
    return [f"{path} {i + 1}" for i in range(depth)] + (["op"] if leaves["op"].null_count() < leaves.height else []) \
        + ["kernel"]


def nodes(leaves: pl.DataFrame) -> pl.DataFrame:
    """One row per node: level (0 the whole), name, x0 and x1 (ms per rank-step, from the left), each part's ms,
    kernels, where (the names from the top, for the hover) and color."""
    rows = levels(leaves)
    depth = len(rows) - 1 - ("op" in rows)
    items = []
    for leaf in leaves.iter_rows(named=True):
        path = (leaf["path"].split(" / ")[:depth] if leaf["path"] else [NONE]) if depth else []
        keys = path + [SELF] * (depth - len(path))
        keys += ([leaf["op"] or NONE] if "op" in rows else []) + [leaf["kernel"] or NONE]
        items.append((keys, [leaf[f"{p}_ms"] for p in PARTS], leaf["kernels"]))
    total = sum(sum(parts) for _, parts, _ in items)
    out = [_node(0, "all device time", 0.0, [sum(p[i] for _, p, _ in items) for i in range(len(PARTS))],
                 sum(k for _, _, k in items), [])]
    _children(items, 0, 0.0, [], total, out)
    return pl.DataFrame(out)


def _node(level: int, name: str, x0: float, parts: list[float], kernels: float, where: list[str]) -> dict:
    time = sum(parts)
    main = max(range(len(PARTS)), key=lambda i: parts[i])
    return {"level": level, "name": name, "x0": x0, "x1": x0 + time, "ms": time, "kernels": kernels,
            **{f"{p}_ms": v for p, v in zip(PARTS, parts, strict=True)}, "where": " › ".join([*where, name]),
            "color": PART_COLORS[PARTS[main]], "part": label(PARTS[main])}


def _children(items: list, depth: int, x0: float, where: list[str], total: float, out: list[dict]) -> None:
    """The nodes under one node (its ``items``: leaves as (keys, parts, kernels)), largest first from ``x0``."""
    groups: dict[str, list] = {}
    for item in items:
        groups.setdefault(item[0][depth], []).append(item)
    sized = sorted(groups.items(), key=lambda g: (-sum(sum(p) for _, p, _ in g[1]), g[0]))
    kept = [g for i, g in enumerate(sized) if i < TOP and sum(sum(p) for _, p, _ in g[1]) >= MIN_SHARE * total]
    rest = [item for _, group in sized[len(kept):] for item in group]
    x = x0
    for name, group in kept:
        node = _node(depth + 1, name, x, [sum(p[i] for _, p, _ in group) for i in range(len(PARTS))],
                     sum(k for _, _, k in group), where)
        out.append(node)
        if depth + 1 < len(items[0][0]):
            _children(group, depth + 1, x, [*where, name], total, out)
        x = node["x1"]
    if rest:
        out.append(_node(depth + 1, f"other ({len(sized) - len(kept)})", x,
                         [sum(p[i] for _, p, _ in rest) for i in range(len(PARTS))], sum(k for _, _, k in rest),
                         where))


def _cut(name: str, px: float) -> str:
    """A label as the page's script writes it at the chart's first width (_LABELS): cut to its room, or none."""
    room = int(px // CHAR_PX) - 1
    return "" if room < 3 else name if len(name) <= room else name[:room - 1] + "…"


def chart(leaves: pl.DataFrame, title: str, path: str = "path") -> figure:
    """The icicle of ``leaves`` (analyses/ops.py ``tree``), rows named on the left (``path``: what the paths are,
    module or NVTX), zoom on tap."""
    frame = nodes(leaves)
    rows = ["all", *levels(leaves, path)]
    span = max(frame["x1"].max(), 1e-9)
    fig = figure(height=90 + 46 * len(rows), title=title, sizing_mode="stretch_width", toolbar_location="above",
                 tools="reset,save", x_range=(0, span), y_range=(len(rows), 0))
    data = {c: frame[c].to_list() for c in frame.columns}
    source = ColumnDataSource(data | {"text": [_cut(n, (b - a) / span * WIDTH_PX) for n, a, b in
                                               zip(data["name"], data["x0"], data["x1"], strict=True)],
                                      "tx": data["x0"],
                                      "top": [lv + 0.04 for lv in data["level"]],
                                      "bottom": [lv + 0.96 for lv in data["level"]],
                                      "ty": [lv + 0.5 for lv in data["level"]]})
    boxes = fig.quad(left="x0", right="x1", top="top", bottom="bottom", source=source, fill_color="color",
                     line_color="white", line_width=1, nonselection_fill_alpha=1.0, selection_fill_alpha=1.0)
    fig.text(x="tx", y="ty", text="text", source=source, text_font_size="11px", text_baseline="middle",
             x_offset=3, text_color="#111111")
    fig.add_tools(HoverTool(renderers=[boxes], tooltips=[
        ("", "@where"), ("time", "@ms{0,0.000} ms per rank-step"), ("mostly", "@part"),
        ("COMP", "@COMP_ms{0,0.000} ms"), ("kernels", "@kernels{0,0.0} per rank-step")]))
    fig.add_tools(TapTool(renderers=[boxes]))
    relabel = CustomJS(args={"source": source, "fig": fig, "width": WIDTH_PX, "char": CHAR_PX}, code=_LABELS)
    source.selected.js_on_change("indices", CustomJS(args={"source": source, "fig": fig}, code=_TAP))
    fig.x_range.js_on_change("start", relabel)
    fig.x_range.js_on_change("end", relabel)
    fig.yaxis.ticker = [i + 0.5 for i in range(len(rows))]
    fig.yaxis.major_label_overrides = {i + 0.5: name for i, name in enumerate(rows)}
    fig.xaxis.axis_label = "ms per rank-step (click a node to zoom into it, the top row to zoom out)"
    fig.ygrid.visible = False
    return fig
