"""What traceana promises whatever the input or the fault: every file given or found is ingested or named in a
one-line error (test_inputs.py), and a killed or failed run leaves nothing running and nothing behind that the next
one does not remove (test_leftovers.py)."""
