"""Experiment DAGs run end to end with real Airflow (dag.test), real Ray and a real trials store."""

from __future__ import annotations

import datetime as dt

import pytest
from airflow.sdk import DAG

from airflow_trials.core.search import grid_search, uniform
from airflow_trials.experiment import tuning_experiment
from tests.airflow.conftest import load_dag_source
from tests.conftest import live_placement_groups, live_trial_actors

START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def xcom(run, task_id, key="return_value", map_index=-1):
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.scalars(
            XComModel.get_many(
                run_id=run.run_id,
                dag_ids=run.dag_id,
                task_ids=task_id,
                key=key,
                map_indexes=map_index,
            )
        ).first()
        return None if row is None else XComModel.deserialize_value(row)


def task_states(run):
    return {(ti.task_id, ti.map_index): ti.state for ti in run.get_task_instances()}


def experiment_dag(dag_id, **kwargs):
    """Write a DAG file into the DAGs folder (dag.test() serializes DAGs from there) and load it."""
    kwargs.setdefault("trainable", "tests.trainables:counting")
    kwargs.setdefault("metric", "score")
    kwargs.setdefault("mode", "max")
    kwargs.setdefault("stop", {"training_iteration": 3})
    kwargs.setdefault("resources_per_trial", {"cpu": 0.5})
    kwargs.setdefault("poll_interval_seconds", 0.05)
    arguments = "".join(f"        {key}={value!r},\n" for key, value in kwargs.items())
    source = (
        "import datetime\n"
        "from airflow.sdk import DAG\n"
        "from airflow_trials.experiment import tuning_experiment\n\n"
        f"with DAG({dag_id!r}, schedule=None, start_date=datetime.datetime(2026, 1, 1), "
        "catchup=False) as dag:\n"
        f"    tuning_experiment(\n        experiment_name={dag_id!r},\n        "
        f"group_id='tune',\n{arguments}    )\n"
    )
    return load_dag_source(dag_id, source)


def test_experiment_reaches_its_leaderboard(trials_env):
    dag = experiment_dag(
        "e2e",
        search_space={"scale": grid_search([1.0, 3.0, 2.0]), "sleep": 0.0, "noise": uniform(0, 1)},
    )
    run = dag.test()
    assert run.state == "success", task_states(run)
    best = xcom(run, "tune.select_best")
    assert best["value"] == 9.0 and best["config"]["scale"] == 3.0 and best["finished_trials"] == 3
    store = trials_env.store
    (exp_run,) = store.reader.list_experiment_runs("e2e")
    trials = store.reader.list_trials(experiment_run_id=exp_run.id)
    assert len(trials) == 3 and {t.status.value for t in trials} == {"TERMINATED"}
    for t in trials:
        assert [r["training_iteration"] for r in store.reader.get_results(t.trial_id)] == [1, 2, 3]
        assert t.dag_id == "e2e" and t.task_id == "tune.trial" and t.map_index in (0, 1, 2)
        assert store.reader.latest_checkpoint(t.trial_id).iteration == 3
    trial_state = xcom(run, "tune.trial", key="trial", map_index=0)
    assert trial_state["status"] == "TERMINATED" and trial_state["num_failures"] == 0
    assert trial_state["best_checkpoint"]
    assert [r.trial_id for r in store.reader.leaderboard(exp_run.id, "score", "max")][0] == best[
        "trial_id"
    ]
    assert exp_run.picked_trial_id == best["trial_id"]  # select_best recorded its pick
    assert live_trial_actors() == [] and live_placement_groups() == []


