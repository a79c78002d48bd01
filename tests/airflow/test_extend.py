"""Extending a finished run (``extend_run`` params, ``airflow-trials extend``): new samples and a
raised stop on the mapped path and on the sweep path, with real Airflow (dag.test), real Ray and
the trials store; refusals write nothing."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from airflow_trials.cli import app
from airflow_trials.core.search import grid_search
from tests.airflow.test_early_stopping import SEARCH, UNIFORM, Code
from tests.airflow.test_experiment_dag import experiment_dag, task_states, xcom
from tests.factories import add_checkpoint, add_results

#: A grid and a random key (the trainable ignores it): new samples are new configs.
GRID_AND_NOISE = {"scale": grid_search([1.0, 2.0]), "noise": UNIFORM}
ASHA = Code(
    "__import__('airflow_trials').ASHAScheduler(max_t=3, grace_period=1, reduction_factor=3)"
)


def iterations(store, trial_id):
    return [r["training_iteration"] for r in store.reader.get_results(trial_id)]


# Each path on one backend (the store's extension records have their contract on both, in
# tests/contract/test_store_extensions.py): the mapped path, with the CLI, on PostgreSQL; the sweep
# on SQLite.
@pytest.mark.parametrize(
    ("trials_env_any_db", "sweep"),
    [
        pytest.param("postgresql", False, marks=pytest.mark.postgres, id="postgresql-mapped"),
        pytest.param("sqlite", True, id="sqlite-sweep"),
    ],
    indirect=["trials_env_any_db"],
)
def test_an_extension_continues_finished_trials_and_adds_samples(trials_env_any_db, sweep):
    trials_env = trials_env_any_db
    name = f"extend_{'sweep' if sweep else 'mapped'}"
    dag = experiment_dag(name, search_space=GRID_AND_NOISE, sweep=sweep)
    first = dag.test()
    assert first.state == "success", task_states(first)
    store = trials_env.store
    (run,) = store.reader.list_experiment_runs(name)
    before = {t.trial_id: t for t in store.reader.list_trials(experiment_run_id=run.id)}
    assert all(iterations(store, t) == [1, 2, 3] for t in before)

    conf = {
        "extend_run": run.run_key,
        "extend_num_samples": 1,
        "extend_stop": {"training_iteration": 5},
    }
    extension = dag.test(run_conf=conf)
    assert extension.state == "success", task_states(extension)

    (again,) = store.reader.list_experiment_runs(name)  # the same run, finished again
    assert again.id == run.id and again.status.value == "SUCCESS"
    trials = {t.trial_id: t for t in store.reader.list_trials(experiment_run_id=run.id)}
    assert len(trials) == 4  # two continued + one sample: one pass over a two-value grid
    for trial_id in before:  # continued from the checkpoint at 3: nothing repeated or lost
        assert iterations(store, trial_id) == [1, 2, 3, 4, 5]
        assert trials[trial_id].status.value == "TERMINATED"
    new = [t for t in trials if t not in before]
    assert len(new) == 2 and all(iterations(store, t) == [1, 2, 3, 4, 5] for t in new)
    assert sorted(trials[t].config["scale"] for t in new) == [1.0, 2.0]
    # The pass draws the random key afresh: no new trial repeats a config the run had.
    assert {trials[t].config["noise"] for t in new}.isdisjoint(
        {before[t].config["noise"] for t in before}
    )
    (record,) = store.reader.list_run_extensions(run.id)
    assert record.dag_run_id == extension.run_id and record.status.value == "SUCCESS"
    assert record.stop_before == {"training_iteration": 3}
    assert record.stop_after == {"training_iteration": 5}
    assert sorted(record.trials_continued) == sorted(before) and sorted(
        record.trials_added
    ) == sorted(new)
    best = xcom(extension, "tune.select_best")
    assert best["value"] == 10.0 and best["experiment_run_id"] == run.id

    if sweep:
        return
    # Refused by the DAG run: a stop below the extension's; nothing is written.
    lower = dag.test(
        run_conf={**conf, "extend_num_samples": 0, "extend_stop": {"training_iteration": 4}}
    )
    assert lower.state == "failed"
    assert task_states(lower)[("tune.suggest_configs", -1)] == "failed"
    assert len(store.reader.list_run_extensions(run.id)) == 1
    assert store.reader.list_experiment_runs(name)[0].status.value == "SUCCESS"
    assert all(iterations(store, t) == [1, 2, 3, 4, 5] for t in trials)
    check_the_cli(trials_env, run, record)


def invoke(*args):
    return CliRunner().invoke(app, [str(a) for a in args])


def check_the_cli(trials_env, run, record):
    """``extensions`` shows the record; ``extend`` refuses at once, dry-runs, and triggers a DAG
    run of the experiment's DAG with the params that name the run."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    db = ("--db-url", trials_env.url)
    listed = invoke("extensions", run.id, *db, "--json")
    assert listed.exit_code == 0, listed.output
    (shown,) = json.loads(listed.output)
    assert shown["dag_run_id"] == record.dag_run_id and shown["status"] == "SUCCESS"
    assert shown["stop_after"] == {"training_iteration": 5}

    lower = invoke("extend", run.id, "--stop", "training_iteration=4", *db)
    assert lower.exit_code == 1
    assert f"Run {run.run_key} (id {run.id})" in lower.output and "lowers or drops" in lower.output
    nothing = invoke("extend", run.run_key, *db)
    assert nothing.exit_code == 1 and "would change nothing" in nothing.output

    dry = invoke(
        "extend",
        run.run_key,
        "--num-samples",
        "+2",
        "--stop",
        "training_iteration=7",
        "--dry-run",
        *db,
    )
    assert dry.exit_code == 0, dry.output
    assert (
        "4 trials continue" in dry.output
        and "Dry run: would trigger DAG extend_mapped" in dry.output
    )
    assert (
        "+2 samples (2 pass(es) over the grid's 2 combinations, each drawing noise afresh, as "
        "Ray Tune's num_samples does: 4 new trials)"
    ) in dry.output
    with create_session() as session:
        before = {r.run_id for r in session.query(DagRun).filter(DagRun.dag_id == "extend_mapped")}

    triggered = invoke("extend", run.run_key, "--num-samples", "+2", *db)
    assert triggered.exit_code == 0, triggered.output
    with create_session() as session:
        runs = session.query(DagRun).filter(DagRun.dag_id == "extend_mapped").all()
        (new,) = [r for r in runs if r.run_id not in before]
        assert f"Triggered DAG run {new.run_id} of DAG extend_mapped" in triggered.output
        assert new.conf == {"extend_run": run.run_key, "extend_num_samples": 2, "extend_stop": None}
    assert len(trials_env.store.reader.list_run_extensions(run.id)) == 1  # the DAG run records it


