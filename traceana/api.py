"""The Python API for notebooks: ``traceana.open(db)`` and one method per report, each a polars DataFrame.

Every method opens the store read-only for the call (as the report commands do), so a notebook never holds a lock
against `traceana ingest` and always sees the latest ingest. Times are in ms where the name says ``_ms`` and ns
where it says ``_ns``, as in the CLI's ``--json``. ``frame.to_pandas()`` needs the ``pandas`` extra
(``pip install 'traceana[pandas]'``).

A new analysis adds one method here, reading its view through :meth:`Traces.read`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import duckdb
import polars as pl

from traceana import store
from traceana.analyses import breakdown as bd
from traceana.errors import TraceanaError

if TYPE_CHECKING:
    from mcp.server import MCPServer

    from traceana.model.predict import Prediction

T = TypeVar("T")


class Traces:
    """A traceana store opened read-only. ``run``: the run methods read when they are not given one (default: the
    latest ingested run, as on the command line)."""

    def __init__(self, db: str | Path = store.DEFAULT_DB, run: str | None = None) -> None:
        self.db = Path(db)
        self.run = run
        self._held: duckdb.DuckDBPyConnection | None = None
        self._shown: tuple[str | None, str] | None = None  # (name asked for, run id) the session's connection shows
        with store.connect(self.db, read_only=True, views=False) as con:  # one line now for a missing file or run
            if run is not None:
                store.resolve_run(con, run)

    @contextmanager
    def session(self) -> Iterator[Traces]:
        """Every call inside reads through one connection (a report makes dozens; each would open the file and
        set up its views anew, 0.08 s apiece); outside it, each call opens the file afresh and holds nothing."""
        if self._held is not None:
            yield self
            return
        with store.connect(self.db, read_only=True) as con:
            self._held = con
            try:
                yield self
            finally:
                self._held, self._shown = None, None

    @contextmanager
    def _connect(self, *, every: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-only connection: the session's, else a new one; ``every``: one that shows every run (a session's
        connection shows the run its last :meth:`read` read)."""
        if self._held is None:
            with store.connect(self.db, read_only=True) as con:
                yield con
            return
        if every and self._shown is not None:
            store.show_every_run(self._held)
            self._shown = None
        yield self._held

    def __repr__(self) -> str:
        return f"traceana.open({str(self.db)!r}, run={self.run!r})"

    def read(self, run: str | None, read: Callable[[duckdb.DuckDBPyConnection, str], T]) -> T:
        """``read(connection, run_id)`` on a read-only connection that shows that run only (store.open_run: its
        views compute over its rows alone), for the run named here, else ``self.run``."""
        name = run or self.run
        with self._connect() as con:
            if self._held is not con:
                return read(con, store.open_run(con, name))
            if self._shown is None or self._shown[0] != name:
                if self._shown is not None:
                    store.show_every_run(con)
                self._shown = (name, store.open_run(con, name))
            return read(con, self._shown[1])

    def runs(self) -> pl.DataFrame:
        """One row per ingested run: format, world size, layout, sources, notes."""
        with self._connect(every=True) as con:
            return con.sql("SELECT * FROM runs ORDER BY ingested_at").pl()

    def ranks(self, run: str | None = None) -> pl.DataFrame:
        """The run's ranks with host, device, clock offset and tp cp ep dp pp coordinates."""
        return self.read(run, lambda con, rid: con.sql(
            "SELECT * EXCLUDE (run_id) FROM ranks WHERE run_id = ? ORDER BY rank", params=[rid]).pl())

    def steps(self, run: str | None = None) -> pl.DataFrame:
        """Each rank's step windows (ns on the run's aligned clock); ``from_markers`` false: the whole trace."""
        return self.read(run, lambda con, rid: con.sql(
            "SELECT * EXCLUDE (run_id) FROM step_windows WHERE run_id = ? ORDER BY step, rank", params=[rid]).pl())

    def breakdown(self, by: str = "rank", step: int | str | None = None, run: str | None = None) -> pl.DataFrame:
        """Where step time went (ms): per rank, or per pipeline stage (mean and max over its ranks); ``step`` None
        is the typical step (mean over steps after the first), "median" the step whose TOTAL is their median.
        OVERLAP_pct: the share of communication time under compute (OVERLAPPED / (OVERLAPPED + Σ *_WAIT))."""
        if by not in ("rank", "stage"):
            raise TraceanaError(f"by={by!r}: choose 'rank' or 'stage'")
        reader = bd.by_rank if by == "rank" else bd.by_stage
        return self.read(run, lambda con, rid: reader(con, rid, bd.resolve_step(con, rid, step)))

    def stragglers(self, run: str | None = None) -> pl.DataFrame:
        """Per rank (ms): typical COMP against its stage's median, the straggler stage, lateness it caused."""
        return self.read(run, bd.stragglers)

    def late_ranks(self, run: str | None = None, top: int = 10) -> pl.DataFrame:
        """The ranks most often last to arrive at collectives, by dim, with the wait they caused (ms)."""
        return self.read(run, lambda con, rid: bd.late_ranks(con, rid, top))

    def waits(self, run: str | None = None) -> pl.DataFrame:
        """Each rank's part in each collective instance: its start, the last arrival, how long it waited (ns)."""
        return self.read(run, lambda con, rid: con.sql(
            "SELECT * EXCLUDE (run_id) FROM collective_waits WHERE run_id = ? ORDER BY instance, rank",
            params=[rid]).pl())

    def collectives(self, run: str | None = None) -> pl.DataFrame:
        """One row per collective instance matched across its ranks: spreads, last rank, total wait (ns)."""
        return self.read(run, lambda con, rid: con.sql(
            "SELECT * EXCLUDE (run_id) FROM collective_instances WHERE run_id = ? ORDER BY first_start_ns",
            params=[rid]).pl())

    def timeline(self, step: int | str | None = None, run: str | None = None) -> pl.DataFrame:
        """One step's activity across ranks: rank, pp, lane (COMP or a comm dim), start_ns, end_ns — what the
        `timeline` Gantt draws. ``step`` None: the first analysed step (the first after the warm-up one);
        "median": the median step."""
        def intervals_of(con: duckdb.DuckDBPyConnection, rid: str) -> pl.DataFrame:
            chosen = bd.resolve_step(con, rid, step)
            windows, intervals = bd.timeline(con, rid, bd.first_analysed_step(con, rid) if chosen is None else chosen)
            return intervals.join(windows.select("rank", "pp"), on="rank", how="left").select(
                "rank", "pp", "lane", "start_ns", "end_ns").sort("rank", "start_ns", "lane")
        return self.read(run, intervals_of)

    def critical_path(self, step: int | str | None = None, by: str = "segments",
                      run: str | None = None) -> pl.DataFrame:
        """The cross-rank critical path of ``step`` (None: the second step; "median": the median step), as
        `traceana critical-path --json`: its segments (``by="segments"``: rank, stage, kind, dim, name, start_ms,
        duration_ms, share_pct), their totals ``by`` "rank", "stage" or "kind", or ``by="communication"``: one row,
        comm_ms split into exposed_ms and overlapped_ms (under compute on another stream)."""
        from traceana.analyses import critical_path as cp

        keys = {"segments": "segments", "rank": "by_rank", "stage": "by_stage", "kind": "by_kind",
                "communication": "communication"}
        if by not in keys:
            raise TraceanaError(f"by={by!r}: choose {', '.join(map(repr, keys))}")

        def read(con: duckdb.DuckDBPyConnection, rid: str) -> pl.DataFrame:
            found, _, segments = cp.of_step(con, rid, bd.resolve_step(con, rid, step))
            if by == "communication":
                return pl.DataFrame([cp.communication(con, rid, found, segments)])
            return cp.report(segments)[keys[by]]

        return self.read(run, read)

    def replay(self, step: int | str | None = None, run: str | None = None) -> pl.DataFrame:
        """Each rank-step replayed from the run's dependency graph (every step: None or "all"; or ``step``, a number
        or "median"), as `traceana replay --json`: measured and replayed TOTAL and parts in ms, error_pct,
        unexplained_hold_ms, external_hold_ms."""
        from traceana.model import replay

        return self.read(run, lambda con, rid: replay.replay_run(con, rid, bd.resolve_step(con, rid, step,
                                                                                           every=True))[1])

    def whatif(self, *changes: str, step: int | str | None = None, run: str | None = None) -> pl.DataFrame:
        """One step (default: the second; "median": the median step) predicted after ``changes`` (specs as
        `traceana whatif --change`, e.g. "dim=TP:0.5"): per rank the measured and predicted TOTAL and parts in ms,
        gain_ms and error_bar_ms, and the predicted step's interval (the median rank's, as `traceana whatif
        --json`): step_ms, low, high, level."""
        from traceana.model import whatif

        parsed = [whatif.parse(c) for c in changes]

        def one(con, rid: str) -> pl.DataFrame:
            _, _, frame, _, interval = whatif.whatif_interval(con, rid, parsed, bd.resolve_step(con, rid, step))
            return frame.with_columns(step_ms=pl.lit(interval.value), low=pl.lit(interval.low),
                                      high=pl.lit(interval.high), level=pl.lit(interval.level))

        return self.read(run, one)

    def predict(self, config: str | Path | None = None, to: str | Path | None = None, run: str | None = None,
                changes: list[str] | None = None) -> Prediction:
        """Another configuration of the job that ran (``to``, an estimator YAML, and / or ``changes``,
        "parallel.micro_batch=1" as `--set` takes them), predicted from the run, which ``config`` describes (None:
        inferred from the trace), as `traceana predict --json`: ``.step`` and ``.stages`` (per dim measured_A_ms,
        ratio, predicted_B_ms, error_bar_ms, estimated_B_ms, source; the TOTAL row's low, high, level),
        ``.interval`` (that TOTAL's Interval with the sources that set its width), ``.memory``, ``.schedule`` and
        ``.notes`` (what was inferred, what the trace could not inform, how the interval was built)."""
        from dataclasses import replace

        from traceana.analyses.job import configs
        from traceana.model.predict import predict

        def run_predict(con: duckdb.DuckDBPyConnection, rid: str) -> Prediction:
            source, target, notes = configs(con, rid, Path(config) if config else None, Path(to) if to else None,
                                            changes or [])
            result = predict(con, rid, source, target)
            return replace(result, notes=notes + result.notes)

        return self.read(run, run_predict)

    def advise(self, step: int | str | None = None, run: str | None = None,
               roof_target: float | None = None) -> pl.DataFrame:
        """Findings of ``step`` (None: the second; "median": the median step) ranked by the lower end of their
        gain, as `traceana advise --json` (``roof_target``: its --roof-target): finding, evidence, change,
        measured_step_ms, predicted_step_ms with low, high, level, gain_ms with gain_low_ms, gain_high_ms,
        sources, error_bar_ms, graph; those with gain_high_ms <= 0 are `advise`'s "checked, no gain"."""
        from traceana.model import advise

        return self.read(run, lambda con, rid: advise.findings(con, rid, bd.resolve_step(con, rid, step),
                                                               roof_target=roof_target)[1])

    def comm(self, run: str | None = None) -> pl.DataFrame:
        """Communication per op, dim and link (intra- / inter-node): instances, bytes, time (ms), algbw and busbw
        (GB/s, as nccl-tests defines them), as `traceana comm --json` gives ``by_op``."""
        from traceana.analyses.comm import by_op

        return self.read(run, by_op)

    def comm_matrix(self, run: str | None = None) -> pl.DataFrame:
        """Bytes, messages, time (ms) and GB/s per rank pair (src, dst, dim) from point-to-point and all-to-all."""
        from traceana.analyses.comm import matrix

        return self.read(run, matrix)

    def slow_links(self, threshold_pct: float = 20.0, run: str | None = None) -> pl.DataFrame:
        """Rank pairs and groups whose bandwidth is ``threshold_pct`` % or more below their peers' median."""
        from traceana.analyses.comm import by_group, matrix, slow_links

        return self.read(run, lambda con, rid: slow_links(matrix(con, rid), by_group(con, rid), threshold_pct))

    def ops(self, by: str = "op", step: int | str | None = None, top: int | None = None,
            run: str | None = None) -> pl.DataFrame:
        """Device time by what launched it, as `traceana ops`: per op, module, layer or NVTX range (``by``), COMP
        and exposed waits by dim (ms per rank-step), kernels and share of the step; the rows add up to the
        breakdown's COMP and waits, "(none)" holding what no range claims. Per event: the op_time view."""
        from traceana.analyses.ops import attribute

        return self.read(run, lambda con, rid: attribute(con, rid, by, step, top).frame)

    def kernels(self, top: int = 20, by: str = "run", run: str | None = None) -> pl.DataFrame:
        """The ``top`` kernels by total time (short names), over the run or ``by="stage"``, as `traceana kernels`."""
        from traceana.analyses.kernels import ranking

        return self.read(run, lambda con, rid: ranking(con, rid, top, by))

    def roofline(self, by: str = "shape", profile: str | None = None, top: int | None = None,
                 run: str | None = None) -> pl.DataFrame:
        """The measured roofline, as `traceana kernels --roofline`: per op and input shapes (``by="shape"``) or per
        kernel (``by="kernel"``), FLOPs and bytes a call, TFLOP/s, GB/s, intensity, the ``profile``'s peak and
        ridge (default: the profile of the trace's device), bound and share of the roof, longest first (``top``).
        Its notes (the profile and why, what was left out): traceana.analyses.roofline.measure."""
        from traceana.analyses.roofline import measure

        return self.read(run, lambda con, rid: measure(con, rid, by, profile, top).frame)

    def launch_stats(self, by: str = "kernel", buckets: int = 200, run: str | None = None) -> pl.DataFrame:
        """Kernel-launch statistics, as `traceana kernels --launch`: the delay from each launch call's start to the
        event's start (µs: mean, p50, p95, max) and short_pct (events shorter than their rank's launch cost, the
        median delay onto an idle device), ``by`` "kernel" (short name), "rank" (with launch_cost_us), "step", or
        "time" (``buckets`` equal buckets of the run, start_ms / end_ms since its first launch). Empty for runs
        without launch records (CPU-only, Ascend)."""
        from traceana.analyses import launches as la

        readers = {"kernel": la.by_kernel, "rank": la.by_rank, "step": la.by_step,
                   "time": lambda con, rid: la.over_time(con, rid, buckets)}
        if by not in readers:
            raise TraceanaError(f"by={by!r}: choose {', '.join(map(repr, readers))}")
        return self.read(run, readers[by])

    def queue_length(self, by: str = "stream", buckets: int = 200, run: str | None = None) -> pl.DataFrame:
        """Each stream's queue of events launched but not yet started: ``by="stream"`` one row per rank and stream
        (events, span_ms, time-weighted mean_queue, max_queue, busy_queue_pct), ``by="time"`` the series decimated
        into ``buckets`` equal buckets (start_ms, end_ms since the first launch, mean_queue, max_queue), for plots.
        The full step function is the view queue_length (:meth:`sql`)."""
        from traceana.analyses import launches as la

        readers = {"stream": la.queue_summary, "time": lambda con, rid: la.queue_over_time(con, rid, buckets)}
        if by not in readers:
            raise TraceanaError(f"by={by!r}: choose {', '.join(map(repr, readers))}")
        return self.read(run, readers[by])

    def idle(self, step: int | str | None = None, run: str | None = None) -> pl.DataFrame:
        """Per rank: IDLE (ms) split by cause (host launch, sync wait, queued, step boundary, unknown), of ``step``
        (None: the typical step; "median": the median step)."""
        from traceana.analyses.idle import idle_causes

        return self.read(run, lambda con, rid: idle_causes(con, rid, bd.resolve_step(con, rid, step)))

    def memory(self, run: str | None = None) -> pl.DataFrame:
        """Peak allocated and reserved memory (bytes) per rank and step; empty when the run sampled none."""
        from traceana.analyses.memory import peaks

        return self.read(run, peaks)

    def diff(self, run_a: str, run_b: str, part: str = "breakdown") -> pl.DataFrame:
        """Run A against run B, as `traceana diff`: ``part`` "breakdown" (per stage and part: A, B, delta, %,
        which dims explain it), "kernels" (every kernel, with its status: both, new or vanished) or
        "collectives" (by op and dim)."""
        from traceana.analyses import diff

        readers = {"breakdown": diff.breakdown_diff, "kernels": diff.kernel_diff,
                   "collectives": diff.collective_diff}
        if part not in readers:
            raise TraceanaError(f"part={part!r}: choose {', '.join(map(repr, readers))}")
        with self._connect(every=True) as con:
            for name in (run_a, run_b):
                store.resolve_run(con, name)
            return readers[part](con, run_a, run_b)

    def report(self, html: str | Path, estimate: str | Path | None = None, run: str | None = None) -> int:
        """Write the run's interactive HTML report, as `traceana report --html` (with ``estimate``, a job config,
        estimate against measured too); returns the file's size in bytes."""
        from traceana.render.report.page import need_bokeh

        need_bokeh()
        from traceana.render.report.run import write

        with self.session():  # one connection for the dozens of reads of the report
            rid = self.read(run, lambda _con, rid: rid)
            return write(self, rid, Path(html), None if estimate is None else Path(estimate))

    def diff_report(self, run_a: str, run_b: str, html: str | Path) -> int:
        """Write run A against run B as one interactive HTML page, as `traceana diff A B --html`; returns its size
        in bytes."""
        from traceana.render.report.page import need_bokeh

        need_bokeh()
        from traceana.render.report.diff import write

        with self._connect(every=True) as con:
            for name in (run_a, run_b):
                store.resolve_run(con, name)
            return write(con, Path(self.db), run_a, run_b, Path(html))

    def mcp_server(self, output_dir: str | Path | None = None, configs: tuple[str | Path, ...] = ()) -> MCPServer:
        """The Model Context Protocol server `traceana mcp` runs over stdio, on this store (needs the ``mcp`` extra):
        ``.run()`` serves stdio; ``mcp.Client(server)`` talks to it in-process. ``configs``: the estimator YAMLs its
        tools may read; ``output_dir``: where `report` writes (YAMLs under it are readable too)."""
        from traceana.mcp.server import build_server

        return build_server(self, None if output_dir is None else Path(output_dir), tuple(map(Path, configs)))

    def compare(self, config: str | Path | None = None, run: str | None = None,
                predicted: str | Path | None = None) -> pl.DataFrame:
        """Estimate (job YAML ``config``) versus measured, per dimension (ms), as `traceana compare` prints it; or,
        with ``predicted`` instead of ``config``, another estimator's predictions file for the run (read-only:
        `traceana compare --predicted` also stores them as estimates)."""
        if (config is None) == (predicted is None):
            raise TraceanaError("compare: give config or predicted (one of them)")
        if predicted is not None:
            from traceana.model import predicted as pr

            def read(con: duckdb.DuckDBPyConnection, rid: str) -> pl.DataFrame:
                return pr.compare(con, pr.load(con, Path(predicted), [rid]), rid).by_dimension

            return self.read(run, read)
        from traceana.estimator import config as cfgmod
        from traceana.estimator.estimate import estimate
        from traceana.model.compare import compare_run

        est = estimate(cfgmod.load(Path(config)))  # type: ignore[arg-type]  (not None: checked above)
        return self.read(run, lambda con, rid: compare_run(con, rid, est).by_dimension)

    def sql(self, query: str, run: str | None = None, limit: int | None = None) -> pl.DataFrame:
        """Ad-hoc SQL over the tables and views; with ``run`` (or the run given to open), that run's rows only;
        at most ``limit`` rows (None: all), cut by DuckDB before any reaches Python.
        One SELECT that reads the store's own files only (store/sql_guard.py), on a connection of its own, never
        a session's: its confinement lasts as long as the connection."""
        from traceana.store import sql_guard

        sql_guard.check_select(query)  # before the store is opened
        with store.connect(self.db, read_only=True) as con:
            if run or self.run:
                store.open_run(con, run or self.run)
            return sql_guard.select(con, self.db, query, limit=limit)
