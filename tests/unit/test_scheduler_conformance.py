"""Our ASHA and median stopping rule decide as Ray Tune 2.60's, result by result, over each state.

Each stream of events (trials added, results reported at different rates, trials paused, resumed,
completed early, removed, failed) is replayed through Ray Tune's scheduler and through ours; every
decision must be the same. Ray's schedulers run on stub trials and never touch a cluster: no Ray
is started here. Ours keep their state (ASHA's rungs, the median rule's running means) in each
place the rule runs from, with the same test code: in memory (the runner's), and in a trials DB
(the Airflow path's: SQLite, and PostgreSQL when AIRFLOW_TRIALS_TEST_POSTGRES_URL is set).
"""

from __future__ import annotations

import math
import random
import warnings

import numpy as np
import pytest
from ray.tune.experiment import Trial as RayTrial
from ray.tune.schedulers import AsyncHyperBandScheduler as RayASHA
from ray.tune.schedulers import MedianStoppingRule as RayMedian

from airflow_trials import (
    ASHAScheduler,
    AsyncHyperBandScheduler,
    Decision,
    MedianStoppingRule,
    Trial,
    TrialStatus,
)
from airflow_trials.schedulers.asha.asha_rungs import MemoryRungs
from airflow_trials.schedulers.asha.async_hyperband import nan_percentile
from airflow_trials.schedulers.asha.stored_rungs import StoredRungs
from airflow_trials.schedulers.median.median_stopping import MemoryMeans
from airflow_trials.schedulers.median.stored_means import StoredMeans
from airflow_trials.store import TrialStore
from tests.contract.conftest import new_postgres_schema
from tests.contract.test_store import register
from tests.scheduler_writes import OneWriteEach

SEEDS = 400
# A decision in a trials DB is a transaction: the random streams run over fewer seeds there.
DB_SEEDS = 60
IN_MEMORY, SQLITE, POSTGRESQL = "memory", "sqlite", "postgresql"


class State:
    """Where our schedulers keep their state: in memory, or in a trials DB (one run per replay,
    whose trials are registered as the replay adds them; ids are made unique per run)."""

    def __init__(self, kind: str, store: TrialStore | None = None):
        self.kind, self.store = kind, store
        self.run: int | None = None
        self.replays = 0

    def start(self) -> None:
        self.replays += 1
        if self.store is not None:
            name = f"{self.kind}-{self.replays}"
            self.run = self.store.create_experiment_run("conformance", name)

    def trial_id(self, name: str) -> str:
        return name if self.store is None else f"r{self.run}-{name}"

    def register(self, trial_id: str) -> None:
        if self.store is not None:
            register(self.store, trial_id, self.run)

    def rungs(self):
        return (
            MemoryRungs() if self.store is None else StoredRungs(OneWriteEach(self.store), self.run)
        )

    def means(self):
        return (
            MemoryMeans() if self.store is None else StoredMeans(OneWriteEach(self.store), self.run)
        )


def pytest_generate_tests(metafunc):
    """Every test that takes ``state`` runs over each state; the random streams (``seed``) run
    over SEEDS seeds in memory and DB_SEEDS in a trials DB."""
    if "state" not in metafunc.fixturenames:
        return
    kinds = [IN_MEMORY, SQLITE, POSTGRESQL]
    if "seed" not in metafunc.fixturenames:
        metafunc.parametrize("state", kinds, indirect=True, scope="module")
        return
    pairs = [
        (kind, seed) for kind in kinds for seed in range(SEEDS if kind == IN_MEMORY else DB_SEEDS)
    ]
    metafunc.parametrize(
        ("state", "seed"),
        pairs,
        indirect=["state"],
        scope="module",
        ids=[f"{kind}-{seed}" for kind, seed in pairs],
    )


@pytest.fixture(scope="module")
def state(request, tmp_path_factory):
    if request.param == IN_MEMORY:
        yield State(IN_MEMORY)
        return
    if request.param == SQLITE:
        url = f"sqlite:///{tmp_path_factory.mktemp('conformance') / 'trials.db'}"
        store = TrialStore(url, create=True)
        yield State(SQLITE, store)
        store.dispose()
        return
    with new_postgres_schema("at_conformance") as url:
        store = TrialStore(url, create=True)
        yield State(POSTGRESQL, store)
        store.dispose()


