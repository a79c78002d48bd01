"""tuning_experiment with several metrics: bad input is refused when the DAG file is parsed, and
the two-objective example DAG (README.md shows it) runs to its Pareto front and its pick."""

from __future__ import annotations

import datetime as dt
import importlib.util
import math
import os
import re
import shutil
from types import SimpleNamespace

import pytest
from airflow.sdk import DAG

from airflow_trials import (
    ASHAScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
    OptunaSearch,
    PopulationBasedTraining,
)
from airflow_trials.core.search import uniform
from airflow_trials.experiment import tuning_experiment
from tests.airflow.conftest import dags_folder
from tests.airflow.test_experiment_dag import xcom
from tests.conftest import REPO

START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
METRICS = {"metric": ["val_acc", "latency"], "mode": ["max", "min"]}
EXAMPLE = "two_objective_tuning.py"


def declare(**kwargs):
    settings = {"search_space": {"x": uniform(0.0, 1.0)}, **METRICS, **kwargs}
    with DAG("several", schedule=None, start_date=START) as dag:
        tuning_experiment(
            experiment_name="bad",
            trainable="tests.trainables:counting",
            group_id="tune",
            **settings,
        )
    return dag


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"mode": ["max"]},
            r"Experiment bad: metric/mode: metric=\['val_acc', 'latency'\] has 2 metrics but "
            r"mode=\['max'\] has 1 modes; give one 'min' or 'max' per metric",
        ),
        (
            {"mode": "max"},
            r"Experiment bad: .*is a list but mode='max' is not; give mode as a list",
        ),
        ({"metric": "val_acc"}, r"Experiment bad: mode=\['max', 'min'\] is a list but metric="),
        (
            {"scheduler": ASHAScheduler()},
            r"Experiment bad: The scheduler AsyncHyperBandScheduler judges trials by one metric "
            r"and cannot take several, but the experiment has \['val_acc', 'latency'\].*"
            r"AsyncHyperBandScheduler\(metric='val_acc', mode='max'\).*"
            r"takes_several_metrics = True",
        ),
        (
            {"scheduler": MedianStoppingRule()},
            r"Experiment bad: The scheduler MedianStoppingRule judges trials by one metric and "
            r"cannot take several",
        ),
        (
            {"scheduler": HyperBandScheduler()},
            r"Experiment bad: The scheduler HyperBandScheduler judges trials by one metric",
        ),
        (
            {"scheduler": PopulationBasedTraining(hyperparam_mutations={"lr": [0.1, 0.2]})},
            r"Experiment bad: The scheduler PopulationBasedTraining judges trials by one metric",
        ),
        (
            {"scheduler": ASHAScheduler(metric="loss", mode="min")},
            r"AsyncHyperBandScheduler judges trials by 'loss', which is not one of the "
            r"experiment's metrics \['val_acc', 'latency'\]",
        ),
        (
            {"scheduler": ASHAScheduler(metric="latency", mode="max")},
            r"disagree on the mode of 'latency': 'max' vs 'min' \(scheduler vs experiment\)",
        ),
        (
            {"pick": {"metric": "accuracy"}},
            r"Experiment bad: select_best: pick=\{'metric': 'accuracy'\} ranks by 'accuracy', "
            r"which is not one of the experiment's metrics \['val_acc', 'latency'\]",
        ),
        (
            {"pick": {"weights": {"val_acc": 1.0, "size": -1.0}}},
            r"pick weights name 'size', which is not one of the experiment's metrics",
        ),
        (
            {"pick": {"weights": {"latency": 0.5}}},
            r"gives? 'latency' \(mode 'min'\) the weight 0.5.*a weight <= 0, e.g. -0.5",
        ),
        (
            {"pick": {"metric": "val_acc", "bounds": {"latency": [9, 1]}}},
            r"pick bounds give 'latency' \[9, 1\], whose low is above its high",
        ),
        (
            {"pick": {"metric": "val_acc", "weights": {"val_acc": 1}}},
            r"is not a pick; give either weights or a metric",
        ),
        (
            {"metric": "val_acc", "mode": "max", "pick": {"metric": "val_acc"}},
            r"Experiment bad: pick=.* chooses among several metrics, but the experiment has one",
        ),
        (
            {"metric": ["m" * 150, "n" * 150], "mode": ["max", "min"]},
            r"Experiment bad: The metrics .* take 319 characters together in the trials DB, "
            r"which holds 250; use shorter result keys",
        ),
        (
            {"search_alg": OptunaSearch(metric="val_acc", mode="max")},
            r"The search_alg and the experiment disagree on metric 'val_acc' vs "
            r"\['val_acc', 'latency'\]",
        ),
    ],
)
def test_bad_several_metrics_are_refused_when_the_dag_is_parsed(kwargs, message):
    with pytest.raises(ValueError, match=message):
        declare(**kwargs)


