"""synth: the synthesized runs (traceana synth) against what they were asked to hold."""
