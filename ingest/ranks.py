"""Which rank an input is, where the trace does not say: a rank in a file name only through an explicit pattern, and
no two inputs claiming one rank."""

from __future__ import annotations

import re

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
