"""Searchers on the runner path without Ray: ConcurrencyLimiter, SearchDriver and the runner's
search loop."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from airflow_trials import (
    ConcurrencyLimiter,
    OptunaSearch,
    Searcher,
    SearcherError,
    Trial,
    TrialRunner,
    TrialStatus,
)
from airflow_trials.core.result import TRAINING_ITERATION
from airflow_trials.core.search import uniform
from airflow_trials.execution.driver.suggest import SearchDriver
from airflow_trials.storage.trial_storage import TrialStorage


class ListSearcher(Searcher):
    """Suggests ``{"x": x}`` for each x in turn, then FINISHED; records every call it gets."""

    def __init__(self, xs, *, finish=True, raise_on=None):
        super().__init__(metric="loss", mode="min")
        self.xs = list(xs)
        self.finish = finish
        self.raise_on = raise_on  # (hook, call number): raise RuntimeError there
        self.calls: list[tuple] = []

    def _maybe_raise(self, hook):
        if (
            self.raise_on
            and self.raise_on[0] == hook
            and sum(c[0] == hook for c in self.calls) == self.raise_on[1]
        ):
            raise RuntimeError(f"{hook} broke")

    def suggest(self, trial_id):
        self.calls.append(("suggest", trial_id))
        self._maybe_raise("suggest")
        if not self.xs:
            return Searcher.FINISHED if self.finish else None
        return {"x": self.xs.pop(0)}

    def on_trial_result(self, trial_id, result):
        self.calls.append(("result", trial_id, result[TRAINING_ITERATION]))
        self._maybe_raise("result")

    def on_trial_complete(self, trial_id, result=None, error=False):
        self.calls.append(("complete", trial_id, None if result is None else result["loss"], error))


class LocalExecutor:
    """The runner's executor for tests without Ray: each trial reports ``loss = objective(config)``
    ``iterations`` times, one result per fetch, the running trials taking turns; ``slots`` at
    once."""

    def __init__(
        self,
        storage_path: str,
        objective: Callable[[dict], float],
        iterations: int = 3,
        slots: int = 2,
    ):
        self.storage = TrialStorage(storage_path)
        self.objective = objective
        self.iterations = iterations
        self.slots = slots
        self.running: list[Trial] = []
        self.most_running = 0
        self._iteration: dict[str, int] = {}

    @property
    def actors(self):
        """The actor client RayTrialExecutor composes: here the fake answers its cluster questions
        (check_fits_cluster, refresh_cluster_resources) itself."""
        return self

    def check_fits_cluster(self, trial):
        pass

    def has_resources(self, resources):
        return len(self.running) < self.slots

    could_start = has_resources  # has_resources has no effect here

    hand_over = False  # no actors to hand over (execution/driver/hand_over.py)

    def reserved_trial_ids(self):
        return set()

    def take_handed_over(self):
        return []

    def handed_over(self, trial):
        return False

    def start_trial(self, trial, checkpoint_path=None, train=True, run_ahead_below=0):
        trial.set_status(TrialStatus.RUNNING)
        self.running.append(trial)
        self.most_running = max(self.most_running, len(self.running))
        self._iteration[trial.trial_id] = 0
        return True

    def get_running_trials(self):
        return list(self.running)

    def get_next_available_trial(self, timeout_s=None):
        trial = self.running.pop(0)
        self.running.append(trial)
        return trial

    def fetch_result(self, trial):
        self._iteration[trial.trial_id] += 1
        i = self._iteration[trial.trial_id]
        return {
            "loss": self.objective(trial.config),
            TRAINING_ITERATION: i,
            "done": i == self.iterations,
        }

    def continue_training(self, trial, run_ahead_below=0, successor=None):
        pass

    def stop_trial(self, trial, error=False, error_msg=None):
        if trial in self.running:
            self.running.remove(trial)
        trial.set_status(TrialStatus.ERROR if error else TrialStatus.TERMINATED)

    def has_cached_slots(self):
        return False

    def refresh_cluster_resources(self, force=False):
        pass

    def cleanup(self):
        pass


def _runner(tmp_path, search_alg, num_samples, objective=lambda c: (c["x"] - 0.3) ** 2, **kwargs):
    executor = LocalExecutor(str(tmp_path), objective, slots=kwargs.pop("slots", 2))
    runner = TrialRunner(
        "exp",
        executor=executor,
        search_alg=search_alg,
        num_samples=num_samples,
        trainable="tests.trainables:quadratic",
        **kwargs,
    )
    return runner, executor


def test_optuna_on_the_runner_gets_every_result_and_end(tmp_path):
    search = OptunaSearch({"x": uniform(0, 1)}, metric="loss", mode="min", seed=0)
    runner, executor = _runner(tmp_path, search, 6, trial_kwargs={"max_failures": 2})

    trials = runner.run()

    assert len(trials) == 6 and {t.status for t in trials} == {TrialStatus.TERMINATED}
    assert {t.max_failures for t in trials} == {2} and executor.most_running == 2
    done = search.study.trials
    assert [t.state.name for t in done] == ["COMPLETE"] * 6
    assert [sorted(t.intermediate_values) for t in done] == [[1, 2, 3]] * 6
    by_x = {t.params["x"]: t.value for t in done}
    assert by_x == {t.config["x"]: t.last_result["loss"] for t in trials}


def test_the_searcher_is_asked_only_when_a_slot_is_free_and_stops_at_num_samples(tmp_path):
    searcher = ListSearcher([0.1, 0.2, 0.3, 0.4, 0.5])
    runner, executor = _runner(tmp_path, searcher, 3)

    trials = runner.run()

    assert [t.config for t in trials] == [{"x": 0.1}, {"x": 0.2}, {"x": 0.3}]
    suggests = [c for c in searcher.calls if c[0] == "suggest"]
    assert len(suggests) == 3 and executor.most_running == 2
    # The third trial was suggested only after the first one ended and freed its slot.
    third = searcher.calls.index(suggests[2])
    assert ("complete", trials[0].trial_id, pytest.approx(0.04), False) in searcher.calls[:third]
    assert [c for c in searcher.calls if c[0] == "complete"] == [
        ("complete", t.trial_id, pytest.approx((t.config["x"] - 0.3) ** 2), False) for t in trials
    ]


def test_finished_ends_the_search_before_num_samples(tmp_path):
    runner, _ = _runner(tmp_path, ListSearcher([0.1, 0.2]), 10)
    trials = runner.run()
    assert [t.config["x"] for t in trials] == [0.1, 0.2] and runner.is_finished()


def test_concurrency_limiter_keeps_one_trial_at_a_time(tmp_path):
    inner = ListSearcher([0.1, 0.2, 0.3])
    runner, executor = _runner(tmp_path, ConcurrencyLimiter(inner, max_concurrent=1), 3)

    trials = runner.run()

    assert len(trials) == 3 and executor.most_running == 1
    kinds = [c[0] for c in inner.calls]
    assert kinds == ["suggest", "result", "result", "result", "complete"] * 3


def test_a_searcher_that_raises_mid_run_stops_the_trials_and_keeps_the_results(tmp_path):
    searcher = ListSearcher([0.1, 0.2, 0.3], raise_on=("result", 3))
    runner, _ = _runner(tmp_path, searcher, 3)

    with pytest.raises(SearcherError) as e:
        runner.run()

    assert str(e.value).startswith(
        "Search algorithm ListSearcher of experiment exp raised RuntimeError in on_trial_result() "
        "for trial "
    )
    assert isinstance(e.value.__cause__, RuntimeError) and str(e.value.__cause__) == "result broke"
    trials = runner.get_trials()
    assert len(trials) == 2 and {t.status for t in trials} == {TrialStatus.TERMINATED}
    assert len(runner.results()) == 3  # the third, which it raised on, is recorded too
    assert runner.is_finished()
    assert searcher.calls[-1][0] == "result"  # not called again after it raised


def test_a_searcher_that_has_nothing_while_nothing_runs_is_an_error(tmp_path):
    runner, _ = _runner(tmp_path, ListSearcher([0.1], finish=False), 5)
    with pytest.raises(
        SearcherError,
        match=r"returned None for trial \w+_00002 while no trial .* return Searcher.FINISHED",
    ):
        runner.run()
    assert [t.status for t in runner.get_trials()] == [TrialStatus.TERMINATED]


def test_a_suggestion_that_is_not_a_config_is_an_error_naming_the_searcher(tmp_path):
    class Bad(ListSearcher):
        def suggest(self, trial_id):
            return ["x", 0.1]

    runner, _ = _runner(tmp_path, Bad([]), 2)
    with pytest.raises(
        SearcherError, match=r"Search algorithm Bad of experiment exp suggested list \['x', 0.1\]"
    ):
        runner.run()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"search_alg": None, "trainable": "tests.trainables:quadratic"}, "pass search_alg= too"),
        ({"num_samples": 0}, "num_samples must be a whole number >= 1, got 0"),
        ({"trainable": None}, "pass trainable='my_pkg.train:train' too"),
        ({"trial_kwargs": {"config": {}}}, "trial_kwargs cannot set ['config']"),
        ({"trial_kwargs": {"max_failure": 1}}, "unexpected keyword argument 'max_failure'"),
        ({"resume": True}, "cannot resume a search_alg yet"),
    ],
)
def test_search_arguments_that_clash_are_refused(tmp_path, kwargs, message):
    settings = {
        "search_alg": ListSearcher([0.1]),
        "num_samples": 2,
        "trainable": "tests.trainables:quadratic",
    }
    with pytest.raises(ValueError) as e:
        TrialRunner("exp", executor=LocalExecutor(str(tmp_path), abs), **{**settings, **kwargs})
    assert message in str(e.value)


def test_search_alg_must_be_a_searcher():
    with pytest.raises(TypeError, match="search_alg must be a Searcher"):
        SearchDriver(object(), 1, "tests.trainables:quadratic", {}, "exp")  # type: ignore[arg-type]


def test_concurrency_limiter_passes_everything_through_for_its_live_trials():
    inner = ListSearcher([0.1, 0.2, 0.3])
    limiter = ConcurrencyLimiter(inner, max_concurrent=2)

    assert [limiter.suggest(t) for t in ("a", "b", "c")] == [{"x": 0.1}, {"x": 0.2}, None]
    limiter.on_trial_result("a", {"loss": 1.0, TRAINING_ITERATION: 1})
    limiter.on_trial_result("zz", {"loss": 1.0, TRAINING_ITERATION: 1})  # not its trial: not passed
    limiter.on_trial_complete("a", {"loss": 1.0})
    limiter.on_trial_complete("a", {"loss": 1.0})  # ended already: not passed again

    assert limiter.suggest("c") == {"x": 0.3}
    assert (limiter.metric, limiter.mode, limiter.live_trials) == ("loss", "min", {"b", "c"})
    assert [c[0] for c in inner.calls] == ["suggest", "suggest", "result", "complete", "suggest"]
    with pytest.raises(ValueError, match="max_concurrent must be a whole number >= 1, got 0"):
        ConcurrencyLimiter(inner, max_concurrent=0)


def test_a_searcher_must_implement_suggest_and_on_trial_complete():
    class Half(Searcher):
        def suggest(self, trial_id):
            return {}

    class Full(Half):
        def on_trial_complete(self, trial_id, result=None, error=False):
            pass

    with pytest.raises(TypeError, match="on_trial_complete"):
        Half()  # type: ignore[abstract]
    with pytest.raises(ValueError, match="Full: mode must be 'min' or 'max', got 'minimize'"):
        Full(metric="loss", mode="minimize")
    assert Full(metric="loss").set_search_properties("loss", "min", {}) is False


def test_a_scheduler_and_a_searcher_on_different_metrics_are_refused_before_any_trial():
    from airflow_trials import ASHAScheduler
    from airflow_trials.core.searcher import agree_on_metric

    with pytest.raises(
        ValueError,
        match=r"AsyncHyperBandScheduler and the searcher ListSearcher disagree on metric 'acc' vs "
        r"'loss'",
    ):
        agree_on_metric(ASHAScheduler(metric="acc", mode="min"), ListSearcher([]))
    with pytest.raises(ValueError, match=r"disagree on mode 'max' vs 'min'.*same metric and mode"):
        agree_on_metric(ASHAScheduler(metric="loss", mode="max"), ListSearcher([]))


def test_a_scheduler_without_a_metric_takes_the_searchers():
    from airflow_trials import ASHAScheduler, FIFOScheduler
    from airflow_trials.core.searcher import agree_on_metric

    scheduler = ASHAScheduler()
    agree_on_metric(scheduler, ListSearcher([]))
    assert (scheduler.metric, scheduler.mode) == ("loss", "min")
    agree_on_metric(FIFOScheduler(), ListSearcher([]))  # judges nothing


class LearningSearcher(ListSearcher):
    """A ListSearcher that also records what it is told of trials it did not suggest."""

    def add_evaluated_point(
        self, parameters, value, error=False, pruned=False, intermediate_values=None
    ):
        self.calls.append(("evaluated", dict(parameters), value, error))

    def resume_after(self, asked):
        self.calls.append(("resume_after", asked))


def test_a_resumed_search_learns_the_ended_trials_and_the_adopted_ones_and_names_its_trials(
    tmp_path,
):
    """What the sweep driver does on a resume: the ids are the run's, the searcher is told the
    trials that ended before (first, after it learnt how many it had handed out), and how each
    trial it did not suggest now (one resumed with its stored config) ends; a trial that ended
    before it reported the metric teaches nothing."""
    searcher = LearningSearcher([0.5, 0.6])
    driver = SearchDriver(
        searcher, 2, "tests.trainables:quadratic", {}, "exp", trial_ids=["run_0003", "run_0004"]
    )
    adopted = Trial(
        "tests.trainables:quadratic", {"x": 0.2}, trial_id="run_0002", experiment_name="exp"
    )
    driver.resume(
        [("run_0000", {"x": 0.1}, 0.04), ("run_0001", {"x": 0.9}, None)], [adopted], asked=2
    )
    executor = LocalExecutor(str(tmp_path), lambda c: (c["x"] - 0.3) ** 2, slots=1)
    runner = TrialRunner("exp", executor=executor, search_alg=driver)
    runner.add_trial(adopted)

    trials = runner.run()

    assert [t.trial_id for t in trials] == ["run_0002", "run_0003", "run_0004"]
    assert [t.config for t in trials] == [{"x": 0.2}, {"x": 0.5}, {"x": 0.6}]
    assert searcher.calls[:3] == [
        ("resume_after", 2),
        ("evaluated", {"x": 0.1}, 0.04, False),
        ("evaluated", {"x": 0.9}, None, True),
    ]
    evaluated = [c for c in searcher.calls if c[0] == "evaluated"]
    assert evaluated[2] == (
        "evaluated",
        {"x": 0.2},
        pytest.approx(0.01),
        False,
    )  # the adopted trial's end
    assert searcher.calls.index(("suggest", "run_0003")) > searcher.calls.index(
        evaluated[2]
    )  # one slot
    assert [c[1] for c in searcher.calls if c[0] == "complete"] == ["run_0003", "run_0004"]


def test_a_search_driver_with_trial_ids_needs_one_per_sample_and_a_searcher_that_can_learn():
    with pytest.raises(ValueError, match="trial_ids has 1 ids for num_samples=2"):
        SearchDriver(
            ListSearcher([0.5]), 2, "tests.trainables:quadratic", {}, "exp", trial_ids=["a"]
        )
    driver = SearchDriver(
        ListSearcher([0.5]), 1, "tests.trainables:quadratic", {}, "exp", trial_ids=["a"]
    )
    with pytest.raises(
        SearcherError,
        match=r"raised NotImplementedError in add_evaluated_point\(\) for trial b"
        r".*cannot learn from trials it did not suggest",
    ):
        driver.resume([("b", {"x": 0.1}, 0.2)], [], asked=1)
    with pytest.raises(ValueError, match="A SearchDriver carries its own trainable"):
        TrialRunner(
            "exp", executor=LocalExecutor("/tmp", lambda c: 0.0), search_alg=driver, num_samples=3
        )


def test_a_resumed_constrained_search_learns_the_ended_trials_constraints_from_their_results(
    caplog,
):
    """The sweep driver hands each ended trial's last result on a resume: a constrained
    OptunaSearch sets their constraint values, rather than count them feasible (with a
    warning) as it must for a trial told by value only."""
    from airflow_trials import OptunaSearch

    searcher = OptunaSearch({"x": uniform(0.0, 1.0)}, "loss", "min", constraints=["latency <= 5"])
    driver = SearchDriver(searcher, 1, "tests.trainables:quadratic", {}, "exp", trial_ids=["r2"])
    driver.resume(
        [
            ("r0", {"x": 0.1}, 0.04, {"loss": 0.04, "latency": 9.0}),
            ("r1", {"x": 0.9}, 0.36, {"loss": 0.36, "latency": 1.0}),
            ("r3", {"x": 0.5}, 0.04),  # by value only: counted feasible, and said so
        ],
        [],
        asked=0,
    )
    constraints = [t.constraints for t in searcher.study.trials]
    assert constraints == [{"latency <= 5.0": 4.0}, {"latency <= 5.0": -4.0}, {}]
    assert "was added without its result" in caplog.text


def test_a_concurrency_limiter_hands_its_constrained_search_the_ended_trials_results():
    """Behind a ConcurrencyLimiter, a resumed constrained OptunaSearch still gets each ended
    trial's last result, so its constraint values are set (the limiter forwards ``result=``)."""
    from airflow_trials import OptunaSearch

    searcher = OptunaSearch({"x": uniform(0.0, 1.0)}, "loss", "min", constraints=["latency <= 5"])
    limited = ConcurrencyLimiter(searcher, max_concurrent=2)
    assert limited.constraints == searcher.constraints
    driver = SearchDriver(limited, 1, "tests.trainables:quadratic", {}, "exp", trial_ids=["r2"])
    driver.resume([("r0", {"x": 0.1}, 0.04, {"loss": 0.04, "latency": 9.0})], [], asked=0)
    assert [t.constraints for t in searcher.study.trials] == [{"latency <= 5.0": 4.0}]
    # A searcher written for Ray Tune's signature (no result=) is told as before.
    learner = LearningSearcher([0.5])
    ConcurrencyLimiter(learner, max_concurrent=1).add_evaluated_point({"x": 0.5}, 0.1)
    assert learner.calls == [("evaluated", {"x": 0.5}, 0.1, False)]


