"""`traceana calibrate`: a hardware profile from a real H200 training trace, checked against the raw trace JSON
read directly, and used by `estimate`."""

from __future__ import annotations

import gzip
import json
import statistics
from pathlib import Path

import pytest

from tests.conftest import TRACES, run_cli
from traceana import store as stores
from traceana.model import calibrate as trace_profile

ROOT = Path(__file__).resolve().parents[2]
GPT = "h200_gpt_h2048_L8_s1024_gb4"


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    db = tmp_path_factory.mktemp("calibrate") / "h200.duckdb"
    for run in (GPT, "h200_hostbound_h512_L12_s256_gb8"):
        run_cli("ingest", TRACES / "kineto" / f"{run}.json.gz", "--db", db, "--run-id", run)
    return db


def _raw_events() -> list[dict]:
    with gzip.open(TRACES / "kineto" / f"{GPT}.json.gz") as handle:
        return json.load(handle)["traceEvents"]


def test_profile_points_and_host_time_match_the_raw_trace(store: Path, tmp_path: Path) -> None:
    out = tmp_path / "h200_measured.yaml"
    result = json.loads(run_cli("calibrate", GPT, "--config", ROOT / "examples" / "h200_gpt_h2048_L8.yaml",
                                "--db", store, "--write", out, "--json").stdout)
    events = _raw_events()
    # second route: the QKV projection, aten::addmm of (2048 x 2048) x (2048 x 6144), and its kernels by External id
    ids = {e["args"]["External id"] for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::addmm"
           and e["args"].get("Input Dims") == [[6144], [2048, 2048], [2048, 6144], [], []]}
    kernel_us = [e["dur"] for e in events if e.get("cat") == "kernel" and e["args"].get("External id") in ids]
    row = next(g for g in result["gemms"] if (g["m"], g["n"], g["k"]) == (2048, 6144, 2048))
    assert row["us"] == pytest.approx(statistics.median(kernel_us), rel=1e-6)
    assert len(result["gemms"]) == 10  # 4 layer products x fwd / dgrad / wgrad and the output layer's, deduplicated
    # host: ProfilerStep#2 less the time the host blocked in cudaDeviceSynchronize inside it
    step = next(e for e in events if e.get("name") == "ProfilerStep#2" and e.get("cat") == "user_annotation")
    sync = sum(e["dur"] for e in events if e.get("cat") == "cuda_runtime" and "ynchronize" in e["name"]
               and step["ts"] <= e["ts"] < step["ts"] + step["dur"])
    assert result["host"]["host_busy_ms_per_step"] == pytest.approx((step["dur"] - sync) / 1e3, rel=1e-6)
    # spread over 2 micro-batches x 8 layers at the H200 profile's 220 : 1250 forward : backward
    host = result["host"]
    assert 16 * (host["host_us_per_layer"] + host["host_us_per_backward_layer"]) == pytest.approx(
        host["host_busy_ms_per_step"] * 1e3, rel=1e-9)
    assert host["host_us_per_backward_layer"] / host["host_us_per_layer"] == pytest.approx(1250 / 220)
    assert result["links"] == []  # one GPU: no collectives

    # the written profile drives estimate: 33.3 ms measured (the breakdown's typical step); 35.6 with the built-in
    # H200 profile, within 5% with the one measured from the trace itself
    job = tmp_path / "job.yaml"
    job.write_text((ROOT / "examples" / "h200_gpt_h2048_L8.yaml").read_text().replace(
        "hardware: {profile: h200}", f"hardware: {{profile: {out.name}}}"))
    step_ms = json.loads(run_cli("estimate", job, "--json").stdout)["step_ms"]
    assert step_ms == pytest.approx(33.3, rel=0.05)


def test_a_trace_without_shapes_is_a_one_line_error(store: Path) -> None:
    result = run_cli("calibrate", "h200_hostbound_h512_L12_s256_gb8", "--config",
                     ROOT / "examples" / "h200_hostbound_h512_L12.yaml", "--db", store, check=False)
    assert result.returncode == 2
    assert result.stderr.strip() == ("error: run 'h200_hostbound_h512_L12_s256_gb8': no matrix products with their "
                                     "shapes; record the trace with torch.profiler.profile(record_shapes=True)")
    missing = run_cli("calibrate", "nope", "--config", ROOT / "examples" / "h200_gpt_h2048_L8.yaml", "--db", store,
                      check=False)
    assert missing.returncode == 2 and "no run 'nope'" in missing.stderr


def test_link_bandwidth_from_all_reduces_by_hand(tmp_path: Path) -> None:
    """Three all-reduces written into a store as ingest would: a 1 GiB one over a 16-rank group on 2 nodes of 8 in
    10 ms, a 1 GiB one over 8 ranks of one node in 5 ms, and a 4 KiB one (latency, not bandwidth: ignored).
    nccl-tests' bus bandwidth is bytes x 2(n-1)/n / time; across nodes the model's figure is one NIC's: / 8."""
    db = tmp_path / "links.duckdb"
    with stores.connect(db) as con, stores.transaction(con):
        con.execute("INSERT INTO process_groups (run_id, pg, dim, ranks, name, source) VALUES "
                    "('r', 'g16', 'DP', range(16), NULL, 'trace'), ('r', 'g8', 'TP', range(8), NULL, 'trace')")
        con.execute("INSERT INTO device_events (run_id, rank, event_id, stream, start_ns, end_ns, name, category) "
                    "VALUES ('r', 0, 1, 7, 0, 10000000, 'nccl', 'comm'), "
                    "('r', 0, 2, 7, 0, 5000000, 'nccl', 'comm'), ('r', 0, 3, 7, 0, 20000, 'nccl', 'comm')")
        con.execute("INSERT INTO collectives VALUES "
                    "('r', 0, 1, 'AllReduce', NULL, 1073741824, 'bf16', 'g16', 'DP', NULL, NULL, NULL, 'pg-args'), "
                    "('r', 0, 2, 'AllReduce', NULL, 1073741824, 'bf16', 'g8', 'TP', NULL, NULL, NULL, 'pg-args'), "
                    "('r', 0, 3, 'AllReduce', NULL, 4096, 'bf16', 'g8', 'TP', NULL, NULL, NULL, 'pg-args')")
    links = {row["level"]: row for row in trace_profile._links(db, "r", 8).to_dicts()}
    inter = 2**30 * 2 * 15 / 16 / 10e-3 / 1e9
    intra = 2**30 * 2 * 7 / 8 / 5e-3 / 1e9
    assert links["inter"]["bus_gb_per_s"] == pytest.approx(inter)
    assert links["inter"]["model_gb_per_s"] == pytest.approx(inter / 8)
    assert links["intra"]["model_gb_per_s"] == pytest.approx(intra)
    assert links["intra"]["all_reduces"] == 1
