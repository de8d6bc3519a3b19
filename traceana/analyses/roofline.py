"""Behind `traceana kernels --roofline`: a measured roofline per kernel. Each call of a CPU op that launched kernels
(view op_kernels) gets its FLOPs and the bytes it must move from the shapes it was called with (Kineto ``Input
Dims`` / ``Input type``, recorded with ``record_shapes=True``); over its kernels' time that is an achieved FLOP rate
and bandwidth, set against the roof of the hardware profile (estimator/profiles): min(peak FLOP/s, intensity x HBM
bandwidth). Nsight and Ascend runs have no shapes in the store, so no roofline.

The cost model, per call (one op's kernels together; sizes from the inputs, each tensor's dtype from its type):

- GEMMs (``aten::mm``, ``addmm``, ``bmm``, ``baddbmm``; ``matmul`` and ``linear`` launch through them): 2·b·m·n·k
  FLOPs for (b x) [m, k] @ [k, n]; bytes read A, B (and addmm's bias C) and write the [m, n] result once.
- Attention cores (flash, memory-efficient and cuDNN, forward and backward): forward 2·b·h·s_q·s_k·(d_qk + d_v),
  halved when causal (is_causal, or a causal custom_mask_type; a trace without Concrete Inputs does not say, and
  the whole product is counted); backward 2.5 times the forward (five products against two, FlashAttention-2's
  count). Bytes: every tensor input once, plus the output (forward) or the gradients
  of q, k and v (backward).
- Memory-bound ops (elementwise, normalization, softmax, dropout, reductions, copy / fill): bytes are every tensor
  input once plus the output, an input-sized tensor of the first input's dtype (a reduction's output: the input
  over its reduced dims; dropout adds its one-byte mask; copy_ and fill_ write their target, fill_ reads nothing).
  A tensor past an elementwise op's operands (``torch.mul(a, b, out=c)`` records c as a third input) is its
  output: written, not read.
  FLOPs count one per output element (per input element for reductions): a floor, since what bounds these ops is
  bytes. Small side outputs (layer norm's per-row statistics, a weight's gradient) are not counted.

Peaks: GEMMs and attention run on tensor cores at the profile's peak for their first input's dtype (bf16 / fp16:
``peak_tflops_bf16``; fp8: ``peak_tflops_fp8``; fp32: ``peak_tflops_tf32``, since a roof must bound what ran and
the trace does not say whether TF32 was allowed: an fp32 GEMM on CUDA cores shows as a small share of it, as the
A100 trace's ``s1688gemm`` TF32 kernels would exceed the CUDA-core peak); every other op at the CUDA-core
``peak_tflops_fp32``. The ridge point is peak FLOP/s over HBM bytes/s: a call
whose intensity (FLOPs a byte) is below it is memory-bound, and ``roof_pct`` is its achieved rate's share of the
roof at its intensity (for a compute-bound one the share of peak FLOP/s, for a memory-bound one of HBM bandwidth).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass

import duckdb
import polars as pl

from traceana.errors import TraceanaError
from traceana.ingest.comm_names import DTYPE_BYTES, canonical_dtype
from traceana.store.schema import OUTDATED

BY = ("shape", "kernel")
GEMMS = {"aten::mm": 0, "aten::bmm": 0, "aten::addmm": 1, "aten::baddbmm": 1}  # op -> index of A (B follows)
# op -> (index of q, layout of q / k / v, index of the causal flag, backward): torch's native_functions.yaml
ATTENTION = {
    "aten::_flash_attention_forward": (0, "bshd", 8, False),
    "aten::_flash_attention_backward": (1, "bshd", 11, True),
    "aten::_efficient_attention_forward": (0, "bshd", 9, False),  # custom_mask_type: 0 none, 1 / 2 causal
    "aten::_efficient_attention_backward": (1, "bshd", 14, True),
    "aten::_cudnn_attention_forward": (0, "bhsd", 10, False),
    "aten::_cudnn_attention_backward": (1, "bhsd", 14, True),
}
_ELEMENTWISE = ("add", "sub", "mul", "div", "neg", "exp", "pow", "rsqrt", "sqrt", "relu", "threshold_backward",
                "gelu", "gelu_backward", "silu", "silu_backward", "sigmoid", "sigmoid_backward", "tanh",
                "tanh_backward", "clamp", "masked_fill", "native_dropout", "native_dropout_backward")
MEMORY_BOUND = {
    **{f"aten::{op}{inplace}": "elementwise" for op in _ELEMENTWISE for inplace in ("", "_")},
    **{f"aten::{op}": "normalization" for op in ("native_layer_norm", "native_layer_norm_backward",
                                                  "_fused_rms_norm", "_fused_rms_norm_backward")},
    **{f"aten::{op}": "softmax" for op in ("_softmax", "_softmax_backward_data", "_log_softmax",
                                            "_log_softmax_backward_data")},
    **{f"aten::{op}": "reduction" for op in ("sum", "mean", "amax")},
    **{f"aten::{op}": "copy" for op in ("copy_", "fill_", "zero_")},
}
# the tensor operands of elementwise ops that take more than one (the others take one): later tensors are out=
BINARY = {f"aten::{op}{inplace}" for op in ("add", "sub", "mul", "div", "pow", "threshold_backward",
                                            "gelu_backward", "silu_backward", "sigmoid_backward", "tanh_backward",
                                            "native_dropout_backward", "masked_fill") for inplace in ("", "_")}
BACKWARD_FACTOR = 2.5
# Kineto's Input type spellings that comm_names.canonical_dtype (written for collectives' dtypes) leaves as they are
INPUT_TYPES = {"long int": "int64", "short int": "int16", "unsigned char": "uint8", "signed char": "int8",
               "float8_e4m3fn": "float8_e4m3", "float8_e4m3fnuz": "float8_e4m3", "float8_e5m2fnuz": "float8_e5m2"}


@dataclass(frozen=True)
class Cost:
    """What one call of an op must do: FLOPs, bytes moved, and the dtype and unit whose peak applies."""

    family: str      # gemm, attention, elementwise, normalization, softmax, reduction, copy
    flops: float
    bytes: float
    dtype: str       # the first tensor input's (store spelling: bfloat16, float32 ...)
    tensor_cores: bool


@dataclass(frozen=True)
class Tensor:
    shape: tuple[int, ...]
    dtype: str

    @property
    def elements(self) -> int:
        out = 1
        for size in self.shape:
            out *= size
        return out

    @property
    def bytes(self) -> int:
        return self.elements * DTYPE_BYTES[self.dtype]


def tensors(dims: list, types: list) -> list[Tensor | None]:
    """Each input as a Tensor (a shape of ints and a dtype with a size), else None (a scalar, a list, a None)."""
    out: list[Tensor | None] = []
    for shape, kind in zip(dims, types, strict=False):
        dtype = canonical_dtype(kind) if isinstance(kind, str) else None
        dtype = INPUT_TYPES.get(dtype or "", dtype)
        ok = isinstance(shape, list) and all(isinstance(s, int) and s >= 0 for s in shape)
        out.append(Tensor(tuple(shape), dtype) if ok and dtype in DTYPE_BYTES else None)
    return out


def op_cost(op: str, input_dims: str | None, input_types: str | None, concrete: str | None) -> Cost | None:
    """The Cost of one call of ``op`` with these recorded inputs (JSON text, as event_ops holds them), or None when
    the op has no model here or its inputs do not fit it."""
    if input_dims is None or input_types is None:
        return None
    try:
        dims, types = json.loads(input_dims), json.loads(input_types)
        values = json.loads(concrete) if concrete else []
    except json.JSONDecodeError:
        return None
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    inputs = tensors(dims, types)
    model: Callable[..., Cost | None] | None = (
        _gemm if op in GEMMS else _attention if op in ATTENTION else _memory_bound if op in MEMORY_BOUND else None)
    return model(op, inputs, values if isinstance(values, list) else []) if model else None


def _gemm(op: str, inputs: list[Tensor | None], _: list) -> Cost | None:
    at = GEMMS[op]
    a, b = (inputs[at], inputs[at + 1]) if len(inputs) >= at + 2 else (None, None)
    if a is None or b is None:
        return None
    rank = 3 if op.endswith("bmm") else 2
    if len(a.shape) != rank or len(b.shape) != rank or a.shape[-1] != b.shape[-2] or a.shape[:-2] != b.shape[:-2]:
        return None
    batch = a.shape[0] if rank == 3 else 1
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    bias = inputs[0].bytes if at == 1 and inputs[0] is not None else 0
    written = batch * m * n * DTYPE_BYTES[a.dtype]
    return Cost("gemm", 2.0 * batch * m * n * k, a.bytes + b.bytes + bias + written, a.dtype, True)


def _attention(op: str, inputs: list[Tensor | None], values: list) -> Cost | None:
    at, layout, flag, backward = ATTENTION[op]
    q, k, v = [*inputs[at:at + 3], None, None, None][:3]
    if q is None or k is None or v is None or not len(q.shape) == len(k.shape) == len(v.shape) == 4:
        return None
    seq, heads = (2, 1) if layout == "bhsd" else (1, 2)
    batch, h, s_q, s_k = q.shape[0], q.shape[heads], q.shape[seq], k.shape[seq]
    flops = 2.0 * batch * h * s_q * s_k * (q.shape[3] + v.shape[3])
    text = str(values[flag]).strip() if len(values) > flag else ""
    if text in ("True", "1", "2"):  # is_causal, or custom_mask_type 1 / 2 (causal from the top left / bottom right)
        flops /= 2
    read = sum(t.bytes for t in inputs if t is not None)
    written = (q.bytes + k.bytes + v.bytes) if backward else batch * h * s_q * v.shape[3] * DTYPE_BYTES[q.dtype]
    return Cost("attention", flops * (BACKWARD_FACTOR if backward else 1.0), read + written, q.dtype, True)


def _memory_bound(op: str, inputs: list[Tensor | None], values: list) -> Cost | None:
    present = [t for t in inputs if t is not None]
    if not present:
        return None
    family, name = MEMORY_BOUND[op], op.removeprefix("aten::")
    if family == "elementwise":
        present = present[:2 if op in BINARY else 1]  # the rest are out= tensors, the output counted below
    first, largest = present[0], max(t.elements for t in present)
    read = sum(t.bytes for t in present)
    if name in ("fill_", "zero_"):
        return Cost(family, 0.0, first.bytes, first.dtype, False)
    if name == "copy_":  # writes self (the first input), reads src
        return Cost(family, 0.0, read, first.dtype, False)
    if family == "reduction":
        reduced = _reduced_elements(first.shape, values[1] if len(values) > 1 else "")
        if reduced is None:
            return None
        written = first.elements // reduced * DTYPE_BYTES[first.dtype]
        return Cost(family, float(first.elements), read + written, first.dtype, False)
    written = largest * DTYPE_BYTES[first.dtype] + (largest if name == "native_dropout" else 0)  # the bool mask
    return Cost(family, float(largest), read + written, first.dtype, False)


def _reduced_elements(shape: tuple[int, ...], dims_text: str) -> int | None:
    """How many input elements go into each output element of a reduction over ``dims_text`` ('[0]', '' or '[]'
    for all), or None when the dims cannot be read."""
    try:
        dims = json.loads(dims_text) if dims_text.strip() else []
    except json.JSONDecodeError:
        return None
    if isinstance(dims, int):
        dims = [dims]
    if not isinstance(dims, list) or not all(isinstance(d, int) and -len(shape) <= d < len(shape) for d in dims):
        return None
    out = 1
    for d in {d % len(shape) for d in dims} if dims else range(len(shape)):
        out *= shape[d]
    return max(out, 1)


@dataclass(frozen=True)
class Peaks:
    """A hardware profile's roof: peak TFLOP/s per dtype on tensor cores, the CUDA-core fp32 peak, HBM GB/s."""

    profile: str
    why: str             # how the profile was chosen
    tensor: dict[str, float | None]
    cuda_core: float | None
    hbm_gb_per_s: float

    def of(self, cost: Cost) -> float | None:
        return self.tensor.get(cost.dtype) if cost.tensor_cores else self.cuda_core

    def roofs(self) -> list[tuple[str, float]]:
        """(label, TFLOP/s) of each peak the profile has."""
        named = (("bf16 / fp16 tensor cores", self.tensor.get("bfloat16")), ("fp8 tensor cores",
                 self.tensor.get("float8_e4m3")), ("tf32 tensor cores", self.tensor.get("float32")),
                 ("fp32 CUDA cores", self.cuda_core))
        return [(label, peak) for label, peak in named if peak]

    def describe(self) -> str:
        ridge = [f"{label} {peak:,.0f} TFLOP/s (ridge {peak * 1e3 / self.hbm_gb_per_s:,.0f} FLOP/B)"
                 for label, peak in self.roofs()]
        return f"profile {self.profile} ({self.why}): {', '.join(ridge)}, HBM {self.hbm_gb_per_s:,.0f} GB/s"


