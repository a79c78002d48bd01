"""The median stopping rule, as Ray Tune 2.60's MedianStoppingRule: the rule (``median_rule.py``),
the runner's hooks (``median_stopping.py``) and the trials-DB running means
(``stored_means.py``)."""
