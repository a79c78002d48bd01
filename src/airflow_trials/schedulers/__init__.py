"""The schedulers, one slice each: ASHA (``asha/``), HyperBand (``hyperband.py``), the median
stopping rule (``median/``), MOASHA (``moasha/``) and PBT (``pbt/``).

A slice holds its rule, the runner's hooks (the ``TrialScheduler`` Ray Tune users know), its
Airflow-path settings (what a trial's trigger judges by) and its state behind one small interface,
in memory and in the trials DB. :mod:`airflow_trials.schedulers.registry` finds the slices that
judge on the Airflow path. Nothing here imports Airflow or Ray (tests/unit/test_layering.py).
"""
