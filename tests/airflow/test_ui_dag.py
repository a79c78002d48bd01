"""The UI-triggered example DAG: its Params form, the settings it takes per run, and real runs."""

from __future__ import annotations

import re

import pytest

from airflow_trials.operators.trial_operator import MAX_INFRASTRUCTURE_RESTARTS
from tests.airflow.test_example_dags import load
from tests.airflow.test_experiment_dag import task_states, xcom
from tests.conftest import live_placement_groups, live_trial_actors

GROUP = "ui_regression_tuning"


@pytest.fixture
def ui_module(airflow_home):
    return load("ui_regression_tuning.py")


def test_one_trial_task_per_gpu_choice_with_exact_pool_slots(ui_module):
    dag = ui_module.dag
    slots = {}
    for gpu, suffix in zip(ui_module.GPU_CHOICES, ("0", "0_25", "0_5", "1"), strict=True):
        task = dag.get_task(f"{GROUP}.trial_gpu_{suffix}")
        kwargs = task.partial_kwargs
        assert kwargs["retries"] == ui_module.MAX_FAILURES + MAX_INFRASTRUCTURE_RESTARTS
        assert kwargs["trainable"] == "airflow_trials.examples.regression:train"
        slots[gpu] = (task.pool, task.pool_slots)
    # 4 slots per GPU: 0.25 GPU takes 1 slot, 0.5 takes 2, 1 takes 4; CPU-only trials take no GPU
    # slot.
    assert slots == {0: ("default_pool", 1), 0.25: ("gpu", 1), 0.5: ("gpu", 2), 1: ("gpu", 4)}
    assert dag.get_task(f"{GROUP}.route_trials").downstream_task_ids == {
        f"{GROUP}.trial_gpu_{k}" for k in ("0", "0_25", "0_5", "1")
    }


@pytest.mark.parametrize(
    ("conf", "field"),
    [
        ({"num_samples": 0}, "num_samples"),
        ({"num_samples": "many"}, "num_samples"),
        ({"lr_min": 0}, "lr_min"),
        ({"mode": "maximise"}, "mode"),
        ({"gpus_per_trial": 0.3}, "gpus_per_trial"),
        ({"max_failures": 4}, "max_failures"),
        # Every JSON Schema range keyword lets NaN through; the DAG's NOT_NAN clause does not.
        ({"lr_min": float("nan")}, "lr_min"),
        ({"lr_max": float("nan")}, "lr_max"),
        ({"l2_max": float("nan")}, "l2_max"),
        ({"lr_max": "NaN"}, "lr_max"),
        ({"lr_max": float("inf")}, "lr_max"),
        ({"lr_min": float("-inf")}, "lr_min"),
        ({"lr_min": -0.1}, "lr_min"),
        ({"l2_max": -0.5}, "l2_max"),
        ({"lr_min": "0.1"}, "lr_min"),
        ({"lr_max": True}, "lr_max"),
        ({"num_samples": 2.5}, "num_samples"),
        ({"num_samples": 100_000}, "num_samples"),
        ({"metric": "../../../tmp/evil"}, "metric"),
    ],
)
def test_out_of_range_params_are_refused_when_the_run_is_triggered(
    ui_module, trials_env, conf, field
):
    from airflow.sdk.exceptions import ParamValidationError

    with pytest.raises(ParamValidationError, match=field):
        ui_module.dag.test(run_conf=conf)
    assert trials_env.store.reader.list_experiment_runs() == []


def test_the_nan_clause_refuses_only_nan(ui_module):
    from airflow.sdk import Param
    from airflow.sdk.exceptions import ParamValidationError

    bound = Param(0.5, type="number", **ui_module.NOT_NAN)
    for value in (-1e300, -1, 0, 1e-12, 0.5, 1, 7, 1e300, float("inf")):
        assert bound.resolve(value) == value
    with pytest.raises(ParamValidationError, match="NaN is not a number: send a finite number"):
        bound.resolve(float("nan"))