def test_a_search_alg_with_the_experiment_s_metrics_is_taken():
    dag = declare(search_alg=OptunaSearch(**METRICS), pick={"weights": {"val_acc": 1}})
    searcher = dag.get_task("tune.trial").partial_kwargs["search_alg"]
    assert (searcher.metric, searcher.mode) == (METRICS["metric"], METRICS["mode"])


def test_a_scheduler_judges_one_of_the_metrics_in_its_mode():
    dag = declare(scheduler=ASHAScheduler(metric="latency", max_t=4), search_alg=OptunaSearch())
    trial = dag.get_task("tune.trial")
    # Each suggested trial carries the scheduler's settings (an extension may raise its max_t):
    # the ones the experiment's plan gives its trials.
    suggest = dag.get_task("tune.suggest_configs").python_callable
    (plan,) = [c.cell_contents for c in suggest.__closure__ if hasattr(c.cell_contents, "varying")]
    scheduler = plan.varying(plan.settings)["scheduler"]
    assert (scheduler["metric"], scheduler["mode"], scheduler["max_t"]) == ("latency", "min", 4)
    assert "scheduler" not in trial.partial_kwargs
    # No one metric ranks a trial's checkpoints: the newest are kept.
    assert trial.partial_kwargs["checkpoint_score_attr"] is None
    assert (trial.partial_kwargs["search_alg"].metric, trial.partial_kwargs["search_alg"].mode) == (
        ["val_acc", "latency"],
        ["max", "min"],
    )


def load_example():
    target = os.path.join(dags_folder(), EXAMPLE)
    shutil.copy(os.path.join(REPO, "dags", EXAMPLE), target)
    spec = importlib.util.spec_from_file_location("example_two_objective", target)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_readme_shows_the_two_objective_dag_as_the_example_file_has_it():
    readme = open(os.path.join(REPO, "README.md"), encoding="utf-8").read()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", readme, flags=re.S) if "pick=" in b]
    assert len(blocks) == 1
    dag_file = open(os.path.join(REPO, "dags", EXAMPLE), encoding="utf-8").read()
    assert blocks[0].strip() in dag_file


def asset_extras(uri):
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        query = (
            select(AssetEvent.extra)
            .join(AssetModel, AssetModel.id == AssetEvent.asset_id)
            .where(AssetModel.uri == uri)
        )
        return list(session.scalars(query))