@pytest.mark.parametrize(("own", "recorded"), [(None, ["loss <= 0.05"]), ([], [])])
def test_the_trials_db_callback_records_the_runner_s_search_constraints(tmp_path, own, recorded):
    """TrialRunner hands a constrained search's constraints to its TrialsDbCallback, which records
    them with the experiment, so the leaderboard judges each trial; constraints= of the callback's
    own (none here) win."""
    from airflow_trials import OptunaSearch, TrialsDbCallback
    from airflow_trials.store import TrialStore

    store = TrialStore(f"sqlite:///{tmp_path / 'trials.db'}", create=True)
    try:
        search = OptunaSearch(
            {"x": uniform(0.0, 1.0)}, "loss", "min", seed=0, constraints=["loss <= 0.05"]
        )
        recorder = TrialsDbCallback(metric="loss", mode="min", store=store, constraints=own)
        runner, _ = _runner(tmp_path / "storage", search, 4, callbacks=[recorder])
        trials = runner.run()
        assert store.reader.get_experiment("exp").constraint_spec == recorded
        board = store.reader.leaderboard(recorder.experiment_run_id, "loss", "min")
        if recorded:
            judged = {r.trial_id: r.feasible for r in board}
            assert judged == {t.trial_id: t.last_result["loss"] <= 0.05 for t in trials}
        else:
            assert {r.feasible for r in board} == {None}
    finally:
        store.dispose()
