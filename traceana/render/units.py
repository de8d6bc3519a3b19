"""Units chosen for a magnitude, so that a plot's axis and a table's column read 1 MiB rather than 0.00098 GiB, and
name the unit they chose: binary for sizes (MiB = 2^20 bytes: message sizes, traffic and memory, as allocators
count, in every table (console.emit_rows) and plot alike), decimal for bandwidth (GB/s = 1e9 bytes/s, as
nccl-tests counts)."""

from __future__ import annotations

Units = tuple[tuple[str, float, str], ...]  # (name, factor, what the name means)

BINARY_BYTES: Units = (("B", 1, "bytes"), ("KiB", 2**10, "2^10 bytes"), ("MiB", 2**20, "2^20 bytes"),
                       ("GiB", 2**30, "2^30 bytes"), ("TiB", 2**40, "2^40 bytes"))
BANDWIDTH: Units = (("B/s", 1, "bytes per second"), ("KB/s", 1e3, "1e3 bytes/s"), ("MB/s", 1e6, "1e6 bytes/s"),
                    ("GB/s", 1e9, "1e9 bytes/s"), ("TB/s", 1e12, "1e12 bytes/s"))


def unit_for(largest: float, units: Units) -> tuple[str, float, str]:
    """The largest of ``units`` in which ``largest`` is at least 1 (the smallest for 0, NaN or less)."""
    chosen = units[0]
    for unit in units:
        if abs(largest) >= unit[1]:
            chosen = unit
    return chosen
