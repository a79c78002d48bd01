"""Code that runs in Airflow's triggerer process, beside the event loop: the poller that asks every
watched trial actor for its news (never airflow: the triggers that use it are in ``triggers/``)."""
