"""OptunaSearch with several metrics (Ray Tune's ``metric=[...], mode=[...]``), checked against
Optuna run directly, and on the TrialRunner without Ray: schedulers that cannot take several
metrics are refused before any trial starts. Also runs docs/engine.md's example of it."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import optuna
import pytest
from optuna.study import StudyDirection
from optuna.trial import TrialState

from airflow_trials import (
    ASHAScheduler,
    FIFOScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
    OptunaSearch,
    PopulationBasedTraining,
    Trial,
    TrialRunner,
    TrialStatus,
)
from airflow_trials.core.pareto import pareto_ranks
from airflow_trials.core.search import uniform
from airflow_trials.core.searcher import agree_on_metric, ended_trial_values
from airflow_trials.execution.driver.suggest import SearchDriver
from tests.unit.test_searcher import LocalExecutor

REPO = Path(__file__).resolve().parents[2]
SPACE = {"x": uniform(0, 1), "y": uniform(0, 1)}
METRICS, MODES = ["acc", "cost"], ["max", "min"]


def objective(params) -> tuple[float, float]:
    """Accuracy peaks at x = 0.7; cost grows with x and y: a trade-off with a real front."""
    return 1 - (params["x"] - 0.7) ** 2, params["x"] + 0.5 * params["y"]


def result(params, iteration=1) -> dict:
    acc, cost = objective(params)
    return {"acc": acc, "cost": cost, "training_iteration": iteration}


@pytest.mark.parametrize(
    "sampler",
    [
        lambda: optuna.samplers.NSGAIISampler(seed=0, population_size=4),
        lambda: optuna.samplers.TPESampler(seed=0, n_startup_trials=4),
        None,  # the default: TPESampler(seed=0), multi-objective past its 10 random startups
    ],
    ids=["nsga2", "tpe", "default"],
)
def test_the_study_is_what_optuna_makes_of_the_same_asks_and_tells(sampler):
    search = OptunaSearch(
        SPACE,
        metric=METRICS,
        mode=MODES,
        **({"sampler": sampler()} if sampler else {"seed": 0}),
    )
    direct = optuna.create_study(
        directions=["maximize", "minimize"],
        sampler=sampler() if sampler else optuna.samplers.TPESampler(seed=0),
    )
    distributions = OptunaSearch.convert_search_space(SPACE)
    for i in range(14):
        config = search.suggest(f"t{i}")
        for iteration in (1, 2):  # results are not reported: Optuna keeps none for several
            search.on_trial_result(f"t{i}", result(config, iteration))
        search.on_trial_complete(f"t{i}", result(config, 2))
        trial = direct.ask(fixed_distributions=distributions)
        direct.tell(trial, list(objective(trial.params)))

    study = search.study
    assert study.directions == [StudyDirection.MAXIMIZE, StudyDirection.MINIMIZE]
    assert [(t.params, t.values, t.state) for t in study.trials] == [
        (t.params, t.values, t.state) for t in direct.trials
    ]
    assert [t.number for t in study.best_trials] == [t.number for t in direct.best_trials]
    assert all(t.intermediate_values == {} for t in study.trials)
    # Optuna's front is rank 0 of core/pareto.py's ranks
    ranks = pareto_ranks([t.values for t in study.trials], MODES)
    assert sorted(t.number for t in study.best_trials) == [
        i for i, rank in enumerate(ranks) if rank == 0
    ]
    assert 1 < len(study.best_trials) < 14


def test_a_result_without_one_of_the_metrics_is_the_same_clear_error():
    search = OptunaSearch(SPACE, metric=METRICS, mode=MODES, seed=0)
    search.suggest("t0")
    with pytest.raises(
        ValueError,
        match=r"Trial t0 reported a result without 'cost', one of the metrics OptunaSearch "
        r"optimises \(\['acc', 'cost'\]; it reported \['acc', 'training_iteration'\]\); report "
        r"every one of them in every result",
    ):
        search.on_trial_complete("t0", {"acc": 0.5, "training_iteration": 1})


def test_an_error_is_fail_and_an_end_before_any_result_is_pruned():
    search = OptunaSearch(SPACE, metric=METRICS, mode=MODES, seed=0)
    for trial_id in ("ok", "failed", "never-reported"):
        search.suggest(trial_id)
    search.on_trial_complete("ok", {"acc": 0.9, "cost": 0.3})
    search.on_trial_complete("failed", error=True)
    search.on_trial_complete("never-reported", None)
    assert [(t.state, t.values) for t in search.study.trials] == [
        (TrialState.COMPLETE, [0.9, 0.3]),
        (TrialState.FAIL, None),
        (TrialState.PRUNED, None),
    ]
    with pytest.raises(ValueError, match="did not suggest trial other"):
        search.on_trial_result("other", {"acc": 1.0, "cost": 1.0})


def test_evaluated_points_and_rewards_take_one_value_per_metric():
    search = OptunaSearch(
        SPACE,
        metric=METRICS,
        mode=MODES,
        seed=0,
        points_to_evaluate=[{"x": 0.1, "y": 0.1}],
        evaluated_rewards=[[0.5, 0.15]],
    )
    search.add_evaluated_point({"x": 0.7, "y": 0.0}, [1.0, 0.7])
    search.add_evaluated_point({"x": 0.2, "y": 0.2}, None, error=True)
    assert [(t.params, t.values, t.state) for t in search.study.trials] == [
        ({"x": 0.1, "y": 0.1}, [0.5, 0.15], TrialState.COMPLETE),
        ({"x": 0.7, "y": 0.0}, [1.0, 0.7], TrialState.COMPLETE),
        ({"x": 0.2, "y": 0.2}, None, TrialState.FAIL),
    ]
    with pytest.raises(
        ValueError,
        match=r"add_evaluated_point value is 0.5, but it optimises 2 metrics, \['acc', 'cost'\]; "
        r"give a list of one value per metric",
    ):
        search.add_evaluated_point({"x": 0.3, "y": 0.3}, 0.5)
    with pytest.raises(ValueError, match=r"add_evaluated_point value is \[0.5\], but it optim"):
        search.add_evaluated_point({"x": 0.3, "y": 0.3}, [0.5])
    with pytest.raises(ValueError, match="keeps no intermediate values for several objectives"):
        search.add_evaluated_point({"x": 0.3, "y": 0.3}, [0.5, 0.5], intermediate_values=[0.1])
    with pytest.raises(ValueError, match=r"evaluated_rewards\[0\] is 0.5, but it optimises 2"):
        OptunaSearch(
            SPACE,
            metric=METRICS,
            mode=MODES,
            points_to_evaluate=[{"x": 0.1, "y": 0.1}],
            evaluated_rewards=[0.5],
        )


def test_the_airflow_paths_ask_learns_finished_trials_with_several_values():
    """suggest_after builds a study of the run's ended trials (as a trial task and a resumed
    sweep rebuild the searcher from the trials DB)."""
    search = OptunaSearch(SPACE, metric=METRICS, mode=MODES, seed=0)
    finished = [({"x": 0.1, "y": 0.1}, [0.64, 0.15]), ({"x": 0.9, "y": 0.5}, None)]
    config = search.suggest_after("t3", finished, index=2, seed=7)
    assert set(config) == {"x", "y"} and 0 <= config["x"] <= 1
    assert search.suggest_after("t3", finished, index=2, seed=7) == config  # one seed, one point
    with pytest.raises(ValueError, match=r"finished trial 0's value is 0.64, but it optimises 2"):
        search.suggest_after("t3", [({"x": 0.1, "y": 0.1}, 0.64)], index=0, seed=7)
    records = [
        SimpleNamespace(
            trial_id="a", config={"x": 0.1}, status=TrialStatus.TERMINATED, last_result=result
        )
        for result in [{"acc": 0.5, "cost": 0.2}]
    ] + [
        SimpleNamespace(trial_id="b", config={"x": 0.2}, status=TrialStatus.ERROR, last_result={}),
        SimpleNamespace(  # stopped before it reported both: nothing to learn
            trial_id="c", config={"x": 0.3}, status=TrialStatus.TERMINATED, last_result={"acc": 1}
        ),
    ]
    assert ended_trial_values(records, METRICS) == [
        ("a", {"x": 0.1}, [0.5, 0.2]),
        ("b", {"x": 0.2}, None),
    ]
    assert ended_trial_values(records, "acc")[-1] == ("c", {"x": 0.3}, 1.0)  # one, as before


def test_a_resume_reseeds_the_sampler_as_with_one_metric():
    one = OptunaSearch(SPACE, metric="acc", mode="max", seed=0)
    several = OptunaSearch(SPACE, metric=METRICS, mode=MODES, seed=0)
    for search in (one, several):
        search.resume_after(3)
    # TPE's first draws are random, whatever the directions: the same reseeded points
    assert [several.suggest(f"t{i}") for i in range(3)] == [one.suggest(f"t{i}") for i in range(3)]
    fresh = OptunaSearch(SPACE, metric=METRICS, mode=MODES, seed=0)
    assert fresh.suggest("t0") != several.study.trials[0].params


# -- on the TrialRunner, without Ray ---------------------------------------------------------


class TwoMetricExecutor(LocalExecutor):
    """LocalExecutor's trials, each result with ``acc`` and ``cost`` of its config."""

    def fetch_result(self, trial):
        return {**super().fetch_result(trial), **result(trial.config)}