class FakeController:
    """What Ray's MedianStoppingRule asks of its TuneController: the live trials."""

    def __init__(self):
        self.live: dict[str, RayTrial] = {}

    def get_live_trials(self):
        return list(self.live.values())


class Replay:
    """Drives Ray Tune's scheduler and ours with the same events and compares every decision."""

    def __init__(self, ray_scheduler, ours, state: State):
        self.ray, self.ours, self.state = ray_scheduler, ours, state
        self.controller = FakeController()
        self.ray_trials: dict[str, RayTrial] = {}
        self.trials: dict[str, Trial] = {}
        self.last: dict[str, dict] = {}
        self.decisions: list[tuple[str, str]] = []

    def add(self, name):
        trial_id = self.state.trial_id(name)  # the streams name trials t0, t1...: unique per DB run
        self.state.register(trial_id)
        ray_trial = RayTrial("__fake", stub=True, trial_id=trial_id)
        trial = Trial("tests.trainables:counting", trial_id=trial_id)
        self.ray_trials[trial_id], self.trials[trial_id] = ray_trial, trial
        self.controller.live[trial_id] = ray_trial
        self.ray.on_trial_add(self.controller, ray_trial)
        self.ours.on_trial_add(trial)
        self.last[trial_id] = {}

    def reason(self, name) -> str | None:
        return self.ours.decision_reason(self.state.trial_id(name))

    def set_status(self, name, status: TrialStatus):
        trial_id = self.state.trial_id(name)
        self.ray_trials[trial_id].set_status(status.value)
        self.trials[trial_id].status = status

    def result(self, name, result) -> str:
        trial_id = self.state.trial_id(name)
        self.last[trial_id] = result
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # numpy on an all-NaN rung
            expected = self.ray.on_trial_result(
                self.controller, self.ray_trials[trial_id], dict(result)
            )
        got = self.ours.on_trial_result(self.trials[trial_id], dict(result))
        assert isinstance(got, Decision)
        assert got == expected, (
            f"trial {trial_id} result {result}: Ray says {expected}, ours {got} "
            f"after {len(self.decisions)} decisions"
        )
        if got is not Decision.CONTINUE:
            assert self.ours.decision_reason(trial_id)
        self.decisions.append((trial_id, got.value))
        return got.value

    def complete(self, name):
        """The controller ends a RUNNING trial: the scheduler hears its last result."""
        trial_id = self.state.trial_id(name)
        result = self.last[trial_id]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            self.ray.on_trial_complete(self.controller, self.ray_trials[trial_id], dict(result))
        self.ours.on_trial_complete(self.trials[trial_id], dict(result))
        self._end(name, TrialStatus.TERMINATED)

    def remove(self, name):
        """The controller ends a PENDING or PAUSED trial."""
        trial_id = self.state.trial_id(name)
        self.ray.on_trial_remove(self.controller, self.ray_trials[trial_id])
        self.ours.on_trial_remove(self.trials[trial_id])
        self._end(name, TrialStatus.TERMINATED)

    def error(self, name):
        trial_id = self.state.trial_id(name)
        self.ray.on_trial_error(self.controller, self.ray_trials[trial_id])
        self.ours.on_trial_error(self.trials[trial_id])
        self._end(name, TrialStatus.ERROR)

    def _end(self, name, status):
        self.set_status(name, status)
        del self.controller.live[self.state.trial_id(name)]


def _value(rng: random.Random, level: float, step: int) -> float:
    roll = rng.random()
    if roll < 0.04:
        return math.nan
    if roll < 0.05:
        return rng.choice([math.inf, -math.inf])
    if roll < 0.25:
        return float(rng.randint(0, 5))  # ties between trials and with cutoffs
    return level * step + rng.gauss(0, 1)


