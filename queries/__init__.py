"""The SQL views every analysis reads, one concept per file, numbered by dependency; each file's header comment names
its columns. traceana/store/ creates them (schema.py: view_sql); 02_step_segments.sql and 04_rank_step_breakdown.sql
are where the breakdown's numbers come from. Installed as traceana.queries, found by importlib.resources."""
