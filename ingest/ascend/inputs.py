"""Where each rank's Ascend profiler data lies: torch_npu *_ascend_pt and MindSpore *_ascend_ms folders (alone or
gathered in a cluster folder), raw msprof PROF_* folders, folders of database exports or of an msprof timeline, or
the files themselves (trace_view.json, msprof_*.json and its msprof_slice_* parts, *.db exports). A rank folder
holding both exports is read from its database; a text export without trace_view.json from kernel_details.csv.

What a folder says before its data is read also comes from here: the rank (profiler_info_{rank}.json, a PROF
device's rank_id, a database file's name), when collection ended (several folders of one rank: the newest wins,
and the run's notes say which was dropped), the host's clock offset, and profiler_metadata.json.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from traceana.errors import TraceanaError
from traceana.ingest.validate import MAX_TIME_NS, checked_rank

OUTPUT = "ASCEND_PROFILER_OUTPUT"
KERNEL_DETAILS = "kernel_details.csv"  # a text export's device tasks: read when trace_view.json was left out
_DB = re.compile(r"^(?:ascend_(?:pytorch|mindspore)_profiler(?:_(\d+))?|msprof_\d+)\.db$")
_MSPROF_JSON = re.compile(r"^msprof_(?:slice_\d+_)?(\d{14})\.json$")
_RANK_FOLDER = re.compile(r"_ascend_(?:pt|ms)$")


@dataclass
class RankInput:
    """Where one rank's data lies, and what its folder says before the data is read."""

    kind: str  # 'db', 'timeline' or 'kernels' (kernel_details.csv: a text export without its timeline)
    files: list[Path]
    origin: Path  # the rank folder, PROF_* folder or file the user's input resolved to
    rank: int | None = None
    rank_source: str | None = None
    collected_ns: int | None = None  # when collection ended (wall clock): the newest folder of a rank wins
    boot_ns: int | None = None  # wall-clock minus monotonic clock: equal on every rank of one host
    level: str | None = None  # profiler level (Level0/1/2) from profiler_info
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


def is_ascend(path: Path) -> bool:
    """Ascend output: a profiler/PROF folder, a folder of them, a database export, or an Ascend timeline JSON."""
    if path.is_dir():
        if is_output_folder(path):
            return True
        return any(_is_rank_folder(child) or _is_prof_folder(child) or _DB.match(child.name)
                   or _MSPROF_JSON.match(child.name) for child in path.iterdir())
    if _DB.match(path.name):
        return True
    return path.suffix == ".json" and (path.name == "trace_view.json" or bool(_MSPROF_JSON.match(path.name))
                                       or _timeline_head(path))


def is_output_folder(path: Path) -> bool:
    """A folder that is itself one Ascend output (a profiler output, rank or PROF folder), not a folder of them: its
    JSON files are the profiler's own, not traces of another format."""
    return path.name == OUTPUT or _is_rank_folder(path) or _is_prof_folder(path)


def _read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TraceanaError(f"{path}: not readable as JSON ({exc})") from None
    if not isinstance(value, dict):
        raise TraceanaError(f"{path}: holds {type(value).__name__} JSON, not an object")
    return value


def _field(info: dict, *keys: str) -> object:
    """info[k1][k2]..., or None where a level is absent or not an object."""
    value: object = info
    for key in keys:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _folder_context(source: RankInput, folder: Path) -> RankInput:
    """Fill rank, clocks and metadata from a rank folder's profiler_info_{rank}.json and profiler_metadata.json."""
    infos = sorted(folder.glob("profiler_info*.json"))
    if infos:
        info = _read_json(infos[0])
        level = _field(info, "config", "experimental_config", "_profiler_level")
        source.level = str(level) if level is not None else None
        number = re.search(r"profiler_info_(\d+)\.json$", infos[0].name)
        rank = checked_rank(info.get("rank_id"), str(infos[0]), "rank_id")
        if rank is not None:
            source.rank, source.rank_source = rank, "profiler_info"
        elif number:
            source.rank, source.rank_source = int(number.group(1)), "profiler_info"
        end, monotonic = _field(info, "end_info", "collectionTimeEnd"), _field(info, "end_info", "MonotonicTimeEnd")
        if isinstance(end, int) and 0 <= end <= MAX_TIME_NS:
            source.collected_ns = end
            if isinstance(monotonic, int) and 0 <= monotonic <= end:
                source.boot_ns = end - monotonic
    if (folder / "profiler_metadata.json").is_file():
        source.metadata = _read_json(folder / "profiler_metadata.json")
    return source


