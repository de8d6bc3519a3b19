"""`kernels`: short names and totals on a real H200 trace against its raw JSON (with a name normalizer written
independently here: a bracket-depth scan instead of the view's regular expressions), and per stage on a sample.

`kernels --roofline` on the same trace against its raw JSON, read here with Python's json: every GEMM's FLOPs
(2·M·N·K from its aten::mm / addmm Input Dims), the bytes of elementwise ops, an attention backward's FLOPs, each
op's kernel time. The kernels are joined to their op here by External id, a route the ingest does not take (it
follows the launching runtime call to the innermost op open on its thread). Then the errors: an unknown profile, a
run without shapes, a run without kernels, options that need --roofline."""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

import duckdb
import polars as pl
import pytest
from typer.testing import CliRunner

import traceana
from tests.analyses.test_breakdown_real import _union_ns
from tests.conftest import SAMPLES, TRACES, add_run, one_line, run_cli, run_main
from tests.test_sample_traces import EXPERIMENTS
from traceana import store
from traceana.analyses.kernels import top_kernels
from traceana.cli.main import app
from traceana.ingest.run_data import RunData

H200 = TRACES / "kineto" / "h200_gpt_h2048_L8_s1024_gb4.json.gz"


def short(name: str) -> str:
    """Drop every <...> at any depth, then the argument list, then 'void '."""
    name = name.replace("(anonymous namespace)::", "")
    out, depth = [], 0
    for ch in name:
        depth += ch == "<"
        if depth == 0:
            out.append(ch)
        depth -= ch == ">" and depth > 0
    text = "".join(out).split("(")[0].strip()
    return text.removeprefix("void ")


@pytest.fixture(scope="module")
def con(tmp_path_factory: pytest.TempPathFactory) -> Iterator[duckdb.DuckDBPyConnection]:
    folder = tmp_path_factory.mktemp("kernels")
    with store.connect(folder / "t.duckdb") as connection:
        add_run(connection, "h200", [H200], "kineto")
        add_run(connection, "pp2_mb1", [SAMPLES / "pp2_mb1"], "kineto", EXPERIMENTS["pp2_mb1"][0])
        yield connection


def test_names_are_cut_to_the_kernel() -> None:
    assert short("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
                 "at::detail::Array<char*, 3> >(int, at::native::CUDAFunctor_add<float>)") == \
        "at::native::vectorized_elementwise_kernel"


def test_h200_top_kernels_against_the_json(con: duckdb.DuckDBPyConnection) -> None:
    with gzip.open(H200) as handle:
        raw = json.load(handle)
    base = int(raw.get("baseTimeNanoseconds") or 0)
    windows = con.execute("SELECT start_ns, end_ns FROM step_windows WHERE run_id = 'h200'").fetchall()
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    busy = []
    for e in raw["traceEvents"]:
        if e.get("ph") != "X" or e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        start = base + round(e["ts"] * 1000)
        end = start + round(e.get("dur", 0) * 1000)
        if any(w0 <= start < w1 for w0, w1 in windows):
            totals[short(e["name"])][0] += 1
            totals[short(e["name"])][1] += end - start
        busy += [(max(start, w0), min(end, w1)) for w0, w1 in windows if start < w1 and end > w0 and end > start]
    comp = sum(_union_ns([iv for iv in busy if w0 <= iv[0] < w1]) for w0, w1 in windows)
    expected = sorted(totals.items(), key=lambda kv: -kv[1][1])[:5]
    got = top_kernels(con, "h200", 5)
    assert [(r["short_name"], r["calls"], round(r["total_ms"] * 1e6)) for r in got.iter_rows(named=True)] == \
        [(name, calls, ns) for name, (calls, ns) in expected]
    assert got["share_of_COMP_pct"][0] == pytest.approx(100 * expected[0][1][1] / comp)


def test_by_stage_and_the_command(con: duckdb.DuckDBPyConnection, tmp_path: Path) -> None:
    frame = top_kernels(con, "pp2_mb1", 30, by_stage=True)
    calls = {(r["stage"], r["short_name"]): r["calls"] for r in frame.iter_rows(named=True)}
    # sample_traces/pipeline.py, 2 ranks per stage, 2 steps: stage 0 computes H = GELU(X W0^T) and in backward only
    # W0's gradient (X needs none): 1 aten::mm per rank and step; stage 1 computes Y = H W1^T and the MSE loss, and in
    # backward both dH (sent back) and W1's gradient: 2 aten::mm.
    assert (calls[0, "aten::mm"], calls[1, "aten::mm"]) == (4, 8)
    assert (0, "aten::gelu") in calls and (1, "aten::gelu") not in calls
    assert (1, "aten::mse_loss") in calls and (0, "aten::mse_loss") not in calls
    db = tmp_path / "k.duckdb"
    with store.connect(db) as writer:
        add_run(writer, "h200", [H200], "kineto")
    result = CliRunner().invoke(app, ["kernels", "--db", str(db), "--top", "3", "--json"])
    assert result.exit_code == 0, result.output
    assert [r["calls"] for r in json.loads(result.stdout)] == [r["calls"] for r in top_kernels(con, "h200", 3)
                                                               .iter_rows(named=True)]
    result = CliRunner().invoke(app, ["kernels", "--db", str(db), "--by", "rank"])
    assert result.exit_code != 0 and "--by" in str(result.exception)


