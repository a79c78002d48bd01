"""Our HyperBandScheduler decides as Ray Tune 2.60's, event by event.

Random streams (trials added over time, results at different rates, pauses and resumes as the
scheduler asks, early ends, restores to an older time, removals, failures) drive Ray Tune's
scheduler (on stub trials, with a fake controller: no Ray is started) and ours as a controller
would. Every decision, choice of trial, STOP of another trial and debug string must be the same.
"""

from __future__ import annotations

import math
import random

import pytest
from ray.tune.experiment import Trial as RayTrial
from ray.tune.schedulers import HyperBandScheduler as RayHyperBand

from airflow_trials import Decision, HyperBandScheduler, Trial, TrialStatus

SEEDS = 300
WAITING = (TrialStatus.PENDING, TrialStatus.PAUSED)


class FakeController:
    """What Ray's HyperBand asks of its TuneController: stop a trial, as TuneController.stop_trial
    does."""

    def __init__(self, scheduler: RayHyperBand):
        self.scheduler = scheduler
        self.stopped: list[str] = []

    def stop_trial(self, trial: RayTrial):
        self.stopped.append(trial.trial_id)
        if trial.status in (RayTrial.PENDING, RayTrial.PAUSED):
            self.scheduler.on_trial_remove(self, trial)
        elif trial.status == RayTrial.RUNNING:
            self.scheduler.on_trial_complete(self, trial, {})
        trial.set_status(RayTrial.TERMINATED)


class Replay:
    """Drives Ray Tune's HyperBand and ours with the same events and compares what they do.

    Our scheduler's pending STOPs are carried out after each call, as TrialRunner.stop_trial would:
    ``on_trial_remove`` for a waiting trial, then TERMINATED.
    """

    def __init__(self, **settings):
        settings.setdefault("metric", "score")
        self.ray = RayHyperBand(**settings)
        self.ours = HyperBandScheduler(**settings)
        self.controller = FakeController(self.ray)
        self.ray_trials: dict[str, RayTrial] = {}
        self.trials: dict[str, Trial] = {}
        self.decisions: list[tuple[str, str]] = []
        self.others_stopped, self.resumed = [], []  # trial ids

    def add(self, trial_id):
        self.ray_trials[trial_id] = RayTrial("__fake", stub=True, trial_id=trial_id)
        self.trials[trial_id] = Trial("tests.trainables:counting", trial_id=trial_id)
        self.ray.on_trial_add(self.controller, self.ray_trials[trial_id])
        self.ours.on_trial_add(self.trials[trial_id])
        self._check()

    def status(self, trial_id) -> TrialStatus:
        return self.trials[trial_id].status

    def set_status(self, trial_id, status: TrialStatus):
        self.ray_trials[trial_id].set_status(status.value)
        self.trials[trial_id].status = status

    def choose(self, free_slots: int) -> str | None:
        """Both choose; ours returns its choice only when it fits (one slot per trial)."""
        expected = self.ray.choose_trial_to_run(self.controller)
        got = self.ours.choose_trial_to_run(
            list(self.trials.values()), lambda resources: free_slots > 0
        )
        if free_slots > 0:
            assert (got and got.trial_id) == (expected and expected.trial_id)
        else:
            assert got is None
        return got and got.trial_id

    def launch(self, trial_id):
        if self.status(trial_id) == TrialStatus.PAUSED:
            self.resumed.append(trial_id)
        self.set_status(trial_id, TrialStatus.RUNNING)

    def result(self, trial_id, result) -> str:
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
        self._check()
        return got.value

    def complete(self, trial_id):
        """A RUNNING trial ends (its own criterion, the scheduler's STOP, or stopped from
        outside)."""
        self._end("on_trial_complete", trial_id, TrialStatus.TERMINATED, {})

    def remove(self, trial_id):
        """A waiting trial is stopped from outside."""
        self._end("on_trial_remove", trial_id, TrialStatus.TERMINATED)

    def error(self, trial_id):
        self._end("on_trial_error", trial_id, TrialStatus.ERROR)

    def _end(self, hook, trial_id, status, *result):
        getattr(self.ray, hook)(self.controller, self.ray_trials[trial_id], *result)
        getattr(self.ours, hook)(self.trials[trial_id], *result)
        self.set_status(trial_id, status)
        self._check()

    def _check(self):
        """Ray's controller stopped the same other trials as our pending actions ask; carry them
        out."""
        pending = self.ours.take_pending_actions()
        assert pending == [(trial_id, Decision.STOP) for trial_id in self.controller.stopped]
        self.controller.stopped.clear()
        for trial_id, _ in pending:
            assert self.status(trial_id) in WAITING, "a pending STOP for a running trial"
            assert self.ours.decision_reason(trial_id).startswith("stopped by HyperBand")
            self.ours.on_trial_remove(self.trials[trial_id])  # what TrialRunner.stop_trial calls
            self.trials[trial_id].status = TrialStatus.TERMINATED
            self.others_stopped.append(trial_id)
        assert self.ours.debug_string() == self.ray.debug_string()


