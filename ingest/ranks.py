"""Which rank an input is, where the trace does not say: a rank in a file name only through an explicit pattern, and
no two inputs claiming one rank or holding the same trace."""

from __future__ import annotations

import hashlib
import re
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
    equal size are read to compare them."""
    by_size: dict[int, list[Path]] = {}
    for file in files:
        by_size.setdefault(file.stat().st_size, []).append(file)
    for same in (group for group in by_size.values() if len(group) > 1):
        seen: dict[str, Path] = {}
        for file in same:
            with file.open("rb") as handle:
                digest = hashlib.file_digest(handle, "sha256").hexdigest()
            if digest in seen:
                raise TraceanaError(f"{file}: the same trace as {seen[digest]} (an input given twice); "
                                    "give each rank's trace once")
            seen[digest] = file
