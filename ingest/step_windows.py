"""Training steps on each rank: from step markers (ProfilerStep#N, NVTX ranges, --step-marker), and for GPU runs the
device windows DESIGN §4 defines: every device event in the step whose CPU range held its launch, consecutive
windows cut where their work overlaps least, so that windows tile the timeline."""

from __future__ import annotations

from dataclasses import dataclass, field

import polars as pl

from traceana.errors import TraceanaError, first_line


def marker_steps(ranges: pl.DataFrame, marker: str) -> pl.DataFrame:
    """Steps from the ranges (NVTX, CPU ops) whose name matches ``marker``, per rank when ``ranges`` has one: a
    step is numbered by the last integer in its name, else by its order on the rank; ranges sharing a number form
    one step spanning them all. A rank without markers gets no rows (step_windows makes its activity one step)."""
    try:
        marked = ranges.filter(pl.col("name").str.contains(marker))
    except pl.exceptions.ComputeError as exc:
        raise TraceanaError(f"--step-marker {marker!r}: {first_line(exc)}") from None
    by = ["rank"] if "rank" in marked.columns else []
    marked = marked.sort([*by, "start_ns"]).with_columns(pl.coalesce(
        pl.col("name").str.extract(r"(\d+)\D*$").cast(pl.Int64),
        pl.int_range(pl.len()).over(by) if by else pl.int_range(pl.len())).alias("step"))
    return marked.group_by([*by, "step"]).agg(pl.col("start_ns").min(), pl.col("end_ns").max()).sort([*by, "step"])


_BEFORE, _AFTER = -(1 << 62), 1 << 62  # launched before the first / after the last step range: no step


def launch_steps(events: pl.DataFrame, markers: pl.DataFrame) -> pl.Series:
    """For each device event (rank, launch_ns), the step whose CPU range on its rank holds the launch: the latest
    step starting at or before it (a launch between two steps is the earlier one's); before the first step or
    after the last one's end, no step. NULL where the launch is unknown."""
    keyed = events.select("rank", "launch_ns").with_row_index("_row")
    marks = markers.select(pl.col("rank").cast(keyed.schema["rank"]), "step", "start_ns", "end_ns").sort("start_ns")
    bounds = marks.group_by("rank").agg(pl.col("start_ns").min().alias("_first"), pl.col("end_ns").max().alias("_last"))
    found = (keyed.filter(pl.col("launch_ns").is_not_null()).sort("launch_ns")
             .join_asof(marks.select("rank", "step", "start_ns"), left_on="launch_ns", right_on="start_ns", by="rank",
                        check_sortedness=False)
             .join(bounds, on="rank", how="left")
             .select("_row", pl.when(pl.col("launch_ns") < pl.col("_first")).then(pl.lit(_BEFORE))
                     .when(pl.col("launch_ns") >= pl.col("_last")).then(pl.lit(_AFTER))
                     .otherwise(pl.col("step")).cast(pl.Int64).alias("step")))
    return pl.Series("step", dtype=pl.Int64).extend_constant(None, keyed.height).scatter(found["_row"], found["step"])


@dataclass
class StepLinks:
    """How :func:`step_windows_of` found steps, counted so that ranks windowed apart (in workers) give the notes of
    the whole run: whether some rank linked launches to steps, device events without a launch record, whether the
    format has device-side step ranges, and the ranks whose steps are their markers' CPU ranges."""

    linked: bool = False
    unlaunched: int = 0
    annotated: bool = False
    unlinked: list[int] = field(default_factory=list)
    launched_ns: int = 0      # device time of events whose step is known (launch or device-side range)
    misplaced_ns: int = 0     # ... of it outside its own step's window
    worst: float = 0.0        # the largest share of one rank-step's launched time outside its window
    outside_ns: int = 0       # device time outside every window of its rank (before the first, after the last)
    outside_events: int = 0   # events with some time there

    def __add__(self, other: StepLinks) -> StepLinks:
        return StepLinks(self.linked or other.linked, self.unlaunched + other.unlaunched,
                         self.annotated or other.annotated, self.unlinked + other.unlinked,
                         self.launched_ns + other.launched_ns, self.misplaced_ns + other.misplaced_ns,
                         max(self.worst, other.worst), self.outside_ns + other.outside_ns,
                         self.outside_events + other.outside_events)

    def notes(self) -> list[str]:
        out = []
        if self.linked:
            note = "step windows on the device: each event in the step that launched it (correlation id), cut " \
                   "where consecutive steps' work overlaps least"
            if self.unlaunched:
                by = "the profiler's device-side step ranges, else " if self.annotated else ""
                note += f"; {self.unlaunched} events without a launch record placed by {by}their stream's previous " \
                        "event"
            out.append(note)
            if self.launched_ns:
                out.append(f"{100 * self.misplaced_ns / self.launched_ns:.1f}% of the device time the steps launched "
                           f"runs outside its own step's window (worst rank-step {100 * self.worst:.1f}%)")
            if self.outside_events:
                out.append(f"{self.outside_events} device events ({self.outside_ns / 1e6:,.3f} ms) lie outside every "
                           "step window, before the first or after the last: no step counts them")
        if self.unlinked:
            out.append(f"no launch records on rank(s) {', '.join(map(str, sorted(set(self.unlinked))))}: steps "
                       "there are the step markers' CPU ranges")
        return out


