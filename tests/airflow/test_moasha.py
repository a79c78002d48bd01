"""MOASHA on the Airflow path: trial tasks judged at MOASHA's rungs by their triggers, with real
Airflow (dag.test), real Ray and a real trials store, deciding as the runner's MOASHA does on the
same streams."""

from __future__ import annotations

from airflow_trials import MOASHA, Decision, Trial
from tests.airflow.test_early_stopping import Code
from tests.airflow.test_experiment_dag import experiment_dag, task_states, xcom
from tests.conftest import live_placement_groups, live_trial_actors

METRIC, MODE = ["score", "cost"], ["max", "min"]
SETTINGS = {"max_t": 9, "grace_period": 1, "reduction_factor": 3}  # rungs at 1 and 3, max_t 9
AT_MAX_T = "stopped by MOASHA at training_iteration=9: it reached max_t=9"


def _rung(iteration: int, rung: int, scale: float, cost: float, among: int, score: str) -> str:
    return (
        f"stopped by MOASHA at training_iteration={iteration} (rung {rung} of 3): score "
        f"{iteration * scale:g}, cost {cost:g}; its rank score among the rung's {among} trials "
        f"(Syne Tune 0.16's non-dominated sort) is {score}, above 1/3"
    )


def runner_decisions(store, trial_ids):
    """The runner's MOASHA (its rungs in memory) fed each trial's stored results, trial after
    trial in the order given (the order they ran): its stop reason for each trial, and its rungs.
    Each trial's last stored result is the one it stopped at."""
    scheduler = MOASHA(metric=METRIC, mode=MODE, **SETTINGS)
    reasons = {}
    for trial_id in trial_ids:
        trial = Trial("tests.trainables:two_metrics", trial_id=trial_id)
        scheduler.on_trial_add(trial)
        results = store.reader.get_results(trial_id)
        decisions = [scheduler.on_trial_result(trial, dict(r)) for r in results]
        assert Decision.STOP not in decisions[:-1], (trial_id, decisions)
        assert decisions[-1] is Decision.STOP, (trial_id, decisions)
        scheduler.on_trial_complete(trial, dict(results[-1]))
        reasons[trial_id] = scheduler.decision_reason(trial_id)
    return reasons, scheduler.state


def stored_rungs(store, trial_ids):
    """(trial, milestone) -> the stored verdict, for the rows judged while the trials ran."""
    return {
        (trial_id, r.milestone): r.decision.value
        for trial_id in trial_ids
        for r in store.reader.trial_rungs(trial_id)
        if not r.at_end
    }


def test_moasha_stops_dominated_trials_at_their_rungs_as_on_the_runner(trials_env):
    # The runner's test (tests/integration/test_moasha_runner.py), one trial task after another:
    # "b" is dominated by "a" at rung 1 and stops there; "c" is on a's front at rung 1 (rank score
    # 1/3) and goes on, but stops at rung 3 (1/2); "a" runs to max_t.
    from airflow_trials.operators.trial_operator import RunTrialOperator
    from tests.airflow.conftest import FakeTI

    store = trials_env.store
    run_pk = store.create_experiment_run("moasha_op", "r1")
    configs = {"a": (1.0, 1.0), "b": (0.5, 2.0), "c": (0.5, 0.5)}
    states = {}
    for index, (trial_id, (scale, cost)) in enumerate(configs.items()):
        operator = RunTrialOperator(
            task_id="trial",
            trainable="tests.trainables:two_metrics",
            config={"scale": scale, "cost": cost},
            experiment_name="moasha_op",
            trial_id=trial_id,
            experiment_run_id=run_pk,
            deferrable=False,
            scheduler=MOASHA(metric=METRIC, mode=MODE, **SETTINGS),
            poll_interval_seconds=0.05,
        )
        states[trial_id] = operator.execute({"ti": FakeTI(map_index=index)})

    trials = {t.trial_id: t for t in store.reader.list_trials(experiment_run_id=run_pk)}
    assert {t.status.value for t in trials.values()} == {"TERMINATED"}
    assert {
        trial_id: [r["training_iteration"] for r in store.reader.get_results(trial_id)]
        for trial_id in configs
    } == {"a": list(range(1, 10)), "b": [1], "c": [1, 2, 3]}  # nothing past the rung
    expected = {
        "a": AT_MAX_T,
        "b": _rung(1, 1, 0.5, 2.0, among=2, score="0.5"),
        "c": _rung(3, 2, 0.5, 0.5, among=2, score="0.5"),
    }
    assert {trial_id: t.stop_reason for trial_id, t in trials.items()} == expected
    assert {trial_id: s["stop_reason"] for trial_id, s in states.items()} == expected
    assert stored_rungs(store, configs) == {
        ("a", 1.0): "CONTINUE",
        ("a", 3.0): "CONTINUE",
        ("b", 1.0): "STOP",
        ("c", 1.0): "CONTINUE",
        ("c", 3.0): "STOP",
    }
    # Each rung's row holds the trial's vector, in the order recorded (MOASHA ranks by it).
    assert store.reader.rung_vectors(run_pk, 0, 1) == [(1.0, 1.0), (0.5, 2.0), (0.5, 0.5)]
    assert store.reader.rung_vectors(run_pk, 0, 3) == [(3.0, 1.0), (1.5, 0.5)]
    # The runner's MOASHA decides the same on the same streams.
    reasons, memory = runner_decisions(store, list(configs))
    assert reasons == expected
    for milestone in (1, 3):
        assert memory.rung_vectors(0, milestone) == store.reader.rung_vectors(run_pk, 0, milestone)
    assert live_trial_actors() == [] and live_placement_groups() == []