def _runner(tmp_path, search, scheduler=None, num_samples=6):
    executor = TwoMetricExecutor(str(tmp_path), lambda config: 0.0)
    runner = TrialRunner(
        "exp",
        executor=executor,
        search_alg=search,
        num_samples=num_samples,
        trainable="tests.trainables:quadratic",
        scheduler=scheduler,
    )
    return runner, executor


def test_the_runner_tells_the_searcher_every_trials_metrics(tmp_path):
    search = OptunaSearch(SPACE, metric=METRICS, mode=MODES, seed=0)
    runner, _ = _runner(tmp_path, search)

    trials = runner.run()

    assert {t.status for t in trials} == {TrialStatus.TERMINATED} and len(trials) == 6
    told = search.study.trials
    assert [t.state for t in told] == [TrialState.COMPLETE] * 6
    assert sorted((tuple(t.params.values()), tuple(t.values)) for t in told) == sorted(
        ((t.config["x"], t.config["y"]), (t.last_result["acc"], t.last_result["cost"]))
        for t in trials
    )
    assert all(t.intermediate_values == {} for t in told)


@pytest.mark.parametrize(
    "scheduler",
    [
        ASHAScheduler(),
        HyperBandScheduler(),
        MedianStoppingRule(),
        PopulationBasedTraining(hyperparam_mutations={"x": uniform(0, 1)}),
    ],
    ids=lambda s: type(s).__name__,
)
def test_a_scheduler_that_cannot_take_several_metrics_is_refused_before_any_trial(
    tmp_path, scheduler
):
    search = OptunaSearch(SPACE, metric=METRICS, mode=MODES, seed=0)
    name = type(scheduler).__name__
    with pytest.raises(
        ValueError,
        match=rf"The scheduler {name} judges trials by one metric, but the searcher OptunaSearch "
        r"optimises several: \['acc', 'cost'\] \(modes \['max', 'min'\]\).*pass one metric to "
        rf"the scheduler, e\.g\. {name}\(metric='acc', mode='max'\), or use FIFOScheduler",
    ):
        _runner(tmp_path, search, scheduler)
    assert search._ot_trials == {} and scheduler.metric is None  # nothing was asked or set