def peaks(profile: str | None, device: str | None) -> Peaks:
    """The roof of ``profile`` (a built-in name or a YAML file), else of the built-in profile the run's device
    names, else h200's, saying which and why."""
    from traceana.estimator.config import profile_for_device, profile_hardware

    if profile is not None:
        name, why = profile, "--profile"
    elif (found := profile_for_device(device)) is not None:
        name, why = found, f"the trace's device {device!r}"
    else:
        name = "h200"
        why = (f"assumed: no built-in profile matches the trace's device {device!r}; pass --profile" if device
               else "assumed: the trace names no device; pass --profile")
    hw = profile_hardware(name)
    assert hw.hbm_bandwidth_gb_per_s is not None  # profile_hardware requires it
    tensor = {"bfloat16": hw.peak_tflops_bf16, "float16": hw.peak_tflops_bf16, "float32": hw.peak_tflops_tf32,
              "float8_e4m3": hw.peak_tflops_fp8, "float8_e5m2": hw.peak_tflops_fp8}
    return Peaks(name, why, tensor, hw.peak_tflops_fp32, hw.hbm_bandwidth_gb_per_s)


@dataclass(frozen=True)
class Roofline:
    frame: pl.DataFrame  # one row per op shape (or kernel): see :func:`measure`
    peaks: Peaks
    notes: list[str]


