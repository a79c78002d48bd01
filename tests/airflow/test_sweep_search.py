"""A sweep's searcher runs in its driver (RunSweepOperator, real Ray, real Airflow, a real trials
store): it learns from each ended trial, resumes its search after the driver is lost, needs its own
space and the experiment's metric, and with two metrics ends at the front."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import TaskDeferred

from tests.airflow.test_early_stopping import Code
from tests.airflow.test_experiment_dag import experiment_dag, task_states, xcom
from tests.airflow.test_sweep import (
    NAMESPACE,
    first_event,
    nothing_left_on_ray,
    sweep_operator,
    wait_for,
)
from tests.conftest import live_trial_actors

# TPE models the history from its second trial on (n_startup_trials=1): what it learnt shows in each
# config.
SEEDED_SEARCH = Code(
    "__import__('airflow_trials').OptunaSearch(points_to_evaluate=[{'x': 0.9}], "
    "sampler=__import__('optuna').samplers.TPESampler(n_startup_trials=1, seed=5))"
)


def seeded_search():
    """SEEDED_SEARCH, here."""
    import optuna

    from airflow_trials import OptunaSearch

    return OptunaSearch(
        points_to_evaluate=[{"x": 0.9}],
        sampler=optuna.samplers.TPESampler(n_startup_trials=1, seed=5),
    )


def test_a_sweep_runs_its_searcher_in_the_driver_learning_from_each_ended_trial(trials_env):
    """OptunaSearch in the driver, one trial at a time: each config is what the same seeded study
    suggests after the trials before it ended, points_to_evaluate first; the trials keep the ids
    suggest_configs gave them (the grid view's, select_best's)."""
    from airflow_trials.core.search import uniform
    from airflow_trials.operators.tuning import airflow_searcher
    from tests.airflow.test_early_stopping import UNIFORM

    dag = experiment_dag(
        "sweep_optuna",
        trainable="tests.trainables:quadratic",
        metric="loss",
        mode="min",
        search_space={"x": UNIFORM},
        num_samples=5,
        stop=None,
        search_alg=SEEDED_SEARCH,
        sweep=True,
        max_concurrent_trials=1,
    )
    run = dag.test()
    assert run.state == "success", task_states(run)
    store = trials_env.store
    (exp_run,) = store.reader.list_experiment_runs("sweep_optuna")
    # suggest_configs registered the trials without configs (the driver asks, as slots free) and
    # handed on a reference to them
    reference = xcom(run, "tune.suggest_configs")
    assert reference["num_trials"] == 5 and "config" not in reference
    suggested = [{"trial_id": s.trial_id} for s in store.reader.run_trial_states(exp_run.id)]
    trials = {t.trial_id: t for t in store.reader.list_trials(experiment_run_id=exp_run.id)}
    assert sorted(trials) == sorted(entry["trial_id"] for entry in suggested)
    replay = airflow_searcher(seeded_search(), {"x": uniform(0.0, 1.0)}, "loss", "min")
    for entry in suggested:  # trial ids in order: the order the driver asked in
        trial = trials[entry["trial_id"]]
        assert trial.config == replay.suggest(trial.trial_id)
        assert (
            trial.status.value == "TERMINATED"
            and len(store.reader.get_results(trial.trial_id)) == 3
        )
        replay.on_trial_complete(trial.trial_id, trial.last_result)
    assert trials[suggested[0]["trial_id"]].config == {"x": 0.9}
    best = xcom(run, "tune.select_best")
    assert (
        best["value"] == min(t.last_result["loss"] for t in trials.values()) and best["trials"] == 5
    )
    nothing_left_on_ray()


def test_a_sweep_with_a_searcher_resumes_its_search_after_losing_its_driver(
    trials_env, fake_context, tmp_path
):
    """The driver is killed with the searcher's first two trials finished and the next two held
    mid-run. Try 3's driver keeps every asked config: the held two continue from their checkpoints
    with theirs, and the searcher (told the two ended trials) is asked for the last two, past its
    points_to_evaluate, with the run's own ids. No trial runs twice, no result is lost."""
    import ray

    from airflow_trials import OptunaSearch
    from airflow_trials.core.search import choice, uniform
    from airflow_trials.experiment import trial_ids
    from airflow_trials.operators.sweep_operator import SweepLostError

    store = trials_env.store
    store.ensure_experiment("sweep_op", metric="score", mode="max")
    run_pk = store.create_experiment_run("sweep_op", "run5")
    gate = tmp_path / "gate"
    ids = trial_ids("sweep_op", "dag", "run5", 6)
    points = [
        {"scale": 1.0, "hold_at": 99},
        {"scale": 2.0, "hold_at": 99},  # 99: never held (3 iterations)
        {"scale": 3.0, "hold_at": 2},
        {"scale": 3.5, "hold_at": 2},
    ]
    search = OptunaSearch(
        {"scale": uniform(0.5, 4.0), "hold_at": choice([2, 99]), "gate": str(gate)},
        metric="score",
        mode="max",
        points_to_evaluate=points,
        seed=1,
    )
    operator = sweep_operator(
        trials=[{"trial_id": i, "config": {}, "experiment_run_id": run_pk} for i in ids],
        search_alg=search,
        max_concurrent_trials=2,
    )
    with pytest.raises(TaskDeferred) as first:
        operator.execute(fake_context(run_id="run5", try_number=1))
    driver = ray.get_actor("sweep.sweep_op.run5", namespace=NAMESPACE)

    def progressed() -> bool:
        records = {r.trial_id: r for r in store.reader.list_trials(experiment_run_id=run_pk)}
        return all(
            ids[i] in records and records[ids[i]].status.value == "TERMINATED" for i in (0, 1)
        ) and all(ids[i] in records and len(store.reader.get_results(ids[i])) == 1 for i in (2, 3))

    wait_for(progressed, "two trials to finish and two to hold at iteration 2")
    before = {t.trial_id: t.config for t in store.reader.list_trials(experiment_run_id=run_pk)}
    assert sorted(before) == sorted(ids[:4])  # the last two not asked yet: no slot freed
    assert [before[i]["scale"] for i in ids[:4]] == [1.0, 2.0, 3.0, 3.5]
    finished_before = {i: store.reader.get_results(ids[i]) for i in (0, 1)}
    ray.kill(driver, no_restart=True)
    wait_for(lambda: live_trial_actors() == [], "the driver's trials to die with it")
    lost = first_event(first.value.trigger)
    with pytest.raises(SweepLostError):
        operator.execute_complete(fake_context(run_id="run5", try_number=1), lost)

    gate.touch()
    with pytest.raises(TaskDeferred) as third:
        operator.execute(fake_context(run_id="run5", try_number=3))
    summary = operator.execute_complete(
        fake_context(run_id="run5", try_number=3), first_event(third.value.trigger)
    )
    assert (summary["total"], summary["terminated"], summary["errored"]) == (6, 6, 0)
    after = {t.trial_id: t for t in store.reader.list_trials(experiment_run_id=run_pk)}
    assert sorted(after) == sorted(ids)  # the run's ids: no trial added, none lost
    assert all(after[i].config == before[i] for i in ids[:4])  # asked once, kept
    for i in (4, 5):  # asked by the new driver, past points_to_evaluate
        assert after[ids[i]].config["scale"] not in (1.0, 2.0, 3.0, 3.5)
    for i in (0, 1):
        assert store.reader.get_results(ids[i]) == finished_before[i]  # not run again
    for trial_id in ids:
        assert [r["training_iteration"] for r in store.reader.get_results(trial_id)] == [1, 2, 3]
    nothing_left_on_ray()


