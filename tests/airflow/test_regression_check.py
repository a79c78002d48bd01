"""tuning_experiment(regression_tolerance=...): the check_regression task after select_best,
refused when the DAG file is parsed if misspelt, and run for real (dag.test, Ray, a SQLite trials
DB) over two nights; with several metrics, over two seeded runs' Pareto fronts."""

from __future__ import annotations

import datetime as dt
import logging

import pytest
from airflow.sdk import DAG

from airflow_trials.core.search import grid_search, uniform
from airflow_trials.exceptions import RegressionError
from airflow_trials.experiment import tuning_experiment
from tests.airflow.test_experiment_dag import experiment_dag, task_states, xcom

START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def declare(name="nightly", **kwargs):
    settings = {"search_space": {"x": uniform(0.0, 1.0)}, "metric": "loss", **kwargs}
    with DAG(name, schedule=None, start_date=START) as dag:
        tuning_experiment(
            experiment_name=name, trainable="tests.trainables:counting", group_id="tune", **settings
        )
    return dag


def test_without_a_tolerance_there_is_no_check_and_with_one_it_follows_select_best():
    assert "tune.check_regression" not in declare().task_dict
    dag = declare(regression_tolerance={"relative": 0.05})
    check = dag.get_task("tune.check_regression")
    assert check.upstream_task_ids == {"tune.select_best"} and not check.downstream_task_ids
    # A task after the group waits for the check: a regressed best goes no further.
    with dag:
        from airflow.sdk import task

        @task(task_id="publish")
        def publish():
            return None

        dag.task_group_dict["tune"] >> publish()
    assert dag.get_task("publish").upstream_task_ids == {"tune.check_regression"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"regression_tolerance": 0.05},
            r"Experiment nightly: regression_tolerance=0.05 is not a tolerance: give a dict of "
            r"one key, \{\"relative\": 0.05\} .* or leave it out \(no check\)\.",
        ),
        (
            {"regression_tolerance": {"relative": 5}},
            r"Experiment nightly: regression_tolerance=\{'relative': 5\}: a relative tolerance "
            r"is a fraction",
        ),
        (
            {
                "regression_tolerance": {"absolute": 0.1},
                "metric": ["loss", "latency"],
                "mode": ["min", "min"],
            },
            r"Experiment nightly: regression_tolerance=\{'absolute': 0.1\} is absolute, but with "
            r"several metrics .* give a relative tolerance",
        ),
    ],
)
def test_a_bad_tolerance_is_refused_when_the_dag_file_is_parsed(kwargs, message):
    with pytest.raises(ValueError, match=message):
        declare(**kwargs)


def night(name, scale, tolerance):
    """The experiment's DAG with one trial of this ``scale`` (its best score is 3 * scale)."""
    return experiment_dag(
        name,
        search_space={"scale": grid_search([scale])},
        stop={"training_iteration": 3},
        regression_tolerance=tolerance,
    )


def test_a_night_worse_than_the_last_successful_one_fails_its_check(trials_env, capfd):
    first = night("regress", 3.0, {"absolute": 1.0}).test()
    assert first.state == "success", task_states(first)
    assert xcom(first, "tune.check_regression")["checked"] is False  # nothing before it

    # Night 2: a narrowed config space, best 6.0 < 9.0 by 3 > 1.
    capfd.readouterr()
    second = night("regress", 2.0, {"absolute": 1.0}).test()
    states = task_states(second)
    assert states[("tune.select_best", -1)] == "success"  # the best is still published
    assert states[("tune.check_regression", -1)] == "failed"
    assert second.state == "failed"
    assert xcom(second, "tune.select_best")["value"] == 6.0
    runs = trials_env.store.reader.list_experiment_runs("regress")
    assert [r.status.value for r in runs] == ["SUCCESS", "SUCCESS"]

    # The failure's message, as the task's log shows it (dag.test() writes it to stdout).
    task_log = capfd.readouterr().out
    expected = (
        f"Experiment regress, DAG run {second.run_id}: the best score (max) is 6, worse than 9 "
        f"in the previous successful run, {first.run_id} of DAG regress (experiment run "
        f"{runs[0].id}), by 3: more than regression_tolerance {{'absolute': 1.0}} allows (1). "
        "select_best has published this run's best all the same. The next run is compared "
        "with this one whatever this task's state (select_best recorded this run SUCCESS in the "
        "trials DB). To run the tasks after the task group with this best anyway, mark this "
        "check_regression task success, then clear those tasks (clearing this one only fails it "
        "again: the same runs compare the same); to check less strictly, raise "
        "regression_tolerance in the DAG file, or leave it out to stop the check."
    )
    assert expected in task_log and "RegressionCheckFailed" in task_log

    # As it says: with nothing marked, night 3 (as good as night 2) compares with night 2.
    third = night("regress", 2.0, {"absolute": 1.0}).test()
    assert third.state == "success", task_states(third)
    checked = xcom(third, "tune.check_regression")
    assert checked["previous_run"]["run_key"] == second.run_id and checked["previous"] == 6.0


