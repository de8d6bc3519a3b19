"""HCCL communicators: which process group each HCCL op ran in, and what the framework called that group.

Evidence, strongest first: the database's COMMUNICATION_OP.groupName is the communicator name itself; the text
export's communication.json keys each op as ``op@hash`` where hash is msprof-analyze's double_hash of the
communicator name. parallel_group_info (profiler_metadata.json, or META_DATA in the database) maps communicator
names to the framework's group_name (tp, dp, dp_cp, exp ...) and global ranks. The three digits inside an op name
are only the hash's last digits and can collide, so they are never used to pick a group.
"""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path

import polars as pl

from traceana.errors import TraceanaError
from traceana.ingest.validate import MAX_RANK, rank_list
from traceana.layout import Layout

_MASK = 0xFFFFFFFF


def double_hash(name: str) -> int:
    """msprof-analyze's group hash: two 32-bit polynomial string hashes (primes 29 and 131), concatenated."""
    low = high = 0
    for char in name:
        high = (high * 29 + ord(char)) & _MASK
        low = (low * 131 + ord(char)) & _MASK
    return (high << 32) | low


def metadata_groups(metadata: list[dict]) -> pl.DataFrame:
    """pg (communicator name), name (group_name), ranks from every rank's parallel_group_info, deduplicated."""
    groups: dict[str, tuple[str | None, list[int]]] = {}
    for meta in metadata:
        info = _object(meta.get("parallel_group_info"), "parallel_group_info")
        for comm, group in info.items():
            group = _object(group, f"parallel_group_info {comm}")
            groups[comm] = (group.get("group_name") or None,
                            rank_list(group.get("global_ranks"), "profiler metadata",
                                      f"parallel_group_info {comm} global_ranks"))
    return pl.DataFrame(
        [{"pg": comm, "name": name, "ranks": ranks} for comm, (name, ranks) in groups.items()],
        schema={"pg": pl.String(), "name": pl.String(), "ranks": pl.List(pl.Int32())},
    )


def communication_keys(path: Path) -> pl.DataFrame:
    """Every op of a communication.json (all steps, p2p and collective): op_name, group_hash, step (None under the
    key "step" of a run without steps), start_ns and end_ns (Start Timestamp(us) + Elapse Time(ms); NULL where
    the entry lacks either)."""
    try:
        data = json.loads(path.read_text(), parse_float=Decimal)  # the times as written: a float loses ~100 ns
    except (OSError, ValueError) as exc:
        raise TraceanaError(f"{path}: not readable as JSON ({exc})") from None
    if not isinstance(data, dict):
        raise TraceanaError(f"{path}: holds {type(data).__name__} JSON, not an object of steps")
    rows = []
    for step_key, step in data.items():
        number = re.fullmatch(r"step(\d{1,9})", step_key)
        for kind in ("p2p", "collective"):
            for key, info in _entries(_entries(step).get(kind)).items():
                op, sep, group_hash = key.rpartition("@")
                if sep and group_hash.isdigit() and int(group_hash) < 2**64:
                    times = _entries(_entries(info).get("Communication Time Info"))
                    start, elapse = _number(times.get("Start Timestamp(us)")), _number(times.get("Elapse Time(ms)"))
                    start_ns = round(start * 1000) if start is not None else None
                    rows.append((op, int(group_hash), int(number.group(1)) if number else None, start_ns,
                                 start_ns + round(elapse * 10**6) if start_ns is not None and elapse is not None
                                 else None))
    return pl.DataFrame(rows, orient="row", schema={"op_name": pl.String(), "group_hash": pl.UInt64(),
                                                    "step": pl.Int32(), "start_ns": pl.Int64(), "end_ns": pl.Int64()})


def _entries(value: object) -> dict:
    """A JSON object of the file, or nothing where another type stands (its ops are then not there to count)."""
    return value if isinstance(value, dict) else {}


def _number(value: object) -> Decimal | None:
    """A JSON number that a time can be made of (not a bool, NaN or past 2^52), else None."""
    ok = isinstance(value, int | Decimal) and not isinstance(value, bool) and Decimal(value).is_finite()
    return Decimal(value) if ok and abs(value) < 2 ** 52 else None


def link_by_hash(ops: pl.DataFrame, keys: pl.DataFrame) -> pl.DataFrame:
    """Give each HCCL op (name, start_ns) the group_hash its communication.json entry names.

    Names repeat across groups whose hashes end in the same 3 digits, so an op takes the entry of its own name
    whose start (a float in µs there) is nearest to its own, within 50 µs.
    """
    keyed = keys.select("op_name", "group_hash", "start_ns").drop_nulls("start_ns").rename({"op_name": "name"})
    return ops.drop("group_hash").sort("start_ns").join_asof(
        keyed.sort("start_ns"), on="start_ns", by="name", strategy="nearest", tolerance=50_000,
        check_sortedness=False)


def layout_from_metadata(metadata: list[dict]) -> Layout | None:
    """The Megatron layout MindSpeed records in ``distributed_args``, if any (Megatron's default order)."""
    for meta in metadata:
        args = _object(meta.get("distributed_args"), "distributed_args")
        if args:
            sizes = {dim: args.get(f"{key}_parallel_size") or 1 for dim, key in
                     (("tp", "tensor_model"), ("cp", "context"), ("ep", "expert_model"), ("dp", "data"),
                      ("pp", "pipeline_model"))}
            if bad := next((f"{d}={v!r}" for d, v in sizes.items() if not isinstance(v, int) or v < 1), None):
                raise TraceanaError(f"profiler metadata: distributed_args {bad} is not a group size")
            return Layout(**sizes)
    return None


def checked_metadata(meta: dict) -> dict:
    """``meta`` with parallel_group_info and distributed_args as objects (a database holds them as JSON text), and
    distributed_args.world_size a number of ranks; a field of another type is a one-line error naming it."""
    meta = {**meta, **{key: _object(meta.get(key), key) for key in ("parallel_group_info", "distributed_args")}}
    size = meta["distributed_args"].get("world_size")
    if size is not None and (isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= MAX_RANK + 1):
        raise TraceanaError(f"profiler metadata: distributed_args world_size is {size!r}, not a number of ranks")
    return meta


def _object(value: object, field: str) -> dict:
    """A metadata field that must be a JSON object (or its text); absent is empty; else a one-line error."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            raise TraceanaError(f"profiler metadata: {field} is not valid JSON ({value[:60]!r})") from None
    if value is None or value == "":
        return {}
    if not isinstance(value, dict):
        raise TraceanaError(f"profiler metadata: {field} is {json.dumps(value)[:60]}, not an object")
    return value


