"""Ascend profiler output (torch_npu *_ascend_pt, MindSpore *_ascend_ms, raw msprof PROF_*): find each rank's data,
read it (database export preferred over the text timeline), number ranks, link HCCL ops to their communicators.

Accepted inputs: a cluster folder holding one profiler folder per rank, rank folders, PROF_* folders, or the files
themselves (trace_view.json, msprof_*.json / msprof_slice_*, *.db). Ranks come from profiler_info_{rank}.json,
then the database's RANK_DEVICE_MAP, then the database file name, else device or input order. When several folders
claim one rank, the one whose collection ended last wins and the run's notes say which was dropped.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from traceana.errors import TraceanaError
from traceana.ingest.ascend_db import read_database
from traceana.ingest.ascend_groups import (
    communication_keys,
    double_hash,
    group_dims,
    layout_from_metadata,
    link_by_hash,
    metadata_groups,
)
from traceana.ingest.ascend_tasks import RankTrace
from traceana.ingest.ascend_timeline import read_timeline
from traceana.ingest.dispatch import IngestOptions
from traceana.ingest.run_data import RunData, require_unique_ranks
from traceana.layout import DIMS, Layout

OUTPUT = "ASCEND_PROFILER_OUTPUT"
_DB = re.compile(r"^(?:ascend_(?:pytorch|mindspore)_profiler(?:_(\d+))?|msprof_\d+)\.db$")
_MSPROF_JSON = re.compile(r"^msprof_(?:slice_\d+_)?(\d{14})\.json$")
_RANK_FOLDER = re.compile(r"_ascend_(?:pt|ms)$")
_HOST_CLOCK_TOLERANCE_NS = 1_000_000  # ranks of one host see the same wall-minus-monotonic offset to a few µs


@dataclass
class _Source:
    """Where one rank's data lies, and what its folder says before the data is read."""

    kind: str  # 'db' or 'timeline'
    files: list[Path]
    origin: Path  # the rank folder, PROF_* folder or file the user's input resolved to
    rank: int | None = None
    rank_source: str | None = None
    collected_ns: int | None = None  # when collection ended (wall clock): the newest folder of a rank wins
    boot_ns: int | None = None  # wall-clock minus monotonic clock: equal on every rank of one host
    info: dict = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)
    communication: Path | None = None


def _is_rank_folder(path: Path) -> bool:
    return path.is_dir() and (bool(_RANK_FOLDER.search(path.name)) or (path / OUTPUT).is_dir())


def _is_prof_folder(path: Path) -> bool:
    return path.is_dir() and path.name.startswith("PROF_")


def _timeline_head(path: Path) -> bool:
    """A JSON array of Chrome-trace events with string timestamps: the Ascend timeline's signature."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(65536).lstrip()
    except OSError:
        return False
    return head.startswith(b"[") and re.search(rb'"ts"\s*:\s*"', head) is not None


def matches(path: Path) -> bool:
    """Ascend output: a profiler/PROF folder, a folder of them, a database export, or an Ascend timeline JSON."""
    if path.is_dir():
        if path.name == OUTPUT or _is_rank_folder(path) or _is_prof_folder(path):
            return True
        return any(_is_rank_folder(child) or _is_prof_folder(child) for child in path.iterdir())
    if _DB.match(path.name):
        return True
    return path.suffix == ".json" and (path.name == "trace_view.json" or bool(_MSPROF_JSON.match(path.name))
                                       or _timeline_head(path))


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TraceanaError(f"{path}: not readable as JSON ({exc})") from None


def _folder_context(source: _Source, folder: Path) -> _Source:
    """Fill rank, clocks and metadata from a rank folder's profiler_info_{rank}.json and profiler_metadata.json."""
    infos = sorted(folder.glob("profiler_info*.json"))
    if infos:
        source.info = _read_json(infos[0])
        number = re.search(r"profiler_info_(\d+)\.json$", infos[0].name)
        rank = source.info.get("rank_id")
        if isinstance(rank, int) and rank >= 0:
            source.rank, source.rank_source = rank, "profiler_info"
        elif number:
            source.rank, source.rank_source = int(number.group(1)), "profiler_info"
        end = source.info.get("end_info") or {}
        if isinstance(end.get("collectionTimeEnd"), int):
            source.collected_ns = end["collectionTimeEnd"]
            if isinstance(end.get("MonotonicTimeEnd"), int):
                source.boot_ns = end["collectionTimeEnd"] - end["MonotonicTimeEnd"]
    if (folder / "profiler_metadata.json").is_file():
        source.metadata = _read_json(folder / "profiler_metadata.json")
    return source