def play(replay: Replay, rng: random.Random, time_attr: str, concurrency: int) -> None:
    """Trials report at their own rates; up to ``concurrency`` run; events come in random order."""
    count = rng.randint(2, 8)
    ids = [f"t{i}" for i in range(count)]
    for trial_id in ids:
        replay.add(trial_id)
    level = {t: rng.uniform(-1, 1) for t in ids}
    rate = {t: rng.choice([1, 1, 2, 3]) for t in ids}
    step = dict.fromkeys(ids, 0)
    clock = dict.fromkeys(ids, 0.0)
    limit = {t: rng.randint(3, 40) for t in ids}  # the trial's own end (its stopping criterion)
    waiting = list(ids)
    running: list[str] = []
    while waiting or running:
        while waiting and len(running) < concurrency:
            trial_id = waiting.pop(0)
            replay.set_status(trial_id, TrialStatus.RUNNING)
            running.append(trial_id)
        trial_id = rng.choice(running)
        event = rng.random()
        if event < 0.02:
            running.remove(trial_id)
            replay.error(trial_id)
            continue
        if event < 0.03 and waiting:
            replay.remove(waiting.pop(rng.randrange(len(waiting))))
            continue
        step[trial_id] += rate[trial_id]
        clock[trial_id] += rng.choice([0.5, 1.0, 1.5, 2.0]) * rate[trial_id]
        progress = step[trial_id] if time_attr == "training_iteration" else clock[trial_id]
        result = {
            "training_iteration": step[trial_id],
            "time_total_s": clock[trial_id],
            "score": _value(rng, level[trial_id], step[trial_id]),
        }
        result[time_attr] = progress
        decision = replay.result(trial_id, result)
        if decision == "STOP" or step[trial_id] >= limit[trial_id]:
            running.remove(trial_id)
            replay.complete(trial_id)
        elif decision == "PAUSE":
            running.remove(trial_id)
            replay.set_status(trial_id, TrialStatus.PAUSED)
            waiting.append(trial_id)


def _asha_settings(rng: random.Random) -> dict:
    max_t = rng.choice([5, 9, 10, 16, 20, 27, 81])
    return {
        "time_attr": rng.choice(["training_iteration", "time_total_s"]),
        "mode": rng.choice(["min", "max"]),
        "max_t": max_t,
        "grace_period": rng.choice([g for g in (1, 2, 3) if g <= max_t]),
        "reduction_factor": rng.choice([2, 3, 4, 2.5]),
        "brackets": rng.choice([1, 1, 2, 3]),
        "stop_last_trials": rng.random() < 0.7,
    }


def play_asha(seed: int, state: State) -> Replay:
    rng = random.Random(seed)
    settings = _asha_settings(rng)
    np.random.seed(
        seed
    )  # Ray draws brackets from NumPy's global state; ours from the same sequence
    state.start()
    replay = Replay(
        RayASHA(metric="score", **settings),
        ASHAScheduler(
            metric="score", rng=np.random.RandomState(seed), state=state.rungs(), **settings
        ),
        state,
    )
    play(replay, rng, settings["time_attr"], concurrency=rng.randint(1, 4))
    return replay


def play_median(seed: int, state: State) -> Replay:
    rng = random.Random(10_000 + seed)
    settings = _median_settings(rng)
    state.start()
    replay = Replay(
        RayMedian(metric="score", **settings),
        MedianStoppingRule(metric="score", state=state.means(), **settings),
        state,
    )
    play(replay, rng, settings["time_attr"], concurrency=rng.randint(1, 4))
    return replay


def test_asha_decides_as_ray_tune(seed, state):
    replay = play_asha(seed, state)
    ray_brackets = {tid: replay.ray._brackets.index(b) for tid, b in replay.ray._trial_info.items()}
    assert ray_brackets == replay.ours._trial_bracket
    assert len(replay.decisions) > 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # numpy on an all-NaN rung
        expected = replay.ray.debug_string()
    assert replay.ours.debug_string() == expected  # every rung's cutoff, read from the state


def _median_settings(rng: random.Random) -> dict:
    return {
        "time_attr": rng.choice(["training_iteration", "time_total_s"]),
        "mode": rng.choice(["min", "max"]),
        "grace_period": rng.choice([0, 1, 2, 5, 10.0]),
        "min_samples_required": rng.choice([1, 2, 3]),
        "min_time_slice": rng.choice([0, 2, 5]),
        "hard_stop": rng.random() < 0.6,
    }