def step_windows_of(events: pl.DataFrame, markers: pl.DataFrame) -> tuple[pl.DataFrame, StepLinks]:
    """Steps of a GPU run: device windows (:func:`device_step_windows`) on every rank where some device event's
    launch (``launch_ns``, the runtime call's time; else the format's own device-side ``step``, if any) falls in a
    step marker's CPU range; the marker ranges themselves on ranks without such links."""
    annotated = events["step"] if "step" in events.columns else pl.Series("step", [None] * len(events), pl.Int64)
    if markers.is_empty() or events.is_empty():  # (run apart, a rank's events without markers have no step)
        return markers, StepLinks(unlaunched=events.height, annotated=annotated.is_not_null().any(),
                                  unlinked=markers["rank"].unique().to_list())
    launched = launch_steps(events, markers)
    events = events.with_columns(pl.coalesce(launched, annotated).alias("step"))
    linked = events.filter(~pl.col("step").is_in([_BEFORE, _AFTER]))["rank"].unique()
    windows = device_step_windows(events.filter(pl.col("rank").is_in(linked.implode())))
    rest = markers.filter(~pl.col("rank").is_in(linked.implode()))
    links = StepLinks(not linked.is_empty(), launched.null_count(), annotated.is_not_null().any(),
                      rest["rank"].unique().to_list(), *_misplaced(events, windows))
    return pl.concat([windows, rest.select(windows.columns)], how="vertical_relaxed"), links


def _misplaced(events: pl.DataFrame, windows: pl.DataFrame) -> tuple[int, int, float, int, int]:
    """(launched_ns, misplaced_ns, worst share, outside_ns, outside_events) of :class:`StepLinks`: how much of the
    time each step launched its windows leave to a neighbour, and how much no window holds (DESIGN §4)."""
    work = events.filter(pl.col("end_ns") > pl.col("start_ns")).select("rank", "step", "start_ns", "end_ns")
    own = work.join(windows.select("rank", pl.col("step").cast(work.schema["step"]), pl.col("start_ns").alias("w0"),
                                   pl.col("end_ns").alias("w1")), on=["rank", "step"])
    inside = (pl.min_horizontal("end_ns", "w1") - pl.max_horizontal("start_ns", "w0")).clip(lower_bound=0)
    per_step = own.group_by("rank", "step").agg((pl.col("end_ns") - pl.col("start_ns")).sum().alias("ran"),
                                                inside.sum().alias("inside"))
    span = windows.group_by("rank").agg(pl.col("start_ns").min().alias("lo"), pl.col("end_ns").max().alias("hi"))
    edges = work.join(span, on="rank").select(
        ((pl.min_horizontal("end_ns", "lo") - pl.col("start_ns")).clip(lower_bound=0)
         + (pl.col("end_ns") - pl.max_horizontal("start_ns", "hi")).clip(lower_bound=0)).alias("out"))
    ran, kept = int(per_step["ran"].sum() or 0), int(per_step["inside"].sum() or 0)
    worst = per_step.select(((pl.col("ran") - pl.col("inside")) / pl.col("ran")).max()).item() or 0.0
    return ran, ran - kept, float(worst), int(edges["out"].sum() or 0), int((edges["out"] > 0).sum())


