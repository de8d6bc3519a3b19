"""Hardware profiles: shape-aware GEMM, attention and memory-bound times, and host overhead by default.

Second routes: the measured CSVs of ../shared/hardware/h200 (read here directly), hand-computed trilinear
interpolation and wave quantization, and the two real H200 training traces (their step time read by SQL from the
store after ingesting them).
"""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path

import duckdb
import pytest

from tests.conftest import SHARED, TRACES, run_cli
from traceana.errors import TraceanaError
from traceana.estimator import compute, hardware
from traceana.estimator.config import from_dict, load
from traceana.estimator.estimate import estimate, layer_cost
from traceana.estimator.memory import GIB

ROOT = Path(__file__).resolve().parents[2]
H200 = SHARED / "hardware" / "h200"
GPT = {"model": {"layers": 8, "hidden": 2048, "ffn_hidden": 8192, "heads": 16, "vocab": 50304, "seq_len": 1024,
                 "gated_mlp": False},
       "parallel": {"micro_batch": 2, "global_batch": 4}, "hardware": {"profile": "h200"}}


def _csv(name: str) -> list[dict[str, str]]:
    with open(H200 / name) as handle:
        return list(csv.DictReader(handle))


def _gpt(**sections: dict) -> compute.Config:
    return from_dict({**GPT, **sections}, "gpt.yaml")


def test_built_in_h200_profile_is_the_measured_tables_row_for_row() -> None:
    profile = _gpt().profile
    assert profile is not None
    assert [tuple(r) for r in profile.gemm_us] == [
        (float(r["m"]), float(r["n"]), float(r["k"]), float(r["us"])) for r in _csv("gemm_sweep.csv")]
    assert [tuple(r) for r in profile.attention_us] == [
        (float(r["batch"]), float(r["heads"]), float(r["seq"]), float(r["head_dim"]), float(r["causal"] == "True"),
         float(r["fwd_us"]), float(r["fwd_bwd_us"])) for r in _csv("attention.csv")]
    assert [tuple(r) for r in profile.memory_gb_per_s] == [
        (float(r["bytes"]), float(r["gb_per_s"])) for r in _csv("memory_bound.csv")]
    # its matmul efficiency is the table's fastest product over the data-sheet peak
    assert profile.matmul_efficiency == pytest.approx(max(float(r["tflops"]) for r in _csv("gemm_sweep.csv")) / 989,
                                                      abs=1e-4)


def _gemm_us(cfg: compute.Config, m: float, n: float, k: float) -> float:
    assert cfg.profile is not None
    hw = cfg.hardware
    hbm = hw.hbm_bandwidth_gb_per_s and hw.hbm_bandwidth_gb_per_s * 1e9
    return 1e6 * hardware.gemm_seconds(m, n, k, hw.peak_tflops_bf16 * 1e12, cfg.calibration.matmul_efficiency, hbm,
                                       cfg.profile)


def test_gemm_time_is_the_measured_time_on_the_grid_and_log_interpolated_between() -> None:
    cfg = _gpt()
    rows = {(int(r["m"]), int(r["n"]), int(r["k"])): float(r["us"]) for r in _csv("gemm_sweep.csv")}
    for shape in ((2048, 2048, 2048), (1024, 16384, 28672), (8192, 2048, 12288)):
        assert _gemm_us(cfg, *shape) == pytest.approx(rows[shape], rel=1e-9)
    # halfway (in log2) between k = 2048 and 4096: the geometric mean of the two achieved rates
    k = math.sqrt(2048 * 4096)
    rate = math.sqrt(2 * 2048**3 / rows[(2048, 2048, 2048)] * 2 * 2048 * 2048 * 4096 / rows[(2048, 2048, 4096)])
    assert _gemm_us(cfg, 2048, 2048, k) == pytest.approx(2 * 2048 * 2048 * k / rate, rel=1e-9)
    # below the table (m = 512): the 1024 row's rate, carried by the roofline's ratio: 512 rows of 128-row tiles
    # fill half the waves' tiles, 4 x 8 = 32 tiles on 132 SMs in either case, so the time is the same as m = 1024
    assert _gemm_us(cfg, 512, 2048, 2048) == pytest.approx(rows[(1024, 2048, 2048)], rel=1e-9)