def record_stopped_early(store, run_pk, trial_id):
    from airflow_trials.core.end import TrialEnd
    from airflow_trials.core.fate import Transition
    from airflow_trials.core.status import TrialStatus
    from airflow_trials.core.stop_kind import StopKind

    store.upsert_trial(
        trial_id,
        trainable="tests.trainables:counting",
        config={"scale": 0.1},
        resources={"cpu": 0.5},
        max_failures=0,
        experiment_run_id=run_pk,
    )
    store.record_transition(trial_id, Transition.PLACED)
    add_results(store, trial_id, [{"training_iteration": 1, "score": 0.1}])
    add_checkpoint(store, trial_id, "/nowhere/checkpoint_1", 1)
    store.record_end(
        TrialEnd(
            trial_id,
            "extend_asha",
            TrialStatus.TERMINATED,
            last_result={"training_iteration": 1, "score": 0.1},
            stop_reason="stopped by ASHA at training_iteration=1 (rung 1 of 2): score 0.1 below "
            "the rung's cutoff 1",
            stop_kind=StopKind.SCHEDULER,
        )
    )


def test_an_asha_extension_judges_continued_trials_at_the_new_rungs_only(trials_env, fake_context):
    """ASHA(max_t=3) then stop 9: max_t rises to 9. Trials ASHA stopped early keep that verdict;
    the others continue from iteration 3, judged at the new rung 9 only; the verdicts recorded at
    rungs 1 and 3 stand."""
    dag = experiment_dag(
        "extend_asha",
        search_space={"scale": grid_search([1.0, 2.0, 3.0, 4.0])},
        scheduler=ASHA,
    )
    first = dag.test()
    assert first.state == "success", task_states(first)
    store = trials_env.store
    (run,) = store.reader.list_experiment_runs("extend_asha")
    # dag.test orders the trial tasks its own way, and which trials ASHA stops depends on it: one
    # more, stopped early as a trial's trigger records it, makes that case certain.
    record_stopped_early(store, run.id, "stopped-early")
    before = {t.trial_id: t for t in store.reader.list_trials(experiment_run_id=run.id)}
    rungs_before = {
        t: [(r.milestone, r.value, r.decision) for r in store.reader.trial_rungs(t)] for t in before
    }
    early = {t for t, r in before.items() if r.last_result["training_iteration"] < 3}
    results_before = {t: iterations(store, t) for t in before}
    assert "stopped-early" in early and len(early) < len(before)

    extension = dag.test(
        run_conf={"extend_run": run.run_key, "extend_stop": {"training_iteration": 9}}
    )
    assert extension.state == "success", task_states(extension)
    (record,) = store.reader.list_run_extensions(run.id)
    assert sorted(record.trials_continued) == sorted(set(before) - early)
    after = {t.trial_id: t for t in store.reader.list_trials(experiment_run_id=run.id)}
    for trial_id in early:  # stopped early: unchanged
        assert iterations(store, trial_id) == results_before[trial_id]
        assert after[trial_id].stop_reason == before[trial_id].stop_reason
    reached = []
    for trial_id in record.trials_continued:
        last = after[trial_id].last_result["training_iteration"]
        assert iterations(store, trial_id) == list(range(1, last + 1))  # none repeated or lost
        rungs = [(r.milestone, r.value, r.decision) for r in store.reader.trial_rungs(trial_id)]
        assert rungs[: len(rungs_before[trial_id])] == rungs_before[trial_id]  # verdicts stand
        assert [m for m, _, _ in rungs[len(rungs_before[trial_id]) :]] in ([], [9.0])
        reached.append(last)
    assert 9 in reached and min(reached) > 3  # each continued past its old end

    # New samples of its grid alone would repeat its configs: the DAG run refuses them too.
    from airflow.sdk.exceptions import AirflowFailException

    params = {"extend_run": run.run_key, "extend_num_samples": 1, "extend_stop": None}
    with pytest.raises(AirflowFailException, match="draws nothing at random") as refused:
        dag.get_task("tune.suggest_configs").python_callable(
            ti=fake_context(dag_id="extend_asha", run_id="more")["ti"], params=params, dag=dag
        )
    assert "grid over scale (4 combinations)" in str(refused.value)
    assert len(store.reader.list_run_extensions(run.id)) == 1  # nothing was written