def test_select_best_hands_over_the_best_checkpoint_not_the_latest(trials_env):
    from airflow_trials import load_checkpoint

    dag = experiment_dag(
        "peak",
        trainable="tests.trainables:peaked",
        search_space={"x": 1},
        stop={"training_iteration": 4},
    )
    run = dag.test()
    assert run.state == "success", task_states(run)
    best = xcom(run, "tune.select_best")
    assert (best["value"], best["iteration"]) == (5.0, 2)
    assert best["best_checkpoint"] != best["latest_checkpoint"]
    assert best["checkpoint"] == best["best_checkpoint"]
    assert load_checkpoint(best["best_checkpoint"]) == {"i": 2, "score": 5.0}
    assert load_checkpoint(best["latest_checkpoint"]) == {"i": 4, "score": 3.0}
    assert (
        trials_env.store.reader.latest_checkpoint(best["trial_id"]).path
        == best["latest_checkpoint"]
    )


def test_same_run_suggests_the_same_configs():
    from airflow_trials.experiment import run_seed

    assert run_seed("e", "d", "manual__1") == run_seed("e", "d", "manual__1")
    assert run_seed("e", "d", "manual__1") != run_seed("e", "d", "manual__2")


def test_a_crash_at_iteration_3_retries_from_its_checkpoint(trials_env, tmp_path):
    dag = experiment_dag(
        "retry",
        search_space={"crash_at": 3, "marker": str(tmp_path / "crashed")},
        stop={"training_iteration": 5},
        max_failures=1,
        retry_delay=dt.timedelta(0),
    )
    run = dag.test()
    assert run.state == "success", task_states(run)
    store = trials_env.store
    (trial,) = store.reader.list_trials(experiment_name="retry")
    assert trial.status.value == "TERMINATED" and trial.num_failures == 1 and trial.try_number == 2
    results = store.reader.get_results(trial.trial_id)
    assert [r["training_iteration"] for r in results] == [
        1,
        2,
        3,
        4,
        5,
    ]  # continuous, no duplicates
    assert [r["score"] for r in results] == [1.0, 2.0, 3.0, 4.0, 5.0]
    # The retry restored checkpoint 2: its first result is one iteration after the restore.
    assert results[2]["iterations_since_restore"] == 1


def test_exceeding_max_failures_fails_the_task_with_the_traceback(trials_env, capfd):
    dag = experiment_dag(
        "fails", trainable="tests.trainables:failing", search_space={}, max_failures=0
    )
    run = dag.test()
    assert run.state == "failed"
    assert task_states(run)[("tune.trial", 0)] == "failed"
    (trial,) = trials_env.store.reader.list_trials(experiment_name="fails")
    assert trial.status.value == "ERROR" and trial.num_failures == 1
    assert "Traceback (most recent call last)" in trial.error_msg
    assert "broken trainable: key 'missing'" in trial.error_msg
    task_log = capfd.readouterr().out  # dag.test() writes the task logs to stdout
    assert (
        "Trial " + trial.trial_id + " of experiment fails failed (failure 1, no retries left)"
        in task_log
    )
    assert "broken trainable: key 'missing'" in task_log
    assert live_trial_actors() == []


def test_gpu_pool_slots_on_the_mapped_trials(airflow_home):
    for gpu, slots in ((0.25, 1), (0.5, 2), (1, 4), (2, 8)):
        dag = experiment_dag(
            f"pool{slots}",
            search_space={},
            resources_per_trial={"cpu": 1, "gpu": gpu},
            gpu_pool="gpu",
        )
        trial_task = dag.get_task("tune.trial")
        assert trial_task.partial_kwargs["pool"] == "gpu"
        assert trial_task.partial_kwargs["pool_slots"] == slots


