"""ASHA: asynchronous successive halving, as Ray Tune 2.60's AsyncHyperBandScheduler: the rule
(``asha_rungs.py``), its pure functions (``rung_math.py``), the runner's hooks
(``async_hyperband.py``) and the trials-DB rungs (``stored_rungs.py``)."""