# op_kernels' calls of one signature and longest kernel counted together: a row a call held the 1,024 copies of a
# real rank's calls, their JSON shapes included, in 5.3 GiB for 34 s (the roofline then groups them anyway)
CALLS_SQL = """
SELECT op, input_dims, input_types, concrete_inputs, kernel, count(*) AS calls, sum(launched)::BIGINT AS launched,
       sum(kernel_ns)::BIGINT AS kernel_ns
FROM op_kernels WHERE run_id = ? GROUP BY ALL
"""


def measure(con: duckdb.DuckDBPyConnection, run_id: str, by: str = "shape", profile: str | None = None,
            top: int | None = None) -> Roofline:
    """The roofline of run ``run_id``, one row per op, input shapes, dtype and kernel (``by="shape"``) or per kernel
    short name (``by="kernel"``), by total time (the ``top`` first). Columns: kernel, op (by kernel: its first
    four ops, ', ' between them), family, input_dims (JSON text, by shape), dtype, calls, launched (kernels a call),
    total_ms, mean_us, GFLOP and MB (a call's FLOPs and bytes, 1e9 and 1e6), FLOP_per_B, TFLOP_per_s, GB_per_s,
    peak_TFLOP_per_s (the profile's for the dtype and unit), peak_GB_per_s, ridge_FLOP_per_B, bound (compute /
    memory), roof_pct (the achieved rate's share of min(peak, intensity x HBM)), peak_FLOP_pct, peak_HBM_pct;
    by shape also shapes (the tensor inputs' shapes, '2048x2048, 2048x8192')."""
    if by not in BY:
        raise TraceanaError(f"--by {by!r}: the roofline is by shape or kernel")
    if top is not None and top < 1:
        raise TraceanaError(f"--top {top}: must be >= 1")
    try:  # a store written before event_ops (and runs.device) has no op_kernels view
        calls = con.sql(CALLS_SQL, params=[run_id]).pl()
    except duckdb.CatalogException:
        raise TraceanaError(OUTDATED) from None
    device, fmt = con.execute("SELECT device, source_format FROM runs WHERE run_id = ?", [run_id]).fetchall()[0]
    roof = peaks(profile, device)
    if calls.is_empty():
        why = (f"traceana reads op shapes from PyTorch profiler (Kineto) traces only, and this run is {fmt}"
               if fmt != "kineto" else "no kernel in it is linked to the CPU op that launched it (a CPU-only run "
               "has no kernels; a store written before the event_ops table existed needs the run ingested again)")
        raise TraceanaError(f"run {run_id!r} has no op shapes, so no roofline: {why}")
    shaped = calls.filter(pl.col("input_dims").is_not_null())
    if shaped.is_empty():
        raise TraceanaError(f"run {run_id!r}: the trace recorded no op shapes, so no roofline (profile with "
                            "torch.profiler.profile(record_shapes=True))")
    keys = ["op", "input_dims", "input_types", "concrete_inputs"]
    costs = shaped.select(keys).unique()
    rows = [op_cost(*row) for row in costs.iter_rows()]  # one per distinct call signature, not per event
    costs = costs.with_columns(
        pl.Series("family", [c.family if c else None for c in rows], dtype=pl.String),
        pl.Series("flops", [c.flops if c else None for c in rows], dtype=pl.Float64),
        pl.Series("bytes", [c.bytes if c else None for c in rows], dtype=pl.Float64),
        pl.Series("dtype", [c.dtype if c else None for c in rows], dtype=pl.String),
        pl.Series("peak_TFLOP_per_s", [roof.of(c) if c else None for c in rows], dtype=pl.Float64))
    priced = shaped.join(costs, on=keys, how="left", nulls_equal=True)
    notes = [roof.describe(), *_left_out(con, run_id, calls, priced)]
    modelled = priced.filter(pl.col("flops").is_not_null())
    group = ["kernel", "family", "dtype", "peak_TFLOP_per_s"] + (
        ["op", "input_dims", "flops", "bytes"] if by == "shape" else [])
    frame = (modelled.group_by(group).agg(
        *([pl.concat_str(pl.col("op").unique().sort().head(4).str.join(", "),
                         pl.when(pl.col("op").n_unique() > 4).then(pl.lit(" ...")).otherwise(pl.lit("")))
           .alias("op")] if by == "kernel" else []),
        pl.col("calls").sum(), (pl.col("launched").sum() / pl.col("calls").sum()).alias("launched"),
        pl.col("kernel_ns").sum().alias("ns"), (pl.col("flops") * pl.col("calls")).sum().alias("total_flops"),
        (pl.col("bytes") * pl.col("calls")).sum().alias("total_bytes"))
        .sort(order := ["ns", "kernel", "op", *(["input_dims"] if by == "shape" else []), "dtype"],
              descending=[True] + [False] * (len(order) - 1), nulls_last=True))  # ties in a stated order
    if top is not None:
        frame = frame.head(top)
    hbm = roof.hbm_gb_per_s
    ns = pl.when(pl.col("ns") > 0).then(pl.col("ns"))  # kernels too short to time (0 ns) give no rate
    intensity = pl.col("total_flops") / pl.when(pl.col("total_bytes") > 0).then(pl.col("total_bytes"))
    tflops = pl.col("total_flops") / ns / 1e3
    gbps = pl.col("total_bytes") / ns
    ridge = pl.col("peak_TFLOP_per_s") * 1e3 / hbm
    frame = frame.with_columns(
        (pl.col("ns") / 1e6).alias("total_ms"), (pl.col("ns") / pl.col("calls") / 1e3).alias("mean_us"),
        (pl.col("total_flops") / pl.col("calls") / 1e9).alias("GFLOP"),
        (pl.col("total_bytes") / pl.col("calls") / 1e6).alias("MB"),
        intensity.alias("FLOP_per_B"), tflops.alias("TFLOP_per_s"), gbps.alias("GB_per_s"),
        pl.lit(hbm).alias("peak_GB_per_s"), ridge.alias("ridge_FLOP_per_B"),
        pl.when(ridge.is_null() | intensity.is_null()).then(None).when(intensity >= ridge).then(pl.lit("compute"))
        .otherwise(pl.lit("memory")).alias("bound"),
        (100 * tflops / pl.col("peak_TFLOP_per_s")).alias("peak_FLOP_pct"), (100 * gbps / hbm).alias("peak_HBM_pct"))
    # the share of the roof min(peak, intensity x HBM): of peak FLOP/s above the ridge, of HBM bandwidth below it
    frame = frame.with_columns(pl.when(pl.col("bound") == "compute").then(pl.col("peak_FLOP_pct"))
                               .when(pl.col("bound") == "memory").then(pl.col("peak_HBM_pct")).alias("roof_pct"))
    if by == "shape":
        frame = frame.with_columns(pl.col("input_dims").map_elements(shapes, return_dtype=pl.String).alias("shapes"))
    columns = ["kernel", "op", "family", *(["shapes", "input_dims"] if by == "shape" else []), "dtype", "calls",
               "launched",
               "total_ms", "mean_us", "GFLOP", "MB", "FLOP_per_B", "TFLOP_per_s", "GB_per_s", "peak_TFLOP_per_s",
               "peak_GB_per_s", "ridge_FLOP_per_B", "bound", "roof_pct", "peak_FLOP_pct", "peak_HBM_pct"]
    over = frame.filter(pl.col("roof_pct") > 100)
    if over.height:
        notes.append(f"{over.height} rows run above their roof (up to {over['roof_pct'].max():,.0f}%), moving at most "
                     f"{over['MB'].max():,.1f} MB a call: data a cache (L2) can serve, which the HBM roof does not "
                     "bound")
    return Roofline(frame.select(columns), roof, notes)


