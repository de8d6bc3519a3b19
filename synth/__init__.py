"""Synthetic per-rank profiler traces from the estimator's simulated step, with the ground truth beside them.

:mod:`schedule` turns a config into every rank's device work on one true timeline (jitter, a straggler, collectives
that end together on all their members); :mod:`truth` measures that work the way DESIGN §4 defines the breakdown;
:mod:`kineto`, :mod:`nsys` and :mod:`ascend` write it in each profiler's own format, with per-host and per-device
clock offsets. The synthesizer drives round-trip tests and scale benchmarks; it is never the only evidence that an
ingester reads real files (the tests on ../shared/traces stay).
"""