def test_median_stopping_rule_decides_as_ray_tune(seed, state):
    replay = play_median(seed, state)
    assert len(replay.decisions) > 0


def test_the_streams_reach_every_decision(state):
    """The random streams are not all CONTINUE: ASHA stops, the median rule stops and pauses."""
    asha_seen = {d for seed in range(30) for _, d in play_asha(seed, state).decisions}
    median_seen = {d for seed in range(30) for _, d in play_median(seed, state).decisions}
    assert asha_seen == {"CONTINUE", "STOP"}
    assert median_seen == {"CONTINUE", "PAUSE", "STOP"}


# -- hand-written cases
# -----------------------------------------------------------------------------


def asha(state: State, **kwargs):
    kwargs.setdefault("metric", "score")
    kwargs.setdefault("mode", "max")
    state.start()
    return Replay(RayASHA(**kwargs), ASHAScheduler(state=state.rungs(), **kwargs), state)


def it(iteration, score):
    return {"training_iteration": iteration, "score": score}


def test_asha_rays_bracket_example(state):
    # Ray's _Bracket docstring: grace 1, max_t 10, reduction factor 2.
    replay = asha(state, max_t=10, grace_period=1, reduction_factor=2)
    for trial_id in ("t1", "t2", "t3"):
        replay.add(trial_id)
    assert replay.result("t1", it(1, 2)) == "CONTINUE"  # first at the rung: no cutoff yet
    assert replay.result("t2", it(1, 4)) == "CONTINUE"
    assert replay.result("t3", it(1, 1)) == "STOP"  # below the median 3.0
    assert replay.reason("t3") == (
        "stopped by ASHA at training_iteration=1 (rung 1 of 4): score 1 below the rung's cutoff 3"
    )
    assert replay.reason("t1") is None


def test_asha_a_tie_with_the_cutoff_continues_and_min_mode_reads_the_other_way(state):
    replay = asha(state, max_t=9, grace_period=1, reduction_factor=3, mode="min")
    for trial_id in ("a", "b", "c", "d"):
        replay.add(trial_id)
    assert replay.result("a", it(1, 0.5)) == "CONTINUE"
    assert replay.result("b", it(1, 0.5)) == "CONTINUE"  # equal to the cutoff: not below it
    assert replay.result("c", it(1, 0.9)) == "STOP"
    assert replay.result("d", it(1, 0.1)) == "CONTINUE"
    assert replay.reason("c") == (
        "stopped by ASHA at training_iteration=1 (rung 1 of 3): score 0.9 above the rung's cutoff "
        "0.5"
    )


def test_asha_judges_a_trial_that_skipped_rungs_at_the_highest_it_reached(state):
    replay = asha(state, max_t=16, grace_period=1, reduction_factor=2)
    for trial_id in ("fast", "slow"):
        replay.add(trial_id)
    for i in range(1, 6):
        assert replay.result("fast", it(i, 10.0)) == "CONTINUE"
    assert replay.result("slow", it(5, 1.0)) == "STOP"  # judged at rung 4, never at 1 or 2
    assert "(rung 3 of 5, milestone 4)" in replay.reason("slow")


def test_asha_nan_scores_are_recorded_but_left_out_of_cutoffs(state):
    replay = asha(state, max_t=4, grace_period=1, reduction_factor=2)
    for trial_id in ("a", "b", "c"):
        replay.add(trial_id)
    assert replay.result("a", it(1, math.nan)) == "CONTINUE"
    assert replay.result("b", it(1, math.nan)) == "CONTINUE"  # an all-NaN rung has no cutoff
    assert replay.result("c", it(1, -5.0)) == "CONTINUE"
    assert replay.result("a", it(2, 3.0)) == "CONTINUE"
    assert replay.result("c", it(2, 1.0)) == "STOP"


def test_asha_stops_at_max_t_unless_stop_last_trials_is_false(state):
    replay = asha(state, max_t=2, grace_period=1, reduction_factor=2)
    replay.add("a")
    assert replay.result("a", it(1, 1.0)) == "CONTINUE"
    assert replay.result("a", it(2, 1.0)) == "STOP"
    assert replay.reason("a") == "stopped by ASHA at training_iteration=2: it reached max_t=2"
    replay.complete("a")
    keep = asha(state, max_t=2, grace_period=1, reduction_factor=2, stop_last_trials=False)
    keep.add("a")
    assert [keep.result("a", it(i, 1.0)) for i in range(1, 6)] == ["CONTINUE"] * 5


