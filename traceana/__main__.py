"""`python -m traceana` runs the CLI (same as the `traceana` script)."""

from traceana.cli.main import main

main()