def _value(rng: random.Random, level: float, step: int) -> float:
    roll = rng.random()
    if roll < 0.04:
        return math.nan
    if roll < 0.05:
        return rng.choice([math.inf, -math.inf])
    if roll < 0.25:
        return float(rng.randint(0, 5))  # ties
    return level * step + rng.gauss(0, 1)


class Stream:
    """One random stream: a controller loop over trials that report at their own rates."""

    def __init__(self, seed: int):
        self.rng = rng = random.Random(seed)
        self.settings = {
            "time_attr": rng.choice(["training_iteration", "time_total_s"]),
            "mode": rng.choice(["min", "max"]),
            "max_t": rng.choice([1, 2, 3, 4, 5, 8, 9, 10, 16, 27, 12.5]),
            "reduction_factor": rng.choice([2, 3, 3, 4, 2.5, 1.5]),
            "stop_last_trials": rng.random() < 0.7,
        }
        self.replay = Replay(**self.settings)
        self.concurrency = rng.randint(1, 5)
        self.to_add = rng.randint(2, 24)
        self.step, self.clock, self.level, self.rate, self.limit = {}, {}, {}, {}, {}
        self.running: list[str] = []

    def add(self):
        trial_id = f"t{len(self.step)}"
        rng, max_t = self.rng, self.settings["max_t"]
        self.step[trial_id], self.clock[trial_id] = 0, 0.0
        self.level[trial_id] = rng.uniform(-1, 1)
        self.rate[trial_id] = rng.choice([1, 1, 1, 2, 3])
        self.limit[trial_id] = rng.randint(1, int(3 * max_t) + 2)  # its own stopping criterion
        self.to_add -= 1
        self.replay.add(trial_id)

    def waiting(self) -> list[str]:
        return [t for t in self.replay.trials if self.replay.status(t) in WAITING]

    def play(self) -> Replay:
        for _ in range(self.rng.randint(1, self.to_add)):
            self.add()
        for _ in range(20_000):
            if not self.tick():
                return self.replay
        raise AssertionError("the stream did not end")

    def tick(self) -> bool:
        """One controller step: maybe add a trial, launch the chosen one, or process one event."""
        replay, rng = self.replay, self.rng
        if self.to_add and rng.random() < 0.1:
            self.add()
        self.running = [t for t in self.running if replay.status(t) == TrialStatus.RUNNING]
        chosen = replay.choose(self.concurrency - len(self.running))
        if chosen is not None:
            replay.launch(chosen)
            self.running.append(chosen)
            return True
        if self.running:
            self.event(rng.choice(self.running))
            return True
        if self.to_add:
            self.add()
        elif self.waiting():  # nothing can run: the user stops a trial that waits for ever
            replay.remove(rng.choice(self.waiting()))
        return bool(self.to_add or self.waiting())

    def event(self, trial_id: str):
        replay, rng = self.replay, self.rng
        roll = rng.random()
        if roll < 0.015:
            return replay.error(trial_id)
        if roll < 0.03:  # it fails and is retried from an older checkpoint: no scheduler call
            back = rng.randint(0, self.step[trial_id])
            self.step[trial_id] -= back
            self.clock[trial_id] = max(0.0, self.clock[trial_id] - back)
            return replay.set_status(trial_id, TrialStatus.PENDING)
        if roll < 0.04 and self.waiting():
            return replay.remove(rng.choice(self.waiting()))
        if roll < 0.045:
            return replay.complete(trial_id)  # stopped from outside while running
        self.report(trial_id)

    def report(self, trial_id: str):
        replay, rng = self.replay, self.rng
        self.step[trial_id] += self.rate[trial_id]
        self.clock[trial_id] += rng.choice([0.5, 1.0, 1.5, 2.0]) * self.rate[trial_id]
        step, clock = self.step[trial_id], self.clock[trial_id]
        score = _value(rng, self.level[trial_id], step)
        result = {"training_iteration": step, "time_total_s": clock, "score": score}
        if step >= self.limit[trial_id]:
            return replay.complete(
                trial_id
            )  # its own criterion ends it: the scheduler is not asked
        decision = replay.result(trial_id, result)
        if decision == "STOP":
            replay.complete(trial_id)
        elif decision == "PAUSE":
            replay.set_status(trial_id, TrialStatus.PAUSED)


