"""MOASHA: successive halving over several metrics, as Syne Tune 0.16's: the rule and the runner's
hooks (``moasha_scheduler.py``), its ranking (``moasha_rank.py``); its trials-DB rungs are ASHA's
(``asha/stored_rungs.py`` StoredVectorRungs)."""