@pytest.mark.parametrize(
    "conf",
    [
        {"lr_min": 0.5, "lr_max": 0.1},
        {"lr_min": 0.1, "lr_max": 0.1},
        {"num_samples": 4.0},  # JSON Schema counts 4.0 as an integer
        {"epochs": 3.0},
        {
            "trainable": "os:system",
            "search_space": {"lr": {"uniform": [0, 1]}},
            "experiment_name": "../../x",
        },
    ],
)
def test_params_the_schema_lets_through_fail_before_any_trial(ui_module, trials_env, conf):
    run = ui_module.dag.test(run_conf=conf)
    states = task_states(run)
    assert states[(f"{GROUP}.suggest_configs", -1)] == "failed"
    assert all(
        state != "success" for (task_id, _), state in states.items() if ".trial_gpu_" in task_id
    )
    assert (
        trials_env.store.reader.list_experiment_runs() == []
        and trials_env.store.reader.list_trials() == []
    )
    assert live_trial_actors() == []


def test_refusal_names_the_run_the_field_and_the_fix(ui_module, trials_env, fake_context):
    from airflow.sdk.exceptions import AirflowFailException

    suggest = ui_module.dag.get_task(f"{GROUP}.suggest_configs")
    params = dict(ui_module.dag.params.dump(), lr_min=0.5, lr_max=0.1)
    with pytest.raises(AirflowFailException) as raised:
        suggest.python_callable(ti=fake_context(run_id="manual__1")["ti"], params=params)
    message = str(raised.value)
    assert "ui_regression_tuning, DAG run manual__1" in message
    assert "lr_min (0.5) must be below lr_max (0.1); lower lr_min or raise lr_max" in message
    assert "trigger the DAG again with corrected params" in message
    assert trials_env.store.reader.list_experiment_runs() == []


@pytest.mark.parametrize(
    ("params", "conf", "expected"),
    [
        (
            {"num_samples": 4.0},
            None,
            "param num_samples is 4.0, a float, but it must be an integer; send 4",
        ),
        ({"epochs": 3.0}, None, "param epochs is 3.0, a float, but it must be an integer; send 3"),
        # NaN cannot reach a task through Airflow's API (it arrives as null), but a param of a
        # schema without NOT_NAN, or a run made in Python, could still carry it.
        (
            {"l2_max": float("nan")},
            None,
            "param l2_max is nan, not a finite number; set it to a finite number",
        ),
        (
            {"trainable": "os:system", "experiment_name": "../../../tmp/evil"},
            {"trainable": "os:system", "experiment_name": "../../../tmp/evil"},
            "conf keys ['experiment_name', 'trainable'] are not params of this DAG and would be "
            "ignored (the "
            "trainable, the search space and the experiment name are fixed in the DAG file); the "
            "trigger form "
            "accepts only ['epochs', 'extend_num_samples', 'extend_run', 'extend_stop', "
            "'gpus_per_trial', 'l2_max', 'lr_max', 'lr_min', 'max_failures', 'metric', "
            "'mode', 'num_samples'], so leave out ['experiment_name', 'trainable']",
        ),
    ],
)
def test_refusal_of_what_the_schema_lets_through_names_the_param_the_value_and_the_fix(
    ui_module, trials_env, fake_context, params, conf, expected
):
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowFailException

    suggest = ui_module.dag.get_task(f"{GROUP}.suggest_configs")
    merged = dict(
        ui_module.dag.params.dump(), **params
    )  # as Airflow merges a run's conf into its params
    with pytest.raises(AirflowFailException) as raised:
        suggest.python_callable(
            ti=fake_context(run_id="manual__2")["ti"],
            params=merged,
            dag=ui_module.dag,
            dag_run=SimpleNamespace(conf=conf or params),
        )
    assert str(raised.value) == (
        "Experiment ui_regression_tuning, DAG run manual__2: the run's params are refused: "
        f"{expected}. "
        "No trial was started and nothing was written; trigger the DAG again with corrected params."
    )
    assert trials_env.store.reader.list_experiment_runs() == []


