"""Measure the machine the sample traces ran on, as the estimator's hardware + calibration blocks (DESIGN §5).

    .venv/bin/python sample_traces/probe_hardware.py [--out sample_traces/hardware_cpu.yaml]

- matmul: sustained fp32 GFLOP/s of one thread at the GEMM shapes the samples run, alone and per process with 4 and
  8 processes computing at once (the experiments run 4 or 8 ranks on this machine's cores: a busy rank gets a share);
- gloo on 127.0.0.1: AllReduce and AllToAll over 2-rank groups, two groups at once in a 4-process world (as the TP
  and DP groups of the 4-rank samples run), 8 B to 8 MiB. Latency is the median time of the 8-byte call; bus
  bandwidth (nccl-tests convention: AllReduce moves 2(n-1)/n of the buffer, AllToAll (n-1)/n) is the median over
  the >= 1 MiB sizes of bus bytes / (time - latency).
Writes hardware:, calibration: and measured: (the raw figures) to the YAML file, prints it, then rewrites
sample_traces/configs/ from it (configs.py).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import configs
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import yaml
from harness import free_port

# (m, k, n) of the GEMMs the samples run: TP MLP, pipeline stages, MoE experts (balanced, hot, cold), toy GPT.
SHAPES = [(128, 512, 512), (64, 512, 1024), (64, 1024, 512), (64, 512, 2048), (112, 512, 2048), (16, 512, 2048),
          (128, 256, 384), (128, 256, 512), (128, 256, 1024)]
CONTENTION = (1, 4, 8)
COMM_SIZES = [8, 64 * 1024, 256 * 1024, 1 << 20, 4 << 20, 8 << 20]
REPEATS = 20
SECONDS = 0.5


def _gemm_rates(barrier: mp.Barrier) -> dict[str, float]:
    """Sustained GFLOP/s per shape on one thread: GEMMs completed in SECONDS of wall time, all processes at once."""
    torch.set_num_threads(1)
    rates = {}
    for m, k, n in SHAPES:
        a, b = torch.randn(m, k), torch.randn(k, n)
        a @ b
        barrier.wait()
        done, start = 0, time.perf_counter()
        while (elapsed := time.perf_counter() - start) < SECONDS:
            a @ b
            done += 1
        rates[f"{m}x{k}x{n}"] = round(2 * m * k * n * done / elapsed / 1e9, 1)
    return rates


def _gemm_worker(index: int, barrier: mp.Barrier, results: dict) -> None:
    results[index] = _gemm_rates(barrier)


def gemm_under_contention(processes: int) -> dict[str, float]:
    """Per-process GFLOP/s per shape (median over processes) with ``processes`` computing at once."""
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        barrier, results = manager.Barrier(processes), manager.dict()
        workers = [ctx.Process(target=_gemm_worker, args=(i, barrier, results)) for i in range(processes)]
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        per_process = list(results.values())
    return {shape: round(statistics.median(r[shape] for r in per_process), 1) for shape in per_process[0]}


def _comm_worker(rank: int, port: int, results: dict) -> None:
    torch.set_num_threads(1)
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=4)
    groups = [dist.new_group(ranks) for ranks in ([0, 1], [2, 3])]
    group = groups[rank // 2]
    timings: dict[str, dict[int, float]] = {"all_reduce": {}, "all_to_all": {}}
    for size in COMM_SIZES:
        buffer, out = torch.zeros(max(size // 4, 2)), torch.empty(max(size // 4, 2))
        for name in timings:
            samples = []
            for repeat in range(3 + REPEATS):  # 3 warm-up calls
                dist.barrier(group=group)
                start = time.perf_counter()
                if name == "all_reduce":
                    dist.all_reduce(buffer, group=group)
                else:
                    dist.all_to_all_single(out, buffer, group=group)
                if repeat >= 3:
                    samples.append(time.perf_counter() - start)
            timings[name][buffer.numel() * 4] = statistics.median(samples)
    results[rank] = timings
    dist.destroy_process_group()


def gloo_loopback() -> dict[str, dict[int, float]]:
    """Seconds per call by op and buffer bytes (median over the 4 ranks)."""
    with mp.get_context("spawn").Manager() as manager:
        results = manager.dict()
        mp.spawn(_comm_worker, args=(free_port(), results), nprocs=4, join=True)
        per_rank = list(results.values())
    return {op: {size: statistics.median(r[op][size] for r in per_rank) for size in per_rank[0][op]}
            for op in per_rank[0]}


def alpha_beta(seconds: dict[int, float], bus_factor: float) -> tuple[float, float]:
    """(latency_us, bus GB/s) as described in the module docstring."""
    latency = seconds[min(seconds)]
    bandwidth = statistics.median(size * bus_factor / (t - latency) / 1e9 for size, t in seconds.items()
                                  if size >= 1 << 20)
    return latency * 1e6, bandwidth


def probe() -> dict:
    load_before = os.getloadavg()[0]  # other work on the machine lowers every figure: record how busy it was
    gemm = {n: gemm_under_contention(n) for n in CONTENTION}
    comm = gloo_loopback()
    load_after = os.getloadavg()[0]
    peak = max(gemm[1].values())
    latency, bandwidth = alpha_beta(comm["all_reduce"], bus_factor=1.0)  # 2(n-1)/n = 1 for n = 2
    a2a_latency, a2a_bandwidth = alpha_beta(comm["all_to_all"], bus_factor=0.5)  # (n-1)/n
    memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return {
        "hardware": {
            "device": f"cpu-gloo-loopback-{os.cpu_count()}core",
            "peak_tflops_bf16": round(peak / 1e3, 4),  # fp32, one thread: the precision and threads the samples use
            "hbm_gb": round(memory_gb, 1),  # host memory, shared by the ranks
            "devices_per_node": 8,  # every rank is a process on this one host
            "bandwidth_gb_per_s": {"intra": round(bandwidth, 3), "inter": round(bandwidth, 3)},
            "latency_us": {"intra": round(latency, 1), "inter": round(latency, 1)},
        },
        "calibration": {
            # a lone process at the median shape; configs.py uses the rate of its world size's processes instead
            "matmul_efficiency": round(statistics.median(gemm[1].values()) / peak, 3),
            "overlap": {"dp": 0.0, "tp": 0.0, "ep": 0.0, "cp": 0.0},  # every sample collective is synchronous
            "a2a_efficiency": dict.fromkeys(("intra", "inter"), round(a2a_bandwidth / bandwidth, 3)),
        },
        "measured": {
            "load_average_1min": {"before": round(load_before, 2), "after": round(load_after, 2)},
            "gemm_gflop_per_s": {f"{n}_processes": rates for n, rates in gemm.items()},
            "gloo_2rank_us": {op: {size: round(t * 1e6, 1) for size, t in by_size.items()}
                              for op, by_size in comm.items()},
            "all_to_all_latency_us": round(a2a_latency, 1),
            "all_to_all_bus_gb_per_s": round(a2a_bandwidth, 3),
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "hardware_cpu.yaml")
    args = parser.parse_args()
    text = yaml.safe_dump(probe(), sort_keys=False)
    args.out.write_text(text)
    print(text, end="")
    for path in configs.write(args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
