"""What a file traceana does not read appears to be, and what to do instead: the refusal names the format.

Recognition is by name and the first bytes only (research: formats-vintages-rocprof.md, section 4): a refusal must
be cheap, and it never decides what a reader reads. Used by dispatch.detect (no reader claims the file) and by the
Kineto reader (JSON that is not a PyTorch profiler trace).
"""

from __future__ import annotations

import gzip
import re
from pathlib import Path

_HEAD = 65536

_KINETO = "PyTorch profiler (Kineto) JSON"
_ROCPROFV3 = ("rocprofv3 --kernel-trace --memory-copy-trace --rccl-trace --hip-runtime-trace --output-format json "
              "-- <app>")


def _head(path: Path) -> bytes:
    """The first bytes of the file, decompressed when it is gzip; b'' when it cannot be read."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(_HEAD)
        if head.startswith(b"\x1f\x8b"):
            with gzip.open(path, "rb") as handle:
                head = handle.read(_HEAD)
    except (OSError, EOFError):
        return b""
    return head


def not_read(path: Path) -> str:
    """One line (without the path) saying what ``path`` appears to be and what to give traceana instead."""
    name, head = path.name.lower(), _head(path)
    text = head.lstrip()
    if name.endswith(".qdrep"):
        return ("an Nsight Systems report of nsys 2021.2 or older (.qdrep), which only nsys reads: run "
                "`nsys export --type sqlite` on it (an nsys that opens .qdrep) and ingest the .sqlite")
    if name.endswith(".qdstrm"):
        return ("an unfinished Nsight Systems capture (.qdstrm): turn it into a report with nsys's QdstrmImporter, "
                "then `nsys export --type sqlite`, and ingest the .sqlite")
    if head.startswith(b"NVR\0") or name.endswith(".ncu-rep"):
        return ("an Nsight Compute report (.ncu-rep): per-kernel metrics, not a timeline; record the run with "
                "Nsight Systems or the PyTorch profiler")
    if head.startswith(b"SQLite format 3\0"):
        if b"rocpd_" in head:
            return ("a rocprofv3 database (rocpd, the default output since ROCm 7.0): record with "
                    f"`{_ROCPROFV3}` and ingest the JSON")
        return "an SQLite database that is neither an nsys export nor an Ascend profiler database"
    if head[:1] == b"\x0a":
        if b"/host:" in head[:4096] or b"/device:" in head[:4096]:
            return ("a TensorFlow/JAX profile (XSpace, *.xplane.pb): traceana reads PyTorch, Nsight Systems, "
                    "rocprofv3 and Ascend traces; for a PyTorch job record with torch.profiler")
        return ("a Perfetto protobuf trace (.pftrace): traceana does not read protobuf traces; on ROCm record "
                f"`{_ROCPROFV3}`, with PyTorch torch.profiler's {_KINETO}")
    if _chakra(head) or name.endswith(".et"):
        return ("a Chakra execution trace (protobuf graph of ops, no measured timeline): ingest the PyTorch profiler "
                "(Kineto) traces recorded with it")
    if text.startswith(b"["):
        if b'"CPU functions"' in head or b'"cpu_to_cuda"' in head:
            return ("a PyTorch autograd profiler trace (use_kineto=False, PyTorch 1.7 or older), without device "
                    "events: record with torch.profiler.profile (Kineto)")
        return "a JSON array of events (a Chrome trace without the object around it), not a Kineto trace"
    if text.startswith(b"{"):
        if re.search(rb'"schema"\s*:\s*"\d', head) and b'"nodes"' in head:
            return ("a PyTorch execution trace (Chakra input: ops and tensors, no timings): ingest the PyTorch "
                    "profiler (Kineto) traces recorded with it")
        if b'"otherData"' in head or b'"CPU HIP API"' in head or b'"DataFlow"' in head:
            return f"a rocprof (v1) JSON trace (results.json): record with rocprofv3, `{_ROCPROFV3}`"
        if b'"traceEvents"' not in head:
            return f"a JSON object without a traceEvents array: not a {_KINETO} trace"
        return (f"a Chrome trace without GPU events or {_KINETO} categories: traceana reads PyTorch profiler, "
                "Nsight Systems, rocprofv3 and Ascend traces")
    first = text.split(b"\n", 1)[0]
    if first.startswith(b"Index,KernelName") or first.startswith(b"Index,kernel-name"):
        return f"a rocprof (v1) CSV (results.csv): record with rocprofv3, `{_ROCPROFV3}`"
    if first.startswith(b"Dispatch_ID,GPU_ID") or first.startswith(b"Domain,Function,Start_Timestamp"):
        return f"a rocprofv2 CSV (results_<pid>.csv): record with rocprofv3, `{_ROCPROFV3}`"
    if first.startswith(b'"Kind","Agent_Id"') or first.startswith(b'"Domain","Function"'):
        return f"a rocprofv3 CSV: traceana reads rocprofv3's JSON, `{_ROCPROFV3}`"
    return ("unknown trace format (expected PyTorch profiler JSON, an nsys report or export, rocprofv3 JSON, or "
            "Ascend profiler output)")


def _chakra(head: bytes) -> bool:
    """Chakra's .et: varint-length-prefixed protobuf messages, the first a GlobalMetadata whose field 1 is the
    schema version ("0.0.4"). No magic number: this is the shape of its first message."""
    return len(head) > 4 and head[1:2] == b"\x0a" and re.match(rb"\d+\.\d+\.\d+", head[3:3 + head[2]]) is not None
