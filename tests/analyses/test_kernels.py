"""`kernels`: short names and totals on a real H200 trace against its raw JSON (with a name normalizer written
independently here: a bracket-depth scan instead of the view's regular expressions), and per stage on a sample."""

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

from tests.analyses.test_breakdown_real import _union_ns
from tests.conftest import SAMPLES, TRACES
from tests.test_sample_traces import EXPERIMENTS
from traceana import store
from traceana.analyses.kernels import top_kernels
from traceana.cli.main import app
from traceana.ingest.dispatch import IngestOptions, read_run
from traceana.ingest.run_data import RunData
from traceana.layout import Layout

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
        store.write_run(connection, "h200", read_run([H200], "kineto", IngestOptions(cache_dir=folder / "cache")))
        options = IngestOptions(layout=Layout.parse(EXPERIMENTS["pp2_mb1"][0]), cache_dir=folder / "cache")
        store.write_run(connection, "pp2_mb1", read_run([SAMPLES / "pp2_mb1"], "kineto", options))
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
        store.write_run(writer, "h200", read_run([H200], "kineto", IngestOptions(cache_dir=tmp_path / "cache")))
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