@pytest.mark.parametrize("seed", range(SEEDS))
def test_hyperband_decides_as_ray_tune(seed):
    replay = Stream(seed).play()
    assert all(replay.status(t).is_terminal() for t in replay.trials)
    ray_brackets = [[b is None for b in band] for band in replay.ray._hyperbands]
    assert ray_brackets == [[b is None for b in band] for band in replay.ours._rounds]


def test_the_streams_reach_every_decision_and_stop_and_resume_other_trials():
    replays = [Stream(seed).play() for seed in range(60)]
    assert {d for replay in replays for _, d in replay.decisions} == {"CONTINUE", "PAUSE", "STOP"}
    assert sum(len(replay.others_stopped) for replay in replays) > 20
    assert sum(len(replay.resumed) for replay in replays) > 20


# -- hand-written cases
# -----------------------------------------------------------------------------


def it(iteration, score):
    return {"training_iteration": iteration, "score": score}


def small(**settings):
    """max_t=3: bracket 1 runs a, b to 3; bracket 2 runs c, d, e to 1, then the best of them to
    3."""
    settings = {"mode": "max", "max_t": 3, "reduction_factor": 3, **settings}
    replay = Replay(**settings)
    for trial_id in ("a", "b", "c", "d", "e"):
        replay.add(trial_id)
    return replay


def test_a_bracket_waits_for_its_trials_then_keeps_the_best_and_stops_the_others():
    replay = small()
    for trial_id in ("c", "d", "e"):
        replay.set_status(trial_id, TrialStatus.RUNNING)
    assert replay.result("c", it(1, 0.5)) == "PAUSE"
    replay.set_status("c", TrialStatus.PAUSED)
    assert replay.ours.decision_reason("c") == (
        "paused by HyperBand at training_iteration=1: it reached its bracket's milestone 1 "
        "(round 1, bracket 2) and waits for 2 other trial(s) to reach it"
    )
    assert replay.result("d", it(1, 0.2)) == "PAUSE"
    replay.set_status("d", TrialStatus.PAUSED)
    assert replay.result("e", it(1, 0.9)) == "CONTINUE"  # the best of three: the one kept
    assert replay.others_stopped == ["d", "c"]  # worst first
    assert replay.ours.decision_reason("d") == (
        "stopped by HyperBand at training_iteration=1 (round 1, bracket 2, milestone 1): score 0.2 "
        "ranked 3 of 3, and only the best 1 go on"
    )
    assert replay.result("e", it(2, 0.9)) == "CONTINUE"
    assert replay.result("e", it(3, 0.9)) == "STOP"
    assert replay.ours.decision_reason("e") == (
        "stopped by HyperBand at training_iteration=3: its bracket (round 1, bracket 2) reached "
        "its "
        "last milestone, 3"
    )


def test_min_mode_keeps_the_lowest_and_a_kept_paused_trial_is_chosen_to_run_again():
    replay = small(mode="min", max_t=9)  # bracket 1: 3 trials to 9; bracket 2: 5 trials, 3 then 9
    for trial_id in ("f", "g", "h"):
        replay.add(trial_id)
    for trial_id in ("a", "b", "c"):
        replay.remove(trial_id)  # bracket 1 is finished: bracket 2 comes first when choosing
    for trial_id, score in (("d", 5.0), ("e", 1.0), ("f", 2.0), ("g", 3.0)):
        replay.set_status(trial_id, TrialStatus.RUNNING)
        for i in (1, 2):
            assert replay.result(trial_id, it(i, score)) == "CONTINUE"
        assert replay.result(trial_id, it(3, score)) == "PAUSE"
        replay.set_status(trial_id, TrialStatus.PAUSED)
    assert replay.choose(free_slots=1) == "h"  # the only PENDING trial; the PAUSED ones wait
    replay.launch("h")
    assert replay.result("h", it(3, 4.0)) == "STOP"  # ranked 4 of 5: only the best 2 go on
    replay.complete("h")
    assert replay.others_stopped == ["d", "g"]
    assert replay.choose(free_slots=1) == "e"  # kept and PAUSED: the halving lets it go on
    assert replay.choose(free_slots=0) is None  # it does not fit now: nothing else is started


