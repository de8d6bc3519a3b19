"""Which rank an input is, where the trace does not say: a rank in a file name only through an explicit pattern, and
no two inputs claiming one rank or holding the same trace."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path

from traceana.errors import TraceanaError

# A rank in a file name only where the name says "rank": rank3, rank_3, _r3_, worker3 (tried in this order). Other
# digits (h200_gpt_h2048_L8_s1024_gb4, a timestamp, a pid) are not ranks.
_RANK_IN_NAME = (r"(?i)rank[_-]?(\d+)", r"(?i)(?:^|[_.-])r(\d+)(?=[_.-])", r"(?i)worker[_-]?(\d+)")


def rank_in_file_name(name: str) -> int | None:
    """The rank a file name states through an explicit pattern, else None."""
    for pattern in _RANK_IN_NAME:
        if found := re.search(pattern, name):
            return int(found[1])
    return None


def require_unique_ranks(ranks: list[int], sources: list[str]) -> None:
    """Two inputs claiming the same rank is a user error, named with both files."""
    seen: dict[int, str] = {}
    for rank, source in zip(ranks, sources, strict=True):
        if rank in seen:
            raise TraceanaError(f"{source}: rank {rank} is also claimed by {seen[rank]}")
        seen[rank] = source


def require_distinct(files: list[Path]) -> None:
    """One trace given twice (the same path, or a copy under another name) would store every event twice as two
    ranks, wherever the trace states no rank that would clash: a user error, named with both files. Only files of
    equal size and equal first MiB (where ranks' traces of one job differ: their metadata) are read whole."""
    for same_size in _groups(files, lambda file: file.stat().st_size):
        for same_head in _groups(same_size, lambda file: _digest(file, _HEAD)):
            seen: dict[str, Path] = {}
            for file in same_head:
                digest = _digest(file)
                if digest in seen:
                    raise TraceanaError(f"{file}: the same trace as {seen[digest]} (an input given twice); "
                                        "give each rank's trace once")
                seen[digest] = file


_HEAD = 1 << 20


def _groups(files: list[Path], key: Callable[[Path], object]) -> list[list[Path]]:
    """The files that share ``key`` with another, in groups."""
    by_key: dict[object, list[Path]] = {}
    for file in files:
        by_key.setdefault(key(file), []).append(file)
    return [group for group in by_key.values() if len(group) > 1]


def _digest(file: Path, size: int | None = None) -> str:
    """SHA-256 of the file, or of its first ``size`` bytes."""
    with file.open("rb") as handle:
        if size is not None:
            return hashlib.sha256(handle.read(size)).hexdigest()
        return hashlib.file_digest(handle, "sha256").hexdigest()