def test_a_scheduler_of_one_of_the_metrics_judges_it_in_the_searchers_mode(tmp_path):
    search = OptunaSearch(SPACE, metric=METRICS, mode=MODES, seed=0)
    scheduler = ASHAScheduler(metric="cost", max_t=2, grace_period=1, reduction_factor=2)
    runner, _ = _runner(tmp_path, search, scheduler, num_samples=4)
    assert (scheduler.metric, scheduler.mode) == ("cost", "min")  # its mode, from the searcher
    assert {t.status for t in runner.run()} == {TrialStatus.TERMINATED}
    assert [t.state for t in search.study.trials] == [TrialState.COMPLETE] * 4

    _runner(tmp_path, search, FIFOScheduler())  # judges no metric
    with pytest.raises(
        ValueError,
        match=r"judges trials by 'loss', which is not one of the metrics \['acc', 'cost'\]",
    ):
        agree_on_metric(ASHAScheduler(metric="loss", mode="min"), search)
    with pytest.raises(
        ValueError, match=r"disagree on the mode of 'acc': 'min' vs 'max' \(scheduler vs searcher"
    ):
        agree_on_metric(ASHAScheduler(metric="acc", mode="min"), search)


def test_a_scheduler_given_several_metrics_is_refused_when_made():
    with pytest.raises(
        ValueError,
        match=r"AsyncHyperBandScheduler judges trials by one metric, got metric=\['acc', "
        r"'cost'\]; pass one metric to the scheduler.*or use FIFOScheduler",
    ):
        ASHAScheduler(metric=METRICS, mode="max")
    scheduler = MedianStoppingRule()
    with pytest.raises(ValueError, match=r"MedianStoppingRule judges trials by one metric"):
        scheduler.set_search_properties(METRICS, None)


def test_a_resumed_search_learns_adopted_trials_with_every_metric(tmp_path):
    """The sweep driver's resume, with several metrics: ended trials and the adopted trial's end
    are told with one value per metric."""
    search = OptunaSearch(SPACE, metric=METRICS, mode=MODES, seed=0)
    driver = SearchDriver(
        search, 1, "tests.trainables:quadratic", {}, "exp", trial_ids=["run_0002"]
    )
    adopted = Trial(
        "tests.trainables:quadratic",
        {"x": 0.5, "y": 0.5},
        trial_id="run_0001",
        experiment_name="exp",
    )
    driver.resume([("run_0000", {"x": 0.1, "y": 0.1}, [0.64, 0.15])], [adopted], asked=1)
    executor = TwoMetricExecutor(str(tmp_path), lambda config: 0.0, slots=1)
    runner = TrialRunner("exp", executor=executor, search_alg=driver)
    runner.add_trial(adopted)

    runner.run()

    told = [(t.params, t.values) for t in search.study.trials]
    assert told[0] == ({"x": 0.1, "y": 0.1}, [0.64, 0.15])
    assert told[1] == ({"x": 0.5, "y": 0.5}, pytest.approx(list(objective({"x": 0.5, "y": 0.5}))))
    assert len(told) == 3  # and the one trial it suggested


# -- docs/engine.md --------------------------------------------------------------------------


def test_the_engine_docs_example_of_several_metrics_runs():
    text = (REPO / "docs" / "engine.md").read_text(encoding="utf-8")
    blocks = re.findall(
        r"<!-- runs: tests/unit/test_optuna_multi_objective.py -->\n```python\n(.*?)```",
        text,
        re.S,
    )
    assert len(blocks) == 1
    namespace: dict = {}
    exec(compile(blocks[0], "docs/engine.md", "exec"), namespace)
    front = namespace["front"]
    assert 2 <= len(front) < 30 and all(len(t.values) == 2 for t in front)