def test_asha_multiple_brackets_follow_rays_draws(state):
    np.random.seed(7)
    state.start()
    replay = Replay(
        RayASHA(metric="score", mode="max", max_t=27, reduction_factor=3, brackets=3),
        AsyncHyperBandScheduler(
            metric="score",
            mode="max",
            max_t=27,
            reduction_factor=3,
            brackets=3,
            rng=np.random.RandomState(7),
            state=state.rungs(),
        ),
        state,
    )
    for i in range(40):
        replay.add(f"t{i}")
    ray_brackets = {tid: replay.ray._brackets.index(b) for tid, b in replay.ray._trial_info.items()}
    assert ray_brackets == replay.ours._trial_bracket
    assert set(ray_brackets.values()) == {0, 1, 2}


def median(state: State, **kwargs):
    kwargs.setdefault("metric", "score")
    kwargs.setdefault("mode", "max")
    kwargs.setdefault("time_attr", "training_iteration")
    state.start()
    return Replay(RayMedian(**kwargs), MedianStoppingRule(state=state.means(), **kwargs), state)


def three_finished(replay, scores=(1.0, 2.0, 3.0), steps=4):
    for n, score in enumerate(scores):
        trial_id = f"done{n}"
        replay.add(trial_id)
        replay.set_status(trial_id, TrialStatus.RUNNING)
        for i in range(1, steps + 1):
            replay.result(trial_id, it(i, score))
        replay.complete(trial_id)


def test_median_stops_a_trial_below_the_median_of_running_means(state):
    replay = median(state, grace_period=1, min_samples_required=3)
    three_finished(replay)
    replay.add("x")
    replay.set_status("x", TrialStatus.RUNNING)
    assert replay.result("x", it(1, 2.0)) == "CONTINUE"  # equal to the median 2.0
    assert replay.result("x", it(2, 1.5)) == "CONTINUE"  # its best is still 2.0
    replay.add("y")
    replay.set_status("y", TrialStatus.RUNNING)
    assert replay.result("y", it(1, 1.9)) == "STOP"
    assert replay.reason("y") == (
        "stopped by the median stopping rule at training_iteration=1: best score 1.9 below the "
        "median 2 of 4 other trials' running means"
    )


def test_median_pauses_instead_when_hard_stop_is_false_then_lets_the_trial_run(state):
    replay = median(state, grace_period=1, min_samples_required=3, hard_stop=False, mode="min")
    three_finished(replay)
    replay.add("x")
    replay.set_status("x", TrialStatus.RUNNING)
    assert replay.result("x", it(1, 2.5)) == "PAUSE"
    assert replay.reason("x").startswith("paused by the median stopping rule")
    replay.set_status("x", TrialStatus.RUNNING)
    assert replay.result("x", it(2, 9.0)) == "CONTINUE"  # after its pause the rule lets it run


def test_median_without_enough_samples_yields_to_waiting_trials_once_per_time_slice(state):
    replay = median(state, grace_period=0, min_samples_required=3, min_time_slice=2)
    replay.add("a")
    replay.add("b")  # PENDING: it waits for a's resources
    replay.set_status("a", TrialStatus.RUNNING)
    assert replay.result("a", it(1, 1.0)) == "PAUSE"
    assert replay.result("a", it(2, 1.0)) == "CONTINUE"  # within min_time_slice of its pause
    assert replay.result("a", it(4, 1.0)) == "PAUSE"
    replay.set_status("b", TrialStatus.RUNNING)
    assert replay.result("a", it(7, 1.0)) == "CONTINUE"  # nobody waits


def test_median_a_nan_best_counts_as_worse_and_non_finite_means_are_left_out(state):
    replay = median(state, grace_period=1, min_samples_required=2)
    three_finished(replay, scores=(1.0, math.nan, 3.0))  # done1's running mean is NaN
    replay.add("x")
    replay.set_status("x", TrialStatus.RUNNING)
    assert replay.result("x", it(1, 2.0)) == "CONTINUE"  # median of 1 and 3
    replay.add("y")
    replay.set_status("y", TrialStatus.RUNNING)
    assert replay.result("y", it(1, math.nan)) == "STOP"


