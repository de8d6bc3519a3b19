"""Record the validation pairs (pairs_design.py) as real 2-rank gloo jobs, and write their manifest.

    .venv/bin/python sample_traces/pairs.py [--rounds 1 2 3] [--families dp2 tp2 pp2 ep2] [--seed 0]

A round records every config of the chosen families once: one job per family (families in a shuffled order), which
records its configs one after another in a shuffled order, each under its own profiler (schedule wait=1, warmup=2,
active=8): pairs/traces/<config>/r<round>/rank<N>.json.gz. Each rank is pinned to its own core (ranks <= cores) with
one compute thread, after one recording thrown away (a process's first profiled window runs slow). Then
pairs/recordings.csv (one row per recording, merged with the rounds already there),
pairs/configs/ (estimator configs of the predict kinds) and pairs/manifest.csv (every row of pairs_design whose two
configs have recordings) are rewritten. Paths in the CSVs are relative to the repository root.
"""

from __future__ import annotations

import argparse
import csv
import datetime
import hashlib
import json
import os
import platform
import random
import subprocess
import tempfile
import time
from pathlib import Path

import knobs
import moe
import pipeline
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import tp_mlp
import yaml
from configs import render
from harness import Context, StepFn, free_port, init_rank, new_groups, record
from pairs_design import FAMILIES, MLP_PRODUCTS, STRAGGLER_RANK, Config, configs_and_rows, estimator_model

from traceana.layout import Layout

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PAIRS = HERE / "pairs"
SCHEDULE = (1, 2, 8)  # wait, warmup, active
RANKS = 2
RECORDING_COLUMNS = ("config", "repeat", "path", "ranks", "active_steps", "sha256", "started_utc", "load_avg_1m",
                     "cpu_model", "cores", "threads", "torch", "git_commit", "seed")
MANIFEST_COLUMNS = ("group", "kind", "family", "A", "B", "layout", "layout_B", "change", "config_A", "config_B",
                    "split", "notes")


def build(ctx: Context, c: Config) -> StepFn:
    """One config's training step on this rank, knobs applied."""
    if c.family in ("dp2", "tp2"):
        step = tp_mlp.build(ctx, False, batch=c.tokens, d_model=c.width, hidden=c.hidden, bucket=True,
                            payload=c.payload)
    elif c.family == "pp2":
        step = pipeline.build(ctx, c.micro_batches, d_in=c.width, hidden=c.hidden, batch=c.tokens)
    else:
        step = moe.build(ctx, list(c.splits), ffn=c.hidden)
    step = knobs.straggler(step, ctx.rank == STRAGGLER_RANK, c.straggler, MLP_PRODUCTS, (c.tokens, c.width, c.hidden))
    return knobs.host_delay(step, c.host_ms / 1e3)


def _worker(rank: int, family: str, configs: list[Config], repeat: int, port: int, out: Path, log: Path) -> None:
    os.sched_setaffinity(0, {rank % os.cpu_count()})
    init_rank(rank, RANKS, port)
    try:
        ctx = new_groups(Layout.parse(FAMILIES[family][0]), rank, FAMILIES[family][1], {})
        # A process's first profiled window runs slow (42 against 24 ms a step, measured): recorded once, thrown away.
        with tempfile.TemporaryDirectory() as scratch:
            record(build(ctx, configs[0]), Path(scratch) / "warmup.json.gz", SCHEDULE)
        for c in configs:
            step = build(ctx, c)
            folder = out / "traces" / c.name / f"r{repeat}"
            folder.mkdir(parents=True, exist_ok=True)
            dist.barrier()  # both ranks start the recording together
            started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            load = os.getloadavg()[0]
            record(step, folder / f"rank{rank}.json.gz", SCHEDULE)
            dist.barrier()
            if rank == 0:
                with log.open("a") as lines:
                    lines.write(json.dumps({"config": c.name, "repeat": repeat, "started_utc": started,
                                          "load_avg_1m": load}) + "\n")
    finally:
        dist.destroy_process_group()


def _sha256s(folder: Path) -> str:
    return ";".join(f"{f.name}={hashlib.sha256(f.read_bytes()).hexdigest()}"
                    for f in sorted(folder.glob("rank*.json.gz")))


def _machine() -> dict[str, str]:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=HERE, capture_output=True,
                            text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "."], cwd=HERE, capture_output=True,
                           text=True).stdout.strip()
    return {"cpu_model": cpu, "cores": str(os.cpu_count()), "threads": "1", "torch": torch.__version__,
            "git_commit": commit + ("+dirty" if dirty else "")}