def test_matmul_efficiency_scales_the_profile() -> None:
    cfg = _gpt()
    assert cfg.profile is not None
    half = _gpt(calibration={"matmul_efficiency": cfg.profile.matmul_efficiency / 2})
    assert _gemm_us(half, 4096, 4096, 4096) == pytest.approx(2 * _gemm_us(cfg, 4096, 4096, 4096), rel=1e-9)


def test_roofline_with_wave_quantization_without_a_table() -> None:
    cfg = from_dict({**GPT, "hardware": {"profile": "a100"}}, "a100.yaml")
    assert cfg.profile is not None and not cfg.profile.gemm_us
    # 4096^3 on 108 SMs in 128 x 128 tiles: 1024 tiles in 10 waves (1080 tile slots) at 80% of 312 TFLOP/s
    assert _gemm_us(cfg, 4096, 4096, 4096) == pytest.approx(
        1e6 * 2 * 4096**3 / (312e12 * 0.8 * 1024 / 1080), rel=1e-9)
    # one tile more than a wave costs a second wave: 109 tiles take as long as 216
    assert _gemm_us(cfg, 128 * 109, 128, 8192) == pytest.approx(_gemm_us(cfg, 128 * 216, 128, 8192), rel=1e-9)
    # a thin product is bound by moving its operands: (16384 x 16) x (16 x 16384) writes 512 MiB at 2039 GB/s
    assert _gemm_us(cfg, 16384, 16384, 16) == pytest.approx(1e6 * 2 * (2 * 16384 * 16 + 16384**2) / 2039e9)


def test_layer_products_add_up_to_the_layer_flops() -> None:
    """The (m, n, k) list that times a layer carries exactly its weight FLOPs, for dense, GQA, MoE and MLA."""
    shapes = [_gpt(),
              _gpt(model={**GPT["model"], "kv_heads": 4, "gated_mlp": True}, parallel={"tp": 2, "micro_batch": 2,
                                                                                      "global_batch": 4}),
              load(ROOT / "examples" / "deepseek_v3_reduced.yaml")]
    for cfg in shapes:
        for index in {0, cfg.model.layers - 1}:
            core = compute.attention(cfg)[1]
            weights = compute.layer(cfg, index).forward - core
            assert sum(g.flops for g in compute.layer_gemms(cfg, index)) == pytest.approx(weights, rel=1e-12)


def test_attention_core_from_the_table() -> None:
    cfg = _gpt()  # micro-batch 2 x 16 heads, seq 1024, head 128, causal: a measured row (2, 32 has b x h = 64)
    row = next(r for r in _csv("attention.csv") if (r["batch"], r["heads"], r["seq"], r["causal"])
               == ("1", "16", "1024", "True"))
    fwd, bwd = compute.core_seconds(dataclasses.replace(cfg, parallel=dataclasses.replace(
        cfg.parallel, micro_batch=1, global_batch=2)))
    assert fwd == pytest.approx(float(row["fwd_us"]) * 1e-6, rel=1e-9)
    assert bwd == pytest.approx((float(row["fwd_bwd_us"]) - float(row["fwd_us"])) * 1e-6, rel=1e-9)


def test_memory_bound_kernels_at_the_bandwidth_of_their_size() -> None:
    profile = _gpt().profile
    assert profile is not None
    at_4mb = [float(r["gb_per_s"]) for r in _csv("memory_bound.csv") if r["bytes"] == "4194304"]
    assert profile.memory_rate(4194304) == pytest.approx(1e9 * sum(at_4mb) / 3)
    assert profile.memory_rate(1e3) == profile.memory_rate(4194304)  # clamped below the smallest measured


def test_unknown_profile_names_the_field() -> None:
    with pytest.raises(TraceanaError, match=r"gpt.yaml: hardware.profile='b300': no built-in profile .*a100, h100"):
        from_dict({**GPT, "hardware": {"profile": "b300"}}, "gpt.yaml")
    with pytest.raises(TraceanaError, match="profile: belongs in the hardware section"):
        from_dict({**GPT, "profile": "h200"}, "gpt.yaml")


