"""The `traceana` command line (typer). main.py holds the app and the entry point (`traceana = traceana.cli.main:main`)
and lists every command; each other module is one group of commands, thin over the package that owns the concept:
ingest.py -> ingest/, runs.py -> the store, breakdown.py and analyses.py -> traceana/analyses/, compare.py and
calibrate.py -> traceana/model/, estimate.py -> estimator/, export.py and report.py -> traceana/render/, synth.py ->
synth/. options.py has the option types they share, so no command module imports main.py."""
