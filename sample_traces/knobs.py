"""The validation pairs' step knobs: wrappers around an experiment's training step that change one thing.

- straggler: one rank runs extra matrix products at the start of its step, as many as make its products' FLOPs
  ``factor`` x its peers' (the step's own are ``gemms`` products of one shape), so its peers wait for it at the step's
  first collective: real compute, not a sleep.
- host delay: every rank sleeps on the host before launching the step's work: host time between launches, what
  CUDA graphs remove on a GPU, seen in the trace as the main thread idle between the steps' ops.
The third knob, the data-parallel payload, is training.all_reduce_gradients' ``payload``.
"""

from __future__ import annotations

import time

import torch
from harness import StepFn


def extra_products(factor: float, gemms: int) -> int:
    """Extra products of the step's shape that make a rank's product FLOPs ``factor`` x (exact when integral)."""
    return round((factor - 1) * gemms)


def straggler(step: StepFn, slow: bool, factor: float, gemms: int, shape: tuple[int, int, int]) -> StepFn:
    """``step``, and on the ``slow`` rank first ``extra_products`` products [m, k] x [k, n] (``shape`` = m, k, n)."""
    extra = extra_products(factor, gemms)
    if not slow or extra == 0:
        return step
    m, k, n = shape
    a, b = torch.randn(m, k), torch.randn(k, n)

    def slow_step() -> None:
        for _ in range(extra):
            torch.mm(a, b)
        step()

    return slow_step


def host_delay(step: StepFn, seconds: float) -> StepFn:
    """``step`` after ``seconds`` of host sleep (none for 0)."""
    if seconds <= 0:
        return step

    def delayed_step() -> None:
        time.sleep(seconds)
        step()

    return delayed_step