NAMES = {  # kernel names as real traces spell them -> the short name that lets versions match
    "void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, "
    "3> >(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char*, 3>)":
        "at::native::vectorized_elementwise_kernel",
    "void at::native::(anonymous namespace)::CatArrayBatchedCopy<float, unsigned int, 2, 128, 1>(float*, "
    "at::native::(anonymous namespace)::CatArrInputTensorMetadata<float, unsigned int, 128, 1>, int)":
        "at::native::CatArrayBatchedCopy",
    "void cutlass::Kernel<cutlass_80_tensorop_s1688gemm_64x64_32x4_nn_align1>(cutlass_80_tensorop_s1688gemm_64x64_"
    "32x4_nn_align1::Params)": "cutlass_80_tensorop_s1688gemm_64x64_32x4_nn_align1",
    "std::enable_if<!(false), void>::type internal::gemvx::kernel<int, int, float, float, float, float, false, true, "
    "true, false, 7, false, cublasGemvParamsEx<int, cublasGemvTensorStridedBatched<float const>, "
    "cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float>, float> >(cublasGemvParamsEx"
    "<int, cublasGemvTensorStridedBatched<float const>, cublasGemvTensorStridedBatched<float const>, "
    "cublasGemvTensorStridedBatched<float>, float>)": "internal::gemvx::kernel",
    "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t(ncclWorkElem)": "ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t",
    "hcom_allReduce__586_0_1": "hcom_allReduce",
    "Memcpy HtoD (Pinned -> Device)": "Memcpy HtoD",
    "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT": "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT",
}


def test_kernel_names_view(tmp_path: Path) -> None:
    events = pl.DataFrame({"rank": 0, "event_id": range(len(NAMES)), "start_ns": 0, "end_ns": 1,
                           "name": list(NAMES), "category": "compute"})
    with store.connect(tmp_path / "n.duckdb") as con:
        store.write_run(con, "n", RunData(source_format="kineto", sources=["hand"], world_size=1,
                                          frames={"device_events": events}))
        got = dict(con.execute("SELECT name, short_name FROM kernel_names").fetchall())
    assert got == NAMES


BF16 = 2  # bytes of a c10::BFloat16


@pytest.fixture(scope="module")
def roof_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("roofline") / "t.duckdb"
    run_cli("ingest", H200, "--db", path)
    return path


@pytest.fixture(scope="module")
def raw_calls() -> dict[tuple[str, str, str], list[tuple[dict, list[dict]]]]:
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


def test_every_gemm_has_2mnk_flops_and_its_kernels_time(roof_db: Path, raw_calls: dict) -> None:
    frame = traceana.open(roof_db).roofline()
    gemms = {key: calls for key, calls in raw_calls.items() if key[0] in ("aten::mm", "aten::addmm")}
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


def test_named_gemm_kernels(roof_db: Path) -> None:
    """Two named products, their FLOPs written out: the MLP's down projection backward and the LM head."""
    frame = traceana.open(roof_db).roofline()
    down = _row(frame, "aten::mm", "[[2048,8192],[8192,2048]]", "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT")
    assert down["GFLOP"] == pytest.approx(2 * 2048 * 2048 * 8192 / 1e9) == pytest.approx(68.719476736)
    assert down["calls"] == 32 and down["total_ms"] == pytest.approx(2.501209)  # 32 kernels' dur summed, in µs
    head = _row(frame, "aten::mm", "[[2048,2048],[2048,50304]]", "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_TNT")
    assert head["GFLOP"] == pytest.approx(2 * 2048 * 50304 * 2048 / 1e9) == pytest.approx(421.980536832)
    # bytes: A and B read, C written once, bf16
    assert head["MB"] == pytest.approx((2048 * 2048 + 2048 * 50304 + 2048 * 50304) * BF16 / 1e6)