def test_a_sweep_operators_searcher_needs_its_own_space_and_the_experiments_metric():
    from airflow_trials import OptunaSearch
    from airflow_trials.core.search import uniform

    with pytest.raises(
        ValueError,
        match=r"RunSweepOperator 'sweep': OptunaSearch: the search space has no domain.*"
        r"pass the space to the searcher",
    ):
        sweep_operator(trials=[], search_alg=OptunaSearch())
    with pytest.raises(ValueError, match=r"disagree on metric 'loss' vs 'score'"):
        sweep_operator(trials=[], search_alg=OptunaSearch({"x": uniform(0, 1)}, metric="loss"))
    given = OptunaSearch({"x": uniform(0, 1)})
    operator = sweep_operator(trials=[], search_alg=given)
    assert operator.search_alg is not given and (
        operator.search_alg.metric,
        operator.search_alg.mode,
    ) == ("score", "max")


def test_a_sweep_of_two_metrics_runs_its_multi_objective_search_and_ends_at_the_front(trials_env):
    """sweep=True with metric and mode lists: the driver's OptunaSearch optimises both, ASHA judges
    the one it names, the trials DB records both metrics, and select_best returns the Pareto
    front of the run and the pick, as the mapped path does."""
    from airflow_trials.core.search import choice

    dag = experiment_dag(
        "sweep_two_metrics",
        trainable="tests.trainables:two_metrics",
        metric=["score", "cost"],
        mode=["max", "min"],
        search_space={"scale": choice([1.0, 2.0, 3.0]), "cost": choice([0.5, 5.0])},
        num_samples=4,
        search_alg=Code("__import__('airflow_trials').OptunaSearch(seed=0)"),
        scheduler=Code(
            "__import__('airflow_trials').ASHAScheduler(metric='score', mode='max', "
            "max_t=3, grace_period=1, reduction_factor=2)"
        ),
        sweep=True,
        max_concurrent_trials=2,
    )
    run = dag.test()
    assert run.state == "success", task_states(run)
    store = trials_env.store
    experiment = store.reader.get_experiment("sweep_two_metrics")
    assert (experiment.metrics, experiment.modes) == (["score", "cost"], ["max", "min"])
    (exp_run,) = store.reader.list_experiment_runs("sweep_two_metrics")
    trials = {t.trial_id: t for t in store.reader.list_trials(experiment_run_id=exp_run.id)}
    assert len(trials) == 4 and {t.status.value for t in trials.values()} == {"TERMINATED"}
    assert all(t.config for t in trials.values())  # the driver's searcher chose each config
    values = {i: (t.last_result["score"], t.last_result["cost"]) for i, t in trials.items()}

    def beaten(i):
        return any(
            s >= values[i][0] and c <= values[i][1] and (s, c) != values[i]
            for j, (s, c) in values.items()
            if j != i
        )

    best = xcom(run, "tune.select_best")
    assert {e["trial_id"] for e in best["pareto_front"]} == {i for i in values if not beaten(i)}
    assert best["trial_id"] in {e["trial_id"] for e in best["pareto_front"]}
    summary = xcom(run, "tune.sweep", key="sweep")
    assert summary["metric"] == "score" and summary["terminated"] == 4
    nothing_left_on_ray()
