"""Trial storage as plain file I/O: checkpoints, metadata and logs in a local directory or any
fsspec URL (:mod:`~airflow_trials.storage.trial_storage`), the storage root's one path check
(:mod:`~airflow_trials.storage.storage_root`) and a trial's captured output
(:mod:`~airflow_trials.storage.trial_output`).

Imports neither Ray nor Airflow: the Ray workers, the api-server's dashboard and the CLI all use
it.
"""
