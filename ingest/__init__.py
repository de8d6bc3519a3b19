"""Trace formats -> one run's tables in the store schema (imported as traceana.ingest).

dispatch.py is the entry: it picks the format's reader, runs it, and applies the steps every format shares. Per file
(in a worker, parallel/executor.py): kineto/, nsys/ or ascend/ parses it (reader.py in each), step_windows.py finds
its steps, validate.py leaves out what no store row may be, and parallel/spill.py writes its per-event tables as
Parquet beside the store. Across files: ranks.py, groups/ (process groups, dims, collective instances) and clocks.py
(one timeline) on the small tables the files gave back. Out comes a run_data.RunData, which traceana/store/ writes in
one transaction. Names are classified by rules.py (its table rules.csv) and comm_names.py; profiler_sqlite.py reads
the nsys and Ascend SQLite exports."""
