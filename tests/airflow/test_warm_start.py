"""Cross-run warm start on the Airflow path: real Airflow (dag.test), real Ray and a real trials
store. A second run starts with the first run's best configs, from their checkpoints, and says
where each came from; a source that cannot be used is refused, naming why and the fix."""

from __future__ import annotations

import pytest
from airflow.sdk.exceptions import AirflowFailException

from airflow_trials.core.search import uniform
from tests.airflow.test_early_stopping import Code
from tests.airflow.test_experiment_dag import experiment_dag, task_states, xcom
from tests.factories import add_checkpoint, add_results


def warm(**kwargs) -> Code:
    args = ", ".join(f"{k}={v!r}" for k, v in kwargs.items())
    return Code(f"__import__('airflow_trials').WarmStart({args})")


def runs_trials(store, experiment, run_key):
    (run,) = [r for r in store.reader.list_experiment_runs(experiment) if r.run_key == run_key]
    return run, sorted(
        store.reader.list_trials(experiment_run_id=run.id), key=lambda t: t.map_index
    )


@pytest.mark.parametrize("sweep", [False, True], ids=["mapped", "sweep"])
def test_a_second_run_starts_from_the_first_runs_best_trials_and_checkpoints(trials_env, sweep):
    name = f"warm_{'sweep' if sweep else 'mapped'}"
    dag = experiment_dag(
        name,
        search_space={"scale": uniform(0.5, 5.0)},
        num_samples=4,
        sweep=sweep,
        warm_start=warm(top_k=2, from_checkpoints=True),
    )
    first = dag.test()  # the experiment's first run: nothing to warm-start from, a cold start
    assert first.state == "success", task_states(first)
    store = trials_env.store
    _, night1 = runs_trials(store, name, first.run_id)
    assert all(t.warm_start is None for t in night1)
    board = store.reader.leaderboard(night1[0].experiment_run_id, "score", "max")
    top = [row for row in board if row.best_value is not None][:2]

    second = dag.test()
    assert second.state == "success", task_states(second)
    run2, night2 = runs_trials(store, name, second.run_id)
    by_id = {t.trial_id: t for t in night2}
    seeded = [t for t in night2 if t.warm_start is not None]
    assert len(night2) == 4 and len(seeded) == 2
    for trial, source in zip(sorted(seeded, key=lambda t: t.trial_id), top, strict=True):
        assert trial.config == source.config
        assert trial.warm_start == {
            "run_key": first.run_id,
            "experiment_run_id": night1[0].experiment_run_id,
            "trial_id": source.trial_id,
            "value": source.best_value,
            "checkpoint": source.best_checkpoint,
        }
        # It went on from its source's checkpoint at iteration 3, so its first result here is 4.
        assert [r["training_iteration"] for r in store.reader.get_results(trial.trial_id)] == [4]
    if not sweep:
        state = xcom(second, "tune.trial", key="trial", map_index=0)
        assert (
            state["warm_start"]["run_key"] == first.run_id and by_id[state["trial_id"]].warm_start
        )
    else:
        assert xcom(second, "tune.sweep", key="sweep")["warm_started_trials"] == 2
    best = xcom(second, "tune.select_best")
    assert best["value"] >= top[0].best_value and run2.status.value == "SUCCESS"


def test_a_source_that_cannot_be_used_is_refused_before_anything_is_written(
    trials_env, fake_context
):
    dag = experiment_dag(
        "warm_refused",
        search_space={"scale": uniform(0.5, 5.0)},
        num_samples=2,
        warm_start=warm(source="manual__nope"),
    )
    suggest = dag.get_task("tune.suggest_configs")
    with pytest.raises(AirflowFailException) as raised:
        suggest.python_callable(ti=fake_context(run_id="manual__2")["ti"])
    assert str(raised.value) == (
        "Experiment warm_refused, DAG run manual__2: the warm start is refused: experiment "
        "warm_refused has no run "
        "'manual__nope' of DAG dag to warm-start from (latest runs: none); name one of its runs, "
        "'previous' or 'asset', or name the source DAG with WarmStart(dag_id=...) to take another "
        "DAG's run (its checkpoints are code you load). No "
        "trial was started and nothing was written."
    )
    assert trials_env.store.reader.list_experiment_runs() == []

    strict = experiment_dag(
        "warm_strict",
        search_space={"scale": uniform(0.5, 5.0)},
        num_samples=2,
        warm_start=warm(if_missing="error"),
    )
    with pytest.raises(
        AirflowFailException,
        match="experiment warm_strict has no earlier successful run of DAG dag to "
        r"warm-start from \(WarmStart\(if_missing='error'\)\)",
    ):
        strict.get_task("tune.suggest_configs").python_callable(
            ti=fake_context(run_id="manual__3")["ti"]
        )
    assert trials_env.store.reader.list_experiment_runs() == []