GRID = Code("__import__('airflow_trials.core.search', fromlist=['x']).grid_search([1.0, 0.5, 0.5])")
COST = Code(
    "__import__('airflow_trials.core.search', fromlist=['x'])"
    ".sample_from('tests.search_functions:inverse_scale')"
)


def test_an_experiment_dag_with_moasha_stops_a_dominated_trial_at_its_first_rung(trials_env):
    """tuning_experiment(metric=[...], scheduler=MOASHA(...)) wires MOASHA to the trial tasks'
    triggers. Trials (score, cost) = (i, 1), (i/2, 2), (i/2, 2): whatever order dag.test runs them
    in, a (i/2, 2) trial that meets the other (i/2, 2) or the (i, 1) one at rung 1 stops there,
    and the (i, 1) trial, which dominates both, is never stopped at a rung."""
    dag = experiment_dag(
        "moasha",
        trainable="tests.trainables:two_metrics",
        metric=METRIC,
        mode=MODE,
        search_space={"scale": GRID, "cost": COST},
        stop=None,
        scheduler=Code(
            "__import__('airflow_trials').MOASHA(max_t=9, grace_period=1, reduction_factor=3)"
        ),
    )
    run = dag.test()
    assert run.state == "success", task_states(run)
    # Each suggested trial carries MOASHA's settings (an extension may raise its max_t).
    for entry in xcom(run, "tune.suggest_configs"):
        assert entry["scheduler"] == {
            "rule": "moasha",
            "metric": METRIC,
            "mode": MODE,
            "time_attr": "training_iteration",
            "brackets": 1,
            **SETTINGS,
        }
    store = trials_env.store
    (exp_run,) = store.reader.list_experiment_runs("moasha")
    ran = sorted(store.reader.list_trials(experiment_run_id=exp_run.id), key=lambda t: t.created_at)
    assert len(ran) == 3 and {t.status.value for t in ran} == {"TERMINATED"}
    ids = [t.trial_id for t in ran]
    dominant = next(t for t in ran if t.config["scale"] == 1.0)
    dominated = [t for t in ran if t.config["scale"] == 0.5]
    assert dominant.stop_reason == AT_MAX_T
    # The (i/2, 2) trial that ran after another trial stops at rung 1; the first to run of them
    # goes on when it ran first of all (alone at its rungs), and stops otherwise.
    first_of_them = dominated[0]
    later = [dominated[1]] + ([first_of_them] if ran[0] is not first_of_them else [])
    for trial in later:
        assert trial.stop_reason.startswith(
            "stopped by MOASHA at training_iteration=1 (rung 1 of 3): score 0.5, cost 2; its "
            "rank score among the rung's "
        ), trial.stop_reason
        assert [r["training_iteration"] for r in store.reader.get_results(trial.trial_id)] == [1]
        assert stored_rungs(store, [trial.trial_id]) == {(trial.trial_id, 1.0): "STOP"}
    # The rung rows hold each trial's vector at the rung, in the order the trials ran.
    vectors = [(t.config["scale"], t.config["cost"]) for t in ran]
    assert store.reader.rung_vectors(exp_run.id, 0, 1) == vectors
    # The runner's MOASHA, fed the same streams in the same order, decides the same.
    reasons, memory = runner_decisions(store, ids)
    assert reasons == {t.trial_id: t.stop_reason for t in ran}
    for milestone in (1, 3):
        assert memory.rung_vectors(0, milestone) == store.reader.rung_vectors(
            exp_run.id, 0, milestone
        )
    for t in ran:
        state = xcom(run, "tune.trial", key="trial", map_index=t.map_index)
        assert state["stop_reason"] == t.stop_reason
    best = xcom(run, "tune.select_best")
    assert best["trial_id"] == dominant.trial_id
    assert [entry["trial_id"] for entry in best["pareto_front"]] == [dominant.trial_id]
    assert live_trial_actors() == [] and live_placement_groups() == []
