"""Model against measurement: the analytic estimator's predictions (estimator/) joined with measured runs.
compare.py is one run, estimate vs measured per dim and stage (`compare --estimate`); sweep.py scores many
configurations as seed 000's tables do (Pearson r, MAPE); compare_fit.py fits the calibration block on half of a
sweep and scores the other half (`compare --fit`); calibrate.py measures a hardware profile from a run's own kernels
(the `calibrate` command)."""
