"""The job a run's trace states, as an estimator config: what `predict` starts from when no --config is given.

Read from the store, never guessed where the trace is silent: each value comes with what stated it, and what no trace
records is named as assumed (the estimator's defaults). Inferred:

- layout (``runs.layout``; a single rank needs none) and the device's built-in hardware profile (``runs.device``);
- from the recorded operator shapes (Kineto ``record_shapes=True``, table event_ops) of one rank of the last stage:
  the attention core's query (micro-batch, heads / tp, sequence / cp, head width; keys give the KV heads), the
  matrix products whose inner dimension is the hidden size (``aten::mm`` / ``aten::addmm``): the output layer is the
  one called least often (once per micro-batch, where a layer's products run once per layer and micro-batch), the
  MLP's up projection the widest of the rest, gated (SwiGLU) where ``aten::silu`` runs and ``aten::gelu`` does not;
- micro-batches per step: the output layer's calls per step, or with pipeline stages the first stage's sends per step;
  layers: the attention cores per step and micro-batch, times the stages.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from traceana.analyses.roofline import ATTENTION, GEMMS, Tensor, tensors
from traceana.errors import TraceanaError
from traceana.layout import Layout

if TYPE_CHECKING:
    from traceana.estimator.config import Config

ASSUMED = ("precision (the estimator's mixed-precision bytes a parameter)", "no recompute", "a 1F1B schedule",
           "untied embeddings", "calibration at the hardware profile's defaults")


@dataclass(frozen=True)
class Job:
    """``raw``: the config as YAML would give it (estimator.config.from_dict builds it); ``inferred``: each value with
    what stated it; ``assumed``: what the trace cannot state."""

    raw: dict
    inferred: list[str]
    assumed: list[str]


def infer(con: duckdb.DuckDBPyConnection, run_id: str) -> Job:
    """The job of run ``run_id`` (module doc); a one-line error naming what the trace lacks."""
    from traceana.estimator.config import profile_for_device

    world, spec, device = con.execute("SELECT world_size, layout, device FROM runs WHERE run_id = ?",
                                      [run_id]).fetchall()[0]
    if spec is None and world > 1:
        raise TraceanaError(f"run {run_id!r} has {world} ranks and no layout: ingest it with --layout, or give "
                            "--config")
    layout = Layout.parse(spec) if spec else Layout()
    profile = profile_for_device(device)
    if profile is None:
        named = device or "not named in the trace"
        raise TraceanaError(f"run {run_id!r}: no built-in hardware profile for its device ({named}): give --config")
    rank = next(r for r in range(world) if layout.coords(r)["pp"] == layout.pp - 1)
    calls = _calls_per_step(con, run_id, rank)
    attention = [(op, qk, n) for op, dims, types, n in calls
                 if op in ATTENTION and not ATTENTION[op][3] and (qk := _query_key(op, dims, types))]
    if not attention:
        raise TraceanaError(f"run {run_id!r} records no attention operator with its shapes on rank {rank} (profile "
                            "with record_shapes=True), so the model cannot be read from it: give --config")
    op, (q, k), per_step = max(attention, key=lambda a: a[2])
    seq_at, heads_at = (2, 1) if ATTENTION[op][1] == "bhsd" else (1, 2)
    micro_batch, heads, seq, head_dim = q.shape[0], q.shape[heads_at], q.shape[seq_at], q.shape[3]
    hidden = heads * layout.tp * head_dim
    outputs = {}  # N of the products [tokens, hidden] x [hidden, N] -> calls per step
    for gemm, g_dims, g_types, n in calls:
        if gemm in GEMMS:
            a, b = tensors(g_dims, g_types)[GEMMS[gemm]:GEMMS[gemm] + 2]
            if a is not None and b is not None and len(a.shape) == len(b.shape) == 2 and a.shape[1] == hidden == \
                    b.shape[0]:  # column-parallel under TP: the full hidden in, a slice of N out
                outputs[b.shape[1]] = outputs.get(b.shape[1], 0) + n
    qkv = (heads + 2 * k.shape[heads_at]) * head_dim
    head = min(outputs, key=outputs.__getitem__, default=None)
    vocab = head if head is not None and outputs[head] < per_step and head not in (qkv, hidden // layout.tp) else None
    names = {op for op, *_ in calls}
    gated = "aten::silu" in names and "aten::gelu" not in names
    widths = sorted(n for n in outputs if n not in (qkv, hidden // layout.tp, vocab))
    if not widths:
        raise TraceanaError(f"run {run_id!r}: no MLP product of inner dimension {hidden} among the recorded shapes, "
                            "so the MLP width cannot be read: give --config")
    ffn = widths[-1] * layout.tp // (2 if gated and widths[-1] // 2 in _inner(calls) else 1)  # fused gate+up
    inferred = [f"layout {spec} (the ingest's --layout)" if spec else "one rank: no parallelism",
                f"hardware profile {profile} (the trace's device {device})",
                f"micro-batch {micro_batch}, sequence {seq * layout.cp}, {heads * layout.tp} heads of {head_dim} "
                f"({k.shape[heads_at] * layout.tp} KV), hidden {hidden}: {op}'s inputs on rank {rank}",
                f"MLP width {ffn}{', gated (aten::silu)' if gated else ''}: the widest product of inner dimension "
                f"{hidden}"]
    if layout.pp > 1:
        from traceana.model.compare import _first_stage_sends

        micro_batches = _first_stage_sends(con, run_id)
        if micro_batches is None:
            raise TraceanaError(f"run {run_id!r} records no pipeline sends, so its micro-batches cannot be counted: "
                                "give --config")
        inferred.append(f"{micro_batches} micro-batches a step: the first stage's sends")
    elif vocab is not None:
        micro_batches = outputs[vocab]
        inferred.append(f"{micro_batches} micro-batches a step: the output layer's calls")
    else:
        micro_batches = 1
    layers, odd = divmod(per_step * layout.pp, micro_batches)
    if odd or not layers:
        raise TraceanaError(f"run {run_id!r}: {per_step} attention calls a step on rank {rank} do not split into "
                            f"{micro_batches} micro-batches of whole layers: give --config")
    inferred.append(f"{layers} layers: {per_step} attention calls a step / {micro_batches} micro-batches"
                    + (f" x {layout.pp} stages" if layout.pp > 1 else ""))
    inferred.append(f"vocabulary {vocab * layout.tp}: the output layer's width" if vocab is not None
                    else "no output layer: none of the products runs once per micro-batch")
    assumed = list(ASSUMED) + ([] if vocab is not None or layout.pp > 1 else ["one micro-batch a step (no output "
                                                                              "layer to count them by)"])
    raw = {"model": {"layers": layers, "hidden": hidden, "ffn_hidden": ffn, "heads": heads * layout.tp,
                     "kv_heads": k.shape[heads_at] * layout.tp, "head_dim": head_dim,
                     "vocab": vocab * layout.tp if vocab is not None else 0, "seq_len": seq * layout.cp,
                     "gated_mlp": gated},
           "parallel": {"tp": layout.tp, "cp": layout.cp, "dp": layout.dp, "pp": layout.pp, "ep": layout.ep,
                        "order": layout.order, "micro_batch": micro_batch,
                        "global_batch": micro_batch * micro_batches * layout.dp},
           "hardware": {"profile": profile}}
    return Job(raw, inferred, assumed)


def configs(con: duckdb.DuckDBPyConnection, run_id: str, config: Path | None, to: Path | None,
            changes: list[str]) -> tuple[Config, Config, list[str]]:
    """`predict`'s (source, target, notes): the run's config (``config``, else :func:`infer`'s, the notes saying
    what was inferred and assumed) and the target (``to``, else the source, with ``changes`` made)."""
    from traceana.estimator.config import from_dict, load, load_with, with_changes

    if to is None and not changes:
        raise TraceanaError("predict needs the target: --to CFG_B, or --set KEY=VALUE changes to the run's config")
    if config is not None:
        return load(config), load_with(to or config, changes), []
    job = infer(con, run_id)
    name = f"the job inferred from run {run_id!r}"
    notes = [f"--config inferred from the trace: {'; '.join(job.inferred)}",
             f"assumed (no trace records them): {'; '.join(job.assumed)}"]
    target = load_with(to, changes) if to is not None else with_changes(copy.deepcopy(job.raw), changes, name)
    return from_dict(job.raw, name), target, notes


def _calls_per_step(con: duckdb.DuckDBPyConnection, run_id: str, rank: int) -> list[tuple[str, list, list, int]]:
    """(op, input dims, input types, calls a step: the median over the rank's steps) of every operator the rank
    launched device work from with recorded shapes, one row per distinct shape."""
    rows = con.execute("""
        SELECT op, input_dims, input_types, median(n)::BIGINT FROM (
            SELECT o.op, o.input_dims, o.input_types, w.step, count(DISTINCT o.op_id) AS n
            FROM event_ops o
            JOIN device_events e ON e.run_id = o.run_id AND e.rank = o.rank AND e.event_id = o.event_id
            JOIN step_windows w ON w.run_id = e.run_id AND w.rank = e.rank AND e.start_ns >= w.start_ns
                               AND e.start_ns < w.end_ns
            WHERE o.run_id = ? AND o.rank = ? GROUP BY ALL)
        GROUP BY ALL""", [run_id, rank]).fetchall()
    out = []
    for op, dims, types, n in rows:
        try:
            dims, types = json.loads(dims or "null"), json.loads(types or "null")
        except json.JSONDecodeError:
            continue
        out.append((op, dims if isinstance(dims, list) else [], types if isinstance(types, list) else [], n))
    return out


def _query_key(op: str, dims: list, types: list) -> tuple[Tensor, Tensor] | None:
    """An attention core's query and key as recorded (4-D each), or None."""
    at = ATTENTION[op][0]
    q, k = [*tensors(dims, types)[at:at + 2], None, None][:2]
    return (q, k) if q is not None and k is not None and len(q.shape) == len(k.shape) == 4 else None


def _inner(calls: list[tuple[str, list, list, int]]) -> set[int]:
    """The inner dimensions (K) of the recorded matrix products: a down projection's K is the MLP's width."""
    out = set()
    for op, dims, types, _ in calls:
        if op in GEMMS:
            a = tensors(dims, types)[GEMMS[op]]
            if a is not None and len(a.shape) == 2:
                out.add(a.shape[1])
    return out