def test_nan_percentile_is_numpys_to_the_last_bit():
    rng = random.Random(0)
    for _ in range(3000):
        values = [
            rng.choice([rng.gauss(0, 1), float(rng.randint(0, 3)), math.nan, math.inf, -math.inf])
            for _ in range(rng.randint(1, 9))
        ]
        percent = (1 - 1 / rng.choice([2, 3, 4, 2.5, 1.5, 7])) * 100
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            expected = float(np.nanpercentile(values, percent))
        got = nan_percentile(values, percent)
        assert got == expected or (math.isnan(got) and math.isnan(expected)), (values, percent)


# -- errors
# --------------------------------------------------------------------------------------------


def counting(trial_id="t-1"):
    return Trial("tests.trainables:counting", trial_id=trial_id)


@pytest.mark.parametrize("scheduler", [ASHAScheduler, MedianStoppingRule])
def test_a_scheduler_without_metric_or_mode_refuses_trials_and_says_how_to_fix_it(scheduler):
    for kwargs in ({}, {"metric": "score"}, {"mode": "max"}):
        with pytest.raises(ValueError, match=r"cannot take trial t-1.*set_search_properties"):
            scheduler(**kwargs).on_trial_add(counting())
    late = scheduler()
    assert late.set_search_properties("score", "max") is True
    assert late.set_search_properties("loss", None) is False  # already set: Ray's rule
    assert (late.metric, late.mode) == ("score", "max")
    late.on_trial_add(counting())


@pytest.mark.parametrize("scheduler", [ASHAScheduler, MedianStoppingRule])
def test_a_mode_other_than_min_or_max_is_refused(scheduler):
    with pytest.raises(ValueError, match=r"mode='maximize'.*mode='min'.*mode='max'"):
        scheduler(metric="score", mode="maximize")
    with pytest.raises(ValueError, match="mode='best'"):
        scheduler(metric="score").set_search_properties(None, "best")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"grace_period": 20, "max_t": 10}, r"grace_period=20 > max_t=10.*lower grace_period"),
        ({"reduction_factor": 1}, r"reduction_factor=1: it must be > 1"),
        ({"max_t": 0, "grace_period": 0}, r"max_t=0"),
        ({"brackets": 0}, r"brackets=0"),
    ],
)
def test_asha_refuses_settings_ray_asserts_against(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ASHAScheduler(metric="score", mode="max", **kwargs)


@pytest.mark.parametrize("scheduler", [ASHAScheduler, MedianStoppingRule])
@pytest.mark.parametrize("missing", ["score", "training_iteration"])
def test_a_result_without_the_metric_or_time_attr_names_the_missing_key(scheduler, missing):
    chosen = scheduler(metric="score", mode="max", time_attr="training_iteration")
    trial = counting()
    chosen.on_trial_add(trial)
    result = {"training_iteration": 1, "score": 1.0, "loss": 2.0}
    del result[missing]
    with pytest.raises(
        ValueError, match=rf"Trial t-1 reported a result without '{missing}'.*has: "
    ):
        chosen.on_trial_result(trial, result)
    chosen.on_trial_complete(trial, {})  # a trial that ends before reporting is no error


def test_a_non_numeric_metric_is_refused_with_the_trial_and_key():
    chosen = ASHAScheduler(metric="score", mode="max")
    trial = counting()
    chosen.on_trial_add(trial)
    with pytest.raises(ValueError, match=r"Trial t-1 reported score=None.*needs a number"):
        chosen.on_trial_result(trial, {"training_iteration": 1, "score": None})


def test_median_refuses_a_time_that_goes_back():
    chosen = MedianStoppingRule(metric="score", mode="max", grace_period=0)
    trial = counting()
    chosen.on_trial_add(trial)
    chosen.on_trial_result(trial, {"time_total_s": 5.0, "score": 1.0})
    with pytest.raises(ValueError, match=r"time_total_s=3 after 5.*never decreases"):
        chosen.on_trial_result(trial, {"time_total_s": 3.0, "score": 1.0})
