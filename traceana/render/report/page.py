"""One self-contained HTML document: BokehJS and the data inline, no external URL, so the file opens offline and
can be mailed. Sections add HTML and charts to a Page; tables are sortable (click a header) and the rows and bars a
table or chart marks with ``pick`` filter every table that declares that key (a stage to its ranks, a rank to its
steps). The page fits 1,280 px without scrolling sideways: a sticky table of contents beside the sections, long
names (cuDNN and nvjet kernels) cut with the whole name on hover, a filter box over every long table.

Why Bokeh (README, "The interactive report"): its inline core is 1.3 MB of BSD-3 JavaScript shipped in the Python
wheel, against 4.8 MB for Plotly's only bundled build and a 34 MB converter for Vega-Lite's inline mode.
"""

from __future__ import annotations

import datetime as dt
import html
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

import polars as pl

from traceana.about import version
from traceana.errors import TraceanaError

# the keys rows and bars can be picked by, and the columns that carry them
PICK_COLUMNS = {"stage": ("stage", "pp"), "rank": ("rank",)}
CUT = 32          # a text cell with no space and longer than this is cut to the column's width, whole on hover
FILTER_ROWS = 10  # a table with more rows gets a filter box


def need_bokeh() -> None:
    """Bokeh is the optional extra `report`: without it, say how to get it (one line, exit 2)."""
    try:
        import bokeh  # noqa: F401
    except ModuleNotFoundError:
        raise TraceanaError("the HTML report draws its charts with Bokeh, which is not installed: "
                            "pip install 'traceana[report]'") from None


def number(value: object) -> str:
    """A cell as people read it: integers with thousands separators, floats to 3 decimals, lists joined."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return f"{value:,.3f}"
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return str(value)


def _key_of(frame: pl.DataFrame, key: str) -> str | None:
    return next((c for c in PICK_COLUMNS[key] if c in frame.columns), None)


@dataclass
class Page:
    """The document being built: sections in order, the charts they hold, the first screen's findings."""

    title: str
    subtitle: str
    sections: list[tuple[str, str, str]] = field(default_factory=list)  # (anchor, heading, body)
    charts: list[object] = field(default_factory=list)
    tables: int = 0

    def chart(self, model: object) -> str:
        """A placeholder for a Bokeh model, replaced by its div when the page is written."""
        self.charts.append(model)
        return f"<!--chart:{len(self.charts) - 1}-->"

    def table(self, frame: pl.DataFrame, caption: str, pick: str | None = None,
              filtered_by: Sequence[str] = ()) -> str:
        """Every row of ``frame`` as a sortable table. ``pick``: clicking a row filters the tables that are
        ``filtered_by`` that key; ``filtered_by``: the keys (stage, rank) this table's rows answer to."""
        self.tables += 1
        keys = {k: _key_of(frame, k) for k in {*filtered_by, *([pick] if pick else [])}}
        numeric = [dtype.is_numeric() for dtype in frame.dtypes]
        # a long column name may break after its underscores (per_rank_step_ms), so headers do not widen tables
        head = "".join(f'<th class="{"n" if n else "s"}" title="sort">{html.escape(c).replace("_", "_<wbr>")}</th>'
                       for c, n in zip(frame.columns, numeric, strict=True))
        index = {c: i for i, c in enumerate(frame.columns)}
        rows = []
        for row in frame.iter_rows():
            attrs = "".join(f' data-{k}="{html.escape(number(row[index[c]]).replace(",", ""))}"'
                            for k, c in keys.items() if c is not None)
            cells = "".join(f"<td class=n>{html.escape(number(v))}</td>" if n else _text_cell(number(v))
                            for v, n in zip(row, numeric, strict=True))
            rows.append(f"<tr{attrs}>{cells}</tr>")
        data = (f' data-pick="{pick}"' if pick and keys[pick] else "") + (
            f' data-filter="{" ".join(k for k in filtered_by if keys[k])}"' if filtered_by else "")
        search = (f'<input type="search" class="search" placeholder="filter its {frame.height:,} rows" '
                  f'aria-label="filter the rows of: {html.escape(caption)}"><span class="shown"></span>'
                  if frame.height > FILTER_ROWS else "")
        return (f'<div class="table">{search}<table class="data" id="table-{self.tables}"{data}><caption>'
                f"{html.escape(caption)}</caption><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody>"
                "</table></div>")

    def add(self, heading: str, body: str | None) -> None:
        if body is not None:
            anchor = "s-" + "".join(ch if ch.isalnum() else "-" for ch in heading.lower()).strip("-")
            self.sections.append((anchor, heading, body))

    def render(self, first_screen: str) -> str:
        """The whole document: a table of contents beside the first screen and the sections, the charts' data and
        BokehJS."""
        from bokeh.embed import components
        from bokeh.resources import Resources

        script, divs = components(self.charts) if self.charts else ("", [])
        toc = "".join(f'<li><a href="#{a}">{html.escape(h)}</a></li>' for a, h, _ in self.sections)
        body = first_screen + '<div id="filter" hidden></div>' + "".join(
            f'<section id="{a}"><h2>{html.escape(h)}</h2>{b}</section>' for a, h, b in self.sections)
        for i, div in enumerate(divs):
            body = body.replace(f"<!--chart:{i}-->", f'<div class="chart">{div}</div>', 1)
        bokeh = "\n".join(Resources(mode="inline", components=["bokeh"], log_level="warn").js_raw)
        made = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
        return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>{html.escape(self.title)}'
                f"</title><style>{_asset('page.css')}</style><script>{_inline(bokeh)}</script></head><body>"
                f'<nav class="toc"><h2>Contents</h2><ol><li><a href="#first">First screen</a></li>{toc}</ol></nav>'
                f'<main><header><h1>{html.escape(self.title)}</h1><p class=note>'
                f"{html.escape(self.subtitle)}, written {made} by traceana {html.escape(version())}.</p></header>"
                f"{body}</main>"
                f"<script>{_inline(_asset('page.js'))}</script>{script}</body></html>\n")

    def write(self, out: Path, first_screen: str) -> int:
        """Write the document; returns its size in bytes."""
        text = self.render(first_screen)
        try:
            out.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise TraceanaError(f"{out}: cannot write ({exc.strerror})") from None
        return len(text.encode())


def _text_cell(text: str) -> str:
    """A text cell; a long one that cannot wrap (a cuDNN kernel's 100-character name) is cut to its column's width
    by the style sheet, the whole text kept in the cell (for the filter box and copying) and in its hover title."""
    if len(text) <= CUT or " " in text:
        return f'<td class="s">{html.escape(text)}</td>'
    return f'<td class="s cut" title="{html.escape(text)}"><div>{html.escape(text)}</div></td>'


def _inline(script: str) -> str:
    """A script's text made safe inside <script>: no closing tag can end it early."""
    return script.replace("</script", "<\\/script")


def _asset(name: str) -> str:
    return resources.files("traceana.render.report").joinpath(name).read_text(encoding="utf-8")
