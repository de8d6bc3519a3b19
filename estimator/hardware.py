"""A device's performance profile: how long a matrix product, an attention core and a memory-bound kernel take.

A profile (``hardware.profile:`` a built-in name, ``a100`` / ``h100`` / ``h200``, or a YAML file) gives defaults for
the config's ``hardware`` and ``calibration`` sections (data-sheet peaks, link bandwidths, the fraction of peak large
matrix products reach, host time per eager layer) and the shape-aware pieces here:

- GEMM time from (m, n, k). With a measured table (``gemm_us``: rows of m, n, k, µs) the achieved fraction of peak
  is interpolated trilinearly in log2(m), log2(n), log2(k) when the rows form a grid (as
  ../shared/hardware/h200/gemm_sweep.csv does), else taken from the nearest measured shape; outside the measured
  range it is carried by the ratio of the roofline model between the shape and the nearest measured one. Without a
  table, the roofline with wave quantization: output tiles of ``tile`` run in waves over ``sms`` multiprocessors, so
  a product whose last wave is partly empty pays for a whole wave (NVIDIA, "Matrix Multiplication Background",
  Deep Learning Performance Guide: tile and wave quantization), and no product is faster than moving its operands
  through HBM once.
- Attention core (FlashAttention-style) time from a table (``attention_us``: batch, heads, seq, head_dim, causal,
  forward µs, forward+backward µs) at the nearest head width and masking, interpolated in log2(seq) and
  log2(batch x heads) on the achieved FLOP rate, leaving out the rows that timed the host instead of the device;
  without a table, its FLOPs at the matmul efficiency.
- Memory-bound kernels at the bandwidth measured for their size (``memory_gb_per_s``: bytes, GB/s), interpolated in
  log2(bytes); small kernels reach far less than the data sheet (H200: 470 GB/s at 4 MB, 4.1 TB/s at 1 GB).
- The optimizer step's fraction of HBM bandwidth: the config's calibration.optimizer_efficiency, or within one
  doubling of the model size a calibration trace measured, its point (``optimizer_measured``).

``calibration.matmul_efficiency`` stays a scale on top: with a profile it defaults to the profile's own, and a
different value scales every GEMM time by their ratio.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from functools import cached_property

BF16 = 2


@dataclass(frozen=True, eq=False)
class Profile:
    """Shape-aware performance tables of one device (equality by identity: configs hash it cheaply)."""

    name: str
    source: str
    sms: int = 108
    tile: tuple[int, ...] = (128, 128)          # the GEMM kernels' output tile (rows, columns)
    matmul_efficiency: float = 0.75            # fraction of peak the largest products reach (the tables' top)
    memory_efficiency: float = 0.7             # the profile's own calibration.memory_efficiency
    launch_us: float = 5.0                     # host time to launch one kernel
    gemm_us: tuple[tuple[float, ...], ...] = ()       # m, n, k, us
    gemm_measured_us: tuple[tuple[float, ...], ...] = ()  # m, n, k, us, kernels, spread %: a trace's (calibrate)
    optimizer_measured: tuple[tuple[float, ...], ...] = ()  # parameters a device updates, fraction of HBM bandwidth
    # its optimizer step reached: a trace's (calibrate)
    attention_us: tuple[tuple[float, ...], ...] = ()  # batch, heads, seq, head_dim, causal (0/1), fwd_us, fwd_bwd_us
    memory_gb_per_s: tuple[tuple[float, ...], ...] = ()  # bytes moved (read + write), GB/s
    _cache: dict[tuple[float, ...], float] = field(default_factory=dict, repr=False)

    @cached_property
    def _grid(self) -> tuple[list[float], list[float], list[float], dict[tuple[float, float, float], float]] | None:
        """(log2 m values, log2 n values, log2 k values, log2 shape -> fraction of peak x 1e12) when the GEMM rows
        form a full grid, else None."""
        if not self.gemm_us:
            return None
        points = {(math.log2(m), math.log2(n), math.log2(k)): 2 * m * n * k / (us * 1e-6) for m, n, k, us in
                  self.gemm_us}
        axes = [sorted({p[i] for p in points}) for i in range(3)]
        if len(points) != len(axes[0]) * len(axes[1]) * len(axes[2]):
            return None
        return axes[0], axes[1], axes[2], points

    def table_rate(self, m: float, n: float, k: float) -> float | None:
        """Achieved FLOP/s of an (m x k)·(k x n) product from the measured table, None without one."""
        if not self.gemm_us:
            return None
        grid = self._grid
        if grid is None:  # scattered points: the nearest in log space
            m0, n0, k0, us = min(self.gemm_us, key=lambda r: _log_distance(r[:3], (m, n, k)))
            return 2 * m0 * n0 * k0 / (us * 1e-6)
        *axes, points = grid
        lo_hi = [_bracket(axis, math.log2(x)) for axis, x in zip(axes, (m, n, k), strict=True)]
        rate = 0.0
        for corner in range(8):
            weight, key = 1.0, []
            for d, (lo, hi, frac) in enumerate(lo_hi):
                upper = corner >> d & 1
                weight *= frac if upper else 1 - frac
                key.append(hi if upper else lo)
            if weight:
                rate += weight * math.log(points[(key[0], key[1], key[2])])
        return math.exp(rate)

    def nearest_measured(self, m: float, n: float, k: float) -> tuple[float, float, float]:
        """The shape clamped into the table's range (the point its rate is read at)."""
        grid = self._grid
        if grid is None:
            return tuple(min(self.gemm_us, key=lambda r: _log_distance(r[:3], (m, n, k)))[:3])  # type: ignore[return-value]
        return tuple(2 ** min(max(math.log2(x), axis[0]), axis[-1])  # type: ignore[return-value]
                     for axis, x in zip(grid[:3], (m, n, k), strict=True))

    def memory_rate(self, nbytes: float) -> float | None:
        """Bytes/s a memory-bound kernel moving ``nbytes`` reaches (mean of the measured ops at each size)."""
        if not self.memory_gb_per_s:
            return None
        sizes = self._memory_curve
        xs = [x for x, _ in sizes]
        lo, hi, frac = _bracket(xs, math.log2(max(nbytes, 1.0)))
        y = dict(sizes)
        return 1e9 * (y[lo] + frac * (y[hi] - y[lo]))

    @cached_property
    def _memory_curve(self) -> list[tuple[float, float]]:
        by_size: dict[float, list[float]] = {}
        for nbytes, rate in self.memory_gb_per_s:
            by_size.setdefault(math.log2(nbytes), []).append(rate)
        return sorted((x, sum(v) / len(v)) for x, v in by_size.items())

    def attention_rate(self, batch_heads: float, seq: float, head_dim: float, causal: bool, part: str) -> float | None:
        """Achieved FLOP/s of the attention core's ``part`` ('fwd' or 'bwd'), FLOPs counted as 4·b·h·s²·d forward
        (halved when causal) and 2.5x that backward, as the table's maker counted them; None without a table.

        Read at the nearest head width and masking, interpolated in log2(seq) and between the two measured
        batch x heads that bracket the call (log2 of the rate). Only device-bound rows count (:func:`_device_bound`).
        """
        rows = [r for r in self.attention_us if bool(r[4]) == causal] or list(self.attention_us)
        if not rows:
            return None
        width = min({r[3] for r in rows}, key=lambda d: abs(math.log2(d / head_dim)))
        rows = [r for r in rows if r[3] == width]
        index = 5 if part == "fwd" else 6

        def rate(r: tuple[float, ...]) -> float:
            flops = 4 * r[0] * r[1] * r[2] ** 2 * r[3] * (0.5 if r[4] else 1.0)
            return flops / (r[5] * 1e-6) if part == "fwd" else 2.5 * flops / ((r[6] - r[5]) * 1e-6)

        curves: dict[float, list[tuple[float, float]]] = {}
        for bh in sorted({math.log2(r[0] * r[1]) for r in rows}):
            curve = sorted((math.log2(r[2]), r) for r in rows if math.log2(r[0] * r[1]) == bh)
            times = [r[5] if index == 5 else r[6] - r[5] for _, r in curve]
            curves[bh] = [(x, math.log(rate(r))) for (x, r), ok in zip(curve, _device_bound(times), strict=True)
                          if ok]

        def along(points: list[tuple[float, float]]) -> float:
            lo, hi, frac = _bracket([x for x, _ in points], math.log2(seq))
            y = dict(points)
            return y[lo] * (1 - frac) + y[hi] * frac

        lo, hi, frac = _bracket(list(curves), math.log2(batch_heads))
        return math.exp(along(curves[lo]) * (1 - frac) + along(curves[hi]) * frac)