def device_step_windows(events: pl.DataFrame) -> pl.DataFrame:
    """Step windows on the device from device events (rank, stream, start_ns, end_ns, step) whose step is the one
    that launched them (NULL: unknown; launched outside every step: the sentinels of :func:`launch_steps`).

    An event without a known step takes the step of the event before it on its stream (a stream runs in issue
    order), or is earlier than every step when nothing precedes it. Each step's window ends where the next one's
    begins: where their work does not overlap, at the later step's first event; where it does (the next step's
    prefetch copies run under this step's compute), at the instant that leaves the least device time on the wrong
    side of the cut (time of this step's events after it plus time of the next step's events before it). The
    first step opens at its first event, or at its cut from the earlier work; the last closes at its last event's
    end, or at its cut from the later work. Windows are contiguous and never overlap."""
    events = events.filter(pl.col("end_ns") >= pl.col("start_ns"))
    if events["step"].null_count():  # the stream's previous event: the only step that needs the events in order
        events = events.sort("rank", "stream", "start_ns", "end_ns").with_columns(
            pl.col("step").forward_fill().over("rank", "stream"))
    events = events.with_columns(pl.col("step").fill_null(_BEFORE))
    groups = (events.group_by("rank", "step").agg(pl.col("start_ns").min().alias("lo"),
                                                  pl.col("end_ns").max().alias("hi"))
              .sort("rank", "step").with_columns(pl.int_range(pl.len()).over("rank").alias("g")))
    # Pair g is the boundary between group g and group g + 1: their work overlaps on [lo of g+1, hi of g].
    pairs = groups.select("rank", "g", "hi", pl.col("lo").shift(-1).over("rank").alias("lo")).drop_nulls()
    zone = pairs.filter(pl.col("lo") < pl.col("hi"))
    # Moving the cut past t changes the misplaced time at the rate (open events of g+1) - (open events of g). Only
    # events in the overlap move it: group g's ending after lo (one ending by then adds -1 and +1 at lo) and group
    # g+1's starting by hi, so only those are exploded into points (the rest are most of a long run's events).
    steps = groups.select("rank", "step", "g")
    earlier = events.join(zone.join(steps, on=["rank", "g"]), on=["rank", "step"]).filter(
        pl.col("end_ns") > pl.col("lo")).select("rank", "g", "lo", "hi", t=pl.concat_list("start_ns", "end_ns"),
                                                d=pl.lit([-1, 1]))
    later = events.join(zone.join(steps.with_columns(pl.col("g") - 1), on=["rank", "g"]), on=["rank", "step"]).filter(
        pl.col("start_ns") <= pl.col("hi")).select("rank", "g", "lo", "hi", t=pl.concat_list("start_ns", "end_ns"),
                                                   d=pl.lit([1, -1]))
    points = (pl.concat([earlier, later]).explode("t", "d")
              .filter(pl.col("t") <= pl.col("hi")).with_columns(pl.max_horizontal("t", "lo").alias("t")))
    points = pl.concat([points, zone.with_columns(t=pl.col("lo"), d=pl.lit(0, points.schema["d"]))],
                       how="diagonal_relaxed")
    cost = points.sort("rank", "g", "t").with_columns(
        (pl.col("d").cum_sum() * (pl.col("t").shift(-1) - pl.col("t")).fill_null(0)).over("rank", "g").alias("_c")
    ).with_columns((pl.col("_c").cum_sum() - pl.col("_c")).over("rank", "g").alias("cost"))
    best = cost.sort("rank", "g", "cost", "t").group_by("rank", "g").agg(pl.col("t").first().alias("cut"))
    cuts = pairs.join(best, on=["rank", "g"], how="left").select(
        "rank", "g", pl.coalesce("cut", "lo").alias("cut"))
    windows = groups.join(cuts.select("rank", pl.col("g") + 1, pl.col("cut").alias("start_cut")),
                          on=["rank", "g"], how="left").join(cuts.rename({"cut": "end_cut"}), on=["rank", "g"],
                                                             how="left")
    return windows.filter(~pl.col("step").is_in([_BEFORE, _AFTER])).select(
        "rank", pl.col("step").cast(pl.Int32), pl.coalesce("start_cut", "lo").alias("start_ns"),
        pl.coalesce("end_cut", "hi").alias("end_ns")).sort("rank", "step")
