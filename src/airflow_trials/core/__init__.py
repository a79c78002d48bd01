"""Pure domain model of tuning: trials, statuses, resources, checkpoints, schedulers, stoppers.

Nothing here imports ray or airflow; tests/unit/test_layering.py keeps it that way.
"""
