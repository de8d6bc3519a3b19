"""Kineto traces of other vintages and accelerators (issue 35): the 2021 Operator/Runtime/Kernel scheme, MTIA's
``mtia_ccp_events``, the CUPTI range profiler's ``cuda_profiler_range``. The files are real (provenance:
tests/data/traces/README.md); every expected number is counted from the raw JSON here with the standard library,
or computed from it (interval unions), not taken from traceana."""

from __future__ import annotations

import gzip
import json
import re
from decimal import Decimal
from pathlib import Path

import pytest

from tests.conftest import ROOT, query, run_cli, union_length

DATA = ROOT / "tests" / "data" / "traces"
TRACE_2021 = DATA / "worker0.1623212756351.pt.trace.json.gz"  # PyTorch 1.9-era tb_plugin sample, June 2021
MTIA_INFERENCE = DATA / "hta_mtia_inference_rank_0.json.gz"
MTIA_TRAINING = DATA / "hta_mtia_rank_0_no_cpu_ops.json.gz"
RANGE_PROFILER = DATA / "hta_cupti_profiler_range.json.gz"


def raw(path: Path) -> dict:
    with gzip.open(path) as handle:
        return json.load(handle, parse_float=Decimal)


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("vintages") / "t.duckdb"
    for file in (TRACE_2021, MTIA_INFERENCE, MTIA_TRAINING, RANGE_PROFILER):
        run_cli("ingest", file, "--db", path)
    return path


def run_id(path: Path) -> str:
    return path.name.removesuffix(".json.gz").removesuffix(".pt.trace")


def breakdown(db: Path, run: str) -> dict:
    return json.loads(run_cli("breakdown", run, "--db", db, "--json").stdout)[0]


def test_2021_trace_has_htas_steps_and_kernels(db: Path) -> None:
    events = [e for e in raw(TRACE_2021)["traceEvents"] if e.get("ph") == "X"]
    kernels = sum(e["cat"] == "Kernel" for e in events)
    device = sum(e["cat"] in ("Kernel", "Memcpy", "Memset") for e in events)
    steps = sorted(int(m[1]) for e in events if e["cat"] == "Operator" and (m := re.match(r"ProfilerStep#(\d+)$",
                                                                                            e["name"])))
    assert (kernels, device, steps) == (8868, 9258, [5, 6, 7, 8, 9, 10])  # HTA: 6 steps, 8,868 kernels
    run = run_id(TRACE_2021)
    assert query(db, "SELECT count(*) FILTER (WHERE category <> 'memcpy' AND category <> 'memset'), count(*) "
                     "FROM device_events WHERE run_id = ?", run) == [(kernels, device)]
    assert [s for (s,) in query(db, "SELECT DISTINCT step FROM steps WHERE run_id = ? ORDER BY step", run)] == steps
    (version,) = query(db, "SELECT tool_version FROM runs WHERE run_id = ?", run)[0]
    assert "2021 categories (Operator, Runtime, Kernel)" in version and "epoch times" in version


def test_2021_trace_replays(db: Path) -> None:
    out = json.loads(run_cli("replay", run_id(TRACE_2021), "--db", db, "--json").stdout)
    assert sorted(r["step"] for r in out["rank_steps"]) == [5, 6, 7, 8, 9, 10]


@pytest.mark.parametrize("trace", [MTIA_INFERENCE, MTIA_TRAINING])
def test_mtia_device_events_and_breakdown(db: Path, trace: Path) -> None:
    """Every mtia_ccp_events row is a device event (dma* a copy; event_record / event_wait syncs); COMP is the
    union of the rest, TOTAL the span of all, as the raw file gives them."""
    device = [e for e in raw(trace)["traceEvents"] if e.get("cat") == "mtia_ccp_events" and e.get("ph") == "X"]
    run = run_id(trace)
    got = dict(query(db, "SELECT category, count(*) FROM device_events WHERE run_id = ? GROUP BY 1", run))
    syncs = sum(e["name"] in ("event_record", "event_wait") for e in device)
    copies = sum(e["name"].startswith("dma") for e in device)
    assert got == {k: v for k, v in {"memcpy": copies, "sync": syncs,
                                     "compute": len(device) - copies - syncs}.items() if v}
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in device]
    work = [(e["ts"], e["ts"] + e["dur"]) for e in device if e["name"] not in ("event_record", "event_wait")]
    steps = query(db, "SELECT count(*) FROM steps WHERE run_id = ?", run)[0][0]
    result = breakdown(db, run)
    assert not [n for (n,) in query(db, "SELECT unnest(notes) FROM runs WHERE run_id = ?", run) if "CPU-only" in n]
    if steps == 0:  # the whole trace is one step: its span
        total = max(e for _, e in spans) - min(s for s, _ in spans)
        assert result["TOTAL_ms"] == pytest.approx(float(total) / 1e3, abs=1e-6)
        assert result["COMP_ms"] == pytest.approx(float(union_length(work)) / 1e3, abs=1e-6)
    else:
        assert result["COMP_ms"] > 0