def test_the_two_objective_dag_returns_its_pareto_front_and_the_picked_trial(trials_env):
    module = load_example()
    run = module.dag.test()
    assert run.state == "success"
    store = trials_env.store
    experiment = store.reader.get_experiment("two_objective_tuning")
    assert (experiment.metrics, experiment.modes) == (
        ["val_accuracy", "weight_norm"],
        ["max", "min"],
    )
    (exp_run,) = store.reader.list_experiment_runs("two_objective_tuning")
    trials = store.reader.list_trials(experiment_run_id=exp_run.id)
    assert len(trials) == 6 and all(t.status.value == "TERMINATED" for t in trials)
    # OptunaSearch chose every config.
    assert len({(t.config["lr"], t.config["l2"]) for t in trials}) == 6

    best = xcom(run, "two_objective_tuning.select_best")
    values = {t.trial_id: t.last_result for t in trials}
    front = {entry["trial_id"] for entry in best["pareto_front"]}

    # The front is exactly the trials no other trial beats on both metrics.
    def beaten(i):
        a = values[i]
        return any(
            b["val_accuracy"] >= a["val_accuracy"]
            and b["weight_norm"] <= a["weight_norm"]
            and (b["val_accuracy"], b["weight_norm"]) != (a["val_accuracy"], a["weight_norm"])
            for j, b in values.items()
            if j != i
        )

    assert front == {i for i in values if not beaten(i)} and front
    assert all(best["pareto_ranks"][i] == 0 for i in front)
    assert all(best["pareto_ranks"][i] > 0 for i in set(values) - front)
    assert best["pick"] == {"weights": {"val_accuracy": 1.0, "weight_norm": -0.01}}
    score = {i: v["val_accuracy"] - 0.01 * v["weight_norm"] for i, v in values.items()}
    assert best["trial_id"] == max(sorted(front), key=lambda i: score[i])
    chosen = values[best["trial_id"]]
    assert best["values"] == {
        "val_accuracy": chosen["val_accuracy"],
        "weight_norm": chosen["weight_norm"],
    }
    assert (best["metric"], best["mode"]) == (["val_accuracy", "weight_norm"], ["max", "min"])
    assert best["config"] == next(t.config for t in trials if t.trial_id == best["trial_id"])
    assert best["best_checkpoint"] and best["iteration"] == 4
    assert best["finished_trials"] == 6 and not math.isnan(chosen["weight_norm"])
    # The Asset event carries the same front and choice, for a downstream DAG.
    [extra] = asset_extras("airflow-trials://two_objective_tuning/best")
    assert extra["pareto_front"] == best["pareto_front"]
    assert (extra["trial_id"], extra["pick"]) == (best["trial_id"], best["pick"])
    assert [r.status.value for r in store.reader.list_experiment_runs("two_objective_tuning")] == [
        "SUCCESS"
    ]
    # The pick is in the trials DB too: the Pareto API's picked_trial_id and the run's history.
    from airflow_trials.plugins.datamodels.runs import ParetoOut
    from airflow_trials.plugins.services.pareto_front import of_board

    (exp_run,) = store.reader.list_experiment_runs("two_objective_tuning")
    assert exp_run.picked_trial_id == best["trial_id"]
    view = of_board(store.reader, exp_run, experiment.metrics, experiment.modes, None, None)
    assert ParetoOut.of(view, lambda trial_id: trial_id).picked_trial_id == best["trial_id"]
    (line,) = store.reader.experiment_history("two_objective_tuning").runs
    assert line.run.picked_trial_id == best["trial_id"] and line.num_trials == 6


@pytest.fixture
def trials_db(airflow_home, tmp_path, monkeypatch):
    """A trials DB the hooks find, without Ray: select_best reads it and nothing needs Ray."""
    from airflow_trials.store import TrialStore

    url = f"sqlite:///{tmp_path / 'trials.db'}"
    monkeypatch.setenv("AIRFLOW_TRIALS_DB_URL", url)
    store = TrialStore(url, create=True)
    yield store
    store.dispose()


def finished_run(store, reported, constraints=None):
    """A run of experiment ``bad`` whose trials ended TERMINATED with these last results; the
    experiment records ``constraints``, as the suggest task records its DAG's."""
    from airflow_trials.core.fate import Transition
    from airflow_trials.core.status import TrialStatus
    from airflow_trials.core.update import TrialUpdate

    store.ensure_experiment("bad", **METRICS, constraints=constraints)
    run = store.create_experiment_run("bad", "run1")
    for trial_id, last_result in reported.items():
        store.upsert_trial(
            trial_id,
            trainable="tests.trainables:counting",
            config={"x": len(trial_id)},
            resources={"cpu": 1},
            max_failures=0,
            experiment_run_id=run,
        )
        store.record_transition(trial_id, Transition.PLACED)
        update = TrialUpdate(trial_id, status=TrialStatus.TERMINATED, last_result=last_result)
        store.record_end(update.end("bad", released=True))
    return [{"trial_id": trial_id, "experiment_run_id": run} for trial_id in reported]


