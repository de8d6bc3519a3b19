"""Communication names -> canonical ops: NCCL/RCCL kernel names, framework op names, HCCL op names.

Only the collective and the data type are read from an NCCL kernel name; its algorithm, protocol and reduction
parts (RING_LL, Sum) say how a kernel was compiled, not what ran.
"""

from __future__ import annotations

import re

# Spellings seen in kernel names, CPU ops, NVTX ranges, Kineto args and HCCL op names -> canonical op.
# Matched on the lower-cased name with separators removed, so all_reduce / allReduce / AllReduce agree.
_OP_WORDS: tuple[tuple[str, str], ...] = (
    ("reducescatter", "ReduceScatter"),
    ("allgather", "AllGather"),
    ("allreduce", "AllReduce"),
    ("alltoall", "AllToAll"),
    ("batchsendrecv", "SendRecv"),
    ("sendrecv", "SendRecv"),
    ("broadcast", "Broadcast"),
    ("barrier", "Barrier"),
    ("gather", "Gather"),
    ("scatter", "Scatter"),
    ("reduce", "Reduce"),
    ("receive", "Recv"),
    ("recv", "Recv"),
    ("send", "Send"),
)

_DTYPES = {
    "f16": "float16", "half": "float16", "float16": "float16", "bf16": "bfloat16", "bfloat16": "bfloat16",
    "f32": "float32", "float": "float32", "float32": "float32", "f64": "float64", "double": "float64",
    "float64": "float64", "i8": "int8", "int8": "int8", "int8_t": "int8", "u8": "uint8", "uint8": "uint8",
    "uint8_t": "uint8", "i32": "int32", "int32": "int32", "int": "int32", "int32_t": "int32", "u32": "uint32",
    "uint32": "uint32", "uint32_t": "uint32", "i64": "int64", "int64": "int64", "int64_t": "int64",
    "u64": "uint64", "uint64": "uint64", "uint64_t": "uint64", "f8e4m3": "float8_e4m3", "f8e5m2": "float8_e5m2",
    "fp8_e4m3": "float8_e4m3", "fp8_e5m2": "float8_e5m2", "long": "int64", "byte": "uint8", "char": "int8",
    "short": "int16", "int16": "int16", "i16": "int16", "bool": "bool", "uint16": "uint16", "int128": "int128",
    "fp16": "float16", "bfp16": "bfloat16", "fp32": "float32", "fp64": "float64",  # HCCL's ENUM_HCCL_DATA_TYPE
}
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "int8": 1, "uint8": 1, "int16": 2,
               "uint16": 2, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "int128": 16, "float8_e4m3": 1,
               "float8_e5m2": 1, "bool": 1}


def canonical_op(text: str | None) -> str | None:
    """The canonical op a name spells ('nccl:_all_gather_base' -> AllGather, 'hcom_receive_' -> Recv), or None."""
    if not text:
        return None
    squeezed = re.sub(r"[^a-z]", "", text.lower())
    for word, op in _OP_WORDS:
        if word in squeezed:
            return op
    return None


def canonical_dtype(text: str | None) -> str | None:
    """'Float' / 'c10::BFloat16' / 'bf16' / 'DT_FLOAT16' -> the store's dtype spelling, or None."""
    if not text:
        return None
    key = text.lower().replace("c10::", "").replace("torch.", "").replace("dt_", "").replace("scalartype::", "")
    return _DTYPES.get(key, key)


_NCCL_KERNEL = re.compile(r"^nccl(?:Dev)?Kernel_([A-Za-z]+)(.*)$")


def parse_nccl_kernel(name: str) -> tuple[str | None, str | None]:
    """(kernel_op, dtype) from an NCCL/RCCL kernel name; (None, None) if it is not one.

    Old: ``ncclKernel_AllReduce_RING_LL_Sum_float``; new: ``ncclDevKernel_AllReduce_Sum_bf16_RING_LL``;
    RCCL: ``ncclDevKernel_Generic`` (no op in the name: kernel_op 'Generic').
    """
    match = _NCCL_KERNEL.match(name.split("(")[0])
    if not match:
        return None, None
    word, rest = match.groups()
    kernel_op = "Generic" if word == "Generic" else canonical_op(word) or word
    dtype = next((_DTYPES[t] for t in rest.split("_") if t in _DTYPES), None)
    return kernel_op, dtype