def shapes(input_dims: str) -> str:
    """The inputs' shapes as people write them ('2048x2048, 2048x8192'; a scalar or a 0-d tensor '-'; a run of
    equal ones once, '3 x 2x16x1024x128'), without the trailing scalar arguments."""
    import itertools

    def one(shape: object) -> str:
        ok = isinstance(shape, list) and shape and all(isinstance(s, int) for s in shape)
        return "x".join(map(str, shape)) if ok else "-"  # type: ignore[union-attr]

    dims = json.loads(input_dims)
    while dims and dims[-1] == []:
        dims.pop()
    runs = [(text, len(list(group))) for text, group in itertools.groupby(one(d) for d in dims)]
    return ", ".join(text if n == 1 else f"{n} x {text}" for text, n in runs)


def _left_out(con: duckdb.DuckDBPyConnection, run_id: str, calls: pl.DataFrame, priced: pl.DataFrame) -> list[str]:
    """What the roofline leaves out, counted: kernels no op call owns, calls without shapes, ops without a model,
    dtypes the profile has no peak for (``calls``: CALLS_SQL's rows, ``priced``: them with their costs)."""
    compute_ns = con.execute("SELECT sum(end_ns - start_ns) FROM device_events WHERE run_id = ? AND category = "
                             "'compute'", [run_id]).fetchall()[0][0] or 0
    ns = calls["kernel_ns"].sum()
    notes = []
    if compute_ns > ns:
        share = 100 * (compute_ns - ns) / compute_ns
        notes.append(f"{(compute_ns - ns) / 1e6:,.3f} ms of compute kernel time ({share:.1f}%) has no launching CPU "
                     "op in the trace and is not in the roofline")
    if (bare := calls.filter(pl.col("input_dims").is_null())).height:
        notes.append(f"{bare['calls'].sum()} op calls ({bare['kernel_ns'].sum() / 1e6:,.3f} ms of kernels) recorded no "
                     "shapes and are left out")
    unmodelled = priced.filter(pl.col("flops").is_null())
    if unmodelled.height:
        top = (unmodelled.group_by("op").agg(pl.col("calls").sum().alias("n"), pl.col("kernel_ns").sum().alias("ns"))
               .sort(["ns", "op"], descending=[True, False]))
        listed = ", ".join(f"{op} {n}" for op, n, _ in top.head(4).iter_rows())
        notes.append(f"{unmodelled['calls'].sum()} op calls ({unmodelled['kernel_ns'].sum() / 1e6:,.3f} ms of kernels, "
                     f"{100 * unmodelled['kernel_ns'].sum() / ns:.1f}% of the linked kernel time) have no cost model "
                     f"for their op or inputs and are left out ({listed}{' ...' if top.height > 4 else ''})")
    if (peakless := priced.filter(pl.col("flops").is_not_null() & pl.col("peak_TFLOP_per_s").is_null())).height:
        dtypes = ", ".join(sorted(set(peakless["dtype"].to_list())))
        notes.append(f"{peakless['calls'].sum()} op calls of dtype {dtypes}: the profile has no peak for them, so no "
                     "ridge, bound or share of peak")
    return notes
