"""The Airflow UI's "Experiments" dashboard: an Airflow plugin serving pages and a JSON API."""

from __future__ import annotations
