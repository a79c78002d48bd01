"""A sweep passes references, not lists: its ``suggest_configs`` registers the run's trials in the
trials DB, and neither its XCom nor the sweep trigger's kwargs grow with the number of trials
(issue 53). Real Airflow (dag.test), real Ray, a real trials DB."""

from __future__ import annotations

import json

from tests.airflow.test_experiment_dag import experiment_dag, task_states, xcom


def sweep_of(trials_env, monkeypatch, dag_id: str, num_trials: int) -> tuple[dict, dict]:
    """Run a sweep of ``num_trials`` one-iteration trials through dag.test(); its
    ``suggest_configs`` XCom and its trigger's kwargs as Airflow stores them (``serialize()``)."""
    from airflow_trials.operators.sweep_operator import RunSweepOperator

    kwargs = []
    defer = RunSweepOperator.defer

    def recording_defer(self, *, trigger, **rest):
        kwargs.append(trigger.serialize()[1])
        return defer(self, trigger=trigger, **rest)

    monkeypatch.setattr(RunSweepOperator, "defer", recording_defer)
    dag = experiment_dag(
        dag_id,
        search_space={"scale": {"grid_search": [float(i) for i in range(num_trials)]}},
        stop={"training_iteration": 1},
        checkpoint_at_end=False,
        sweep=True,
    )
    run = dag.test()
    assert run.state == "success", task_states(run)
    best = xcom(run, "tune.select_best")
    assert (best["trials"], best["finished_trials"]) == (num_trials, num_trials)
    assert best["value"] == float(num_trials - 1)
    (exp_run,) = trials_env.store.reader.list_experiment_runs(dag_id)
    states = trials_env.store.reader.run_trial_states(exp_run.id)
    assert len(states) == num_trials and {s.status.value for s in states} == {"TERMINATED"}
    (trigger_kwargs,) = kwargs
    return xcom(run, "tune.suggest_configs"), trigger_kwargs


def test_a_sweeps_xcom_and_trigger_kwargs_do_not_grow_with_its_trials(trials_env, monkeypatch):
    small_xcom, small_trigger = sweep_of(trials_env, monkeypatch, "refs_10", 10)
    large_xcom, large_trigger = sweep_of(trials_env, monkeypatch, "refs_1000", 1000)
    assert small_xcom["num_trials"] == 10 and large_xcom["num_trials"] == 1000
    assert small_trigger["num_trials"] == 10 and large_trigger["num_trials"] == 1000
    sizes = [len(json.dumps(v, default=str)) for v in (small_xcom, large_xcom)]
    # The same keys and values but the run's id and the count ("10" -> "1000": 2 characters).
    assert sizes[1] - sizes[0] <= 2 and sizes[1] < 1000, (small_xcom, large_xcom)
    sizes = [len(json.dumps(v, default=str)) for v in (small_trigger, large_trigger)]
    assert sizes[1] - sizes[0] <= 2 + len("refs_1000") - len("refs_10"), (
        small_trigger,
        large_trigger,
    )


def test_a_sweep_trigger_serialized_with_the_trial_ids_still_loads():
    """A sweep task deferred before the upgrade: its trigger's kwargs carry the run's ids, not
    num_trials; the triggerer loads it, and it serializes as a number from then on."""
    from airflow_trials.triggers.sweep_trigger import SweepTrigger

    before = {"experiment_name": "e", "run_key": "r", "experiment_run_id": 1, "try_number": 2}
    trigger = SweepTrigger(**before, trial_ids=["t-1", "t-2", "t-3"])
    classpath, kwargs = trigger.serialize()
    assert classpath.endswith("SweepTrigger")
    assert kwargs["num_trials"] == 3 and "trial_ids" not in kwargs
    assert SweepTrigger(**kwargs).num_trials == 3