def test_a_warm_started_sweeps_searcher_learns_the_seeds_before_its_first_suggestion(trials_env):
    """Night 2 of a sweep with OptunaSearch, one trial at a time: the driver's study holds night
    1's two best configs and values first, then the seeds' own ends tonight; its suggestions are
    exactly what the same seeded study suggests after those, points_to_evaluate after the seeds."""
    from airflow_trials.operators.tuning import airflow_searcher
    from tests.airflow.test_early_stopping import UNIFORM
    from tests.airflow.test_sweep_search import SEEDED_SEARCH, seeded_search

    name = "warm_sweep_optuna"
    dag = experiment_dag(
        name,
        trainable="tests.trainables:quadratic",
        metric="loss",
        mode="min",
        search_space={"x": UNIFORM},
        num_samples=5,
        stop=None,
        search_alg=SEEDED_SEARCH,
        sweep=True,
        max_concurrent_trials=1,
        warm_start=warm(top_k=2),
    )
    assert dag.test().state == "success"
    second = dag.test()
    assert second.state == "success", task_states(second)
    store = trials_env.store
    _, night2 = runs_trials(store, name, second.run_id)
    by_id = {t.trial_id: t for t in night2}
    # suggest_configs registered the trials, the seeds first, and handed on a reference to them:
    # the seeds' origins, and the points the searcher learns first, once
    reference = xcom(second, "tune.suggest_configs")
    run_pk = by_id[night2[0].trial_id].experiment_run_id
    order = [s.trial_id for s in store.reader.run_trial_states(run_pk)]
    seeds, asked = order[:2], order[2:]
    assert reference["num_trials"] == 5 and sorted(reference["origins"]) == sorted(seeds)
    assert all(by_id[t].warm_start for t in seeds) and not any(by_id[t].warm_start for t in asked)

    replay = airflow_searcher(seeded_search(), {"x": uniform(0.0, 1.0)}, "loss", "min")
    for config, value in reference["warm_points"]:  # night 1's best two, as the driver learnt them
        replay.add_evaluated_point(config, value)
    for trial_id in seeds:  # then the seeds' runs tonight, as each ended
        seed = by_id[trial_id]
        source = store.reader.get_trial(seed.warm_start["trial_id"])
        assert seed.config == source.config and seed.warm_start["run_key"] != second.run_id
        replay.add_evaluated_point(seed.config, seed.last_result["loss"])
    for trial_id in asked:
        trial = by_id[trial_id]
        assert trial.config == replay.suggest(trial.trial_id) and trial.warm_start is None
        replay.on_trial_complete(trial.trial_id, trial.last_result)
    assert by_id[asked[0]].config == {"x": 0.9}
    assert len(night2) == 5 and {t.status.value for t in night2} == {"TERMINATED"}


def _finished_run(store, experiment, dag_id, run_key, scale) -> str:
    """A run of ``experiment`` on ``dag_id`` that ended SUCCESS with one finished trial (config
    scale, its checkpoint); returns the checkpoint's path."""
    from airflow_trials.core.end import TrialEnd
    from airflow_trials.core.fate import Transition
    from airflow_trials.core.status import TrialStatus

    store.ensure_experiment(experiment, metric="score", mode="max")
    run = store.create_experiment_run(experiment, run_key, dag_id=dag_id, run_id=run_key)
    trial_id, checkpoint = f"{dag_id}-{run_key}-0", f"/ckpt/{dag_id}/{run_key}/1"
    store.upsert_trial(
        trial_id,
        trainable="tests.trainables:counting",
        config={"scale": scale},
        resources={"cpu": 1},
        max_failures=0,
        experiment_run_id=run,
        dag_id=dag_id,
        run_id=run_key,
        task_id="tune.trial",
        map_index=0,
    )
    store.record_transition(trial_id, Transition.PLACED)
    add_results(store, trial_id, [{"training_iteration": 1, "score": scale}])
    add_checkpoint(store, trial_id, checkpoint, 1, score=scale)
    store.record_end(TrialEnd(trial_id, experiment, TrialStatus.TERMINATED))
    store.finish_experiment_run(run, "SUCCESS")
    return checkpoint


def test_a_warm_start_takes_no_run_of_another_dag_unless_the_dag_names_it(
    trials_env_any_db, fake_context
):
    """Two DAGs share experiment name "shared": tune_a's warm start takes tune_a's run, never the
    newer run of other_team (whose checkpoints are pickles that team wrote), unless it names
    other_team as the source DAG."""
    store = trials_env_any_db.store
    ours = _finished_run(store, "shared", "tune_a", "night1", 2.0)
    theirs = _finished_run(store, "shared", "other_team", "night2", 4.0)

    def suggest(**warm_start):
        dag = experiment_dag(
            "shared",
            search_space={"scale": uniform(0.5, 5.0)},
            num_samples=2,
            warm_start=warm(from_checkpoints=True, **warm_start),
        )
        ti = fake_context(dag_id="tune_a", run_id=f"manual__{len(warm_start)}")["ti"]
        return dag.get_task("tune.suggest_configs").python_callable(ti=ti)

    entries = suggest()  # "previous": the newest run of this experiment on this DAG
    assert entries[0]["warm_start"]["run_key"] == "night1" and entries[0]["restore_path"] == ours
    assert all(e.get("restore_path") != theirs for e in entries)
    with pytest.raises(AirflowFailException) as raised:
        suggest(source="night2")  # another DAG's run key, not named
    assert (
        "experiment shared has no run 'night2' of DAG tune_a to warm-start from (latest runs: "
        "night1, manual__0); name one of its runs, 'previous' or 'asset', or name the source DAG "
        "with WarmStart(dag_id=...) to take another DAG's run (its checkpoints are code you load)"
    ) in str(raised.value)
    named = suggest(dag_id="other_team", source="previous")
    assert named[0]["warm_start"]["run_key"] == "night2" and named[0]["restore_path"] == theirs
