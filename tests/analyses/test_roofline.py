"""`kernels --roofline` on the H200 GPT trace against its raw JSON, read here with Python's json: every GEMM's FLOPs
(2·M·N·K from its aten::mm / addmm Input Dims), the bytes of elementwise ops, an attention backward's FLOPs, each
op's kernel time. The kernels are joined to their op here by External id, a route the ingest does not take (it
follows the launching runtime call to the innermost op open on its thread). Then the errors: an unknown profile, a
run without shapes, a run without kernels, options that need --roofline."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from pathlib import Path

import polars as pl
import pytest

import traceana
from tests.analyses.test_kernels import short
from tests.conftest import TRACES, one_line, run_cli, run_main

H200 = TRACES / "kineto" / "h200_gpt_h2048_L8_s1024_gb4.json.gz"
RUN = "h200_gpt_h2048_L8_s1024_gb4"
BF16 = 2  # bytes of a c10::BFloat16


@pytest.fixture(scope="module")
def db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("roofline") / "t.duckdb"
    run_cli("ingest", H200, "--db", path)
    return path


@pytest.fixture(scope="module")
def raw() -> dict[tuple[str, str, str], list[tuple[dict, list[dict]]]]:
    """(op name, Input Dims as JSON, its longest kernel's short name) -> [(the op's args, its kernels)], from the
    raw trace."""
    events = json.loads(gzip.decompress(H200.read_bytes()))["traceEvents"]
    ops = {e["args"]["External id"]: e for e in events if e.get("cat") == "cpu_op" and "External id" in e["args"]}
    kernels: dict[int, list[dict]] = defaultdict(list)
    for e in events:
        if e.get("cat") == "kernel":
            kernels[e["args"]["External id"]].append(e)
    calls: dict[tuple[str, str, str], list[tuple[dict, list[dict]]]] = defaultdict(list)
    for ext, launched in kernels.items():
        op = ops[ext]
        longest = short(max(launched, key=lambda k: k["dur"])["name"])
        calls[(op["name"], json.dumps(op["args"]["Input Dims"], separators=(",", ":")), longest)].append(
            (op["args"], launched))
    return calls


def _row(frame: pl.DataFrame, op: str, dims: str, kernel: str) -> dict:
    rows = frame.filter((pl.col("op") == op) & (pl.col("input_dims") == dims) & (pl.col("kernel") == kernel))
    assert rows.height == 1, (op, dims, kernel, rows)
    return rows.row(0, named=True)


def _kernel_ms(calls: list[tuple[dict, list[dict]]]) -> float:
    return sum(k["dur"] for _, launched in calls for k in launched) / 1e3


def test_every_gemm_has_2mnk_flops_and_its_kernels_time(db: Path, raw: dict) -> None:
    frame = traceana.open(db).roofline()
    gemms = {key: calls for key, calls in raw.items() if key[0] in ("aten::mm", "aten::addmm")}
    assert len(gemms) == 15 and sum(len(c) for c in gemms.values()) == 396  # 268 mm, 128 addmm calls
    for (op, dims, kernel), calls in gemms.items():
        a, b = json.loads(dims)[1:3] if op == "aten::addmm" else json.loads(dims)[:2]
        (m, k), n = a, b[1]
        row = _row(frame, op, dims, kernel)
        assert row["calls"] == len(calls)
        assert row["GFLOP"] == pytest.approx(2 * m * n * k / 1e9, rel=1e-12)
        assert row["total_ms"] == pytest.approx(_kernel_ms(calls), rel=1e-9)
        assert row["TFLOP_per_s"] == pytest.approx(2 * m * n * k * len(calls) / (_kernel_ms(calls) * 1e9), rel=1e-9)
        assert row["bound"] == "compute" and row["peak_TFLOP_per_s"] == 989  # the H200 profile's bf16 peak


def test_named_gemm_kernels(db: Path) -> None:
    """Two named products, their FLOPs written out: the MLP's down projection backward and the LM head."""
    frame = traceana.open(db).roofline()
    down = _row(frame, "aten::mm", "[[2048,8192],[8192,2048]]", "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT")
    assert down["GFLOP"] == pytest.approx(2 * 2048 * 2048 * 8192 / 1e9) == pytest.approx(68.719476736)
    assert down["calls"] == 32 and down["total_ms"] == pytest.approx(2.501209)  # 32 kernels' dur summed, in µs
    head = _row(frame, "aten::mm", "[[2048,2048],[2048,50304]]", "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT")
    assert head["GFLOP"] == pytest.approx(2 * 2048 * 50304 * 2048 / 1e9) == pytest.approx(421.980536832)
    # bytes: A and B read, C written once, bf16
    assert head["MB"] == pytest.approx((2048 * 2048 + 2048 * 50304 + 2048 * 50304) * BF16 / 1e6)


def test_elementwise_bytes_and_bandwidth(db: Path, raw: dict) -> None:
    """An in-place add reads both operands and writes the first; gelu reads one tensor and writes one."""
    frame, rows = traceana.open(db).roofline(), {}
    for op, dims, tensors in (("aten::add_", "[[2,1024,2048],[2,1024,2048],[]]", 3),
                              ("aten::gelu", "[[2,1024,8192],[]]", 2)):
        (key,) = [k for k in raw if k[:2] == (op, dims)]
        shape = json.loads(dims)[0]
        elements = shape[0] * shape[1] * shape[2]
        assert all(args["Input type"][0] == "c10::BFloat16" for args, _ in raw[key])
        row = rows[op] = _row(frame, *key)
        moved = tensors * elements * BF16
        assert row["MB"] == pytest.approx(moved / 1e6)
        assert row["GB_per_s"] == pytest.approx(moved * len(raw[key]) / (_kernel_ms(raw[key]) * 1e6))
        assert row["bound"] == "memory" and row["roof_pct"] == pytest.approx(row["GB_per_s"] / 4800 * 100)
    assert rows["aten::add_"]["MB"] == pytest.approx(25.165824)  # 3 x 2·1024·2048 elements x 2 bytes


