"""A tiny data-parallel training job on CPU (torch + gloo) with NVTX ranges, recorded under Nsight Systems.

Each rank runs a few steps of a two-layer MLP: forward, backward, gradient all-reduce (gloo), SGD update. Every
step is an NVTX range named ``train_step N`` and the phases inside it are ranges too, in the domain "traceana".
Launched by record.sh through torchrun, one nsys report per rank.
"""

from __future__ import annotations

import os

import nvtx
import torch
import torch.distributed as dist

STEPS = 4
DOMAIN = "traceana"


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 256))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(STEPS):
        with nvtx.annotate(f"train_step {step}", domain=DOMAIN):
            with nvtx.annotate("forward", domain=DOMAIN):
                loss = model(torch.randn(64, 256)).square().mean()
            with nvtx.annotate("backward", domain=DOMAIN):
                loss.backward()
            with nvtx.annotate("gloo:all_reduce", domain=DOMAIN):
                for param in model.parameters():
                    dist.all_reduce(param.grad)
                    param.grad /= dist.get_world_size()
            with nvtx.annotate("optimizer", domain=DOMAIN):
                optimizer.step()
                optimizer.zero_grad()
    dist.barrier()
    dist.destroy_process_group()
    print(f"rank {rank} of {os.environ['WORLD_SIZE']}: {STEPS} steps done")


if __name__ == "__main__":
    main()