def _rank_folder(folder: Path) -> _Source:
    output = folder / OUTPUT
    if not output.is_dir():
        raise TraceanaError(f"{folder}: no {OUTPUT} folder (the profiler's analysis did not run or did not finish)")
    databases = sorted(p for p in output.iterdir() if _DB.match(p.name))
    if databases:
        source = _Source("db", databases[:1], folder)
    elif (output / "trace_view.json").is_file():
        communication = output / "communication.json"
        source = _Source("timeline", [output / "trace_view.json"], folder,
                         communication=communication if communication.is_file() else None)
    else:
        raise TraceanaError(f"{output}: neither a profiler database (ascend_*_profiler_*.db) nor trace_view.json")
    return _folder_context(source, folder)


def _msprof_timeline(folder: Path) -> list[Path]:
    """The newest msprof_{time}.json, else the newest complete set of msprof_slice_{i}_{time}.json."""
    found = [(m.group(1), "slice" in p.name, p) for p in folder.glob("msprof_*.json")
             if (m := _MSPROF_JSON.match(p.name))]
    if not found:
        return []
    whole = [f for f in found if not f[1]]
    if whole:
        return [max(whole)[2]]
    newest = max(f[0] for f in found)
    return sorted(p for stamp, _, p in found if stamp == newest)


def _prof_folder(prof: Path) -> _Source:
    databases = sorted(prof.glob("msprof_*.db"))
    timeline = _msprof_timeline(prof / "mindstudio_profiler_output")
    if databases:
        source = _Source("db", databases[-1:], prof)
    elif timeline:
        communication = prof / "analyze" / "communication.json"
        source = _Source("timeline", timeline, prof, communication=communication if communication.is_file() else None)
    else:
        raise TraceanaError(f"{prof}: no msprof_*.db and no mindstudio_profiler_output/msprof_*.json "
                            f"(export with `msprof --export=on` first)")
    for info in sorted(prof.glob("device_*/info.json.*")):
        rank = _read_json(info).get("rank_id")
        if isinstance(rank, int) and rank >= 0:
            source.rank, source.rank_source = rank, "rank_id"
    return source


def _file(path: Path) -> _Source:
    parent = path.parent
    if _DB.match(path.name):
        source = _Source("db", [path], path)
        number = _DB.match(path.name).group(1)
        if number is not None:
            source.rank, source.rank_source = int(number), "file-name"
    elif _MSPROF_JSON.match(path.name) and "slice" in path.name:
        source = _Source("timeline", _msprof_timeline(parent), path)
    else:
        source = _Source("timeline", [path], path)
    if parent.name == OUTPUT:
        _folder_context(source, parent.parent)
        communication = parent / "communication.json"
        source.communication = communication if source.kind == "timeline" and communication.is_file() else None
    return source


def _sources(path: Path) -> list[_Source]:
    if path.is_file():
        return [_file(path)]
    if path.name == OUTPUT:
        return [_rank_folder(path.parent)]
    if _is_rank_folder(path):
        return [_rank_folder(path)]
    if _is_prof_folder(path):
        return [_prof_folder(path)]
    children = sorted(p for p in path.iterdir() if _is_rank_folder(p) or _is_prof_folder(p))
    if not children:
        raise TraceanaError(f"{path}: no Ascend profiler output here (no *_ascend_pt / *_ascend_ms / PROF_* folder)")
    return [s for child in children for s in _sources(child)]


