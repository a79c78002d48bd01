"""Code that runs in Airflow's triggerer process, beside the event loop: the poller that asks every
watched trial actor for its news, the Ray outage clock of the trial and sweep watches, and the echo
of each poll to the task's log (never airflow: the triggers that use them are in ``triggers/``)."""
