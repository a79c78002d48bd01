"""The path and query parameters of the dashboard's routes, validated by FastAPI before a handler
runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Query, Request, status

from airflow_trials.core.trial import validate_name
from airflow_trials.plugins.data.queries import (
    MAX_CURVES,
    MAX_PAGE_SIZE,
    SORT_KEYS,
    STOPPED_FILTERS,
)
from airflow_trials.store import TrialReader

# Experiment names and trial ids follow core.trial.validate_name; the handlers also run it.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
# Airflow's own rule for dag_id and task_id (KEY_REGEX; a task in a group has dots).
AIRFLOW_KEY_PATTERN = r"^[A-Za-z0-9_.-]{1,250}$"
# run_ids are free text in Airflow (manual__2026-01-01T00:00:00+00:00): no control characters.
AIRFLOW_RUN_ID_PATTERN = r"^[^\x00-\x1f\x7f]{1,250}$"
# The UI leaves "{MAP_INDEX}" in the link of a task instance that is not mapped.
MAP_INDEX_PATTERN = r"^(-1|[0-9]{1,9}|\{MAP_INDEX\})$"
METRIC_PATTERN = r'^[^"\x00-\x1f]{1,250}$'


def _store(request: Request) -> TrialReader:
    provider: Callable[[], TrialReader] = request.app.state.store_provider
    return provider()


StoreDep = Annotated[TrialReader, Depends(_store)]
RunPk = Annotated[int, Path(ge=1, le=2**31 - 1, description="The experiment run's id.")]
ExperimentName = Annotated[str, Path(pattern=NAME_PATTERN, description="The experiment's name.")]
TrialId = Annotated[str, Path(pattern=NAME_PATTERN, description="The trial's id.")]
Metric = Annotated[
    str | None, Query(pattern=METRIC_PATTERN, description="Default: the experiment's metric.")
]
Mode = Annotated[
    str | None, Query(pattern="^(min|max)$", description="Default: the experiment's mode.")
]
Sort = Annotated[
    str, Query(pattern=f"^({'|'.join(SORT_KEYS)})$", description="Column to sort the page by.")
]
Order = Annotated[str, Query(pattern="^(asc|desc)$")]
Page = Annotated[int, Query(ge=1, le=1_000_000)]
PageSize = Annotated[
    int, Query(ge=1, le=MAX_PAGE_SIZE, description=f"Rows per page, 1 to {MAX_PAGE_SIZE}.")
]
Stopped = Annotated[
    str,
    Query(
        pattern=f"^({'|'.join(STOPPED_FILTERS)})$",
        description="early: only trials their scheduler stopped early; not_early: only the others; "
        "all (default).",
    ),
]
Top = Annotated[int, Query(ge=1, le=MAX_CURVES, description="How many of the best trials to draw.")]
DagId = Annotated[str, Query(pattern=AIRFLOW_KEY_PATTERN)]
DagRunId = Annotated[str, Query(pattern=AIRFLOW_RUN_ID_PATTERN)]
TaskId = Annotated[str, Query(pattern=AIRFLOW_KEY_PATTERN)]
MapIndex = Annotated[str, Query(pattern=MAP_INDEX_PATTERN)]


def checked_name(kind: str, value: str) -> str:
    """``value`` if it is a valid experiment name or trial id, else a 422 that says why."""
    try:
        return validate_name(kind, value)
    except ValueError as e:
        raise HTTPException(status.HTTP_422_UNPROCESSABLE_CONTENT, str(e)) from e