def record_rounds(rounds: list[int], families: list[str], seed: int) -> list[dict[str, str]]:
    """Record the rounds; the new recordings.csv rows."""
    configs, _ = configs_and_rows()
    machine = _machine()
    log = PAIRS / ".recording.jsonl"
    log.unlink(missing_ok=True)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ["OMP_NUM_THREADS"] = "1"
    for repeat in rounds:
        order = random.Random(f"{seed}:{repeat}")
        for family in order.sample(families, len(families)):
            members = [c for c in configs if c.family == family]
            started = time.perf_counter()
            mp.spawn(_worker, args=(family, order.sample(members, len(members)), repeat, free_port(), PAIRS, log),
                     nprocs=RANKS, join=True)
            print(f"r{repeat} {family}: {len(members)} configs in {time.perf_counter() - started:.0f} s, "
                  f"1-min load {os.getloadavg()[0]:.1f}", flush=True)
    rows = []
    for line in log.read_text().splitlines():
        meta = json.loads(line)
        folder = PAIRS / "traces" / meta["config"] / f"r{meta['repeat']}"
        rows.append({"config": meta["config"], "repeat": str(meta["repeat"]), "path": str(folder.relative_to(ROOT)),
                     "ranks": str(RANKS), "active_steps": str(SCHEDULE[2]), "sha256": _sha256s(folder),
                     "started_utc": meta["started_utc"], "load_avg_1m": f"{meta['load_avg_1m']:.2f}", **machine,
                     "seed": str(seed)})
    log.unlink()
    return rows


def _read(path: Path) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _write(path: Path, columns: tuple[str, ...], rows: list[dict[str, str]]) -> None:
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def write_configs(configs: list[Config]) -> dict[str, str]:
    """The estimator configs of the given configs: name -> path from the repository root."""
    hardware_file = HERE / "hardware_cpu.yaml"
    hardware = yaml.safe_load(hardware_file.read_text())
    folder = PAIRS / "configs"
    folder.mkdir(exist_ok=True)
    paths = {}
    for c in configs:
        model, extras, schedule, caveat = estimator_model(c)
        # 2 ranks on 2 cores, each alone on its core: the GEMM rate the probe measured with one process
        body = render(model, extras, schedule, Layout.parse(c.layout), hardware, processes=1)
        path = folder / f"{c.name}.yaml"
        header = (f"# {c.name}: validation pair config, layout {c.layout}; written by sample_traces/pairs.py from "
                  f"{hardware_file.name}\n# not modelled: {caveat}\n")
        path.write_text(header + yaml.safe_dump(body, sort_keys=False))
        paths[c.name] = str(path.relative_to(ROOT))
    return paths


def write_manifest(recorded: set[str]) -> int:
    """manifest.csv from the design, for the rows whose A and B both have recordings; the row count."""
    _, rows = configs_and_rows()
    rows = [r for r in rows if r.a.name in recorded and r.b.name in recorded]
    predicted = {c.name: c for r in rows if r.family == "predict" for c in (r.a, r.b)}
    paths = write_configs(list(predicted.values()))
    _write(PAIRS / "manifest.csv", MANIFEST_COLUMNS, [
        {"group": r.group, "kind": r.kind, "family": r.family, "A": r.a.name, "B": r.b.name, "layout": r.a.layout,
         "layout_B": r.b.layout, "change": r.change, "config_A": paths.get(r.a.name, "") if r.family == "predict"
         else "", "config_B": paths.get(r.b.name, "") if r.family == "predict" else "", "split": r.split,
         "notes": r.notes} for r in rows])
    return len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, nargs="*", default=[1, 2, 3], help="rounds to record (r<N>)")
    parser.add_argument("--families", nargs="+", choices=sorted(FAMILIES), default=sorted(FAMILIES))
    parser.add_argument("--seed", type=int, default=0, help="seeds the shuffled orders")
    args = parser.parse_args()
    started = time.perf_counter()
    new = record_rounds(args.rounds, args.families, args.seed) if args.rounds else []
    fresh = {(r["config"], r["repeat"]) for r in new}
    kept = [r for r in _read(PAIRS / "recordings.csv") if (r["config"], r["repeat"]) not in fresh]
    rows = sorted(kept + new, key=lambda r: (r["config"], int(r["repeat"])))
    _write(PAIRS / "recordings.csv", RECORDING_COLUMNS, rows)
    count = write_manifest({r["config"] for r in rows})
    size = sum(f.stat().st_size for f in (PAIRS / "traces").rglob("*.json.gz"))
    print(f"{len(new)} recordings in {time.perf_counter() - started:.0f} s; {len(rows)} in recordings.csv, "
          f"{count} manifest rows, traces {size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
