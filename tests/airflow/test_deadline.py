"""tuning_experiment(deadline=...): the Deadline Alert it adds to its DAG, its checks at parse
time, and the notifier Airflow's CallbackTrigger runs in the triggerer when the deadline passes.
(tests/faults/test_deadline_alert.py runs a deadline that passes mid-run on the real stack.)"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any

import pytest
from airflow.sdk import DAG
from airflow.sdk.definitions.deadline import AsyncCallback, DeadlineAlert, DeadlineReference

from airflow_trials.experiment import ExperimentDeadline, tuning_experiment
from tests.airflow.test_example_dags import load

NOTIFIER = "airflow_trials.triggers.deadline_notifier.ExperimentDeadlineNotifier"
CALLS: list[dict[str, Any]] = []


def record_call(**kwargs: Any) -> None:
    """The team's callback in these tests: a plain function, which the notifier runs in a thread."""
    CALLS.append(kwargs)


async def async_record_call(**kwargs: Any) -> None:
    CALLS.append({"async": True, **kwargs})


def _dag(deadline: Any, dag_deadline: Any = None) -> DAG:
    with DAG("deadline_dag", schedule=None, deadline=dag_deadline) as dag:
        tuning_experiment(
            experiment_name="deadline_exp",
            trainable="tests.trainables:quadratic",
            search_space={"x": 1.0},
            metric="loss",
            deadline=deadline,
        )
    return dag


def test_a_timedelta_adds_an_alert_from_queued_at_whose_callback_is_the_notifier():
    own = DeadlineAlert(
        reference=DeadlineReference.DAGRUN_LOGICAL_DATE,
        interval=dt.timedelta(hours=9),
        callback=AsyncCallback(async_record_call),
    )
    dag = _dag(dt.timedelta(hours=4), dag_deadline=own)
    assert dag.deadline[0] is own  # the DAG's own alert is kept
    alert = dag.deadline[1]
    assert alert.reference == DeadlineReference.DAGRUN_QUEUED_AT
    assert alert.interval == dt.timedelta(hours=4) and alert.name == "deadline_exp_deadline"
    assert isinstance(alert.callback, AsyncCallback) and alert.callback.path == NOTIFIER
    assert alert.callback.kwargs == {
        "experiment_name": "deadline_exp",
        "callback": None,
        "callback_kwargs": {},
    }


def test_no_deadline_adds_no_alert():
    assert _dag(None).deadline is None


def test_an_experiment_deadline_sets_reference_and_the_teams_callback():
    deadline = ExperimentDeadline(
        dt.timedelta(minutes=30),
        reference="logical_date",
        callback="tests.airflow.test_deadline.record_call",
        callback_kwargs={"channel": "#ml"},
    )
    (alert,) = _dag(deadline).deadline
    assert alert.reference == DeadlineReference.DAGRUN_LOGICAL_DATE
    assert alert.callback.kwargs["callback"] == "tests.airflow.test_deadline.record_call"
    assert alert.callback.kwargs["callback_kwargs"] == {"channel": "#ml"}


@pytest.mark.parametrize(
    ("deadline", "message"),
    [
        ("4h", "deadline must be a datetime.timedelta or an ExperimentDeadline, got str"),
        (dt.timedelta(0), "deadline interval must be a positive datetime.timedelta"),
        (ExperimentDeadline(dt.timedelta(hours=1), reference="end"), "reference must be one of"),
        (ExperimentDeadline(dt.timedelta(hours=1), callback="not a path"), "an import path"),
    ],
)
def test_bad_deadlines_are_refused_at_parse_time_in_one_line(deadline, message):
    with pytest.raises(ValueError, match=message) as e:
        _dag(deadline)
    assert str(e.value).startswith("Experiment deadline_exp: ") and "\n" not in str(e.value)


def test_the_nightly_example_is_due_four_hours_after_its_slot(airflow_home):
    (alert,) = load("nightly_regression_tuning.py").dag.deadline
    assert alert.reference == DeadlineReference.DAGRUN_LOGICAL_DATE
    assert alert.interval == dt.timedelta(hours=4) and alert.callback.path == NOTIFIER


def test_the_provider_lists_the_notifier_airflow_can_import():
    from airflow.sdk.module_loading import import_string

    from airflow_trials import get_provider_info

    (path,) = get_provider_info()["notifications"]
    assert path == NOTIFIER and import_string(path).__name__ == "ExperimentDeadlineNotifier"


def _fire(alert: DeadlineAlert, context: dict[str, Any]) -> list[dict[str, Any]]:
    """Run the alert's callback as the triggerer does: Airflow's CallbackTrigger, with the kwargs
    and the context the scheduler gives it (Deadline.handle_miss)."""
    from airflow.triggers.callback import CallbackTrigger

    trigger = CallbackTrigger(alert.callback.path, {**alert.callback.kwargs, "context": context})

    async def events() -> list[dict[str, Any]]:
        return [event.payload async for event in trigger.run()]

    return asyncio.run(events())


CONTEXT = {
    "dag_run": {"dag_id": "deadline_dag", "dag_run_id": "manual__1"},
    "deadline": {"id": "d-1", "deadline_time": "2026-01-01T06:00:00+00:00"},
}


@pytest.mark.parametrize("callback", ["record_call", "async_record_call"])
def test_the_triggerer_logs_the_miss_and_calls_the_teams_callback(callback, capsys):
    CALLS.clear()
    deadline = ExperimentDeadline(
        dt.timedelta(hours=1),
        callback=f"tests.airflow.test_deadline.{callback}",
        callback_kwargs={"channel": "#ml"},
    )
    (alert,) = _dag(deadline).deadline
    payloads = _fire(alert, dict(CONTEXT))
    assert [p["state"] for p in payloads] == ["running", "success"], payloads
    assert (
        "Experiment deadline_exp, DAG run manual__1 of DAG deadline_dag, missed its deadline "
        "(due 2026-01-01T06:00:00+00:00)" in capsys.readouterr().out
    )
    (call,) = CALLS
    assert call["experiment_name"] == "deadline_exp" and call["channel"] == "#ml"
    assert call["context"]["dag_run"]["dag_run_id"] == "manual__1"
    assert call.get("async", False) is (callback == "async_record_call")


def test_a_failing_team_callback_fails_the_callback_with_its_error():
    deadline = ExperimentDeadline(dt.timedelta(hours=1), callback="tests.airflow.no_such.module")
    (alert,) = _dag(deadline).deadline
    payloads = _fire(alert, dict(CONTEXT))
    assert payloads[-1]["state"] == "failed" and "no_such" in payloads[-1]["body"]
