"""Where a device event was launched from: the host ranges open on the launching thread when its runtime call ran
(Kineto CPU ops and ``nn.Module`` ranges, nsys NVTX ranges), for the event_scopes table and `traceana ops`.

Ranges of one thread nest, so one sweep finds them without a range join (which would pair every launch with every
range of its thread): a range opens (+1) at its start and closes (-1) at its end; a launch at t lies inside the d
ranges open then; the innermost is the last range to open at depth d before t, the outermost the last at depth 1
(ASOF joins). Ties: opens first (the longer first; of two with the same start and end, the outer first by the
caller's key), then launches, then closes, as a range's interval is closed.
A range's path is its parent's path and its name, the parent being the last range to open one level up before it.
"""

from __future__ import annotations

SEPARATOR = " / "  # between the names of a path, outermost first
# For every connection that runs these sweeps: DuckDB runs an ASOF join as a nested loop over every pair of a thread
# when it guesses the left side holds under 64 rows, and it guesses so for the CTEs here whatever they hold (1.3 s
# for the 9k CPU ops of one thread in a real H200 trace, quadratic; 0.07 s as an ASOF join).
SWEEP_CONFIG = {"asof_loop_join_threshold": 0}


def open_ranges_sql(ranges: str, points: str, thread: str, outer_first: str = "name", path: bool = True) -> str:
    """SQL over two relations that share the ``thread`` columns (a comma-separated list, e.g. "f, pid, tid"):
    ``ranges`` (thread columns, start_ns, end_ns, name) and ``points`` (thread columns, t, id: a launch call).
    ``outer_first`` orders ranges with the same start and end (aten::to and the aten::_to_copy it calls, within a
    microsecond), so that which one counts as the outer is the same on every run, not the scan's order.
    One row per point inside some range: its thread columns, id, ``outermost`` (the outermost open range's name)
    and, with ``path``, ``path`` (the open ranges' names, outermost first, joined by SEPARATOR; a third of the
    sweep's time over the 40k CPU ops of a real rank)."""
    cols = [c.strip() for c in thread.split(",")]
    same = " AND ".join(f"o.{c} IS NOT DISTINCT FROM p.{c}" for c in cols)
    same_parent = " AND ".join(f"u.{c} IS NOT DISTINCT FROM o.{c}" for c in cols)
    paths = f"""), parents AS (
    SELECT o.id, o.name, u.id AS parent FROM opens o
    ASOF LEFT JOIN opens u ON {same_parent} AND u.d = o.d - 1 AND u.t <= o.t
), paths(id, path) AS (
    SELECT id, name FROM parents WHERE parent IS NULL
    UNION ALL SELECT c.id, p.path || '{SEPARATOR}' || c.name FROM parents c JOIN paths p ON c.parent = p.id
"""
    innermost_path = f"""
ASOF JOIN opens o ON {same} AND o.d = p.d AND o.t <= p.t
JOIN paths s ON s.id = o.id"""
    return f"""WITH RECURSIVE r AS (
    SELECT {thread}, start_ns, end_ns, name,
           row_number() OVER (ORDER BY {thread}, start_ns, end_ns DESC, {outer_first}) AS rid
    FROM {ranges} WHERE end_ns >= start_ns
), marks AS (
    SELECT {thread}, start_ns AS t, 0 AS k, -end_ns AS tie, 1 AS delta, rid AS id FROM r
    UNION ALL SELECT {thread}, end_ns, 2, 0, -1, NULL FROM r
    UNION ALL SELECT {thread}, t, 1, 0, 0, id FROM {points}
), depth AS (
    SELECT *, sum(delta) OVER (PARTITION BY {thread} ORDER BY t, k, tie, id ROWS UNBOUNDED PRECEDING) AS d FROM marks
), opens AS (
    SELECT d.{', d.'.join(cols)}, d.t, d.d, d.id, r.name FROM depth d JOIN r ON r.rid = d.id WHERE d.k = 0
{paths if path else ""}), launched AS (SELECT * FROM depth WHERE k = 1 AND d > 0)
SELECT p.{', p.'.join(cols)}, p.id, top.name AS outermost{", s.path" if path else ""}
FROM launched p
ASOF JOIN opens top ON {same.replace('o.', 'top.')} AND top.d = 1 AND top.t <= p.t{innermost_path if path else ""}"""
