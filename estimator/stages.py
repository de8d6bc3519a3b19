"""Which layers each pipeline device runs: model chunks in model order, and the device each chunk lives on.

A schedule splits the model into ``chunks`` pieces: pp for gpipe / 1f1b / zb-h1 / dualpipe, pp x vpp for
interleaved (chunk k on device k mod pp), 2 x pp for ZB-V (the V: device i holds chunks i and 2pp-1-i). The split
is ``schedule.stage_layers`` when given (per chunk, or per device), else the even split adjusted by
``schedule.layer_offset``, else the balancer's even split (balance.uniform); a device's layers are split evenly over
its chunks.
"""

from __future__ import annotations

from traceana.estimator.balance import uniform
from traceana.estimator.config import Config


def chunks_per_device(cfg: Config) -> int:
    return 2 if cfg.schedule.kind == "zb-v" else cfg.parallel.vpp


def device_of_chunk(cfg: Config, chunk: int) -> int:
    pp = cfg.parallel.pp
    if cfg.schedule.kind == "zb-v":
        return chunk if chunk < pp else 2 * pp - 1 - chunk
    return chunk % pp


def chunk_sizes(cfg: Config, per_device: list[int] | None = None) -> list[int]:
    """Layers per model chunk, in model order. ``per_device`` overrides the config's split (used by balancing)."""
    layers, pp, v = cfg.model.layers, cfg.parallel.pp, chunks_per_device(cfg)
    explicit = cfg.schedule.stage_layers if isinstance(cfg.schedule.stage_layers, tuple) else None
    if per_device is None:
        if explicit is not None and len(explicit) == pp * v:
            return list(explicit)
        if explicit is not None:
            per_device = list(explicit)
        elif cfg.schedule.layer_offset is not None:
            per_device = [layers // pp + o for o in cfg.schedule.layer_offset]
        else:
            return list(uniform(layers, pp * v))
    # a device's layers split over its chunks, in the order the chunks come in the model
    per_chunk = [0] * (pp * v)
    for device, count in enumerate(per_device):
        mine = [k for k in range(pp * v) if device_of_chunk(cfg, k) == device]
        for k, n in zip(mine, uniform(count, v), strict=True):
            per_chunk[k] = n
    return per_chunk


def chunk_layers(cfg: Config, per_device: list[int] | None = None) -> list[range]:
    """The layer indices of each model chunk, in model order."""
    result, start = [], 0
    for size in chunk_sizes(cfg, per_device):
        result.append(range(start, start + size))
        start += size
    return result