@pytest.mark.parametrize(
    ("override", "expected"),
    [
        (
            {"search_space": {"lr": {"loguniform": [0.01, float("inf")]}}},
            "needs finite bounds (not NaN or infinity)",
        ),
        ({"search_space": {"lr": {"uniform": [float("nan"), 1.0]}}}, "needs finite bounds"),
        (
            {"num_samples": 2000},
            "num_samples 2000 is 2000 trials, more than 1024, the most one mapped task may have "
            "(Airflow's [core] max_map_length); pass sweep=True to run them all in one sweep task, "
            "raise [core] max_map_length to at least 2000, or ask for at most 1024 samples",
        ),
        (
            {
                "num_samples": 1,
                "search_space": {
                    "a": {"grid_search": list(range(40))},
                    "b": {"grid_search": list(range(40))},
                },
            },
            "num_samples 1 x 1600 grid combinations is 1600 trials, more than 1024, the most one "
            "mapped task may have "
            "(Airflow's [core] max_map_length); pass sweep=True to run them all in one sweep task, "
            "raise [core] max_map_length to at least 1600, or use fewer grid_search values",
        ),
        (
            {"num_samples": 100, "search_space": {"a": {"grid_search": list(range(20))}}},
            "num_samples 100 x 20 grid combinations is 2000 trials, more than 1024, the most one "
            "mapped task may have "
            "(Airflow's [core] max_map_length); pass sweep=True to run them all in one sweep task, "
            "raise [core] max_map_length to at least 2000, or ask for at most 51 samples",
        ),
        (
            {"stop": {"training_iteration": float("nan")}},
            "stop must map metric names to finite numbers",
        ),
        (
            {"resources_per_trial": {"cpu": float("nan")}},
            "resources_per_trial must hold finite amounts >= 0",
        ),
        (
            {"resources_per_trial": {"cpu": float("inf")}},
            "resources_per_trial must hold finite amounts >= 0",
        ),
        ({"resources_per_trial": {"cpu": -1}}, "resources_per_trial must hold finite amounts >= 0"),
        ({"max_failures": 1.0}, "max_failures must be -1 (unlimited) or an integer >= 0, got 1.0"),
    ],
)
def test_settings_a_from_params_function_returns_are_refused_when_unusable(
    ui_module, override, expected
):
    from airflow_trials.experiment import ExperimentSettings

    settings = {**ui_module.settings_from_params(ui_module.dag.params.dump()), **override}
    with pytest.raises(ValueError, match=re.escape(expected)):
        ExperimentSettings.validated(**settings)
    with pytest.raises(ValueError, match=f"^Experiment {GROUP}: .*{re.escape(expected)}"):
        ExperimentSettings.checked(GROUP, **settings)


def test_as_many_trials_as_one_mapped_task_may_have_are_accepted(ui_module):
    from airflow_trials.experiment import ExperimentSettings

    settings = {**ui_module.settings_from_params(ui_module.dag.params.dump()), "num_samples": 1024}
    assert ExperimentSettings.validated(**settings).num_samples == 1024


def test_a_sweep_takes_more_trials_than_one_mapped_task_may_have(ui_module):
    from airflow_trials.experiment import ExperimentSettings

    settings = {
        **ui_module.settings_from_params(ui_module.dag.params.dump()),
        "num_samples": 10_000,
    }
    assert ExperimentSettings.validated(**settings, sweep=True).num_samples == 10_000


def test_gpus_beyond_the_cluster_are_refused_before_any_trial(ui_module, trials_env, fake_context):
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_trials.core.resources import InsufficientResourcesError
    from tests.conftest import start_ray

    start_ray(num_cpus=2, num_gpus=0)
    suggest = ui_module.dag.get_task(f"{GROUP}.suggest_configs")
    params = dict(ui_module.dag.params.dump(), gpus_per_trial=0.5)
    # Without the DAG in the context (a hand-made one) the form's defaults are unknown: the
    # refusal names the run's params without naming a field.
    with pytest.raises(
        AirflowFailException, match="the run's params are refused: from_params "
    ) as e:
        suggest.python_callable(ti=fake_context()["ti"], params=params)
    assert isinstance(e.value.__cause__, InsufficientResourcesError)
    assert trials_env.store.reader.list_experiment_runs() == []