def test_profile_file_relative_to_the_config(tmp_path: Path) -> None:
    (tmp_path / "mine.yaml").write_text("name: mine\nsource: test\nsms: 100\ntile: [64, 64]\n"
                                        "hardware: {peak_tflops_bf16: 100, hbm_gb: 10}\n"
                                        "calibration: {matmul_efficiency: 0.5}\ngemm_us: [[1024, 1024, 1024, 100]]\n")
    (tmp_path / "job.yaml").write_text("model: {layers: 2, hidden: 1024, ffn_hidden: 4096, heads: 8, vocab: 1000, "
                                       "seq_len: 512}\nparallel: {}\nhardware: {profile: mine.yaml, hbm_gb: 20}\n")
    cfg = load(tmp_path / "job.yaml")
    assert cfg.hardware.peak_tflops_bf16 == 100 and cfg.hardware.hbm_gb == 20  # the job's own value wins
    assert cfg.calibration.matmul_efficiency == 0.5
    # one scattered point: every product runs at its rate, scaled by the roofline ratio (1024^3 fills a wave of
    # 256 tiles on 100 SMs: 3 waves; 2048 x 1024 x 1024: 512 tiles, 6 waves: twice the time)
    assert _gemm_us(cfg, 1024, 1024, 1024) == pytest.approx(100)
    assert _gemm_us(cfg, 2048, 1024, 1024) == pytest.approx(200)


# --- host overhead by default, against the two real H200 traces -----------------------------------------------------

def test_small_model_is_host_bound_without_calibration() -> None:
    """A micro-batch's forward and backward take max(device, host): host 220 us forward and 1250 us backward a layer
    (the profile's launch.csv numbers), so the idle time is, by hand, 8 micro-batches x (12 layers' host time less
    the device's time for the chunk, output layer included)."""
    cfg = load(ROOT / "examples" / "h200_hostbound_h512_L12.yaml")
    est = estimate(cfg)
    (chunk,) = est.costs
    by_hand = 8 * (12 * (220e-6 + 1250e-6) - chunk.compute)
    assert est.stages[0].idle == pytest.approx(by_hand, rel=1e-9)
    assert est.stages[0].idle > 0.85 * est.step_s  # host-bound, as measured (90.8% idle)
    # per pass instead (a framework that synchronizes between passes): each layer pass waits on its own
    per_pass = estimate(dataclasses.replace(cfg, calibration=dataclasses.replace(cfg.calibration,
                                                                                 host_overlap="pass")))
    device = layer_cost(cfg, 0)
    assert per_pass.costs[0].idle.forward == pytest.approx(12 * (220e-6 - device.forward), rel=1e-9)


@pytest.mark.parametrize(("name", "measured_peak_gib"), [("h200_gpt_h2048_L8", 6.214),
                                                         ("h200_hostbound_h512_L12", None)])
def test_h200_steps_within_10_percent_of_the_traces(tmp_path: Path, name: str,
                                                    measured_peak_gib: float | None) -> None:
    trace = {"h200_gpt_h2048_L8": "h200_gpt_h2048_L8_s1024_gb4",
             "h200_hostbound_h512_L12": "h200_hostbound_h512_L12_s256_gb8"}[name]
    db = tmp_path / "h200.duckdb"
    run_cli("ingest", TRACES / "kineto" / f"{trace}.json.gz", "--db", db, "--run-id", trace)
    with duckdb.connect(str(db), read_only=True) as con:
        # steps after the first, as the breakdown's typical step; the peak of the profiler's [memory] samples
        (measured,) = con.execute("select avg(end_ns - start_ns) / 1e6 from steps where run_id = ? and step > "
                                  "(select min(step) from steps where run_id = ?)", [trace, trace]).fetchone()
        (peak,) = con.execute("select max(allocated_bytes) from memory where run_id = ?", [trace]).fetchone()
    est = estimate(load(ROOT / "examples" / f"{name}.yaml"))
    assert est.step_s * 1e3 == pytest.approx(measured, rel=0.10)
    if measured_peak_gib is not None:
        assert peak / GIB == pytest.approx(measured_peak_gib, abs=0.01)
        assert est.peak_memory / GIB == pytest.approx(peak / GIB, rel=0.05)
