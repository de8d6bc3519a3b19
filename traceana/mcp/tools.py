"""The MCP server's tools: one per analysis, each a thin call into traceana.api.Traces (or the analysis module the
matching command calls, through Traces.read), answering with the fields of that command's ``--json``.

Every tool opens the store read-only for its own call (no connection is shared between calls, which the worker
threads of concurrent calls would otherwise contend for). Files: the store is read; estimator YAMLs are read only
when given at start (``--config``) or under ``--output-dir``; the report is written only into ``--output-dir``.
A new analysis adds one method here and its name to TOOLS. (No ``from __future__ import annotations``: the SDK
reads the parameters' types, Top's calls included, from the live annotations.)
"""

import copy
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import polars as pl
from duckdb import DuckDBPyConnection
from pydantic import Field

from traceana.errors import TraceanaError
from traceana.mcp.results import Result

if TYPE_CHECKING:  # the API builds the server (Traces.mcp_server): an import of it here would be a circle
    from traceana.api import Traces

RunId = Annotated[str | None, Field(description="Run id, from `runs` (default: the latest ingested run).")]
Step = Annotated[int | None, Field(description="One step number, from `info` (default: see the tool).")]


def Top(what: str = "rows per list") -> Any:
    """A ``top`` parameter: how many rows each list of the result keeps (the rest are counted in a note)."""
    return Annotated[int, Field(ge=1, le=10_000, description=f"How many {what} to return.")]


# The tools in the order `tools/list` gives them.
TOOLS = ("runs", "info", "breakdown", "stragglers", "critical_path", "comm", "kernels", "idle", "memory", "diff",
         "replay", "whatif", "advise", "predict", "sql", "report")


