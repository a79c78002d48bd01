"""Ray-facing execution, in one folder per process it runs in. Imports ray (lazily where it can),
never airflow.

- ``worker/``: inside a trial's Ray actor (the trainable APIs, the actor, its holds);
- ``driver/``: in the process that starts and steps trials (TrialRunner, RayTrialExecutor,
  TrialActorClient, the sweep's driver actor, the runner's callbacks);
- ``triggerer/``: in Airflow's triggerer (a trial trigger's watch, the poller of watched trial
  actors);
- the modules here are used by more than one of those: actor handles by name, Ray's view of actor
  states, trial storage, progress tracking, resumes, captured output and ``with_parameters`` refs.
"""
