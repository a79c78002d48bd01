"""Code that runs in Airflow's triggerer process, beside the event loop: the poller that asks every
watched trial actor for its news, and the Ray outage clock of the trial and sweep watches (never
airflow: the triggers that use them are in ``triggers/``)."""
