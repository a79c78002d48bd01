"""The median stopping rule on the Airflow path: trial tasks with real Airflow (the operator, and
an experiment DAG under dag.test), real Ray and a real trials store, each trial judged by its
trigger at every result from grace_period against the run's running means in the store."""

from __future__ import annotations

from airflow_trials import MedianStoppingRule
from airflow_trials.core.search import grid_search
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.trial import Trial
from tests.airflow.test_early_stopping import Code
from tests.airflow.test_experiment_dag import experiment_dag, task_states, xcom
from tests.conftest import live_placement_groups, live_trial_actors


def test_the_median_rule_stops_trials_below_the_median_at_the_result_that_fell_below(trials_env):
    # score = scale * iteration; grace_period 2. 3.0 runs alone (6 iterations). At iteration 2,
    # 1.0's best 2 is below 3.0's running mean 6: stopped there. 2.0 at 2: best 4 against the
    # median of 3.0's 6 and 1.0's 2 (its last result, added again when it ended) is not below; at
    # 3 (1.0 ended before 3) 6 is below 3.0's mean (6 + 9) / 2.
    from airflow_trials.operators.trial_operator import RunTrialOperator
    from tests.airflow.conftest import FakeTI

    store = trials_env.store
    run_pk = store.create_experiment_run("median_op", "r1")
    states = {}
    for i, scale in enumerate([3.0, 1.0, 2.0]):
        operator = RunTrialOperator(
            task_id="trial",
            trainable="tests.trainables:counting",
            config={"scale": scale},
            experiment_name="median_op",
            trial_id=f"t{i}",
            experiment_run_id=run_pk,
            deferrable=False,
            stopping_criterion={"training_iteration": 6},
            poll_interval_seconds=0.05,
            scheduler=MedianStoppingRule(
                metric="score",
                mode="max",
                time_attr="training_iteration",
                grace_period=2,
                min_samples_required=1,
            ),
        )
        states[scale] = operator.execute({"ti": FakeTI(map_index=i)})
    trials = {t.config["scale"]: t for t in store.reader.list_trials(experiment_run_id=run_pk)}
    iterations = {
        scale: [r["training_iteration"] for r in store.reader.get_results(t.trial_id)]
        for scale, t in trials.items()
    }
    assert iterations == {
        3.0: list(range(1, 7)),
        1.0: [1, 2],
        2.0: [1, 2, 3],
    }  # nothing past the decision
    assert {t.status.value for t in trials.values()} == {"TERMINATED"}
    assert trials[1.0].stop_reason == (
        "stopped by the median stopping rule at training_iteration=2: best score 2 "
        "below the median 6 of 1 other trials' running means"
    )
    assert trials[2.0].stop_reason == (
        "stopped by the median stopping rule at training_iteration=3: best score 6 "
        "below the median 7.5 of 1 other trials' running means"
    )
    assert trials[3.0].stop_reason == "it met its stopping criterion"
    points = {
        scale: [
            (p.iteration, p.decision.value, p.at_end)
            for p in store.reader.trial_median_points(t.trial_id)
        ]
        for scale, t in trials.items()
    }
    assert points == {
        3.0: [(i, "CONTINUE", False) for i in range(2, 7)] + [(6, "CONTINUE", True)],
        1.0: [(2, "STOP", False), (2, "CONTINUE", True)],
        2.0: [(2, "CONTINUE", False), (3, "STOP", False), (3, "CONTINUE", True)],
    }
    assert (
        states[2.0]["status"] == "TERMINATED"
        and states[2.0]["stop_reason"] == trials[2.0].stop_reason
    )
    assert live_trial_actors() == [] and live_placement_groups() == []


MEDIAN = Code(
    "__import__('airflow_trials').MedianStoppingRule(time_attr='training_iteration', "
    "grace_period=2, "
    "min_samples_required=1)"
)


def test_an_experiment_dag_with_the_median_rule_decides_as_the_rule_would(trials_env):
    """The DAG path's wiring (the experiment's metric and mode reach the rule); dag.test runs the
    trials one after another in an order of its own, so the decisions are checked against the
    in-memory rule fed the same results in the order the trials ran."""
    dag = experiment_dag(
        "median",
        search_space={"scale": grid_search([1.0, 3.0, 2.0, 2.5])},
        stop={"training_iteration": 6},
        scheduler=MEDIAN,
    )
    run = dag.test()
    assert run.state == "success", task_states(run)
    store = trials_env.store
    (exp_run,) = store.reader.list_experiment_runs("median")
    trials = sorted(
        store.reader.list_trials(experiment_run_id=exp_run.id), key=lambda t: t.created_at
    )
    assert len(trials) == 4 and {t.status.value for t in trials} == {"TERMINATED"}
    memory = MedianStoppingRule(
        metric="score",
        mode="max",
        time_attr="training_iteration",
        grace_period=2,
        min_samples_required=1,
    )
    for record in trials:
        trial = Trial("tests.trainables:counting", trial_id=record.trial_id)
        memory.on_trial_add(trial)
        trial.set_status(TrialStatus.RUNNING)
        results = store.reader.get_results(record.trial_id)
        decisions = [memory.on_trial_result(trial, dict(r)).value for r in results]
        memory.on_trial_complete(trial, dict(results[-1]))
        # It stopped at its first STOP (nothing trained past it), or ran to its criterion.
        assert "STOP" not in decisions[:-1] and (decisions[-1] == "STOP" or len(results) == 6), (
            decisions
        )
        assert record.stop_reason == (
            memory.decision_reason(record.trial_id) or "it met its stopping criterion"
        )
        stored = [
            p.decision.value
            for p in store.reader.trial_median_points(record.trial_id)
            if not p.at_end
        ]
        assert stored == decisions[1:], (stored, decisions)  # from grace_period on
        assert (
            xcom(run, "tune.trial", key="trial", map_index=record.map_index)["stop_reason"]
            == record.stop_reason
        )
    best = xcom(run, "tune.select_best")
    assert (
        best["config"]["scale"] == 3.0 and best["value"] == 18.0
    )  # the best trial is never stopped
    assert live_trial_actors() == [] and live_placement_groups() == []
