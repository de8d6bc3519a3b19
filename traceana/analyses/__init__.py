"""The analyses: each reads its view of queries/*.sql from an open store and returns Polars frames, in ms and % where
users quote them. Open breakdown.py first (per rank, per stage, a step's timeline, stragglers; COMP, the per-dim
waits and IDLE themselves are computed in queries/04_rank_step_breakdown.sql); then critical_path, comm, kernels,
idle, memory, diff and roofline, one concept each. The CLI (traceana/cli/), the Python API (traceana/api.py) and
the HTML report (traceana/render/) print what these return."""
