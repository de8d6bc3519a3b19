"""Run one experiment as a real multi-process gloo job on 127.0.0.1 and write one Kineto trace per rank.

Every rank creates every process group of the kinds an experiment needs, in one global order (seed 002: a different
order on different ranks can hang), named with ``group_desc`` so the trace's ``pg_config`` carries the framework name.
Rank sets come from traceana's own Layout (Megatron RankGenerator semantics), so the traces and the ``--layout`` given
to ``traceana ingest`` cannot disagree. Which threads each group started is written beside the traces
(``<name>.pg_threads.json``): gloo traces do not say which group ran a collective, and tests need the truth.
"""

from __future__ import annotations

import gc
import json
import os
import socket
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.profiler import ProfilerActivity, profile, schedule

from traceana.layout import Layout

# Group kind (a key of Layout.groups) -> the group_desc the trace will carry.
GROUP_DESC = {"TP": "tp", "CP": "cp", "EP": "ep", "DP": "dp", "PP": "pp", "DP-EP": "edp"}

# Profiler schedule: step 0 waits, step 1 warms up, steps 2 and 3 are recorded (ProfilerStep#2, ProfilerStep#3).
WAIT, WARMUP, ACTIVE = 1, 1, 2


@dataclass
class Context:
    """What an experiment's builder gets on each rank."""

    rank: int
    layout: Layout
    groups: dict[str, dist.ProcessGroup]  # group kind -> the group of that kind this rank belongs to
    ranks: dict[str, list[int]]  # group kind -> that group's global ranks

    @property
    def coords(self) -> dict[str, int]:
        return self.layout.coords(self.rank)


StepFn = Callable[[], None]


@dataclass(frozen=True)
class Experiment:
    name: str
    layout: str  # the spec passed to `traceana ingest --layout`
    groups: tuple[str, ...]  # group kinds to create, e.g. ("TP", "DP")
    build: Callable[[Context], StepFn]  # builds the rank's model and returns one training step
    summary: str
    profile_memory: bool = False  # record allocator samples ([memory] events): the measured side of peak memory


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _threads() -> set[int]:
    return {int(tid) for tid in os.listdir("/proc/self/task")}


def new_groups(layout: Layout, rank: int, kinds: tuple[str, ...], pg_threads: dict[int, str]) -> Context:
    """Create the groups; record which worker threads each group of this rank started (tid -> pg_name)."""
    groups: dict[str, dist.ProcessGroup] = {}
    ranks: dict[str, list[int]] = {}
    for kind in kinds:
        for members in layout.groups[kind]:  # every rank creates every group, in the same order
            before = _threads()
            group = dist.new_group(members, group_desc=GROUP_DESC[kind])
            if rank in members:
                groups[kind], ranks[kind] = group, members
                pg_threads.update(dict.fromkeys(_threads() - before, group.group_name))
    return Context(rank, layout, groups, ranks)


def record(step: StepFn, path: Path, steps: tuple[int, int, int] = (WAIT, WARMUP, ACTIVE),
           profile_memory: bool = False) -> None:
    """Run ``step`` under torch.profiler with schedule (wait, warmup, active); write the trace to ``path``. The
    profile's events are cyclic garbage: collected now, not by a GC pass inside a later recording's steps (left to
    the collector, they made one config's median step vary 0.22-0.33 in log-SD over 12 back-to-back recordings,
    0.08 collected here; sample_traces/README.md, "Noise floor")."""
    wait, warmup, active = steps
    with profile(
        activities=[ProfilerActivity.CPU],
        schedule=schedule(wait=wait, warmup=warmup, active=active),
        record_shapes=True,
        profile_memory=profile_memory,
        on_trace_ready=lambda prof: prof.export_chrome_trace(str(path)),  # gzipped when the name ends in .gz
    ) as prof:
        for _ in range(wait + warmup + active):
            step()
            prof.step()
    del prof
    gc.collect()


def init_rank(rank: int, world: int, port: int) -> set[int]:
    """One rank's process: one compute thread, a fixed seed, the gloo default group; returns the threads it started."""
    # seed 002 and Megatron call APIs torch 2.13 deprecates (distributed.nn.functional, reduce_scatter_tensor);
    # the notice would repeat on every rank and every call.
    warnings.filterwarnings("ignore", message=r".*deprecated", category=FutureWarning)
    torch.set_num_threads(1)  # 2 cores, up to 8 ranks: one compute thread per process
    torch.manual_seed(1234 + rank)
    before = _threads()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    return _threads() - before


def _worker(rank: int, exp: Experiment, port: int, out_dir: Path) -> None:
    layout = Layout.parse(exp.layout)
    started = init_rank(rank, layout.world_size, port)
    try:
        pg_threads = dict.fromkeys(started, dist.group.WORLD.group_name)
        ctx = new_groups(layout, rank, exp.groups, pg_threads)
        record(exp.build(ctx), out_dir / f"rank{rank}.json.gz", profile_memory=exp.profile_memory)
        everyone: list[dict[int, str] | None] = [None] * layout.world_size
        dist.all_gather_object(everyone, pg_threads)
        if rank == 0:
            threads = {str(r): {str(tid): pg for tid, pg in sorted(m.items())} for r, m in enumerate(everyone)}
            (out_dir.parent / f"{exp.name}.pg_threads.json").write_text(json.dumps(threads, indent=1) + "\n")
    finally:
        dist.destroy_process_group()


def launch(exp: Experiment, out_root: Path) -> Path:
    """Run ``exp`` on its layout's world size; returns the folder holding rank{N}.json.gz."""
    out_dir = out_root / exp.name
    out_dir.mkdir(parents=True, exist_ok=True)
    for old in out_dir.glob("rank*.json.gz"):
        old.unlink()
    world = Layout.parse(exp.layout).world_size
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(_worker, args=(exp, free_port(), out_dir), nprocs=world, join=True)
    return out_dir
