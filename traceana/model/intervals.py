"""Prediction intervals at a stated level (DESIGN §8 "Intervals"), one type for every predicted number.

A prediction ŷ gets ``[ŷ·exp(q_lo·σ), ŷ·exp(q_hi·σ)]``: σ is a difficulty measured on run A alone (its step-to-step
and rank-to-rank spread, its replay residual, the size of the predicted change, in log units, in quadrature), and
q_lo, q_hi are split-conformal quantiles of the normalised signed scores ``log(y_B / ŷ_B) / σ`` of real one-knob
pairs of that kind of change (Mondrian: kind, else its family, else all kinds pooled; a level needs
``MIN_GROUPS`` groups), computed by ``benchmarks/calibrate_intervals.py`` from the pairs that set widths and shipped
as ``intervals.json`` with its provenance. A platform or kind without calibration gets the model-based interval
``ŷ·exp(±z·σ)`` marked "coverage unmeasured". Method: ../shared/research/intervals.md §2 and §6.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from functools import cache
from importlib import resources

import numpy as np

LEVEL = 0.8
MIN_GROUPS = 9      # signed two-sided 80% needs k = ceil((n+1)(1-α/2)) <= n
CHANGE_WEIGHT = 0.1  # a predicted change's own error grows with it: a tenth of its size (log units) until calibrated
SIGMA_FLOOR = 1e-3  # a difficulty never below 0.1%: no interval is ± 0 for a change that moves the step
Z = {0.5: 0.6745, 0.8: 1.2816, 0.9: 1.6449, 0.95: 1.96}  # normal quantiles for the model-based fallback


@dataclass(frozen=True)
class Interval:
    """A predicted value in ms with its interval at ``level``; ``sources``: what set the width (each measured
    spread in log units with how it was measured, the calibration level that served and its n)."""

    value: float
    low: float
    high: float
    level: float
    sources: dict = field(default_factory=dict)

    def __str__(self) -> str:
        return f"{self.value:,.3f} ms [{self.low:,.3f}, {self.high:,.3f}] ({100 * self.level:.0f}%)"

    def to_json(self) -> dict:
        return {"value": self.value, "low": self.low, "high": self.high, "level": self.level,
                "sources": self.sources}

    def hull(self, low: float, high: float, why: dict) -> Interval:
        """Widened to hold [low, high] too (a part the trace cannot see), ``why`` added to the sources."""
        return Interval(self.value, min(self.low, low), max(self.high, high), self.level, {**self.sources, **why})

    def clamp(self, floor: float) -> Interval:
        """Never below ``floor`` (the step's fixed parts: nothing a change does removes them)."""
        if floor <= self.low:
            return self
        return Interval(max(self.value, floor), max(self.low, floor), max(self.high, floor), self.level,
                        {**self.sources, "floor_ms": floor})


def conformal(scores: np.ndarray, weights: np.ndarray | None = None, level: float = LEVEL
              ) -> tuple[float, float] | None:
    """(q_lo, q_hi): the split-conformal order statistics of signed scores, the floor((n+1)·α/2)-th and the
    ceil((n+1)(1-α/2))-th, each row weighted (1/rows of its group, so a group counts once and n is the number of
    groups); None when the groups are too few for a finite interval at ``level``."""
    s = np.asarray(scores, float)
    w = np.ones_like(s) if weights is None else np.asarray(weights, float)
    n = float(w.sum())
    alpha = 1 - level
    k_lo, k_hi = math.floor((n + 1) * alpha / 2 + 1e-9), math.ceil((n + 1) * (1 - alpha / 2) - 1e-9)
    if k_lo < 1 or k_hi > n + 1e-9:
        return None
    order = np.argsort(s, kind="stable")
    s, cum = s[order], np.cumsum(w[order])
    return float(s[np.searchsorted(cum, k_lo - 1e-9)]), float(s[np.searchsorted(cum, k_hi - 1e-9)])


@cache
def calibration() -> dict:
    """The shipped calibration (intervals.json): per platform, per kind / family / pooled, q_lo, q_hi and n
    groups, with the provenance of the pairs that set them."""
    text = resources.files("traceana.model").joinpath("intervals.json").read_text()
    return json.loads(text)


def quantiles(platform: str, kind: str, family: str, level: float = LEVEL) -> tuple[float, float, dict] | None:
    """The most specific calibrated level for ``kind`` on ``platform`` with enough groups: (q_lo, q_hi, its
    provenance), or None."""
    cal = calibration()
    table = cal.get("platforms", {}).get(platform, {})
    for name, key in (("kind", kind), ("family", family), ("pooled", "all")):
        entry = table.get(name, {}).get(key, {}).get(f"{level:g}")
        if entry and entry["n_groups"] >= MIN_GROUPS and math.isfinite(entry["q_lo"]):
            return entry["q_lo"], entry["q_hi"], {"calibrated_by": f"{name} {key}", "platform": platform,
                                                  "n_groups": entry["n_groups"], "q_lo": entry["q_lo"],
                                                  "q_hi": entry["q_hi"], **cal.get("provenance", {})}
    return None


UNVALIDATED = ("none: the estimator is unvalidated on {device} (no published measured runs of its profile in the "
               "calibration)")


def from_scratch(step_ms: float, profile: str | None, level: float = LEVEL) -> Interval | None:
    """The estimator's step with the interval its own error sets on the published measured runs of its hardware
    profile (``estimate`` in intervals.json: plain split conformal on log(measured / estimated)); None where the
    profile has none (the estimator is then unvalidated on that hardware)."""
    entry = calibration().get("estimate", {}).get(profile or "", {}).get(f"{level:g}")
    if not entry:
        return None
    return Interval(step_ms, step_ms * math.exp(entry["q_lo"]), step_ms * math.exp(entry["q_hi"]), level,
                    {"coverage": "measured (split conformal on published runs)", "profile": profile, **entry})


def sigma(spreads: dict[str, float]) -> float:
    """The difficulty σ: the measured spreads (log units) in quadrature, the size of the change (``change``,
    |log(predicted / measured)|) weighted by CHANGE_WEIGHT, never below SIGMA_FLOOR."""
    weighted = [v * (CHANGE_WEIGHT if k == "change" else 1.0) for k, v in spreads.items() if math.isfinite(v)]
    return max(SIGMA_FLOOR, math.sqrt(sum(v * v for v in weighted)))


def around(value: float, spreads: dict[str, float], platform: str, kind: str, family: str,
           level: float = LEVEL, notes: dict | None = None) -> Interval:
    """``value`` (ms) with its interval: conformal where the kind is calibrated on this platform, else
    model-based (normal in log units, σ from the spreads) and said so."""
    s = sigma(spreads)
    sources = {"spreads_log": spreads, "sigma_log": s, "kind": kind, "family": family, **(notes or {})}
    got = quantiles(platform, kind, family, level)
    if got is None:
        z = Z.get(level) or _z(level)
        lo, hi = -z, z
        sources["coverage"] = (f"unmeasured: no calibration of {kind} ({family}) on {platform} with "
                               f">= {MIN_GROUPS} pair groups; model-based ±{z:.2f}σ")
    else:
        lo, hi, provenance = got
        sources["coverage"] = "measured (split conformal on held-out pair groups)"
        sources["calibration"] = provenance
    value = max(value, 0.0)
    return Interval(value, value * math.exp(lo * s), value * math.exp(hi * s), level, sources)


def _z(level: float) -> float:
    """The two-sided normal quantile for ``level`` by bisection of erf (no scipy)."""
    lo, hi = 0.0, 10.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.erf(mid / math.sqrt(2)) < level else (lo, mid)
    return (lo + hi) / 2


def log_spread(values: np.ndarray) -> float:
    """The standard deviation of log(values) over the positive ones (0 with fewer than two); of them sorted, so that
    the order a group_by gives them in does not move its last bits (an advise at 1,024 ranks differed so run to
    run)."""
    v = np.asarray(values, float)
    v = np.sort(v[v > 0])
    return float(np.std(np.log(v), ddof=1)) if len(v) > 1 else 0.0


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper-Pearson) band of a binomial rate k/n, by bisection on the binomial tails."""
    if n == 0:
        return 0.0, 1.0
    a = (1 - confidence) / 2

    def at_most(j: int, p: float) -> float:  # P(X <= j)
        return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(j + 1))

    def solve(f, rising: bool) -> float:  # the p in [0, 1] where f(p) = a
        lo, hi = 0.0, 1.0
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if (f(mid) < a) == rising else (lo, mid)
        return (lo + hi) / 2

    low = 0.0 if k == 0 else solve(lambda p: 1 - at_most(k - 1, p), True)
    high = 1.0 if k == n else solve(lambda p: at_most(k, p), False)
    return low, high


def platform_of(con, run_id: str) -> str:
    """The platform class a calibration holds for: ``cpu-gloo`` (no launch records, gloo collectives: the sample
    jobs), ``gpu`` (launched kernels) or ``other``."""
    launched, gloo = con.execute(
        "SELECT count(launch_ns), count(*) FILTER (WHERE category = 'comm' AND starts_with(name, 'gloo:')) "
        "FROM device_events WHERE run_id = ?", [run_id]).fetchall()[0]
    return "gpu" if launched else "cpu-gloo" if gloo else "other"


def notes(interval: Interval) -> list[str]:
    """What a reader must know about an interval: whether its coverage was measured, and by what."""
    src = interval.sources
    out = [f"interval: {src.get('coverage')}"]
    if "calibration" in src:
        cal = src["calibration"]
        out[0] += f" ({cal['calibrated_by']}, {cal['n_groups']} pair groups on {cal['platform']})"
    spreads = ", ".join(f"{k} {100 * v:.1f}%" for k, v in src.get("spreads_log", {}).items())
    out.append(f"interval width from σ {100 * src.get('sigma_log', 0):.1f}% (log units, in quadrature: {spreads})")
    if src.get("absent_peer_wait_ms"):
        out.append(f"absent peers: the step's collectives waited {src['absent_peer_wait_ms']:.3f} ms for ranks not in "
                   f"the trace; {src.get('absent_peers', 'the change is to profiled ranks alone')}; the interval "
                   "also holds " + "; ".join(f"{k}: {v:.3f} ms" for k, v in src.items()
                                              if k.startswith("absent peers ")))
    if src.get("external_hold_ms"):
        out.append(f"external holds: {src['external_hold_ms']:.3f} ms ({100 * src['external_hold_share']:.0f}% of "
                   "the step) wait on something outside the trace and keep their length; the step is never "
                   "predicted below them")
    return out
