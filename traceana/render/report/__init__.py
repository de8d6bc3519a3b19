"""The interactive HTML report (`traceana report --html`, `traceana diff A B --html`): one file that opens offline,
with zoomable, hoverable Bokeh charts, sortable tables and drill-down from a stage to its ranks and from a rank to
its steps. page.py is the document (inline scripts, tables, the drill-down script), charts.py the charts, run.py the
sections about one run, diff.py those about two."""
