"""The schedulers, one slice each: ASHA (``asha/``), HyperBand (``hyperband.py``), the median
stopping rule (``median/``), MOASHA (``moasha/``) and PBT (``pbt/``).

A slice holds its rule, the runner's hooks (the ``TrialScheduler`` Ray Tune users know), its
Airflow-path settings (what a trial's trigger judges by) and its state behind one small interface,
in memory and in the trials DB. A slice that judges on the Airflow path has a ``*_judging``
module with its ``SLICE``, which :mod:`airflow_trials.schedulers.registry` finds by itself; a
trial's trigger judges through the one adapter over it,
:mod:`airflow_trials.schedulers.trial_judge`. Nothing here imports Airflow, Ray or Optuna
(tests/unit/test_layering.py).
"""