def test_a_trial_leaving_a_bracket_that_waits_for_it_lets_it_halve():
    replay = small()
    for trial_id in ("c", "d"):
        replay.set_status(trial_id, TrialStatus.RUNNING)
        assert replay.result(trial_id, it(1, 1.0 if trial_id == "c" else 0.0)) == "PAUSE"
        replay.set_status(trial_id, TrialStatus.PAUSED)
    replay.remove("e")
    assert replay.others_stopped == ["d"]
    assert replay.choose(free_slots=1) == "a"  # bracket 1 is the least complete
    replay.remove("a")
    replay.remove("b")
    assert replay.choose(free_slots=1) == "c"  # kept and PAUSED: the halving lets it go on


def test_without_stop_last_trials_the_last_trials_run_on():
    replay = small(stop_last_trials=False)
    replay.set_status("a", TrialStatus.RUNNING)
    assert [replay.result("a", it(i, 1.0)) for i in range(1, 8)] == ["CONTINUE"] * 7


def test_a_terminated_trial_of_a_resumed_experiment_takes_no_place_in_a_bracket():
    scheduler = HyperBandScheduler(metric="score", mode="max", max_t=3, reduction_factor=3)
    done = counting("done")
    done.status = TrialStatus.TERMINATED
    scheduler.on_trial_add(done)
    scheduler.on_trial_remove(done)
    assert scheduler._rounds == [[]]
    with pytest.raises(ValueError, match="trial done, which it was never given"):
        scheduler.on_trial_result(done, it(1, 1.0))


# -- errors
# --------------------------------------------------------------------------------------------


def counting(trial_id="t-1"):
    return Trial("tests.trainables:counting", trial_id=trial_id)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_t": 0}, r"HyperBandScheduler got max_t=0: it must be > 0"),
        ({"max_t": -3}, r"max_t=-3: it must be > 0"),
        ({"max_t": 0.5}, r"max_t=0.5: .*would be 0; use max_t >= 1"),
        ({"reduction_factor": 1}, r"reduction_factor=1: it must be > 1 .*2 to 4 is usual"),
        ({"reduction_factor": 0.5}, r"reduction_factor=0.5: it must be > 1"),
        ({"mode": "maximize"}, r"mode='maximize'.*mode='min'.*mode='max'"),
    ],
)
def test_bad_settings_are_refused_naming_the_parameter_and_the_fix(kwargs, message):
    with pytest.raises(ValueError, match=message):
        HyperBandScheduler(metric="score", **{"mode": "max", **kwargs})


def test_without_metric_or_mode_no_trial_is_taken_and_the_error_says_how_to_fix_it():
    for kwargs in ({}, {"metric": "score"}, {"mode": "max"}):
        with pytest.raises(ValueError, match=r"cannot take trial t-1.*set_search_properties"):
            HyperBandScheduler(**kwargs).on_trial_add(counting())
    late = HyperBandScheduler()
    assert late.set_search_properties("score", "max") is True
    late.on_trial_add(counting())


@pytest.mark.parametrize("missing", ["score", "training_iteration"])
def test_a_result_without_the_metric_or_time_attr_names_the_missing_key(missing):
    scheduler = HyperBandScheduler(metric="score", mode="max")
    trial = counting()
    scheduler.on_trial_add(trial)
    result = it(1, 1.0)
    del result[missing]
    with pytest.raises(ValueError, match=rf"Trial t-1 reported a result without '{missing}'"):
        scheduler.on_trial_result(trial, result)


def test_a_negative_time_and_a_result_after_the_trial_left_are_refused():
    scheduler = HyperBandScheduler(metric="score", mode="max", max_t=3, reduction_factor=3)
    trial = counting()
    scheduler.on_trial_add(trial)
    with pytest.raises(ValueError, match=r"training_iteration=-1: .*needs a time_attr >= 0"):
        scheduler.on_trial_result(trial, it(-1, 1.0))
    scheduler.on_trial_complete(trial, {})
    with pytest.raises(ValueError, match=r"trial t-1, .*already left its bracket"):
        scheduler.on_trial_result(trial, it(1, 1.0))