def _rank_folder(folder: Path) -> RankInput:
    output = folder / OUTPUT
    if not output.is_dir():
        raise TraceanaError(f"{folder}: no {OUTPUT} folder (the profiler's analysis did not run or did not finish)")
    databases = sorted(p for p in output.iterdir() if _DB.match(p.name))
    communication = output / "communication.json"
    communication = communication if communication.is_file() else None
    if databases:
        source = RankInput("db", databases[:1], folder)
    elif (output / "trace_view.json").is_file():
        source = RankInput("timeline", [output / "trace_view.json"], folder, communication=communication)
    elif (output / KERNEL_DETAILS).is_file():
        source = RankInput("kernels", [output / KERNEL_DETAILS], folder, communication=communication)
    else:
        raise TraceanaError(f"{output}: no profiler database (ascend_*_profiler_*.db), trace_view.json or "
                            f"{KERNEL_DETAILS}")
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


def _prof_folder(prof: Path) -> RankInput:
    databases = sorted(prof.glob("msprof_*.db"))
    timeline = _msprof_timeline(prof / "mindstudio_profiler_output")
    if databases:
        source = RankInput("db", databases[-1:], prof)
    elif timeline:
        communication = prof / "analyze" / "communication.json"
        source = RankInput("timeline", timeline, prof, communication=communication if communication.is_file() else None)
    else:
        raise TraceanaError(f"{prof}: no msprof_*.db and no mindstudio_profiler_output/msprof_*.json "
                            f"(export with `msprof --export=on` first)")
    for info in sorted(prof.glob("device_*/info.json.*")):
        rank = checked_rank(_read_json(info).get("rank_id"), str(info), "rank_id")
        if rank is not None:
            source.rank, source.rank_source = rank, "rank_id"
    return source


def _file(path: Path) -> RankInput:
    parent = path.parent
    if _DB.match(path.name):
        source = RankInput("db", [path], path)
        number = _DB.match(path.name).group(1)
        if number is not None:
            source.rank, source.rank_source = int(number), "file-name"
    elif _MSPROF_JSON.match(path.name) and "slice" in path.name:
        source = RankInput("timeline", _msprof_timeline(parent), path)
    else:
        source = RankInput("timeline", [path], path)
    if parent.name == OUTPUT:
        _folder_context(source, parent.parent)
        communication = parent / "communication.json"
        source.communication = communication if source.kind == "timeline" and communication.is_file() else None
    return source


def _sources(path: Path) -> list[RankInput]:
    if path.is_file():
        return [_file(path)]
    if path.name == OUTPUT:
        return [_rank_folder(path.parent)]
    if _is_rank_folder(path):
        return [_rank_folder(path)]
    if _is_prof_folder(path):
        return [_prof_folder(path)]
    children = sorted(p for p in path.iterdir() if _is_rank_folder(p) or _is_prof_folder(p))
    if children:
        return [s for child in children for s in _sources(child)]
    # a folder of database exports (one per rank), or of msprof's timeline (mindstudio_profiler_output)
    databases, timeline = sorted(p for p in path.iterdir() if _DB.match(p.name)), _msprof_timeline(path)
    if not databases and not timeline:
        raise TraceanaError(f"{path}: no Ascend profiler output here (no *_ascend_pt / *_ascend_ms / PROF_* folder, "
                            "database export or msprof timeline)")
    return [_file(p) for p in databases] or [_file(timeline[0])]


def _newest_per_rank(sources: list[RankInput], notes: list[str]) -> list[RankInput]:
    """Keep one source per claimed rank: the one whose collection ended last."""
    kept: dict[int, RankInput] = {}
    for source in sources:
        if source.rank is None or source.rank not in kept:
            if source.rank is not None:
                kept[source.rank] = source
            continue
        other = kept[source.rank]
        if source.collected_ns is None or other.collected_ns is None or source.collected_ns == other.collected_ns:
            raise TraceanaError(f"{source.origin}: rank {source.rank} is also claimed by {other.origin}, and their "
                                f"profiler_info end times do not tell which is newer; pass only one of them")
        newer, older = (source, other) if source.collected_ns > other.collected_ns else (other, source)
        kept[source.rank] = newer
        notes.append(f"rank {source.rank}: kept {newer.origin} (newest), ignored {older.origin}")
    return list(kept.values()) + [s for s in sources if s.rank is None]


def find_inputs(paths: list[Path], notes: list[str]) -> list[RankInput]:
    """One input per rank (newest wins) for the user's paths; each file is read once however it was named."""
    seen: dict[Path, RankInput] = {}
    for path in paths:
        for source in _sources(path):
            seen.setdefault(source.files[0].resolve(), source)
    return _newest_per_rank(list(seen.values()), notes)
