"""Hand-over on a reused actor, on a real local Ray: an ending trial's actor starts the next trial
the runner named without waiting for the runner (execution/driver/hand_over.py). Every trial gets
exactly its results, once, in order, and ends as it did without the protocol."""

from __future__ import annotations

import json
import os

import pytest

from airflow_trials import (
    Callback,
    RayTrialExecutor,
    Searcher,
    Trial,
    TrialRunner,
    TrialStatus,
)
from airflow_trials.core.fate import CRITERION_MET, TRAINABLE_FINISHED

HANDED = "tests.trainables:handed"
LOGGED = "tests.trainables:logged"


class Events(Callback):
    """Every event the runner tells its callbacks, in order."""

    def __init__(self):
        self.events: list[tuple[str, str, int]] = []

    def on_trial_start(self, trial):
        self.events.append(("start", trial.trial_id, 0))

    def on_trial_result(self, trial, result):
        self.events.append(("result", trial.trial_id, result["training_iteration"]))

    def on_trial_complete(self, trial):
        self.events.append(("complete", trial.trial_id, 0))

    def on_trial_error(self, trial):
        self.events.append(("error", trial.trial_id, 0))

    def of(self, trial_id):
        return [(kind, i) for kind, tid, i in self.events if tid == trial_id]


def runner_for(storage, hand_over=True, **kwargs):
    executor = RayTrialExecutor(
        storage, reuse_actors=True, reuse_placement_groups=True, hand_over=hand_over
    )
    kwargs.setdefault("wait_timeout_s", 120.0)
    return TrialRunner("exp", executor=executor, **kwargs), executor


def handed(i, iterations=3, **config):
    return Trial(
        HANDED,
        {"x": i, "iterations": iterations, "sleep": 0.02, **config},
        trial_id=f"t{i:02d}",
        experiment_name="exp",
        resources={"cpu": 1},
    )


def results_of(runner):
    per_trial: dict[str, list[tuple[int, float]]] = {}
    for trial_id, result in runner.results():
        per_trial.setdefault(trial_id, []).append((result["training_iteration"], result["x"]))
    return per_trial


def saved_stdout(storage, trial_id):
    with open(os.path.join(storage, "exp", trial_id, "logs", "stdout.log")) as f:
        return f.read().splitlines()


def trial_json(storage, trial_id):
    with open(os.path.join(storage, "exp", trial_id, "trial.json")) as f:
        return json.load(f)


def test_fifo_with_reuse_gives_each_trial_the_same_results_with_and_without_hand_over(
    ray_cluster, tmp_path
):
    outcomes = {}
    for hand_over in (True, False):
        storage = str(tmp_path / f"hand_over_{hand_over}")
        events = Events()
        runner, executor = runner_for(storage, hand_over, callbacks=[events])
        for i in range(10):
            runner.add_trial(handed(i))
        trials = runner.run()
        per_trial = results_of(runner)
        for trial in trials:
            x = trial.config["x"]
            assert per_trial[trial.trial_id] == [(1, x), (2, x), (3, x)], trial.trial_id
            assert trial.status == TrialStatus.TERMINATED
            assert trial.stop_reason == TRAINABLE_FINISHED
            # Its end is recorded as before: trial.json, one start, its results, one end.
            assert trial_json(storage, trial.trial_id)["status"] == "TERMINATED"
            assert events.of(trial.trial_id) == [
                ("start", 0),
                ("result", 1),
                ("result", 2),
                ("result", 3),
                ("complete", 0),
            ]
            # Its logs hold its own output only, whichever trial ran on the actor before it.
            assert saved_stdout(storage, trial.trial_id) == [
                f"{trial.trial_id} {i}" for i in (1, 2, 3)
            ]
        outcomes[hand_over] = (per_trial, executor.num_hand_overs)
    assert outcomes[True][0] == outcomes[False][0]
    # With the protocol, once the first trials showed where their end comes, trials started on
    # the actor of the trial before them; without it, none did.
    assert outcomes[True][1] > 0
    assert outcomes[False][1] == 0


@pytest.mark.parametrize("iterations", [1, 3])
def test_a_stopping_criterion_hands_over_at_it_and_the_ended_trial_never_trains_past_it(
    ray_cluster, storage, tmp_path, iterations
):
    runner, executor = runner_for(storage, stop={"training_iteration": iterations})
    logs = {}
    for i in range(6):
        logs[f"c{i}"] = tmp_path / f"c{i}.log"
        runner.add_trial(
            Trial(
                LOGGED,
                {"log": str(logs[f"c{i}"]), "sleep": 0.02},
                trial_id=f"c{i}",
                experiment_name="exp",
                resources={"cpu": 1},
            )
        )
    trials = runner.run()
    per_trial = results_of_scores(runner)
    expected = list(range(1, iterations + 1))
    for trial in trials:
        assert per_trial[trial.trial_id] == [(i, float(i)) for i in expected]
        assert trial.status == TrialStatus.TERMINATED and trial.stop_reason == CRITERION_MET
        # Each iteration it started is one it reported: nothing ran past the criterion's stop.
        lines = logs[trial.trial_id].read_text().splitlines()
        assert lines == [f"start {i}" for i in expected]
        assert trial.checkpoint is not None and trial.checkpoint.iteration == iterations
        checkpoints = sorted(
            name
            for name in os.listdir(os.path.join(storage, "exp", trial.trial_id))
            if name.startswith("checkpoint_")
        )
        assert len(checkpoints) == iterations
    # The end is known from the criterion (at the first call, with 1), so trials hand over from
    # the first ones on.
    assert executor.num_hand_overs > 0