class Tools:
    """The tools over the store ``traces`` opened. ``configs``: estimator YAMLs the user allowed at start;
    ``output_dir``: where YAMLs may also be read from and where `report` writes (None: no report, no YAML but
    ``configs``)."""

    def __init__(self, traces: "Traces", output_dir: Path | None = None, configs: tuple[Path, ...] = ()) -> None:
        self.traces = traces
        self.output_dir = output_dir.resolve() if output_dir is not None else None
        self.configs = frozenset(p.resolve() for p in configs)

    def _traces(self, run_id: str | None) -> "Traces":
        """The store for one call, reading ``run_id``: a copy, so a session one call holds is never another's."""
        traces = copy.copy(self.traces)
        traces.run = run_id
        return traces

    def _config(self, path: str, option: str) -> Path:
        """``path`` when the user allowed it at start (listed by --config, or under --output-dir), else an error."""
        resolved = Path(path).expanduser().resolve()
        if resolved in self.configs or (self.output_dir is not None and resolved.is_relative_to(self.output_dir)):
            return resolved
        allowed = [str(p) for p in sorted(self.configs)] + ([f"{self.output_dir}/*"] if self.output_dir else [])
        raise TraceanaError(f"{option} {path}: not a config this server may read (allowed: "
                            f"{', '.join(allowed) or 'none; start `traceana mcp` with --config or --output-dir'})")

    def runs(self, top: Top("runs") = 50) -> str:
        """The runs in the store, oldest first: run_id (what every other tool's run_id takes), source_format,
        world_size (ranks), layout, tool_version, rank_source, ingested_at, n_sources (trace files). Call first."""
        frame = self._traces(None).runs().select(
            "run_id", "source_format", "world_size", "layout", "tool_version", "rank_source", "ingested_at",
            pl.col("sources").list.len().alias("n_sources"))
        result = Result()
        result.rows("runs", frame, top)
        return result.to_json()

    def info(self, run_id: RunId = None, top: Top() = 16) -> str:
        """A run's ranks (host, device, clock_offset_ns, tp cp ep dp pp coordinates), its steps (ranks, mean_ms,
        max_ms, from_markers: true when the trace marked them), process groups (pg id, dim, ranks), device events
        by category (events, busy_ms) and collectives by op and dim, and the ingest's notes."""
        from traceana.analyses.info import tables

        def read(con: DuckDBPyConnection, rid: str) -> tuple:
            return rid, *tables(con, rid)

        rid, frames, notes = self._traces(run_id).read(None, read)
        result = Result(run_id=rid, notes=notes)
        for title, frame in frames.items():
            result.rows(title.replace(" ", "_"), frame, top)
        return result.to_json()

    def breakdown(self, run_id: RunId = None, by: Literal["rank", "stage"] = "rank",
                  step: Annotated[int | Literal["median"] | None, Field(
                      description="A step number, 'median' (the steady step whose TOTAL is the median), or "
                                  "omitted: the typical step, the mean over steps after the first.")] = None,
                  top: Top("ranks or stages (the slowest TOTAL kept)") = 16) -> str:
        """Where step time went, per rank (or pipeline stage: mean and max over its ranks), in ms per step: TOTAL =
        COMP (device busy computing) + MP/CP/EP/DP/PP/OTHER_WAIT (communication waits not hidden under compute, by
        parallel dimension) + IDLE (device idle); OVERLAPPED: communication under compute; <PART>_pct: share of
        TOTAL; OVERLAP_pct: OVERLAPPED / (OVERLAPPED + waits). As `traceana breakdown --json`. Next: stragglers,
        critical_path."""
        from traceana.analyses import breakdown as bd
        from traceana.analyses.memory import rank_peaks

        traces = self._traces(run_id)

        def read(con: DuckDBPyConnection, rid: str) -> tuple:
            chosen = bd.resolve_step(con, rid, step)
            return (rid, chosen, bd.which_step(con, rid, chosen), bd.outlier_notes(con, rid) if chosen is None else [],
                    rank_peaks(con, rid, chosen) if by == "rank" else None)

        with traces.session():
            rid, chosen, which, notes, peaks = traces.read(None, read)
            frame = traces.breakdown(by, chosen)
        if peaks is not None:  # the memory peak of the same step(s), where sampled, as `breakdown --json` adds it
            frame = frame.join(peaks, on="rank", how="left")
        if frame.is_empty():
            raise TraceanaError(f"run {rid!r} has no device events, so no breakdown")
        suffix = "_ms" if by == "rank" else "_mean_ms"
        result = Result(run_id=rid, step=chosen if chosen is not None else which, by=by, notes=notes)
        result.rows(f"{by}s", bd.percent_of_total(frame, suffix), top, keep=f"TOTAL{suffix}")
        return result.to_json()

    def stragglers(self, run_id: RunId = None,
                   threshold_pct: Annotated[float, Field(ge=0, le=1e6, description="Flag ranks whose COMP exceeds "
                                                         "their stage's median by more than this many %.")] = 5.0,
                   top: Top() = 10) -> str:
        """The straggler stage (largest mean COMP per step), the ranks slower than their stage's median COMP by
        more than threshold_pct (COMP_ms, COMP_excess_pct, the lateness they caused, ms), and late_ranks: the ranks
        most often last at collectives, by dim, with the wait they caused others (ms). As `traceana stragglers
        --json`, over the typical step (mean over steps after the first)."""
        traces = self._traces(run_id)
        with traces.session():
            rid = traces.read(None, lambda _con, rid: rid)
            per_rank, late = traces.stragglers(), traces.late_ranks(top=1_000_000)  # all: the note counts them
        if per_rank.is_empty():
            raise TraceanaError(f"run {rid!r} has no device events, so no stragglers")
        stage_ranks = per_rank.filter(pl.col("straggler_stage"))
        result = Result(run_id=rid, step="typical (mean over steps after the first)", threshold_pct=threshold_pct,
                        straggler_stage=stage_ranks["pp"][0],
                        straggler_stage_mean_COMP_ms=stage_ranks["COMP_ms"].mean())
        slow = per_rank.filter(pl.col("COMP_excess_pct") > threshold_pct).drop("straggler_stage")
        result.rows("straggler_ranks", slow, top, keep="COMP_excess_pct")
        result.rows("late_ranks", late, top)
        return result.to_json()

    def critical_path(self, run_id: RunId = None, step: Step = None, top: Top("segments") = 12) -> str:
        """The chain of work and waits across ranks that set one step's length (default: the second step; the
        first carries warm-up): length_ms, communication on the path (comm_ms = exposed_ms + overlapped_ms), its
        longest segments (rank, stage, kind, dim, name, start_ms, duration_ms, share_pct of the length) in time
        order, and totals by rank, stage and kind. As `traceana critical-path --json`."""
        from traceana.analyses import critical_path as cp

        def read(con: DuckDBPyConnection, rid: str) -> tuple:
            found, _, segments = cp.of_step(con, rid, step)
            return rid, found, segments, cp.communication(con, rid, found, segments)

        rid, found, segments, split = self._traces(run_id).read(None, read)
        parts = cp.report(segments)
        result = Result(run_id=rid, step=found, length_ms=(segments["end_ns"].max() - segments["start_ns"].min()) / 1e6,
                        communication=split)
        result.rows("segments", parts["segments"], top, keep="duration_ms")
        for name in ("by_rank", "by_stage", "by_kind"):
            result.rows(name, parts[name], top)
        return result.to_json()

    def comm(self, run_id: RunId = None,
             threshold_pct: Annotated[float, Field(ge=0, lt=100, description="Flag rank pairs and groups whose "
                                                   "bandwidth is this many % below their peers' median.")] = 20.0,
             top: Top() = 10) -> str:
        """Communication of the whole run: by_op (per op, dim and link intra/inter-node: instances, bytes, time ms,
        algbw and busbw GB/s as nccl-tests defines them), the slowest instances (time from the last arrival to
        the end), matrix (bytes, GB/s per rank pair from point-to-point and all-to-all), groups, and slow_links.
        As `traceana comm --json`."""
        from traceana.analyses.comm import by_group, by_op, matrix, slow_links, slowest
        from traceana.store import materialize

        def read(con: DuckDBPyConnection, rid: str) -> tuple:
            materialize(con, "collective_bandwidth", rid)
            return rid, by_op(con, rid), slowest(con, rid, top), matrix(con, rid), by_group(con, rid)

        rid, ops, worst, pairs, groups = self._traces(run_id).read(None, read)
        if ops.is_empty():
            raise TraceanaError(f"run {rid!r} has no collectives matched into instances, so no communication report")
        result = Result(run_id=rid, step="every step", threshold_pct=threshold_pct)
        result.rows("by_op", ops, top)
        result.rows("slowest", worst, top)
        result.rows("matrix", pairs, top, keep="bytes" if "bytes" in pairs.columns else None)
        result.rows("groups", groups, top)
        result.rows("slow_links", slow_links(pairs, groups, threshold_pct), top)
        return result.to_json()

    def kernels(self, run_id: RunId = None,
                view: Annotated[Literal["top", "roofline", "launch"], Field(
                    description="top: kernels by total device time; roofline: achieved TFLOP/s and GB/s against "
                                "the hardware's roof per op shape or kernel; launch: delay from launch call to "
                                "kernel start, and each stream's queue length.")] = "top",
                by: Annotated[Literal["run", "stage", "shape", "kernel"] | None, Field(
                    description="top: run (default) or stage; roofline: shape (default) or kernel.")] = None,
                profile: Annotated[str | None, Field(description="roofline: hardware profile a100, h100 or h200 "
                                                     "(default: the trace's device).")] = None,
                top: Top() = 15) -> str:
        """Kernels, as `traceana kernels --json` (view top), `--roofline --json` or `--launch --json`. top: short
        name, category, calls, total_ms, mean_us, share of COMP, ms per rank-step. Times ms or us as named."""
        from traceana.analyses import launches as la
        from traceana.analyses.kernels import ranking
        from traceana.analyses.roofline import measure

        traces = self._traces(run_id)
        rid = traces.read(None, lambda _con, rid: rid)
        result = Result(run_id=rid, step="steps after the first" if view == "top" else "every step", view=view)
        if view == "top":
            frame = traces.read(None, lambda con, rid: ranking(con, rid, top, by or "run"))
            if frame.is_empty():
                raise TraceanaError(f"run {rid!r} has no device events in its steps, so no kernels")
            result.rows("kernels", frame, frame.height)  # ranking keeps the top (per stage)
        elif view == "roofline":
            if by not in (None, "shape", "kernel"):
                raise TraceanaError(f"by={by!r}: the roofline is per 'shape' or 'kernel'")
            roof = traces.read(None, lambda con, rid: measure(con, rid, by or "shape", profile, top + 1))
            result.fields.update(by=by or "shape", profile=roof.peaks.profile, notes=roof.notes)
            result.rows("rows", roof.frame, top)
        else:
            if by is not None or profile is not None:
                raise TraceanaError("view='launch' reports per kernel, rank and step: drop by and profile")

            def read(con: DuckDBPyConnection, rid: str) -> tuple:
                return la.notes(con, rid), {"by_kernel": la.by_kernel(con, rid), "by_rank": la.by_rank(con, rid),
                                            "by_step": la.by_step(con, rid), "queue": la.queue_summary(con, rid)}

            notes, parts = traces.read(None, read)
            result.fields["notes"] = notes
            for name, frame in parts.items():
                result.rows(name, frame, top)
        return result.to_json()

    def idle(self, run_id: RunId = None, step: Step = None, top: Top("ranks (the most IDLE kept)") = 16) -> str:
        """Why each rank's device was idle (ms per step, default: the typical step, the mean over steps after the
        first): IDLE_ms split into host-bound launch gaps, sync waits, queued work, step-boundary gaps, unknown.
        As `traceana idle --json`."""
        traces = self._traces(run_id)
        with traces.session():
            rid = traces.read(None, lambda _con, rid: rid)
            frame = traces.idle(step)
        if frame.is_empty():
            raise TraceanaError(f"run {rid!r} has no device events, so no idle time")
        result = Result(run_id=rid, step=step if step is not None else "typical (mean over steps after the first)")
        result.rows("ranks", frame, top, keep="IDLE_ms")
        return result.to_json()

    def memory(self, run_id: RunId = None, top: Top("rank-steps (the largest peaks kept)") = 16) -> str:
        """Peak allocated and reserved device memory (bytes) per rank and step, from the allocator's samples. As
        `traceana memory --json`."""
        traces = self._traces(run_id)
        with traces.session():
            rid = traces.read(None, lambda _con, rid: rid)
            frame = traces.memory()
        if frame.is_empty():
            raise TraceanaError(f"run {rid!r} has no memory samples (Kineto needs profile_memory=True; Ascend "
                                "needs the allocator records)")
        result = Result(run_id=rid, step="every step")
        result.rows("rank_steps", frame, top, keep=next(c for c in frame.columns if c.endswith("_bytes")))
        return result.to_json()

    def diff(self, run_a: Annotated[str, Field(description="The reference run (A), from `runs`.")],
             run_b: Annotated[str, Field(description="The run compared with A (B), from `runs`.")],
             top: Top("kernels per list") = 10) -> str:
        """What changed from run A to B, per typical step: breakdown per stage and part (ms_A, ms_B, ms_delta, %,
        explains_pct: share of the stage's TOTAL change), the kernels whose time changed most, new and vanished
        kernels (ms and calls per rank and step), collectives by op and dim. As `traceana diff --json`."""
        traces = self._traces(None)
        with traces.session():
            parts, kernels, comms = (traces.diff(run_a, run_b, part)
                                     for part in ("breakdown", "kernels", "collectives"))
        if parts.is_empty():
            raise TraceanaError(f"runs {run_a!r} and {run_b!r} have no device events to compare")
        result = Result(run_a=run_a, run_b=run_b, step="typical (mean over steps after the first)")
        result.rows("breakdown", parts, top * parts["part"].n_unique())  # whole stages: `top` of them
        status = pl.col("status")
        result.rows("kernels_changed", kernels.filter(status == "both"), top)
        result.rows("kernels_new", kernels.filter(status == "new"), top)
        result.rows("kernels_vanished", kernels.filter(status == "vanished").sort("ms_A", descending=True), top)
        result.rows("collectives", comms, top)
        return result.to_json()

    def replay(self, run_id: RunId = None, step: Step = None,
               top: Top("rank-steps (the largest |error_pct| kept)") = 16) -> str:
        """Replay the run from its own dependency graph, nothing changed: the check of what whatif and advise rest
        on. Median and worst |error_pct| of the replayed TOTAL against the measured over rank-steps (all, or one
        step), the graph's edges by kind, what it lacks (missing), and per rank-step measured and replayed TOTAL
        and parts (ms), unexplained_hold_ms, external_hold_ms. As `traceana replay --json`."""
        from traceana.model import replay

        def read(con: DuckDBPyConnection, rid: str) -> tuple:
            return rid, *replay.replay_run(con, rid, step)

        rid, graph, frame = self._traces(run_id).read(None, read)
        result = Result(run_id=rid, step=step if step is not None else "every step", **replay.summary(frame),
                        edges=graph.counts, missing=graph.missing)
        result.rows("rank_steps", frame, top, keep="error_pct", magnitude=True)
        return result.to_json()

    def whatif(self, changes: Annotated[list[str], Field(min_length=1, description=(
                   "Changes to the step's dependency graph, KEY=TARGET[:FACTOR], applied in order: dim=TP:0.5 "
                   "(TP transfers 0.5x as long), op=AllToAll:0.7, pg=ID:0.5 (a process group from info), "
                   "link=0-4:2 (the link between ranks 0 and 4 at half speed), "
                   "kernel=*flash*:0.8 (fnmatch), kernel=*flash*:roof=60 (to 60% of the roof), host=0 (no host "
                   "time between launches), rank=5:median, rank=5:1.4, rank=*:median, stage=0:median, stage=0:1.3, "
                   "overlap=DP (DP no longer waited for), overlap=DP:backward (all DP buckets but each step's last "
                   "beside the backward)."))],
               run_id: RunId = None, step: Step = None, top: Top("ranks (the largest gain kept)") = 16) -> str:
        """Predict one step (default: the second) after the changes: measured_step_ms and predicted_step_ms (the
        median rank's TOTAL) with error_bar_ms (the plain replay's residual), per rank and per stage the measured
        and predicted TOTAL and parts (ms) and gain_ms, and the critical path after the change by kind. As
        `traceana whatif --json`. A change of layout, micro-batches or schedule needs predict instead."""
        from traceana.analyses.critical_path import report
        from traceana.model import whatif

        parsed = [whatif.parse(spec) for spec in changes]

        def read(con: DuckDBPyConnection, rid: str) -> tuple:
            return rid, *whatif.whatif_step(con, rid, parsed, step, path=True)

        rid, found, graph, frame, segments = self._traces(run_id).read(None, read)
        path = report(segments)["by_kind"] if segments is not None and segments.height else pl.DataFrame()
        result = Result(run_id=rid, step=found, changes=[str(c) for c in parsed],
                        measured_step_ms=float(frame["TOTAL_ms"].median()),
                        predicted_step_ms=float(frame["predicted_TOTAL_ms"].median()),
                        error_bar_ms=float(frame["error_bar_ms"].max()), edges=graph.counts, missing=graph.missing)
        result.rows("ranks", frame, top, keep="gain_ms")
        result.rows("stages", whatif.by_stage(frame), top)
        result.rows("critical_path_by_kind", path, top)
        return result.to_json()

    def advise(self, run_id: RunId = None, step: Step = None,
               config: Annotated[str | None, Field(description="The job's estimator YAML (a file given to "
                                                   "`traceana mcp --config` or under its --output-dir): adds the "
                                                   "changes only the estimator predicts.")] = None,
               top: Top("findings") = 10) -> str:
        """Ranked findings for one step (default: the second): what was measured (evidence, with the view it comes
        from), a concrete change (a whatif spec), measured_step_ms, predicted_step_ms, gain_ms and error_bar_ms,
        best first by gain less its error bar. As `traceana advise --json`. Check a finding with whatif."""
        from traceana.model import advise

        path = None if config is None else str(self._config(config, "config"))
        rid, found, frame = self._traces(run_id).read(
            None, lambda con, rid: (rid, *advise.findings(con, rid, step, path)))
        result = Result(run_id=rid, step=found)
        result.rows("findings", frame, top)
        return result.to_json()

    def predict(self, config: Annotated[str, Field(description="The estimator YAML that describes the run (a file "
                                                   "given to `traceana mcp --config` or under --output-dir).")],
                to: Annotated[str, Field(description="The estimator YAML of the configuration to predict (allowed "
                                         "as config is).")],
                run_id: RunId = None, top: Top("rows per list") = 16) -> str:
        """Another configuration of the same job (layout, micro-batches, schedule) predicted from the measured run:
        per dim measured_A_ms, ratio, predicted_B_ms with error_bar_ms, estimated_B_ms (the estimator alone) and
        source, for the typical step and per stage; peak memory (MiB); the schedule; notes on what the trace could
        not inform; the TOTAL's interval with the sources that set its width. As `traceana predict --json`."""
        source, target = self._config(config, "config"), self._config(to, "to")
        traces = self._traces(run_id)
        rid = traces.read(None, lambda _con, rid: rid)
        found = traces.predict(source, target)
        result = Result(run_id=rid, step="typical (mean over steps after the first)", config=str(source),
                        target=str(target), memory=found.memory, schedule=found.schedule,
                        interval=found.interval.to_json(), notes=found.notes)
        result.rows("step", found.step, top)
        result.rows("stages", found.stages, top)
        return result.to_json()

    def sql(self, query: Annotated[str, Field(max_length=20_000, description=(
                "One read-only SELECT (also WITH, FROM, DESCRIBE, SHOW, SUMMARIZE) over the store's tables and "
                "views; resource traceana://schema lists them with their columns. Main views: rank_breakdown, "
                "stage_breakdown, stragglers, collective_instances, collective_waits, kernel_totals, idle_gaps, "
                "memory_peaks. Times are ns where a column says _ns, ms where _ms."))],
            run_id: Annotated[str | None, Field(description="Show this run's rows only (from `runs`; default: every "
                                                "run's rows).")] = None,
            limit: Annotated[int, Field(ge=1, le=1_000, description="How many rows to return.")] = 50) -> str:
        """Ad-hoc SQL for what no other tool answers. Read-only: statements that write, and file access outside
        the store, are refused. Returns the columns and the first `limit` rows."""
        frame = self._traces(run_id).sql(query, run_id, limit=limit + 1)  # one row more: were rows cut?
        result = Result(run_id=run_id, step=None, columns=frame.columns)
        result.rows("rows", frame.head(limit), limit)
        result.fields["rows"] = [list(row.values()) for row in result.fields["rows"]]
        if frame.height > limit:
            result.notes.append(f"rows: the first {limit} shown; the query returns more (pass a larger limit, or "
                                "aggregate in SQL)")
        return result.to_json()

    def report(self, file_name: Annotated[str, Field(pattern=r"^[\w.-]+\.html$", description="The HTML file's name "
                                                     "(no folder): it is written into the server's --output-dir.")],
               run_id: RunId = None,
               estimate: Annotated[str | None, Field(description="A job YAML (allowed as for advise): add estimate "
                                                     "vs measured.")] = None) -> str:
        """Write the run's interactive HTML report (breakdowns, timeline with the critical path, communication,
        kernels, idle, memory; opens offline) into --output-dir and return its path and size. For a person to
        open; the other tools give the same numbers as JSON."""
        if self.output_dir is None:
            raise TraceanaError("report: start `traceana mcp` with --output-dir to let it write reports")
        html = self.output_dir / file_name
        if html.resolve().parent != self.output_dir:
            raise TraceanaError(f"report {file_name}: must name a file directly in {self.output_dir}")
        traces = self._traces(run_id)
        size = traces.report(html, None if estimate is None else self._config(estimate, "estimate"))
        return Result(run_id=traces.read(None, lambda _con, rid: rid), step="every step", path=str(html),
                      bytes=size).to_json()
