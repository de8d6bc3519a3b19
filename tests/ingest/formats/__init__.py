"""Trace formats beyond the main readers (issue 35): Kineto of other vintages and accelerators, rocprofv3, and
the refusals that name a format traceana does not read (docs/trace-formats.md)."""
