"""ASHA on the Airflow path: an experiment DAG run with real Airflow (dag.test), real Ray and a
real trials store, whose trial tasks are judged at ASHA's rungs by their triggers."""

from __future__ import annotations

import datetime as dt

import pytest
from airflow.sdk import DAG

from airflow_trials import ASHAScheduler, HyperBandScheduler, MedianStoppingRule
from airflow_trials.core.search import grid_search
from airflow_trials.core.stop_kind import StopKind
from airflow_trials.experiment import tuning_experiment
from tests.airflow.test_experiment_dag import experiment_dag, task_states, xcom
from tests.conftest import live_placement_groups, live_trial_actors

START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


class Code(str):
    """A DAG-file argument written as code (experiment_dag writes the others with repr)."""

    def __repr__(self) -> str:
        return str(self)


ASHA = Code(
    "__import__('airflow_trials').ASHAScheduler(max_t=9, grace_period=1, reduction_factor=3)"
)


def _run_trials(store, run_pk, scales):
    """Run one trial task per scale, one after another (its trigger's code in the worker)."""
    from airflow_trials.operators.trial_operator import RunTrialOperator
    from tests.airflow.conftest import FakeTI

    states = {}
    for i, scale in enumerate(scales):
        operator = RunTrialOperator(
            task_id="trial",
            trainable="tests.trainables:counting",
            config={"scale": scale},
            experiment_name="asha_op",
            trial_id=f"t{i}",
            experiment_run_id=run_pk,
            deferrable=False,
            scheduler=ASHAScheduler(
                metric="score", mode="max", max_t=9, grace_period=1, reduction_factor=3
            ),
            poll_interval_seconds=0.05,
        )
        states[scale] = operator.execute({"ti": FakeTI(map_index=i)})
    return states


def test_asha_stops_a_trial_at_its_first_rung_and_records_why(trials_env):
    # Scale 1.0, then 3.0, then 2.0; rungs at 1, 3 and 9 (max_t). At rung 1, 3.0 beats the 1.0
    # recorded there (cutoff 1.0); 2.0 falls below the cutoff of (1.0, 3.0), 2.33, and stops there.
    store = trials_env.store
    run_pk = store.create_experiment_run("asha_op", "r1")
    states = _run_trials(store, run_pk, [1.0, 3.0, 2.0])
    trials = {t.config["scale"]: t for t in store.reader.list_trials(experiment_run_id=run_pk)}
    iterations = {
        scale: [r["training_iteration"] for r in store.reader.get_results(t.trial_id)]
        for scale, t in trials.items()
    }
    assert iterations == {
        1.0: list(range(1, 10)),
        3.0: list(range(1, 10)),
        2.0: [1],
    }  # nothing past the rung
    assert {t.status.value for t in trials.values()} == {"TERMINATED"}
    stopped = trials[2.0]
    assert stopped.stop_reason == (
        "stopped by ASHA at training_iteration=1 (rung 1 of 3): score 2 below the rung's cutoff "
        "2.333"
    ), stopped.stop_reason
    assert trials[3.0].stop_reason == "stopped by ASHA at training_iteration=9: it reached max_t=9"
    # The kind travels from the trigger's verdict through the actor's hold to the stored end.
    assert {scale: t.stop_kind for scale, t in trials.items()} == {
        1.0: StopKind.MAX_T,
        3.0: StopKind.MAX_T,
        2.0: StopKind.SCHEDULER,
    }
    assert states[2.0]["stop_kind"] == "scheduler"
    rungs = {
        (scale, r.milestone): (r.value, r.decision.value)
        for scale, t in trials.items()
        for r in store.reader.trial_rungs(t.trial_id)
        if not r.at_end
    }
    assert rungs == {
        (1.0, 1.0): (1.0, "CONTINUE"),
        (1.0, 3.0): (3.0, "CONTINUE"),
        (3.0, 1.0): (3.0, "CONTINUE"),
        (3.0, 3.0): (9.0, "CONTINUE"),
        (2.0, 1.0): (2.0, "STOP"),
    }
    assert (
        states[2.0]["status"] == "TERMINATED" and states[2.0]["stop_reason"] == stopped.stop_reason
    )
    assert live_trial_actors() == [] and live_placement_groups() == []