def test_gpu_trials_go_to_the_gpu_queue_and_cpu_trials_to_the_default_one(
    airflow_home, monkeypatch
):
    from airflow.configuration import conf

    gpu = experiment_dag(
        "queued_gpu", search_space={}, resources_per_trial={"cpu": 1, "gpu": 1}, gpu_queue="gpu"
    )
    assert gpu.get_task("tune.trial").partial_kwargs["queue"] == "gpu"
    cpu = experiment_dag("queued_cpu", search_space={}, gpu_queue="gpu")
    default_queue = conf.get("operators", "default_queue")
    assert cpu.get_task("tune.trial").partial_kwargs["queue"] == default_queue
    sweep = experiment_dag(
        "queued_sweep",
        search_space={},
        sweep=True,
        gpu_queue="gpu",
        resources_per_trial={"cpu": 1, "gpu": 1},
    )
    assert sweep.get_task("tune.sweep").queue == "gpu"
    # Without gpu_queue, Airflow's [airflow_trials] gpu_queue decides (the production shape's).
    monkeypatch.setenv("AIRFLOW__AIRFLOW_TRIALS__GPU_QUEUE", "gpus")
    configured = experiment_dag(
        "queued_conf", search_space={}, resources_per_trial={"cpu": 1, "gpu": 0.5}
    )
    assert configured.get_task("tune.trial").partial_kwargs["queue"] == "gpus"
    monkeypatch.delenv("AIRFLOW__AIRFLOW_TRIALS__GPU_QUEUE")
    default = experiment_dag("queued_none", search_space={}, resources_per_trial={"gpu": 0.5})
    assert default.get_task("tune.trial").partial_kwargs["queue"] == default_queue


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"search_space": {"lr": {"uniform": [1, 0]}}}, "needs lower < upper"),
        ({"search_space": {}, "experiment_name": "../up"}, "not a valid name"),
        ({"search_space": {}, "mode": "best"}, "mode must be 'min' or 'max'"),
    ],
)
def test_malformed_experiments_are_refused_when_the_dag_is_parsed(kwargs, message):
    name = kwargs.pop("experiment_name", "bad")
    with pytest.raises(ValueError, match=message):
        with DAG("bad", schedule=None, start_date=START):
            tuning_experiment(
                experiment_name=name,
                trainable="tests.trainables:counting",
                metric="score",
                **kwargs,
            )


def test_with_parameters_is_refused_when_the_dag_is_parsed_and_names_the_fix():
    from airflow_trials import with_parameters
    from airflow_trials.operators.trial_operator import RunTrialOperator

    bundle = with_parameters("tests.trainables:with_array", data=[1.0, 2.0])
    with DAG("bad", schedule=None, start_date=START):
        with pytest.raises(
            TypeError,
            match=r"Experiment bad: with_parameters\('tests.trainables:with_array', data\) "
            r"works only with TrialRunner .* each trial is its own task",
        ):
            tuning_experiment(
                experiment_name="bad", trainable=bundle, search_space={}, metric="score"
            )
        with pytest.raises(
            TypeError, match=r"RunTrialOperator 'trial': .* load the data inside the trainable"
        ):
            RunTrialOperator(task_id="trial", trainable=bundle)


def test_parsing_does_not_import_sample_from_functions():
    from airflow_trials.core.search import sample_from

    with DAG("lazy", schedule=None, start_date=START):
        tuning_experiment(
            experiment_name="lazy",
            trainable="tests.trainables:counting",
            metric="score",
            search_space={"x": sample_from("tests.not_importable_at_parse:f")},
        )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"trainable": "tests.trainables:nope"}, "has no attribute 'nope'"),
        (
            {"resources_per_trial": {"cpu": 1, "gpu": 8}},
            "needs 1 CPU, 8 GPU but the Ray cluster has",
        ),
    ],
)
def test_bad_trainable_or_resources_fail_the_suggest_task_with_nothing_written(
    trials_env, kwargs, message, capfd
):
    kwargs.setdefault("search_space", {"x": 1})
    run = experiment_dag("badrun", **kwargs).test()
    assert run.state == "failed"
    assert task_states(run)[("tune.suggest_configs", -1)] == "failed"
    assert message in capfd.readouterr().out
    assert (
        trials_env.store.reader.list_experiment_runs() == []
        and trials_env.store.reader.list_trials() == []
    )
    assert live_trial_actors() == []
