"""rocprofv3 JSON ingest (issue 35). A real MI350X trace (tests/data/traces/README.md) against a computation over its
raw records made here with the standard library; copies, RCCL API ranges and several processes on a small file
built from rocprofiler-sdk's documented JSON schema (using-rocprofv3.rst, "JSON output schema"), as the public
sample traced kernels only."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from tests.conftest import ROOT, query, run_cli, union_length

TRACE = ROOT / "tests" / "data" / "traces" / "rocprofv3_mi350x_908.json.gz"


def test_real_trace_breakdown_equals_the_raw_records(tmp_path: Path) -> None:
    with gzip.open(TRACE) as handle:
        process = json.load(handle)["rocprofiler-sdk-tool"][0]
    names = {s["kernel_id"]: s["formatted_kernel_name"] for s in process["kernel_symbols"]}
    spans = [(d["start_timestamp"], d["end_timestamp"], names[d["dispatch_info"]["kernel_id"]])
             for d in process["buffer_records"]["kernel_dispatch"]]
    comm = [(s, e) for s, e, n in spans if n.startswith("nccl")]
    comp = [(s, e) for s, e, n in spans if not n.startswith("nccl")]
    db = tmp_path / "t.duckdb"
    run_cli("ingest", TRACE, "--db", db)
    assert query(db, "SELECT count(*), count(*) FILTER (WHERE category = 'comm') FROM device_events") == [
        (len(spans), len(comm))]
    assert query(db, "SELECT count(*), min(op) FROM collectives") == [(1310, "Unknown")]  # RCCL's Generic kernel
    got = json.loads(run_cli("breakdown", "--db", db, "--json").stdout)[0]
    total = max(e for _, e, _ in spans) - min(s for s, _, _ in spans)
    busy = union_length(comm + comp)
    expected = {"TOTAL_ms": total, "COMP_ms": union_length(comp), "OTHER_WAIT_ms": busy - union_length(comp),
                "IDLE_ms": total - busy, "OVERLAPPED_ms": union_length(comm) + union_length(comp) - busy}
    assert {k: got[k] for k in expected} == pytest.approx({k: v / 1e6 for k, v in expected.items()}, abs=1e-6)
    (version, device, source) = query(db, "SELECT tool_version, device, source_format FROM runs")[0]
    assert (version, device, source) == ("rocprofv3 JSON (rocprofiler-sdk)", "AMD Instinct MI350X", "rocprofv3")


KINDS = [{"kind": "NONE", "operations": []},
         {"kind": "HIP_RUNTIME_API", "operations": ["hipApiName", "hipLaunchKernel", "hipMemcpyAsync"]},
         {"kind": "MEMORY_COPY", "operations": ["MEMORY_COPY_NONE", "MEMORY_COPY_HOST_TO_HOST",
                                                "MEMORY_COPY_HOST_TO_DEVICE"]},
         {"kind": "KERNEL_DISPATCH", "operations": ["KERNEL_DISPATCH_NONE", "KERNEL_DISPATCH_ENQUEUE",
                                                    "KERNEL_DISPATCH_COMPLETE"]},
         {"kind": "RCCL_API", "operations": ["ncclAllGather", "ncclAllReduce"]}]


def process(pid: int, t0: int) -> dict:
    """One process as rocprofv3 writes it: a GEMM, an RCCL kernel launched inside ncclAllReduce, a host-to-device
    copy; the copy's and the launches' API calls share their records' correlation ids."""
    def api(kind: int, op: int, corr: int, start: int, end: int) -> dict:
        return {"size": 48, "kind": kind, "operation": op, "thread_id": pid, "correlation_id": {
            "internal": corr, "external": 0}, "start_timestamp": t0 + start, "end_timestamp": t0 + end}

    def dispatch(kernel: int, corr: int, start: int, end: int) -> dict:
        return {**api(3, 2, corr, start, end), "dispatch_info": {
            "agent_id": {"handle": 9}, "queue_id": {"handle": 1}, "kernel_id": kernel, "dispatch_id": corr},
            "stream_id": {"handle": 1}}

    return {
        "metadata": {"pid": pid, "node": {"hostname": "mi300-node"}},
        "agents": [{"id": {"handle": 9}, "type": 2, "gpu_index": 0, "product_name": "AMD Instinct MI300X"}],
        "strings": {"buffer_records": KINDS},
        "kernel_symbols": [{"kernel_id": 0}, {"kernel_id": 1, "formatted_kernel_name": "Cijk_Alik_Bljk_gemm"},
                           {"kernel_id": 2, "formatted_kernel_name": "ncclDevKernel_Generic_1(ncclDevKernelArgs)"}],
        "buffer_records": {
            "hip_api": [api(1, 1, 1, 0, 5), api(1, 1, 2, 110, 115), api(1, 2, 3, 300, 305)],
            "rccl_api": [api(4, 1, 10, 100, 130)],
            "kernel_dispatch": [dispatch(1, 1, 10, 90), dispatch(2, 2, 120, 200)],
            "memory_copy": [{**api(2, 2, 3, 310, 330), "src_agent_id": {"handle": 8}, "dst_agent_id": {"handle": 9}}],
        }}


def test_copies_rccl_ranges_and_one_rank_per_process(tmp_path: Path) -> None:
    trace = tmp_path / "2222_results.json"
    trace.write_text(json.dumps({"rocprofiler-sdk-tool": [process(2222, 1000), process(2223, 1040)]}))
    db = tmp_path / "t.duckdb"
    run_cli("ingest", trace, "--db", db)
    assert query(db, "SELECT rank, pid FROM ranks ORDER BY rank") == [(0, 2222), (1, 2223)]
    assert query(db, "SELECT rank, name, category, start_ns, launch_ns FROM device_events ORDER BY rank, start_ns") \
        == [(r, n, c, t0 + s, t0 + launch) for r, t0 in ((0, 1000), (1, 1040))
            for n, c, s, launch in (("Cijk_Alik_Bljk_gemm", "compute", 10, 0),
                                    ("ncclDevKernel_Generic_1(ncclDevKernelArgs)", "comm", 120, 110),
                                    ("MEMORY_COPY_HOST_TO_DEVICE", "memcpy", 310, 300))]
    assert query(db, "SELECT rank, op, kernel_op, evidence FROM collectives ORDER BY rank") == [
        (0, "AllReduce", "Generic", "op-only"), (1, "AllReduce", "Generic", "op-only")]
