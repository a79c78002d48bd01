"""The provider's settings: ``[airflow_trials]`` in Airflow's configuration, and the older
``AIRFLOW_TRIALS_*`` environment variables, which keep working and win when set.

Each setting is found in this order (:func:`setting`):

1. its ``AIRFLOW_TRIALS_*`` environment variable, when it has one and it is set (not empty): the
   engine's processes (Ray workers, the ``airflow-trials`` command without Airflow) read only
   these, so a process that has one agrees with them;
2. ``[airflow_trials] <option>`` as Airflow resolves it: ``AIRFLOW__AIRFLOW_TRIALS__<OPTION>``
   (and its ``_CMD`` and ``_SECRET`` forms), then ``airflow.cfg``;
3. the default below.

A connection (``trials_default``'s URL, ``ray_default``'s ``storage_path``) and an argument
(``poll_interval_seconds=``) come before all three. Airflow lists the settings, with their
descriptions, in ``airflow config list`` because :func:`provider_config` declares them in
``get_provider_info()["config"]``. This module imports Airflow only when a setting is read, and
not at all where Airflow is not installed.

Example::

    setting("storage_path")              # "s3://bucket/trials", or None: the built-in default
    float(setting("poll_interval_seconds"))
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Any

SECTION = "airflow_trials"
# The version that first declared the settings in Airflow's configuration.
_ADDED = "0.1.0"


@dataclass(frozen=True)
class Setting:
    """One option of ``[airflow_trials]``.

    :param option: its name in the section.
    :param type: Airflow's type: ``"string"``, ``"boolean"``, ``"integer"`` or ``"float"``.
    :param default: its value when nothing sets it, as text; None: the code's own fallback, which
        the description names.
    :param description: what it does and which processes read it.
    :param example: a value, for ``airflow config list``.
    :param env: the older environment variable that sets it too (and wins); default none.
    :param sensitive: hidden by ``airflow config list``; settable through ``_CMD`` and
        ``_SECRET``; default False.
    """

    option: str
    type: str
    default: str | None
    description: str
    example: str | None
    env: str | None = None
    sensitive: bool = False

    def declared(self) -> dict[str, Any]:
        """Its entry in the provider's ``config`` (Airflow's provider_info.schema.json)."""
        env = f" Also ``{self.env}``, which wins when both are set." if self.env else ""
        return {
            "description": self.description + env,
            "version_added": _ADDED,
            "type": self.type,
            "example": self.example,
            "default": self.default,
            "sensitive": self.sensitive,
        }


SETTINGS: tuple[Setting, ...] = (
    Setting(
        "db_url",
        "string",
        None,
        "SQLAlchemy URL of the trials DB (SQLite or PostgreSQL, never Airflow's own database), "
        "used when there is no ``trials_default`` connection; unset: the SQLite file "
        "``<home>/trials.db``. Read by tasks, triggers, the dashboard and the airflow-trials "
        "command.",
        "postgresql+psycopg://airflow@postgres/trials",
        env="AIRFLOW_TRIALS_DB_URL",
        sensitive=True,
    ),
    Setting(
        "home",
        "string",
        None,
        "Directory of the default SQLite trials DB, used when neither the ``trials_default`` "
        "connection nor ``db_url`` is set; unset: ``~/airflow_trials``.",
        "/var/lib/airflow_trials",
        env="AIRFLOW_TRIALS_HOME",
    ),
    Setting(
        "storage_path",
        "string",
        None,
        "Where checkpoints and trial logs go when the ``ray_default`` connection has no "
        "``storage_path`` extra: a path every Ray node and Airflow worker reaches, or an fsspec "
        "URL; unset: ``~/airflow_trials_results``.",
        "s3://bucket/trials",
        env="AIRFLOW_TRIALS_STORAGE",
    ),
    Setting(
        "poll_interval_seconds",
        "float",
        "2.0",
        "How often a trial's or a sweep's trigger polls Ray, when the operator or "
        "``tuning_experiment`` is given no ``poll_interval_seconds``. Read where the DAG file is "
        "parsed.",
        "5.0",
    ),
    Setting(
        "gpu_queue",
        "string",
        None,
        "Executor queue of GPU trials' tasks when the experiment names none (e.g. Celery's "
        "``gpu``); unset: the executor's default queue. Read where the DAG file is parsed.",
        "gpu",
    ),
    Setting(
        "drain_timeout_seconds",
        "float",
        "30",
        "On a graceful stop (the main job's Ctrl-C or SIGTERM, ``airflow-trials shape down``), "
        "how long to wait for the running trials to checkpoint after their current iteration "
        "and pause, before Airflow and Ray stop; 0: no drain. A trial still training then "
        "re-runs, on resume, what followed its last checkpoint. Read by the stopping command.",
        "120",
    ),
    Setting(
        "extension_max_num_samples",
        "integer",
        "1000",
        "The most new samples one extension of a finished run (``extend_num_samples``) may add, "
        "on a DAG without a ``num_samples`` Param with a ``maximum`` (which bounds it then). Read "
        "by the extension's ``suggest_configs``.",
        "5000",
    ),
    Setting(
        "extension_max_stop_factor",
        "float",
        "10",
        "How many times a run's stopping criterion, key by key, one extension "
        "(``extend_stop``) may raise it to. Read by the extension's ``suggest_configs``.",
        "100",
    ),
)
_BY_OPTION = {s.option: s for s in SETTINGS}


def provider_config() -> dict[str, Any]:
    """``get_provider_info()["config"]``: the ``[airflow_trials]`` section and its options."""
    return {
        SECTION: {
            "description": "Settings of the airflow-trials provider (hyperparameter tuning on "
            "Ray). An ``AIRFLOW_TRIALS_*`` environment variable named in an option's "
            "description wins over the option.",
            "options": {s.option: s.declared() for s in SETTINGS},
        }
    }


def setting(option: str) -> str | None:
    """The setting's value as text, found as the module's docstring says; None when unset and
    without a default (the caller's own fallback applies).

    :param option: an option of ``[airflow_trials]``, such as ``"db_url"``.
    """
    found = _BY_OPTION.get(option)
    if found is None:
        raise KeyError(
            f"[{SECTION}] has no option {option!r}; the options are {sorted(_BY_OPTION)}."
        )
    if found.env and os.environ.get(found.env):
        return os.environ[found.env]
    if importlib.util.find_spec("airflow") is not None:
        from airflow.sdk import conf

        value = conf.get(SECTION, option, fallback=None)
        if value not in (None, ""):
            return str(value)
    return found.default


def setting_source(option: str) -> str:
    """Where :func:`setting` found the option's value: its environment variable's name, or
    ``[airflow_trials] <option>`` (also when that is its default)."""
    found = _BY_OPTION[option]
    if found.env and os.environ.get(found.env):
        return found.env
    return f"[{SECTION}] {option}"


def setting_float(option: str) -> float:
    """A float setting; a value that is no number is refused, naming where it came from."""
    return float(_parsed(option, float, "a number"))


def setting_int(option: str) -> int:
    """A whole-number setting; anything else is refused, naming where it came from."""
    return int(_parsed(option, int, "a whole number"))


def _parsed(option: str, kind: type[float] | type[int], what: str) -> float | int:
    text = setting(option)
    try:
        return kind(text or "")
    except ValueError as e:
        raise ValueError(
            f"[{SECTION}] {option} is {text!r} (from {setting_source(option)}), not {what}; set "
            f"it to one such as {_BY_OPTION[option].example}."
        ) from e