def test_a_night_within_the_tolerance_passes_its_check(trials_env):
    first = night("steady", 3.0, {"relative": 0.05}).test()
    assert first.state == "success", task_states(first)
    second = night("steady", 2.9, {"relative": 0.05}).test()  # 8.7: 0.3 worse, 0.45 allowed
    assert second.state == "success", task_states(second)
    checked = xcom(second, "tune.check_regression")
    runs = trials_env.store.reader.list_experiment_runs("steady")
    assert checked["checked"] is True and checked["regressed"] is False
    assert checked["current"] == pytest.approx(8.7) and checked["previous"] == 9.0
    assert checked["allowed"] == pytest.approx(0.45) and checked["tolerance"] == {"relative": 0.05}
    assert checked["experiment_run_id"] == runs[1].id and checked["metric"] == "score"
    assert checked["previous_run"]["run_key"] == first.run_id == runs[0].run_key


# -- several metrics: seeded runs, the check called as its task calls it -------------------------

METRICS = {"metric": ["val_acc", "latency"], "mode": ["max", "min"]}
FRONT = {
    "t-accurate": {"training_iteration": 3, "val_acc": 0.9, "latency": 10.0},
    "t-fast": {"training_iteration": 3, "val_acc": 0.8, "latency": 2.0},
}


@pytest.fixture
def trials_db(airflow_home, tmp_path, monkeypatch):
    """A trials DB the hooks find, without Ray: check_regression reads it and needs nothing else."""
    from airflow_trials.store import TrialStore

    url = f"sqlite:///{tmp_path / 'trials.db'}"
    monkeypatch.setenv("AIRFLOW_TRIALS_DB_URL", url)
    store = TrialStore(url, create=True)
    yield store
    store.dispose()


def seeded_run(store, run_key, reported, status):
    """A run of experiment ``pareto`` whose trials ended TERMINATED with these last results."""
    from airflow_trials.core.fate import Transition
    from airflow_trials.core.status import TrialStatus
    from airflow_trials.core.update import TrialUpdate

    store.ensure_experiment("pareto", **METRICS)
    run = store.create_experiment_run("pareto", run_key, dag_id="pareto", run_id=run_key)
    for trial_id, last_result in reported.items():
        trial_id = f"{run_key}-{trial_id}"
        store.upsert_trial(
            trial_id,
            trainable="tests.trainables:counting",
            config={},
            resources={"cpu": 1},
            max_failures=0,
            experiment_run_id=run,
        )
        store.record_transition(trial_id, Transition.PLACED)
        update = TrialUpdate(trial_id, status=TrialStatus.TERMINATED, last_result=last_result)
        store.record_end(update.end("pareto", released=True))
    if status is not None:
        store.finish_experiment_run(run, status)
    return run


def run_check(tolerance, run_key, experiment_run_id):
    from tests.airflow.conftest import FakeTI

    dag = declare("pareto", regression_tolerance=tolerance, **METRICS)
    task = dag.get_task("tune.check_regression")
    return task.python_callable({"experiment_run_id": experiment_run_id}, ti=FakeTI(run_id=run_key))


def test_several_metrics_fail_when_the_front_loses_hypervolume(trials_db):
    first = seeded_run(trials_db, "night1", FRONT, "SUCCESS")
    # A failed run in between is skipped: the baseline is the newest SUCCESSFUL run.
    seeded_run(trials_db, "night2", {"t-best": {"val_acc": 1.0, "latency": 0.1}}, "FAILED")
    tonight = seeded_run(trials_db, "night3", {"t-slow": FRONT["t-accurate"]}, None)
    with pytest.raises(RegressionError) as raised:
        run_check({"relative": 0.05}, "night3", tonight)
    message = str(raised.value)
    assert message.startswith(
        "Experiment pareto, DAG run night3: the hypervolume of the Pareto front of [max val_acc, "
        "min latency] is 0.088, worse than 0.168 in the previous successful run, night1 of DAG "
        f"pareto (experiment run {first}), by 0.08: more than regression_tolerance "
        "{'relative': 0.05} allows (0.0084). Both hypervolumes are measured up to the reference "
        "point {'val_acc': 0.79, 'latency': 10.8}"
    ), message
    assert "The next run is compared with this one whatever this task's state" in message


def test_several_metrics_pass_when_the_front_holds(trials_db):
    first = seeded_run(trials_db, "night1", FRONT, "SUCCESS")
    better = {**FRONT, "t-new": {"training_iteration": 3, "val_acc": 0.95, "latency": 1.0}}
    tonight = seeded_run(trials_db, "night2", better, None)
    checked = run_check({"relative": 0.0}, "night2", tonight)
    assert checked["checked"] is True and checked["regressed"] is False
    assert checked["current"] > checked["previous"] > 0 and checked["worse_by"] == 0
    assert checked["previous_run"] == {
        "experiment_run_id": first,
        "run_key": "night1",
        "dag_id": "pareto",
        "run_id": "night1",
    }


def test_the_first_run_passes_with_nothing_to_compare(trials_db, caplog):
    tonight = seeded_run(trials_db, "night1", FRONT, None)
    caplog.set_level(logging.INFO)
    checked = run_check({"relative": 0.0}, "night1", tonight)
    assert checked["checked"] is False and checked["previous_run"] is None
    assert "no earlier run of the experiment succeeded in the trials DB" in caplog.text
