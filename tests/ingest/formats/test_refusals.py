"""Files traceana does not read are refused by name (issue 35): exit 2, one line naming the file, what it appears to
be and what to record instead, and no store written. Two inputs are real public files (tests/data/traces/README.md);
the others are built here from each format's documented first bytes (research note formats-vintages-rocprof.md,
section 4), as no small public sample was found."""

from __future__ import annotations

import gzip
import json
import sqlite3
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_cli

DATA = ROOT / "tests" / "data" / "traces"


def _sqlite(path: Path, table: str) -> None:
    with sqlite3.connect(path) as con:
        con.execute(f"CREATE TABLE {table} (id INTEGER)")


# name -> (write the file into this path, the phrase the refusal must hold)
BUILT = {
    "results.csv": (lambda p: p.write_text("Index,KernelName,gpu-id,queue-id,queue-index,pid,tid,grd,wgr,lds,scr,"
                                           "arch_vgpr,accum_vgpr,sgpr,wave_size,sig,obj,DispatchNs,BeginNs,EndNs,"
                                           "CompleteNs\n0,\"k\",0,0,0,1,1,1,1,0,0,8,0,16,64,0,0,1,2,3,4\n"),
                    "a rocprof (v1) CSV"),
    "results_123.csv": (lambda p: p.write_text("Dispatch_ID,GPU_ID,Queue_ID,PID,TID,Grid_Size,Workgroup_Size\n"),
                        "a rocprofv2 CSV"),
    "123_kernel_trace.csv": (lambda p: p.write_text('"Kind","Agent_Id","Queue_Id","Thread_Id","Dispatch_Id"\n'),
                             "a rocprofv3 CSV"),
    "123_results.db": (lambda p: _sqlite(p, "rocpd_kernel_dispatch_0123"), "a rocprofv3 database (rocpd"),
    "trace.pftrace": (lambda p: p.write_bytes(b"\x0a\x12\x0a\x10\x0a\x0erocprofv3 trace"), "a Perfetto protobuf"),
    "trace.et": (lambda p: p.write_bytes(b"\x09\x0a\x050.0.4\x12\x00\x17\x0a\x01"), "a Chakra execution trace"),
    "report1.qdrep": (lambda p: p.write_bytes(b"\x00\x01qdrep payload"), "nsys export --type sqlite"),
    "profile.json": (lambda p: p.write_text(json.dumps([{"name": "aten::mm", "ph": "X", "ts": 1, "dur": 2, "tid": 0,
                                                         "pid": "CPU functions", "args": {}}])),
                     "a PyTorch autograd profiler trace"),
    "results.json": (lambda p: p.write_text('{ "traceEvents":[{}\n,{"args":{"name":"CPU HIP API"},"ph":"M","pid":2,'
                                            '"name":"process_name"}\n,{"ph":"X","name":"hipLaunchKernel","pid":2,'
                                            '"tid":1,"ts":1,"dur":2}\n], "otherData": {}}'),
                     "a rocprof (v1) JSON trace"),
    "chrome.json": (lambda p: p.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "blink", "name": "Paint", "pid": 1, "tid": 1, "ts": 1, "dur": 2}]})),
                    "a Chrome trace without GPU events"),
}
REAL = {
    "hta_execution_trace_simple_add_et.json.gz": "a PyTorch execution trace",
    "tracelens_jax_934987a2fc2f.xplane.pb": "a TensorFlow/JAX profile",
}


def _refused(path: Path, phrase: str, tmp_path: Path) -> None:
    store = tmp_path / "store.duckdb"
    result = run_cli("ingest", path, "--db", store, check=False)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {path}: ") and phrase in lines[0], lines[0]
    assert "Traceback" not in result.stderr and not store.exists()


@pytest.mark.parametrize("name", sorted(BUILT))
def test_built_files_are_refused_by_format(name: str, tmp_path: Path) -> None:
    write, phrase = BUILT[name]
    path = tmp_path / name
    write(path)
    _refused(path, phrase, tmp_path)


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_files_are_refused_by_format(name: str, tmp_path: Path) -> None:
    _refused(DATA / name, REAL[name], tmp_path)


def test_a_gzipped_look_alike_is_recognised_inside(tmp_path: Path) -> None:
    path = tmp_path / "results.json.gz"
    path.write_bytes(gzip.compress(b'{"traceEvents":[{"ph":"X","cat":"x","name":"a","pid":"CPU HIP API","tid":1,'
                                   b'"ts":1,"dur":1}],"otherData":{}}'))
    _refused(path, "a rocprof (v1) JSON trace", tmp_path)