def _newest_per_rank(sources: list[_Source], notes: list[str]) -> list[_Source]:
    """Keep one source per claimed rank: the one whose collection ended last."""
    kept: dict[int, _Source] = {}
    for source in sources:
        if source.rank is None or source.rank not in kept:
            if source.rank is not None:
                kept[source.rank] = source
            continue
        other = kept[source.rank]
        if source.collected_ns is None or other.collected_ns is None or source.collected_ns == other.collected_ns:
            raise TraceanaError(f"{source.origin}: rank {source.rank} is also claimed by {other.origin} and neither "
                                f"says when it was collected; pass only one of them")
        newer, older = (source, other) if source.collected_ns > other.collected_ns else (other, source)
        kept[source.rank] = newer
        notes.append(f"rank {source.rank}: kept {newer.origin} (newest), ignored {older.origin}")
    return list(kept.values()) + [s for s in sources if s.rank is None]


def _read_source(source: _Source, options: IngestOptions) -> RankTrace:
    if source.kind == "db":
        trace = read_database(source.files[0], options.rules, options.step_marker)
    else:
        trace = read_timeline(source.files, options.rules, options.step_marker)
    options.progress(str(source.origin))
    config = (source.info.get("config") or {}).get("experimental_config") or {}
    level = config.get("_profiler_level")
    trace.tool_version = ", ".join(filter(None, [f"profiler {level}" if level else None, trace.tool_version]))
    trace.metadata = {**trace.metadata, **source.metadata}
    if source.communication is not None and "comm" in trace.events.columns:
        trace.events = link_by_hash(trace.events, communication_keys(source.communication))
    return trace


def _host_names(sources: list[_Source], traces: list[RankTrace]) -> list[str | None]:
    """The database's host name; else one label per group of ranks whose wall-minus-monotonic clock offsets agree
    (that offset is the host's boot time, shared by its processes and different between hosts)."""
    label: dict[int, str] = {}
    start = None
    for boot in sorted({s.boot_ns for s, t in zip(sources, traces, strict=True) if t.host is None and s.boot_ns}):
        if start is None or boot - start > _HOST_CLOCK_TOLERANCE_NS:
            start = boot
        label[boot] = "booted " + dt.datetime.fromtimestamp(start / 1e9, dt.UTC).isoformat(timespec="milliseconds")
    return [t.host or label.get(s.boot_ns or 0) for s, t in zip(sources, traces, strict=True)]


def _assign_ranks(sources: list[_Source], traces: list[RankTrace]) -> tuple[list[int], list[str]]:
    claimed = [s.rank if s.rank is not None else t.rank for s, t in zip(sources, traces, strict=True)]
    how = [s.rank_source if s.rank is not None else t.rank_source for s, t in zip(sources, traces, strict=True)]
    if all(r is not None for r in claimed):
        return claimed, how  # type: ignore[return-value]
    devices = [t.device for t in traces]
    if all(d is not None for d in devices) and len(set(devices)) == len(devices):
        order, method = sorted(range(len(traces)), key=lambda i: devices[i]), "device-order"
    else:
        order, method = list(range(len(traces))), "input-order"
    free = (r for r in itertools.count() if r not in claimed)
    ranks = list(claimed)
    for index in order:
        if ranks[index] is None:
            ranks[index], how[index] = next(free), method
    return ranks, how  # type: ignore[return-value]