def test_an_experiment_dag_with_asha_decides_every_rung_as_asha_would(trials_env):
    """The DAG path's wiring; dag.test picks the order the trials run in, so the decisions are
    checked against a replay of ASHA in the order they were recorded."""
    from airflow_trials.schedulers.asha.asha_rungs import AshaRungs, ValueList

    dag = experiment_dag(
        "asha", search_space={"scale": grid_search([1.0, 3.0, 2.0, 2.5])}, stop=None, scheduler=ASHA
    )
    run = dag.test()
    assert run.state == "success", task_states(run)
    store = trials_env.store
    (exp_run,) = store.reader.list_experiment_runs("asha")
    trials = store.reader.list_trials(experiment_run_id=exp_run.id)
    assert len(trials) == 4 and {t.status.value for t in trials} == {"TERMINATED"}
    rows = sorted(
        (r for t in trials for r in store.reader.trial_rungs(t.trial_id) if not r.at_end),
        key=lambda r: r.created_at,
    )
    rungs = AshaRungs(metric="score", mode="max", max_t=9, grace_period=1, reduction_factor=3)
    seen: dict[float, list[float]] = {}
    for row in rows:
        verdict = rungs.decide(0, row.milestone, row.milestone, row.value)(
            ValueList(seen.get(row.milestone, []))
        )
        assert (row.decision, row.reason) == (verdict.decision, verdict.reason), row
        seen.setdefault(row.milestone, []).append(row.value)
    for t in trials:
        stop = next(
            (
                r
                for r in store.reader.trial_rungs(t.trial_id)
                if r.decision.value == "STOP" and not r.at_end
            ),
            None,
        )
        last = stop.iteration if stop else 9
        assert [r["training_iteration"] for r in store.reader.get_results(t.trial_id)] == list(
            range(1, last + 1)
        )
        assert t.stop_reason == (
            stop.reason if stop else "stopped by ASHA at training_iteration=9: it reached max_t=9"
        )
        state = xcom(run, "tune.trial", key="trial", map_index=t.map_index)
        assert state["stop_reason"] == t.stop_reason
    best = xcom(run, "tune.select_best")
    assert (
        best["config"]["scale"] == 3.0 and best["value"] == 27.0
    )  # the best trial is never stopped
    assert live_trial_actors() == [] and live_placement_groups() == []


def test_a_retry_of_a_trial_asha_stopped_reports_its_stored_end(trials_env):
    """Airflow lost the try that recorded the stop: the next try does not resume the trial."""
    from airflow_trials.operators.trial_operator import RunTrialOperator
    from tests.airflow.conftest import FakeTI

    store = trials_env.store
    run_pk = store.create_experiment_run("lost", "r1")
    settings = ASHAScheduler(
        metric="score", mode="max", max_t=9, grace_period=1, reduction_factor=3
    )
    operator = RunTrialOperator(
        task_id="trial",
        trainable="tests.trainables:counting",
        experiment_name="lost",
        trial_id="t1",
        experiment_run_id=run_pk,
        scheduler=settings,
        deferrable=False,
        poll_interval_seconds=0.05,
        max_failures=1,
    )
    first = operator.execute({"ti": FakeTI(try_number=1)})
    assert first["stop_reason"] == "stopped by ASHA at training_iteration=9: it reached max_t=9"
    again = operator.execute({"ti": FakeTI(try_number=2, max_tries=4)})
    assert again["stop_reason"] == first["stop_reason"] and again["status"] == "TERMINATED"
    assert [r["training_iteration"] for r in store.reader.get_results("t1")] == list(range(1, 10))


@pytest.mark.parametrize(
    ("scheduler", "message"),
    [
        (
            HyperBandScheduler(metric="score", mode="max"),
            r"takes scheduler=ASHAScheduler\(\.\.\.\), MOASHA\(\.\.\.\) or "
            r"MedianStoppingRule\(\.\.\.\) only, got "
            r"HyperBandScheduler.*run them on the TrialRunner",
        ),
        (
            MedianStoppingRule(hard_stop=False),
            r"Experiment bad: MedianStoppingRule\(hard_stop=False\) pauses the trials "
            r"it judges worse.*Use hard_stop=True \(the default\)",
        ),
        (MedianStoppingRule(metric="score", mode="min"), r"disagree on mode 'min' vs 'max'"),
        (
            ASHAScheduler(metric="loss", mode="max"),
            r"Experiment bad: The scheduler and the experiment disagree "
            r"on metric 'loss' vs 'score'",
        ),
    ],
)
def test_a_scheduler_the_airflow_path_cannot_run_is_refused_when_the_dag_is_parsed(
    scheduler, message
):
    with pytest.raises(ValueError, match=message):
        with DAG("bad", schedule=None, start_date=START):
            tuning_experiment(
                experiment_name="bad",
                trainable="tests.trainables:counting",
                metric="score",
                mode="max",
                search_space={},
                scheduler=scheduler,
            )