def run_select_best(dag, suggested):
    from collections import defaultdict
    from types import SimpleNamespace

    from tests.airflow.conftest import FakeTI

    outlet_events = defaultdict(lambda: SimpleNamespace(extra=None))
    task = dag.get_task("tune.select_best")
    best = task.python_callable(suggested, ti=FakeTI(run_id="run1"), outlet_events=outlet_events)
    [event] = outlet_events.values()
    return best, event.extra


REPORTED = {
    "t-accurate": {"training_iteration": 3, "val_acc": 0.95, "latency": 12.0},
    "t-fast": {"training_iteration": 3, "val_acc": 0.80, "latency": 1.0},
    "t-slow": {"training_iteration": 3, "val_acc": 0.70, "latency": 20.0},
    "t-no-latency": {"training_iteration": 1, "val_acc": 0.99},
}


def test_select_best_without_a_pick_takes_the_front_s_best_first_metric(trials_db):
    suggested = finished_run(trials_db, REPORTED)
    best, extra = run_select_best(declare(), suggested)
    assert best["trial_id"] == "t-accurate" and best["pick"] == {"metric": "val_acc", "bounds": {}}
    assert [e["trial_id"] for e in best["pareto_front"]] == ["t-accurate", "t-fast"]
    assert best["pareto_ranks"] == {"t-accurate": 0, "t-fast": 0, "t-slow": 1}
    assert best["finished_trials"] == 3 and best["trials"] == 4  # one never reported latency
    assert extra == best
    assert trials_db.reader.list_experiment_runs("bad")[0].status.value == "SUCCESS"


def test_select_best_fails_naming_the_front_when_no_trial_meets_the_bounds(trials_db):
    from airflow.sdk.exceptions import AirflowFailException

    suggested = finished_run(trials_db, REPORTED)
    dag = declare(pick={"metric": "val_acc", "bounds": {"latency": [None, 0.5]}})
    with pytest.raises(
        AirflowFailException,
        match=r"Experiment bad, run run1: no finished trial meets the pick, the highest val_acc "
        r"among the trials with latency <= 0.5 .*'trial_id': 't-accurate'.*Loosen the bounds",
    ):
        run_select_best(dag, suggested)


def test_a_warm_start_of_several_metrics_seeds_the_source_s_front_first(tmp_path):
    """warm_start with several metrics: the source's finished trials in its Pareto leaderboard's
    order (the front first, by the first metric), each told to the searcher as the list of its
    last values, from its newest checkpoint, with its last result when a searcher needs it."""
    from airflow_trials import WarmStart
    from airflow_trials.core.search import choice
    from airflow_trials.experiment.warm_start_source import warm_seeds
    from airflow_trials.store import TrialStore
    from tests.pareto_seed import EXPERIMENT, HISTORIES, MODES, RUN_KEY, seed_pareto
    from tests.pareto_seed import METRICS as PARETO_METRICS

    url = seed_pareto(f"sqlite:///{tmp_path / 'trials.db'}").url
    store = TrialStore(url)
    space = {"width": choice([16 * i for i in range(1, 10)])}
    warm = warm_seeds(
        WarmStart(source=RUN_KEY, top_k=4, from_checkpoints=True),
        store,
        EXPERIMENT,
        "night-2",
        space,
        PARETO_METRICS,
        MODES,
        {"ti": SimpleNamespace(dag_id="pareto")},  # the source is a run of this DAG
        None,
        with_results=True,
    )
    assert [trial.trial_id for _, trial in warm.seeds] == ["p-0", "p-3", "p-1", "p-2"]
    config, value, result = warm.points()[0]
    assert config == {"width": 16} and value == [0.9, 30.0]
    assert result["val_acc"] == 0.9 and result["training_iteration"] == len(HISTORIES["p-0"])
    assert warm.entry(0)["restore_path"] == "/ckpt/p-0/2"
    assert warm.origin(warm.seeds[0][1])["value"] == [0.9, 30.0]
    store.dispose()
