"""Pick the ingester for the paths a user gave, run it, and apply the steps every format shares (:func:`finish`):
the one entry point the CLI calls. The readers (ingest/kineto/, nsys/, ascend/) only parse, so that none of them
re-implements coordinates, group dims, instance numbers or clock alignment."""

from __future__ import annotations

import importlib
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

import polars as pl

from traceana.errors import TraceanaError
from traceana.ingest.clocks import align_hosts, align_ranks
from traceana.ingest.formats import not_read
from traceana.ingest.groups.communicators import attribute, group_dims
from traceana.ingest.groups.instances import number_instances
from traceana.ingest.groups.stated import settle_layout
from traceana.ingest.parallel.executor import RayCluster
from traceana.ingest.rules import Rule, load_rules
from traceana.ingest.run_data import RunData
from traceana.ingest.validate import validate
from traceana.layout import Layout

# Format name -> module. Each module has ``matches(path) -> bool`` (cheap: names and a few header bytes) and
# ``read(paths, options) -> RunData``. Order is the detection order.
FORMATS = {"ascend": "traceana.ingest.ascend.reader", "nsys": "traceana.ingest.nsys.reader",
           "rocprofv3": "traceana.ingest.rocprof.reader", "kineto": "traceana.ingest.kineto.reader"}


class ReadProgress:
    """What an ingester reports as it works; silent here, a progress bar in the CLI (render.console.IngestProgress).

    An ingester calls ``files`` once with every file it will read, ``read`` after each, and ``phase`` as it moves
    on to the work after reading."""

    def files(self, paths: list[Path]) -> None: ...

    def read(self, path: Path) -> None: ...

    def phase(self, name: str) -> None: ...


@dataclass
class IngestOptions:
    layout: Layout | None = None
    step_marker: str | None = None          # regex over annotation names; None = the format's defaults
    rules: list[Rule] = field(default_factory=load_rules)
    cache_dir: Path = Path(".traceana-cache")  # where derived files (nsys -> sqlite exports) are written
    # worker processes parsing files (1: this process; None: all cores for large runs), or Ray tasks on a cluster
    jobs: int | RayCluster | None = None
    spill_near: Path = field(default_factory=lambda: Path(tempfile.gettempdir()) / "traceana")  # the store: the
    # per-event tables wait as Parquet in a folder beside it until the store write streams them in
    progress: ReadProgress = field(default_factory=lambda: ReadProgress())  # what the user sees while it runs


def _module(fmt: str) -> ModuleType | None:
    try:
        return importlib.import_module(FORMATS[fmt])
    except ModuleNotFoundError:
        return None  # that ingester is not built yet


def detect(path: Path) -> str:
    """The format of one input path, or a one-line error naming it (a folder of several formats too)."""
    if not path.exists():
        raise TraceanaError(f"{path}: no such file or directory")
    claims = [fmt for fmt in FORMATS if (module := _module(fmt)) is not None and module.matches(path)]
    if len(claims) > 1 and path.is_dir() and not any(_is_unit(fmt, path) for fmt in claims):
        _require_one_format(path)
    if claims:
        return claims[0]
    if path.is_dir():
        first = next((f for f in sorted(path.iterdir()) if f.is_file() and f.stat().st_size), None)
        raise TraceanaError(f"{path}: nothing to ingest here (no PyTorch profiler JSON, nsys report or export, "
                            "rocprofv3 JSON or Ascend profiler folder)"
                            + (f"; {first.name}: {not_read(first)}" if first else ""))
    if path.stat().st_size == 0:
        raise TraceanaError(f"{path}: the file is empty")
    raise TraceanaError(f"{path}: {not_read(path)}")


def _is_unit(fmt: str, folder: Path) -> bool:
    """Whether ``folder`` is one input of ``fmt`` (an Ascend rank folder), which its files' names do not make a
    folder of other formats' traces (an Ascend rank folder's profiler_info.json is no Kineto trace)."""
    is_unit = getattr(_module(fmt), "is_unit", None)
    return is_unit is not None and is_unit(folder)


def _require_one_format(folder: Path) -> None:
    """A folder whose entries are traces of several formats is refused, as the same entries given as a list are:
    reading one format's would leave the others out."""
    found: dict[str, Path] = {}
    for child in sorted(folder.iterdir()):
        fmt = next((f for f in FORMATS if (module := _module(f)) is not None and module.matches(child)), None)
        if fmt is not None:
            found.setdefault(fmt, child)
    if len(found) > 1:
        listing = ", ".join(f"{p.name} is {k}" for k, p in found.items())
        raise TraceanaError(f"{folder}: holds traces of several formats ({listing}); ingest each format as its own "
                            "run")


def read_run(paths: list[Path], fmt: str, options: IngestOptions) -> RunData:
    """Parse ``paths`` as one run of format ``fmt`` ('auto' detects it; all paths must agree) and finish it."""
    if not paths:
        raise TraceanaError("no input paths given")
    if fmt == "auto":
        found = {p: detect(p) for p in paths}
        kinds = set(found.values())
        if len(kinds) > 1:
            listing = ", ".join(f"{p} is {k}" for p, k in found.items())
            raise TraceanaError(f"inputs mix trace formats ({listing}); ingest each format as its own run")
        fmt = kinds.pop()
    module = _module(fmt) if fmt in FORMATS else None
    if module is None:
        raise TraceanaError(f"format {fmt!r} is not supported (known: {', '.join(FORMATS)})")
    data = module.read(paths, options)
    try:
        data = validate(data, data.dropped)
        options.progress.phase("assigning coordinates, process groups and collective instances")
        return finish(data, options.layout)
    except BaseException:
        data.discard()
        raise


def finish(data: RunData, layout: Layout | None) -> RunData:
    """Coordinates, group dimensions, collective groups and dims (communicators.attribute), instance numbers: the
    steps every format shares.

    ``layout`` is the user's, refused where the trace's own groups contradict it; without it, the layout the trace
    states (MindSpeed distributed_args) or its groups imply (:mod:`traceana.ingest.groups.stated`) is used."""
    if layout is not None:
        layout.check_world_size(data.world_size, data.sources[0])
    layout, notes = settle_layout(data.table("process_groups"), data.world_size, layout, data.layout,
                                  data.sources[0])
    data.layout, data.notes = layout, data.notes + notes
    ranks = data.table("ranks").with_columns(pl.col("clock_offset_ns").fill_null(0))
    if layout is not None:
        coords = pl.DataFrame([{"rank": r, **layout.coords(r)} for r in ranks["rank"].to_list()],
                              schema={"rank": pl.Int32(), **{d: pl.Int32() for d in ("tp", "cp", "ep", "dp", "pp")}})
        ranks = ranks.drop("tp", "cp", "ep", "dp", "pp").join(coords, on="rank", how="left").select(ranks.columns)
    data.frames["ranks"] = ranks
    groups = group_dims(data.table("process_groups"), layout)
    coll = data.table("collectives")
    stated = data.frames.get("collectives")
    if stated is not None and "group_size" in stated.columns:  # kept for the fingerprints, not stored
        coll = coll.with_columns(stated["group_size"].cast(pl.Int64))
    coll, data.frames["process_groups"], notes = attribute(coll, data.device_times(), groups, layout,
                                                           data.world_size, data.source_format)
    data.frames["collectives"] = number_instances(coll)
    data.notes += notes
    align_hosts(data)
    align_ranks(data)
    return data
