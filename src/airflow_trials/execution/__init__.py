"""Ray-facing execution: trainable wrappers, trial actors, the executor and the runner loop.

Imports ray (lazily where it can), never airflow.
"""