def test_gpus_on_a_cpu_only_cluster_are_refused_naming_the_form_s_field(
    ui_module, trials_env, fake_context
):
    from types import SimpleNamespace

    from airflow.sdk.exceptions import AirflowFailException

    from tests.conftest import start_ray

    start_ray(num_cpus=2, num_gpus=0)
    suggest = ui_module.dag.get_task(f"{GROUP}.suggest_configs")
    conf = {"gpus_per_trial": 1, "lr_min": 0.05}  # lr_min's default goes with lr_max: not named
    with pytest.raises(AirflowFailException) as raised:
        suggest.python_callable(
            ti=fake_context(run_id="manual__3")["ti"],
            params=dict(ui_module.dag.params.dump(), **conf),
            dag=ui_module.dag,
            dag_run=SimpleNamespace(conf=conf),
        )
    # The cluster's memory is this machine's.
    message = re.sub(r", [0-9.]+ GiB memory in total", " in total", str(raised.value))
    assert message == (
        "Experiment ui_regression_tuning, DAG run manual__3: the run's params are refused: "
        "gpus_per_trial is 1, so each trial needs 0.25 CPU, 1 GPU, but the Ray cluster has "
        "2 CPU, 0 GPU in total (short of GPU by 1). No trial was started and nothing was "
        "written; trigger the DAG again with gpus_per_trial 0 (the form's default), or first add "
        "a node with GPUs to the Ray cluster (ray start --address=<head address> --num-gpus=N)."
    )
    assert trials_env.store.reader.list_experiment_runs() == []


def test_a_triggered_run_asking_for_gpus_on_a_cpu_only_cluster_fails_naming_the_field(
    ui_module, trials_env, capfd
):
    from tests.conftest import start_ray

    start_ray(num_cpus=2, num_gpus=0)
    run = ui_module.dag.test(run_conf={"gpus_per_trial": 0.5})
    assert task_states(run)[(f"{GROUP}.suggest_configs", -1)] == "failed"
    task_log = capfd.readouterr().out  # dag.test() writes the task logs to stdout
    assert "the run's params are refused: gpus_per_trial is 0.5, so each trial needs" in task_log
    assert "trigger the DAG again with gpus_per_trial 0 (the form's default)" in task_log
    assert trials_env.store.reader.list_experiment_runs() == [] and live_trial_actors() == []


def test_a_run_uses_the_settings_of_its_params(ui_module, trials_env):
    conf = {
        "num_samples": 3,
        "epochs": 2,
        "lr_min": 0.05,
        "lr_max": 0.5,
        "l2_max": 0,
        "metric": "val_accuracy",
        "mode": "max",
        "gpus_per_trial": 0.5,
        "max_failures": 1,
    }
    run = ui_module.dag.test(run_conf=conf)
    states = task_states(run)
    assert run.state == "success", states
    # Only the 0.5-GPU trial task ran (one mapped instance per trial); the others were skipped.
    ran = sorted(k for k, s in states.items() if k[0] == f"{GROUP}.trial_gpu_0_5")
    assert [s for k, s in states.items() if k in ran] == ["success"] * 3
    for other in ("0", "0_25", "1"):
        assert {s for (t, _), s in states.items() if t == f"{GROUP}.trial_gpu_{other}"} == {
            "skipped"
        }
    store = trials_env.store
    (exp_run,) = store.reader.list_experiment_runs(GROUP)
    trials = store.reader.list_trials(experiment_run_id=exp_run.id)
    assert len(trials) == 3
    for t in trials:
        assert t.resources["gpu"] == 0.5 and t.max_failures == 1 and t.config["l2"] == 0.0
        assert 0.05 <= t.config["lr"] <= 0.5
        assert [r["training_iteration"] for r in store.reader.get_results(t.trial_id)] == [1, 2]
    best = xcom(run, f"{GROUP}.select_best")
    assert (best["metric"], best["mode"], best["trials"]) == ("val_accuracy", "max", 3)
    assert best["value"] == max(
        max(r["val_accuracy"] for r in store.reader.get_results(t.trial_id)) for t in trials
    )
    assert live_trial_actors() == [] and live_placement_groups() == []