def test_mtia_one_rank_groups_are_the_reason_for_no_collectives(tmp_path: Path) -> None:
    doc = raw(MTIA_TRAINING)
    groups = doc["distributedInfo"]["pg_config"]
    assert groups and all(len(g["ranks"]) == 1 for g in groups)
    calls = sum(1 for e in doc["traceEvents"] if e.get("cat") == "user_annotation"
                and re.match(r"^(hccl|gloo):", e["name"]))
    out = run_cli("ingest", MTIA_TRAINING, "--db", tmp_path / "t.duckdb").stdout
    assert f"{calls} collective calls on the host" in out and "hold one rank each (pg_config)" in out
    assert "CPU-only" not in out


def test_one_rank_groups_are_the_missing_dims_reason(tmp_path: Path) -> None:
    """The same trace without its device events is a CPU-only run whose gloo collectives have no dim: the note says
    the trace's groups hold one rank (it has pg_config), not to record one."""
    with gzip.open(MTIA_TRAINING) as handle:
        doc = json.load(handle)
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") != "mtia_ccp_events"]
    barriers = sum(e.get("name") == "gloo:barrier" for e in doc["traceEvents"])
    host = tmp_path / "host_only.json"
    host.write_text(json.dumps(doc))
    out = run_cli("ingest", host, "--db", tmp_path / "t.duckdb").stdout
    assert f"{barriers} of {barriers} collectives (100% of communication time) have no dim: their groups hold one " \
           "rank each" in out
    assert "pg_config and Process Group args" not in out


def test_range_profiler_kernels_are_device_events(db: Path) -> None:
    doc = raw(RANGE_PROFILER)
    ranges = [e for e in doc["traceEvents"] if e.get("cat") == "cuda_profiler_range"]
    assert len(ranges) == 77 and not any(e.get("cat") in ("kernel", "Kernel") for e in doc["traceEvents"])
    run = run_id(RANGE_PROFILER)
    assert query(db, "SELECT count(*), sum(end_ns - start_ns) FROM device_events WHERE run_id = ?", run) == [
        (77, sum(int(e["dur"]) * 1000 for e in ranges))]
    result = breakdown(db, run)
    assert result["COMP_ms"] == pytest.approx(
        float(union_length([(e["ts"], e["ts"] + e["dur"]) for e in ranges])) / 1e3, abs=1e-6)
    assert "CUPTI range profiler" in query(db, "SELECT tool_version FROM runs WHERE run_id = ?", run)[0][0]


def test_unknown_category_on_a_device_is_read_and_counted(tmp_path: Path) -> None:
    """A category Kineto never wrote, on a process the trace labels a GPU, is device work, counted in a note by
    category; not a CPU-only run. (The range-profiler trace with its category renamed.)"""
    with gzip.open(RANGE_PROFILER) as handle:
        doc = json.load(handle)
    for event in doc["traceEvents"]:
        if event.get("cat") == "cuda_profiler_range":
            event["cat"] = "future_accelerator_ops"
    renamed = tmp_path / "renamed.json"
    renamed.write_text(json.dumps(doc))
    out = run_cli("ingest", renamed, "--db", tmp_path / "t.duckdb").stdout
    assert "77 device events" in out
    assert "77 events of categories Kineto is not known to write" in out and "future_accelerator_ops 77" in out
    assert "CPU-only" not in out
