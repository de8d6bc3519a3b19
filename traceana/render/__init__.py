"""What users see: console.py prints every table (rich on a terminal, JSON or CSV for machines) and progress bars;
plots.py and compare_plot.py draw the matplotlib pictures (one colour per dim everywhere, the critical path in one
no dim has), in the units units.py picks for the data's magnitude (the tables beside them too); report/ writes the
self-contained, interactive HTML reports (Bokeh charts); perfetto.py writes a run as Trace Event JSON for
ui.perfetto.dev. They take frames from traceana/analyses/ and traceana/model/ and compute nothing of their own."""
