"""HCCL communicators: which process group each HCCL op ran in, and what the framework called that group.

Evidence, strongest first: the database's COMMUNICATION_OP.groupName is the communicator name itself; the text
export's communication.json keys each op as ``op@hash`` where hash is msprof-analyze's double_hash of the
communicator name. parallel_group_info (profiler_metadata.json, or META_DATA in the database) maps communicator
names to the framework's group_name (tp, dp, dp_cp, exp ...) and global ranks. The three digits inside an op name
are only the hash's last digits and can collide, so they are never used to pick a group.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl

from traceana.errors import TraceanaError
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
        info = meta.get("parallel_group_info") or {}
        if isinstance(info, str):
            info = json.loads(info)
        for comm, group in info.items():
            groups[comm] = (group.get("group_name") or None, sorted(int(r) for r in group.get("global_ranks") or []))
    return pl.DataFrame(
        [{"pg": comm, "name": name, "ranks": ranks} for comm, (name, ranks) in groups.items()],
        schema={"pg": pl.String(), "name": pl.String(), "ranks": pl.List(pl.Int32())},
    )


def communication_keys(path: Path) -> pl.DataFrame:
    """op_name, group_hash and start_ns of every op in a communication.json (all steps, p2p and collective)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TraceanaError(f"{path}: not readable as JSON ({exc})") from None
    rows = []
    for step in data.values():
        for kind in ("p2p", "collective"):
            for key, info in (step.get(kind) or {}).items():
                op, sep, group_hash = key.rpartition("@")
                if sep and group_hash.isdigit():
                    start_us = (info.get("Communication Time Info") or {}).get("Start Timestamp(us)")
                    rows.append((op, int(group_hash), round(start_us * 1000) if start_us is not None else None))
    return pl.DataFrame(rows, schema={"op_name": pl.String(), "group_hash": pl.UInt64(), "start_ns": pl.Int64()},
                        orient="row")


def link_by_hash(ops: pl.DataFrame, keys: pl.DataFrame) -> pl.DataFrame:
    """Give each HCCL op (name, start_ns) the group_hash its communication.json entry names.

    Names repeat across groups whose hashes end in the same 3 digits, so an op takes the entry of its own name
    whose start (a float in µs there) is nearest to its own, within 50 µs.
    """
    keyed = keys.drop_nulls("start_ns").rename({"op_name": "name"}).sort("start_ns")
    return ops.drop("group_hash").sort("start_ns").join_asof(
        keyed, on="start_ns", by="name", strategy="nearest", tolerance=50_000, check_sortedness=False)


def layout_from_metadata(metadata: list[dict]) -> Layout | None:
    """The Megatron layout MindSpeed records in ``distributed_args``, if any (Megatron's default order)."""
    for meta in metadata:
        args = meta.get("distributed_args")
        if isinstance(args, str):
            args = json.loads(args)
        if args:
            return Layout(tp=int(args.get("tensor_model_parallel_size") or 1),
                          cp=int(args.get("context_parallel_size") or 1),
                          ep=int(args.get("expert_model_parallel_size") or 1),
                          dp=int(args.get("data_parallel_size") or 1),
                          pp=int(args.get("pipeline_model_parallel_size") or 1))
    return None