def _collectives(events: pl.DataFrame, groups: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Collective rows with pg, and the process groups: parallel_group_info's, plus communicators only seen in ops."""
    comm = events.filter((pl.col("category") == "comm") & pl.col("kernel_op").is_not_null()) \
        if "kernel_op" in events.columns else events.clear()
    if "group_hash" not in comm.columns:
        comm = comm.with_columns(pl.lit(None, dtype=pl.UInt64()).alias("group_hash"))
    by_hash = {double_hash(pg): pg for pg in groups["pg"].to_list()}
    comm = comm.with_columns(
        pl.coalesce("comm", pl.col("group_hash").replace_strict(by_hash, default=None, return_dtype=pl.String()),
                    pl.col("group_hash").cast(pl.String())).alias("pg"),
    ).with_columns(pl.when(pl.col("pg").is_not_null()).then(pl.lit("pg-args")).otherwise(pl.lit("name-rule"))
                   .alias("evidence"))
    seen = (comm.filter(pl.col("pg").is_not_null() & ~pl.col("pg").is_in(groups["pg"].implode()))
            .group_by("pg").agg(pl.col("rank").unique().sort().cast(pl.Int32).alias("ranks")))
    all_groups = pl.concat([groups.with_columns(pl.lit("trace").alias("source")),
                            seen.with_columns(pl.lit(None, dtype=pl.String()).alias("name"),
                                              pl.lit("inferred").alias("source"))], how="diagonal_relaxed")
    return comm, all_groups


def _metadata_layout(metadata: list[dict], world: int, notes: list[str]) -> Layout | None:
    layout = layout_from_metadata(metadata)
    if layout is None:
        return None
    if layout.world_size != world:
        notes.append(f"MindSpeed distributed_args layout {layout.spec} ignored: it has {layout.world_size} ranks, the "
                     f"run {world}")
        return None
    layout.validate()
    notes.append(f"layout {layout.spec} from MindSpeed distributed_args")
    return layout


def read(paths: list[Path], options: IngestOptions) -> RunData:
    notes: list[str] = []
    seen: dict[Path, _Source] = {}
    for path in paths:
        for source in _sources(path):
            seen.setdefault(source.files[0].resolve(), source)
    sources = _newest_per_rank(list(seen.values()), notes)
    traces = [_read_source(s, options) for s in sources]
    ranks, how = _assign_ranks(sources, traces)
    require_unique_ranks(ranks, [str(s.origin) for s in sources])
    hosts = _host_names(sources, traces)
    if any(s.boot_ns and not t.host for s, t in zip(sources, traces, strict=True)):
        notes.append("hosts told apart by the profiler's wall-minus-monotonic clock offset (no host names in text "
                     "exports)")

    def tagged(frame: pl.DataFrame, rank: int) -> pl.DataFrame:
        return frame.with_columns(pl.lit(rank, dtype=pl.Int32()).alias("rank"))

    events = pl.concat([tagged(t.events, r) for t, r in zip(traces, ranks, strict=True)], how="diagonal_relaxed")
    events = events.sort("rank", "start_ns", "end_ns", "name").with_columns(
        pl.int_range(pl.len(), dtype=pl.Int64).over("rank").alias("event_id"))
    metadata = [t.metadata for t in traces]
    comm, groups = _collectives(events, metadata_groups(metadata))
    if comm["pg"].null_count():
        notes.append(f"{comm['pg'].null_count()} HCCL ops have no communicator evidence (no database groupName, no "
                     f"communication.json op@hash: profiler level 0?); their process group is unknown")

    world = max([max(ranks) + 1] + [int((m.get("distributed_args") or {}).get("world_size") or 0) for m in metadata])
    frame_ranks = pl.DataFrame({
        "rank": ranks, "host": hosts, "device": [t.device for t in traces], "pid": [t.pid for t in traces],
        "rank_source": how, "source": [str(s.origin) for s in sources],
    }, schema_overrides={"rank": pl.Int32(), "device": pl.Int32(), "pid": pl.Int64()})
    layout = options.layout or _metadata_layout(metadata, world, notes)
    if layout is not None:
        groups = group_dims(groups, layout)
        if options.layout is None:  # finish() places ranks only on a layout the user gave
            coords = pl.DataFrame([layout.coords(r) for r in ranks], schema={d: pl.Int32() for d in DIMS})
            frame_ranks = pl.concat([frame_ranks, coords], how="horizontal")
    versions = sorted({t.tool_version for t in traces if t.tool_version})
    return RunData(
        source_format="ascend",
        sources=[str(f.resolve()) for s in sources for f in s.files],
        world_size=world,
        tool_version="; ".join(versions) or None,
        rank_source=",".join(sorted(set(how))),
        notes=notes,
        frames={
            "ranks": frame_ranks,
            "process_groups": groups,
            "device_events": events,
            "collectives": comm,
            "annotations": pl.concat([tagged(t.annotations, r) for t, r in zip(traces, ranks, strict=True)]),
            "steps": pl.concat([tagged(t.steps, r) for t, r in zip(traces, ranks, strict=True)]),
        },
    )