def test_a_trial_task_with_a_scheduler_needs_its_experiment_run():
    from airflow_trials.operators.trial_operator import RunTrialOperator
    from tests.airflow.conftest import FakeTI

    operator = RunTrialOperator(
        task_id="trial",
        trainable="tests.trainables:counting",
        scheduler=ASHAScheduler(metric="score", mode="max"),
    )
    with pytest.raises(
        ValueError,
        match=r"RunTrialOperator 'trial', trial t\w+: scheduler= judges a trial against "
        r"the other trials of its experiment run, so it needs experiment_run_id",
    ):
        operator.execute({"ti": FakeTI()})


SEARCH = Code("__import__('airflow_trials').OptunaSearch(points_to_evaluate=[{'x': 0.9}])")
UNIFORM = Code("__import__('airflow_trials.core.search', fromlist=['uniform']).uniform(0.0, 1.0)")


def test_each_trial_task_asks_the_searcher_after_the_trials_that_ended_before_it(trials_env, capfd):
    from airflow_trials import OptunaSearch
    from airflow_trials.core.search import uniform
    from airflow_trials.operators.tuning import airflow_searcher, ask_seed, ended_trials

    dag = experiment_dag(
        "optuna",
        trainable="tests.trainables:quadratic",
        metric="loss",
        mode="min",
        search_space={"x": UNIFORM},
        num_samples=4,
        stop=None,
        search_alg=SEARCH,
        max_concurrent_trials=1,
    )
    assert dag.get_task("tune.trial").max_active_tis_per_dagrun == 1
    run = dag.test()
    assert run.state == "success", task_states(run)
    store = trials_env.store
    (exp_run,) = store.reader.list_experiment_runs("optuna")
    trials = sorted(
        store.reader.list_trials(experiment_run_id=exp_run.id), key=lambda t: t.map_index
    )
    assert [t.map_index for t in trials] == [0, 1, 2, 3]
    assert trials[0].config == {
        "x": 0.9
    }  # points_to_evaluate[0] is map index 0's, whenever it runs
    # dag.test runs the trial tasks one after another, in an order of its own (not always by map
    # index), so the trial that ran p-th learnt from the p that ran before it, and its config is
    # what a study holding those p trials suggests for its seed and its map index.
    in_store_order = store.reader.list_trials(experiment_run_id=exp_run.id)
    ran = sorted(trials, key=lambda t: t.created_at)
    searcher = airflow_searcher(
        OptunaSearch(points_to_evaluate=[{"x": 0.9}]), {"x": uniform(0.0, 1.0)}, "loss", "min"
    )
    log = capfd.readouterr().out
    for position, trial in enumerate(ran):
        earlier = {t.trial_id for t in ran[:position]}
        finished = ended_trials(
            [t for t in in_store_order if t.trial_id in earlier], "loss", exclude=trial.trial_id
        )
        assert len(finished) == position
        seed = ask_seed(exp_run.id, trial.trial_id)
        assert trial.config == searcher.suggest_after(
            trial.trial_id, finished, trial.map_index, seed
        ), trial.map_index
        assert trial.status.value == "TERMINATED"
        assert (
            f"Trial {trial.trial_id}: OptunaSearch suggests {trial.config}, having learnt from "
            f"{position} ended" in log
        )
    assert len({t.config["x"] for t in trials}) == 4


class _Broken:
    """A searcher that raises when asked, as a bug in a user's sampler would."""

    metric = "loss"

    def suggest_after(self, trial_id, finished, index, seed):
        raise RuntimeError("sampler exploded")


def test_a_searcher_that_raises_fails_its_task_for_good_and_writes_nothing(tmp_path, monkeypatch):
    from airflow.sdk.exceptions import AirflowFailException

    from airflow_trials.operators.trial_operator import RunTrialOperator
    from airflow_trials.store import TrialStore
    from tests.airflow.conftest import FakeTI

    url = f"sqlite:///{tmp_path / 'trials.db'}"
    monkeypatch.setenv("AIRFLOW_TRIALS_DB_URL", url)
    store = TrialStore(url, create=True)
    try:
        run_pk = store.create_experiment_run("broken", "r1")
        operator = RunTrialOperator(
            task_id="trial",
            trainable="tests.trainables:quadratic",
            experiment_name="broken",
            trial_id="t1",
            experiment_run_id=run_pk,
            search_alg=_Broken(),
        )
        with pytest.raises(
            AirflowFailException,
            match=r"Trial t1: _Broken raised RuntimeError when asked for its "
            r"config: sampler exploded\. The trial did not start and nothing "
            r"was written for it.*clear this task",
        ):
            operator.execute({"ti": FakeTI()})
        assert store.reader.list_trials(experiment_run_id=run_pk) == []
    finally:
        store.dispose()