def test_elementwise_bytes_and_bandwidth(roof_db: Path, raw_calls: dict) -> None:
    """An in-place add reads both operands and writes the first; gelu reads one tensor and writes one."""
    frame, rows = traceana.open(roof_db).roofline(), {}
    for op, dims, tensors in (("aten::add_", "[[2,1024,2048],[2,1024,2048],[]]", 3),
                              ("aten::gelu", "[[2,1024,8192],[]]", 2)):
        (key,) = [k for k in raw_calls if k[:2] == (op, dims)]
        shape = json.loads(dims)[0]
        elements = shape[0] * shape[1] * shape[2]
        assert all(args["Input type"][0] == "c10::BFloat16" for args, _ in raw_calls[key])
        row = rows[op] = _row(frame, *key)
        moved = tensors * elements * BF16
        assert row["MB"] == pytest.approx(moved / 1e6)
        assert row["GB_per_s"] == pytest.approx(moved * len(raw_calls[key]) / (_kernel_ms(raw_calls[key]) * 1e6))
        assert row["bound"] == "memory" and row["roof_pct"] == pytest.approx(row["GB_per_s"] / 4800 * 100)
    assert rows["aten::add_"]["MB"] == pytest.approx(25.165824)  # 3 x 2·1024·2048 elements x 2 bytes


def test_causal_attention_backward_flops(roof_db: Path, raw_calls: dict) -> None:
    """cuDNN's backward over q, k, v [2, 16, 1024, 128], causal: 2.5 x the forward's 4·b·h·s²·d, halved."""
    frame = traceana.open(roof_db).roofline()
    (key,) = [k for k in raw_calls if k[0] == "aten::_cudnn_attention_backward"]
    args, launched = raw_calls[key][0]
    b, h, s, d = args["Input Dims"][1]
    assert args["Concrete Inputs"][14] == "True" and len(launched) == 3  # is_causal; three kernels a call
    row = _row(frame, *key)
    assert row["GFLOP"] == pytest.approx(2.5 * 0.5 * 4 * b * h * s * s * d / 1e9) == pytest.approx(21.47483648)
    assert row["launched"] == 3 and row["total_ms"] == pytest.approx(_kernel_ms(raw_calls[key]))


def test_by_kernel_regroups_the_same_calls(roof_db: Path) -> None:
    traces = traceana.open(roof_db)
    shapes, kernels = traces.roofline(), traces.roofline(by="kernel")
    assert kernels["calls"].sum() == shapes["calls"].sum()
    assert kernels["total_ms"].sum() == pytest.approx(shapes["total_ms"].sum())
    mm = kernels.filter(pl.col("kernel") == "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT").row(0, named=True)
    assert mm["op"] == "aten::mm" and mm["calls"] == 132


def test_cli_table_notes_json_and_plot(roof_db: Path, tmp_path: Path) -> None:
    out = run_cli("kernels", "--roofline", "--db", roof_db, "--top", "5", "--plot", tmp_path / "roof.png")
    assert "profile h200 (the trace's device 'NVIDIA H200')" in out.stdout
    assert "aten::_fused_adamw_" in out.stdout  # ops without a cost model are named in a note
    assert (tmp_path / "roof.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    payload = json.loads(run_cli("kernels", "--roofline", "--db", roof_db, "--json", "--profile", "a100").stdout)
    assert payload["profile"] == "a100" and payload["rows"][0]["peak_TFLOP_per_s"] == 312


@pytest.mark.parametrize(("args", "message"), [
    (["--profile", "x100"], "hardware.profile='x100': no built-in profile of that name"),
    (["--by", "stage"], "--by 'stage': the roofline is by shape or kernel"),
])
def test_bad_roofline_options_are_one_line(roof_db: Path, args: list[str], message: str) -> None:
    code, _, err = run_main("kernels", "--roofline", "--db", roof_db, *args)
    assert message in one_line(code, err)


def test_plot_without_roofline_is_one_line(roof_db: Path, tmp_path: Path) -> None:
    code, _, err = run_main("kernels", "--db", roof_db, "--plot", tmp_path / "x.png")
    assert "add --launch or --roofline" in one_line(code, err)


def test_runs_without_shapes_or_kernels_say_so(tmp_path: Path) -> None:
    db = tmp_path / "t.duckdb"
    run_cli("ingest", TRACES / "kineto" / "h200_hostbound_h512_L12_s256_gb8.json.gz", "--db", db)
    run_cli("ingest", TRACES / "kineto" / "hta_rank34of300_gloo_pgconfig.json.gz", "--db", db)
    run_cli("ingest", TRACES / "nsys" / "pipit_saxpy_mpi_1rank_nsys2022.2.sqlite", "--db", db)
    code, _, err = run_main("kernels", "h200_hostbound_h512_L12_s256_gb8", "--roofline", "--db", db)
    assert "the trace recorded no op shapes" in one_line(code, err)
    code, _, err = run_main("kernels", "hta_rank34of300_gloo_pgconfig", "--roofline", "--db", db)
    assert "has no op shapes, so no roofline: no kernel in it is linked" in one_line(code, err)
    code, _, err = run_main("kernels", "pipit_saxpy_mpi_1rank_nsys2022.2", "--roofline", "--db", db)
    assert "(Kineto) traces only, and this run is nsys" in one_line(code, err)


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