def results_of_scores(runner):
    per_trial: dict[str, list[tuple[int, float]]] = {}
    for trial_id, result in runner.results():
        per_trial.setdefault(trial_id, []).append((result["training_iteration"], result["score"]))
    return per_trial


def test_an_error_before_the_hand_over_or_in_the_successor_stays_with_its_own_trial(
    ray_cluster, storage
):
    """t05 raises as it would return (the call that brings its end, which carries an offer when
    the runner expects that end): it fails, and the trial offered with that call starts normally.
    t06 raises in its first iteration, trained ahead on an actor that took it over: the error is
    t06's."""
    events = Events()
    runner, executor = runner_for(storage, callbacks=[events])
    for i in range(10):
        fail_at = {5: 4, 6: 1}.get(i)
        runner.add_trial(handed(i, **({"fail_at": fail_at} if fail_at else {})))
    trials = {t.trial_id: t for t in runner.run()}
    per_trial = results_of(runner)
    assert trials["t05"].status == TrialStatus.ERROR
    assert "t05 fails at iteration 4" in trials["t05"].error_msg
    assert per_trial["t05"] == [(1, 5), (2, 5), (3, 5)]
    assert trials["t06"].status == TrialStatus.ERROR
    assert "t06 fails at iteration 1" in trials["t06"].error_msg
    assert "t06" not in per_trial
    assert events.of("t06") == [("start", 0), ("error", 0)]
    for trial_id, trial in trials.items():
        if trial_id in ("t05", "t06"):
            continue
        x = trial.config["x"]
        assert trial.status == TrialStatus.TERMINATED
        assert per_trial[trial_id] == [(1, x), (2, x), (3, x)]
        assert [kind for kind, _ in events.of(trial_id)].count("start") == 1
    assert executor.num_hand_overs > 0


def test_trials_stopped_while_an_offer_is_in_flight(ray_cluster, storage):
    """A successor stopped while a running trial's call offers it never runs there (the actor
    that took it over is retired); a running trial stopped while its call offers a successor
    (a scheduler's or the user's stop, not its own end) leaves that successor waiting, to run
    whole elsewhere. No trial is lost or run twice."""
    runner, executor = runner_for(storage, stop={"training_iteration": 3})
    for i in range(8):
        runner.add_trial(handed(i, iterations=50))
    by_id = {t.trial_id: t for t in runner.get_trials()}
    for _ in range(200):
        if executor.reserved_trial_ids():
            break
        runner.step()
    (offered,) = sorted(executor.reserved_trial_ids())[:1]
    runner.stop_trial(by_id[offered])  # the successor, while the offer is in flight
    assert by_id[offered].status == TrialStatus.TERMINATED
    for _ in range(200):
        if executor.reserved_trial_ids() - {offered}:
            break
        runner.step()
    second = sorted(executor.reserved_trial_ids() - {offered})[0]
    for trial in list(runner.get_trials()):  # the trials whose calls offer it: stopped
        if trial.status == TrialStatus.RUNNING:
            runner.stop_trial(trial)
    assert by_id[second].status == TrialStatus.PENDING
    assert second not in executor.reserved_trial_ids()
    while not runner.is_finished():
        runner.step()
    per_trial = results_of(runner)
    assert offered not in per_trial
    x = by_id[second].config["x"]
    assert per_trial[second] == [(1, x), (2, x), (3, x)]
    assert by_id[second].stop_reason == CRITERION_MET
    for trial_id, results in per_trial.items():
        iterations = [i for i, _ in results]
        assert iterations == list(range(1, len(iterations) + 1)), trial_id
    runner.cleanup()


class Counting(Searcher):
    """Suggests ``{"x": n}`` for n = 0, 1, ...; remembers every end it is told."""

    def __init__(self):
        super().__init__(metric="x", mode="max")
        self.n = 0
        self.completed: dict[str, dict] = {}

    def suggest(self, trial_id):
        self.n += 1
        return {"x": self.n - 1, "iterations": 3, "sleep": 0.02}

    def on_trial_complete(self, trial_id, result=None, error=False):
        self.completed[trial_id] = result


def test_a_searcher_run_with_reuse_gives_each_trial_its_results_once(ray_cluster, storage):
    searcher = Counting()
    executor = RayTrialExecutor(storage, reuse_actors=True, reuse_placement_groups=True)
    runner = TrialRunner(
        "exp",
        executor=executor,
        search_alg=searcher,
        num_samples=8,
        trainable=HANDED,
        trial_kwargs={"resources": {"cpu": 1}},
        wait_timeout_s=120.0,
    )
    trials = runner.run()
    per_trial = results_of(runner)
    assert len(trials) == 8 and sorted(searcher.completed) == sorted(t.trial_id for t in trials)
    for trial in trials:
        x = trial.config["x"]
        assert trial.status == TrialStatus.TERMINATED
        assert per_trial[trial.trial_id] == [(1, x), (2, x), (3, x)]
        assert searcher.completed[trial.trial_id]["training_iteration"] == 3
