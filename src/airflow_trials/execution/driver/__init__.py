"""Code that runs in a Ray driver: the process that starts and steps trials (the main job's or an
Airflow task's process, or a sweep's driver actor). The TrialRunner and its RayTrialExecutor, the
launcher of self-driving trial actors, their slots, and the runner's callbacks and state files."""
