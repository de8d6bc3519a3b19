"""Model against measurement: the analytic estimator's predictions (estimator/) joined with measured runs, and the
measured run as a model of itself.
compare.py is one run, estimate vs measured per dim and stage (`compare --estimate`); sweep.py scores many
configurations as seed 000's tables do (Pearson r, MAPE); compare_fit.py fits the calibration block on half of a
sweep and scores the other half (`compare --fit`); calibrate.py measures a hardware profile from a run's own kernels
(the `calibrate` command). graph.py builds a step's dependency graph from the store, replay.py replays it
(`replay`), whatif.py edits and replays it (`whatif`), advise.py ranks findings by what-if gain (`advise`)."""