def test_causal_attention_backward_flops(db: Path, raw: dict) -> None:
    """cuDNN's backward over q, k, v [2, 16, 1024, 128], causal: 2.5 x the forward's 4·b·h·s²·d, halved."""
    frame = traceana.open(db).roofline()
    (key,) = [k for k in raw if k[0] == "aten::_cudnn_attention_backward"]
    args, launched = raw[key][0]
    b, h, s, d = args["Input Dims"][1]
    assert args["Concrete Inputs"][14] == "True" and len(launched) == 3  # is_causal; three kernels a call
    row = _row(frame, *key)
    assert row["GFLOP"] == pytest.approx(2.5 * 0.5 * 4 * b * h * s * s * d / 1e9) == pytest.approx(21.47483648)
    assert row["launched"] == 3 and row["total_ms"] == pytest.approx(_kernel_ms(raw[key]))


def test_by_kernel_regroups_the_same_calls(db: Path) -> None:
    traces = traceana.open(db)
    shapes, kernels = traces.roofline(), traces.roofline(by="kernel")
    assert kernels["calls"].sum() == shapes["calls"].sum()
    assert kernels["total_ms"].sum() == pytest.approx(shapes["total_ms"].sum())
    mm = kernels.filter(pl.col("kernel") == "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT").row(0, named=True)
    assert mm["op"] == "aten::mm" and mm["calls"] == 132


def test_cli_table_notes_json_and_plot(db: Path, tmp_path: Path) -> None:
    out = run_cli("kernels", "--roofline", "--db", db, "--top", "5", "--plot", tmp_path / "roof.png")
    assert "profile h200 (the trace's device 'NVIDIA H200')" in out.stdout
    assert "aten::_fused_adamw_" in out.stdout  # ops without a cost model are named in a note
    assert (tmp_path / "roof.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    payload = json.loads(run_cli("kernels", "--roofline", "--db", db, "--json", "--profile", "a100").stdout)
    assert payload["profile"] == "a100" and payload["rows"][0]["peak_TFLOP_per_s"] == 312


@pytest.mark.parametrize(("args", "message"), [
    (["--profile", "x100"], "hardware.profile='x100': no built-in profile of that name"),
    (["--by", "stage"], "--by 'stage': the roofline is by shape or kernel"),
])
def test_bad_roofline_options_are_one_line(db: Path, args: list[str], message: str) -> None:
    code, _, err = run_main("kernels", "--roofline", "--db", db, *args)
    assert message in one_line(code, err)


def test_plot_without_roofline_is_one_line(db: Path, tmp_path: Path) -> None:
    code, _, err = run_main("kernels", "--db", db, "--plot", tmp_path / "x.png")
    assert "--plot goes with --roofline" in one_line(code, err)


def test_runs_without_shapes_or_kernels_say_so(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    run_cli("ingest", TRACES / "kineto" / "h200_hostbound_h512_L12_s256_gb8.json.gz", "--db", db)
    run_cli("ingest", TRACES / "kineto" / "hta_rank34of300_gloo_pgconfig.json.gz", "--db", db)
    code, _, err = run_main("kernels", "h200_hostbound_h512_L12_s256_gb8", "--roofline", "--db", db)
    assert "the trace recorded no op shapes" in one_line(code, err)
    code, _, err = run_main("kernels", "hta_rank34of300_gloo_pgconfig", "--roofline", "--db", db)
    assert "no kernel is linked to the CPU op that launched it" in one_line(code, err)


def test_cost_model_on_inputs_the_h200_trace_lacks() -> None:
    """Flash attention's [b, s, h, d] layout; an out= tensor (hta_rank0of16's aten::mul records one) is written,
    not read; a reduction writes its input over the reduced dims."""
    from traceana.analyses.roofline import op_cost

    q = [2, 1024, 16, 128]
    flash = op_cost("aten::_flash_attention_forward", json.dumps([q, q, q, [], [], [], [], [], [], []]),
                    json.dumps(["c10::BFloat16"] * 3 + ["", "", "Scalar", "Scalar", "Scalar", "Scalar", "Scalar"]),
                    json.dumps(["", "", "", "", "", "1024", "1024", "0.", "True", "False"]))
    assert flash is not None and flash.flops == 0.5 * 4 * 2 * 16 * 1024 * 1024 * 128
    assert flash.bytes == 4 * 2 * 1024 * 16 * 128 * BF16  # q, k, v read, the output written
    mul = op_cost("aten::mul", "[[8192,11192],[],[8192,11192]]", '["float","double","float"]', None)
    assert mul is not None and mul.bytes == 2 * 8192 * 11192 * 4 + 8  # self and a 0-d double read, out written
    total = op_cost("aten::sum", "[[2048,8192],[],[],[]]", '["c10::BFloat16","ScalarList","Scalar",""]',
                    '["","[0]","True",""]')
    assert total is not None and total.bytes == (2048 * 8192 + 8192) * BF16 and total.flops == 2048 * 8192
    assert op_cost("aten::cat", "[[[2,3],[2,3]],[]]", '["TensorList","Scalar"]', None) is None