def test_new_samples_of_a_searched_run_ask_the_searcher_after_every_ended_trial(trials_env, capfd):
    dag = experiment_dag(
        "extend_optuna",
        trainable="tests.trainables:quadratic",
        metric="loss",
        mode="min",
        search_space={"x": UNIFORM},
        num_samples=2,
        stop=None,
        search_alg=SEARCH,
        max_concurrent_trials=1,
    )
    assert dag.test().state == "success"
    store = trials_env.store
    (run,) = store.reader.list_experiment_runs("extend_optuna")
    capfd.readouterr()
    extension = dag.test(run_conf={"extend_run": str(run.id), "extend_num_samples": 2})
    assert extension.state == "success", task_states(extension)
    (record,) = store.reader.list_run_extensions(run.id)
    assert len(record.trials_added) == 2 and record.trials_continued == []
    log = capfd.readouterr().out
    learnt = sorted(
        int(
            log.split(f"Trial {t}: OptunaSearch suggests ")[1]
            .split("having learnt from ")[1]
            .split()[0]
        )
        for t in record.trials_added
    )
    assert learnt == [2, 3]  # the run's two ended trials first, then the new one that ended
    trials = store.reader.list_trials(experiment_run_id=run.id)
    assert len(trials) == 4 and {t.status.value for t in trials} == {"TERMINATED"}


def test_an_extension_asks_for_no_more_than_the_dag_allows_a_run(
    trials_env, fake_context, monkeypatch
):
    """extend_num_samples is bounded by the DAG's num_samples Param's maximum, else by
    [airflow_trials] extension_max_num_samples; extend_stop by [airflow_trials]
    extension_max_stop_factor times the run's stopping criterion. A refusal writes nothing."""
    from airflow.sdk import Param
    from airflow.sdk.exceptions import AirflowFailException

    name = "extend_bounded"
    dag = experiment_dag(name, search_space=GRID_AND_NOISE)
    assert dag.test().state == "success"
    store = trials_env.store
    (run,) = store.reader.list_experiment_runs(name)
    suggest = dag.get_task("tune.suggest_configs")

    def extend(num_samples=0, stop=None, key="ext"):
        params = {"extend_run": run.run_key, "extend_num_samples": num_samples, "extend_stop": stop}
        ti = fake_context(dag_id=name, run_id=key)["ti"]
        with pytest.raises(AirflowFailException) as raised:
            suggest.python_callable(ti=ti, params=params, dag=dag)
        return str(raised.value)

    owner = f"Run {run.run_key} (id {run.id}) of experiment {name}"
    assert (
        f"{owner}: 1001 new samples is above 1000, the most one extension may add "
        "([airflow_trials] extension_max_num_samples; raise it to allow more); nothing was "
        "written."
    ) in extend(num_samples=1001)
    assert (
        f"{owner}: the stop training_iteration=31 (at most 30) is above what one extension may "
        "ask for (10 times the run's stopping criterion {'training_iteration': 3}, "
        "[airflow_trials] extension_max_stop_factor; raise it to allow more); nothing was written."
    ) in extend(stop={"training_iteration": 31})
    monkeypatch.setenv("AIRFLOW__AIRFLOW_TRIALS__EXTENSION_MAX_NUM_SAMPLES", "5")
    assert "6 new samples is above 5" in extend(num_samples=6)
    dag.params["num_samples"] = Param(2, type="integer", minimum=1, maximum=4)
    assert (
        "5 new samples is above 4, the most one extension may add (the maximum of the DAG's "
        "num_samples Param; raise it to allow more)"
    ) in extend(num_samples=5)
    assert store.reader.list_run_extensions(run.id) == []

    within = suggest.python_callable(
        ti=fake_context(dag_id=name, run_id="ext_ok")["ti"],
        params={
            "extend_run": run.run_key,
            "extend_num_samples": 4,
            "extend_stop": {"training_iteration": 30},
        },
        dag=dag,
    )
    assert len(within) == 2 + 4 * 2  # both trials continue to 30; four new samples of the grid
    (record,) = store.reader.list_run_extensions(run.id)
    assert record.num_samples_added == 4 and record.stop_after == {"training_iteration": 30}
