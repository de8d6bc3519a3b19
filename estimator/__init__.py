"""The analytic estimator (DESIGN §5): a job YAML in, per-stage time by dimension and memory by component out.

config (the YAML, validated) -> stages (which layers each pipeline device runs) -> compute (FLOPs, elementwise
bytes) + comm (per-dimension collectives, alpha-beta per network level) + memory (per-stage peak) -> estimate
(per-chunk costs through pipeline's simulated schedule; PPB from balance) -> search, timeline (Gantt / Chrome
trace), record (store tables). The commands `traceana estimate` and `search` are in traceana/cli/estimate.py.
"""
