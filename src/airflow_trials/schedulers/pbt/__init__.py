"""Population based training, as Ray Tune 2.60's: the runner's hooks (``pbt_scheduler.py``) and the
explore step (``pbt_explore.py``). It runs on the TrialRunner only."""