def _device_bound(times: list[float]) -> list[bool]:
    """Which rows of one curve (sequence doubling from row to row) timed the device rather than the host.

    The profile's maker times eager calls by wall clock, so a call shorter than its host cost (an eager op ~16 µs,
    autograd.grad hundreds: ../shared/hardware/h200/launch.csv) measures the host. Doubling the sequence quadruples
    the core's FLOPs; on the device that takes 2-4x the time (efficiency only rises with size), so a row whose next
    row took less than twice as long was host-bound and is dropped: its size reads the next trusted row's rate
    (H200 backward at 1 x 16 x 1024: 313 µs in the table, 76 µs for twice the work in a training trace).
    The last row is always kept."""
    return [i == len(times) - 1 or times[i + 1] >= 2 * times[i] for i in range(len(times))]


def _log_distance(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    return sum((math.log2(x) - math.log2(y)) ** 2 for x, y in zip(a, b, strict=True))


def _bracket(axis: list[float], x: float) -> tuple[float, float, float]:
    """(lower, upper, fraction of the way) of ``x`` on a sorted axis, clamped to its ends."""
    if x <= axis[0]:
        return axis[0], axis[0], 0.0
    if x >= axis[-1]:
        return axis[-1], axis[-1], 0.0
    i = bisect.bisect_right(axis, x)
    lo, hi = axis[i - 1], axis[i]
    return lo, hi, (x - lo) / (hi - lo)


def roofline_seconds(m: float, n: float, k: float, peak: float, efficiency: float, hbm: float | None,
                     profile: Profile | None) -> float:
    """An (m x k)·(k x n) bf16 product on a device of ``peak`` FLOP/s reaching ``efficiency`` of it on full waves:
    wave quantization over the output tiles, never faster than reading and writing its operands at ``hbm`` B/s."""
    sms, tile = (profile.sms, profile.tile) if profile else (108, (128, 128))
    tiles = math.ceil(m / tile[0]) * math.ceil(n / tile[1])
    waves = math.ceil(tiles / sms)
    compute = 2 * m * n * k / (peak * efficiency * tiles / (waves * sms))
    memory = BF16 * (m * k + k * n + m * n) / hbm if hbm else 0.0
    return max(compute, memory)


MEASURED_REACH = 1.0  # log2 units: a trace's measured product informs shapes within one doubling of it in m, n and k


def gemm_seconds(m: float, n: float, k: float, peak: float, efficiency: float, hbm: float | None,
                 profile: Profile) -> float:
    """Seconds of one (m x k)·(k x n) product on the profiled device, scaled by ``efficiency`` relative to the
    profile's own matmul efficiency (1 when the config leaves calibration.matmul_efficiency at the profile's).

    A product a calibration trace measured (``gemm_measured_us``) overrides the table at its own shape and fades
    back to it within one doubling in every dimension: the table's time times (measured / table at the measured
    shape) ** (1 - d), d the largest |log2| distance to the nearest measured shape; farther away, the table alone."""
    key = (m, n, k, peak, efficiency, hbm or 0.0)
    cached = profile._cache.get(key)
    if cached is not None:
        return cached
    seconds = _table_seconds(m, n, k, peak, efficiency, hbm, profile)
    if profile.gemm_measured_us:
        near = min(profile.gemm_measured_us, key=lambda r: _reach(r, (m, n, k)))
        d = _reach(near, (m, n, k))
        if d < MEASURED_REACH:
            at = _table_seconds(near[0], near[1], near[2], peak, profile.matmul_efficiency, hbm, profile)
            seconds *= (near[3] * 1e-6 / at) ** (1 - d / MEASURED_REACH)
    profile._cache[key] = seconds
    return seconds


def optimizer_efficiency(profile: Profile | None, params: float, prior: float) -> float:
    """The fraction of HBM bandwidth an optimizer step over ``params`` parameters a device reaches: ``prior`` (the
    config's calibration.optimizer_efficiency), unless a calibration trace measured a step within one doubling of
    that size (``optimizer_measured``): then the measured fraction at its own size, fading back to the prior as a
    measured product does. By size, because fused AdamW's multi_tensor_apply launches hold at most 320 chunks of
    65536 parameters, so the launch count and how full each launch's waves run follow the parameter count: the
    H200 traces reach 2.5 TB/s with 38M parameters (4 launches of 168 blocks) and 1.66 with 506M (25 of 320)."""
    if profile is None or not profile.optimizer_measured or params <= 0:
        return prior
    near = min(profile.optimizer_measured, key=lambda r: abs(math.log2(r[0] / params)))
    d = abs(math.log2(near[0] / params))
    return prior * (near[1] / prior) ** (1 - d / MEASURED_REACH) if d < MEASURED_REACH else prior


def _reach(row: tuple[float, ...], shape: tuple[float, float, float]) -> float:
    return max(abs(math.log2(a / b)) for a, b in zip(row[:3], shape, strict=True))


def _table_seconds(m: float, n: float, k: float, peak: float, efficiency: float, hbm: float | None,
                   profile: Profile) -> float:
    """The measured grid (or the roofline) alone."""
    scale = profile.matmul_efficiency / efficiency
    rate = profile.table_rate(m, n, k)
    if rate is None:
        seconds = roofline_seconds(m, n, k, peak, efficiency, hbm, profile)
    else:
        near = profile.nearest_measured(m, n, k)
        model = (roofline_seconds(m, n, k, peak, 1.0, hbm, profile)
                 / roofline_seconds(*near, peak, 1.0, hbm, profile))  # 1 inside the table's range
        seconds = 2 * near[0] * near[1] * near[2] / rate * model * scale
    return seconds
