"""Our PopulationBasedTraining explores and exploits as Ray Tune 2.60's, draw by draw.

Ray's explore function and Ray's scheduler run here on stub trials with a fake controller: no
Ray cluster is started. Ray draws from the ``random`` module, seeded with ``random.seed(s)``; ours
from ``random.Random(s)``. Resamples from a search-space domain are the one exception (Ray draws
them from NumPy's global state), so those are checked by invariant and distribution.
"""

from __future__ import annotations

import math
import random
import statistics

import numpy as np
import pytest
from ray import tune
from ray.train._internal.session import _TrainingResult
from ray.tune.experiment import Trial as RayTrial
from ray.tune.schedulers import PopulationBasedTraining as RayPBT
from ray.tune.schedulers.pbt import _explore as ray_explore

from airflow_trials import Decision, Trial, TrialStatus
from airflow_trials.core.checkpoint import CheckpointRecord
from airflow_trials.core.search import choice, loguniform, uniform
from airflow_trials.schedulers.pbt.pbt_explore import explore
from airflow_trials.schedulers.pbt.pbt_scheduler import Exploit, PopulationBasedTraining

SEEDS = 300


def counter(seed):
    """A mutation function; each side gets its own, drawing the same values."""
    draws = random.Random(seed)
    return lambda: draws.uniform(0.0, 10.0)


def both_explore(seed, config, make_mutations, p=0.25, factors=(1.2, 0.8), custom=None):
    random.seed(seed)
    np.random.seed(seed)
    expected = ray_explore(config, make_mutations("ray"), p, factors, custom)
    got = explore(config, make_mutations("ours"), p, factors, custom, random.Random(seed))
    return expected, got


def plain_mutations(side):
    return {
        "lr": counter(7),
        "batch_size": [16, 32, 64, 128],
        "layers": counter(8),
        "optimizer": {
            "momentum": [0.8, 0.9, 0.99],
            "decay": counter(9),
            "nested": {"flag": counter(10)},
        },
        "activation": ("relu", "tanh"),
    }


@pytest.mark.parametrize("p", [0.0, 0.25, 0.9])
def test_explore_gives_rays_configs_and_operations(p):
    config = {
        "lr": 0.01,
        "batch_size": 32,
        "layers": 4,
        "other": "kept",
        "optimizer": {"momentum": 0.9, "decay": 1e-4, "nested": {"flag": True}},
        "activation": "gelu",  # not in its list: always resampled, after the draw
    }
    seen = set()
    for seed in range(SEEDS):
        config["batch_size"] = [16, 32, 64, 128][seed % 4]  # the ends shift to themselves: noop
        expected, got = both_explore(seed, config, plain_mutations, p=p)
        assert got == expected, f"seed {seed}"
        seen.update(str(op) for op in _flat(got[1]))
    if p == 0.25:
        assert {"* 1.2", "* 0.8", "resample", "shift left", "shift right"} <= seen
        assert any("(noop)" in op for op in seen)


def test_explore_with_three_factors_and_a_custom_explore_fn_as_ray():
    def custom(config):
        config["lr"] = min(config["lr"], 0.05)
        return config

    for seed in range(SEEDS):
        expected, got = both_explore(
            seed,
            {"lr": 0.04, "bs": 8},
            lambda side: {"lr": counter(1), "bs": [4, 8]},
            factors=(2.0, 1.0, 0.5),
            custom=custom,
        )
        assert got == expected


@pytest.mark.parametrize(
    ("ray_domain", "ours", "value", "inside", "middle"),
    [
        (
            tune.loguniform(1e-4, 1e-1),
            loguniform(1e-4, 1e-1),
            0.01,
            lambda v: 1e-4 <= v < 1e-1,
            lambda vs: abs(math.log10(statistics.median(vs)) + 2.5) < 0.3,
        ),
        (
            tune.uniform(0.0, 0.1),
            uniform(0.0, 0.1),
            0.05,
            lambda v: 0.0 <= v < 0.1,
            lambda vs: abs(statistics.mean(vs) - 0.05) < 0.008,
        ),
        (
            tune.choice([64, 128, 256]),
            choice([64, 128, 256]),
            128,
            lambda v: v in (64, 128, 256),
            lambda vs: set(vs) == {64, 128, 256},
        ),
    ],
)
def test_explore_resamples_a_domain_within_it_and_otherwise_draws_as_ray(
    ray_domain, ours, value, inside, middle
):
    """Ray resamples a domain from NumPy, we from rng: the operations, the list before it and every
    perturbation match exactly; a resampled value lies in the domain, spread as the domain says. The
    domain comes last, as after a resample the two streams part."""
    config = {"bs": 32, "x": value}
    resampled = []
    for seed in range(1500):
        (ray_config, ray_ops), (got, ops) = both_explore(
            seed,
            config,
            lambda side: {"bs": [16, 32, 64], "x": ray_domain if side == "ray" else ours},
        )
        assert ops == ray_ops and got["bs"] == ray_config["bs"]
        if ops["x"] == "resample":
            assert inside(got["x"]) and type(got["x"]) is type(value)
            resampled.append(got["x"])
        else:  # a perturbation: Ray treats tune.choice as a number too (an int is rounded back)
            perturbed = value * float(ops["x"][2:])
            assert (
                got["x"]
                == ray_config["x"]
                == (round(perturbed) if isinstance(value, int) else perturbed)
            )
    assert 300 < len(resampled) < 450  # resample_probability 0.25
    assert middle(resampled)


def _flat(operations):
    for value in operations.values():
        yield from _flat(value) if isinstance(value, dict) else [value]


# -- exploit decisions, replayed through Ray's scheduler and ours ----------------------------------


class FakeController:
    """What Ray's PBT asks of its TuneController: the trials, a save and a pause."""

    def __init__(self, replay):
        self.replay = replay
        self.search_alg = None

    def get_trials(self):
        return list(self.replay.ray_trials.values())

    def get_live_trials(self):
        return [t for t in self.get_trials() if not t.is_finished()]

    def _schedule_trial_save(self, trial, result=None):
        # Our runner checkpoints a trial it pauses; Ray pauses this one when others wait (or synch).
        pausing = self.replay.synch or any(
            t.status in (RayTrial.PENDING, RayTrial.PAUSED)
            for t in self.get_trials()
            if t is not trial
        )
        return self.replay.token(trial.trial_id, pausing)

    def pause_trial(self, trial, should_checkpoint=True):
        trial.set_status(RayTrial.PAUSED)


class Replay:
    """One population driven through both schedulers; every decision and exploit must agree.

    Trials marked ``saves`` checkpoint with every result, the others only when paused (our
    runner's pause saves): Ray's save then succeeds exactly when our donor has a checkpoint since
    its last perturbation.
    """

    def __init__(self, seed, n, synch, quantile_fraction):
        self.stream, self.synch = random.Random(10_000 + seed), synch
        kwargs = dict(
            time_attr="training_iteration",
            metric="score",
            mode=self.stream.choice(["min", "max"]),
            perturbation_interval=self.stream.choice([1, 2, 3]),
            synch=synch,
            burn_in_period=self.stream.choice([0, 2]),
            quantile_fraction=quantile_fraction,
            hyperparam_mutations={"lr": lambda: 0.5, "bs": [16, 32, 64, 128]},
        )
        random.seed(seed)
        self.ray = RayPBT(log_config=False, **kwargs)
        self.ours = PopulationBasedTraining(rng=random.Random(seed), **kwargs)
        self.controller = FakeController(self)
        self.ray_trials, self.trials, self.progress, self.level, self.saves = {}, {}, {}, {}, {}
        self.exploits = self.decisions = 0
        for index in range(n):
            trial_id = f"t-{index}"
            config = {
                "lr": self.stream.uniform(0.001, 0.1),
                "bs": self.stream.choice([16, 32, 64, 128]),
            }
            self.ray_trials[trial_id] = RayTrial(
                "__fake", stub=True, trial_id=trial_id, config=dict(config)
            )
            self.trials[trial_id] = Trial(
                "tests.trainables:counting", dict(config), trial_id=trial_id
            )
            self.progress[trial_id] = 0
            self.level[trial_id] = self.stream.choice([0.0, 1.0, self.stream.gauss(0, 2)])
            self.saves[trial_id] = self.stream.random() < 0.8
            self.ray.on_trial_add(self.controller, self.ray_trials[trial_id])
            self.ours.on_trial_add(self.trials[trial_id])

    def token(self, trial_id, pausing=False):
        return f"{trial_id}@{self.progress[trial_id]}" if self.saves[trial_id] or pausing else None

    def set_status(self, trial_id, status):
        self.ray_trials[trial_id].set_status(status.value)
        self.trials[trial_id].set_status(status)

    def start_next(self):
        expected = self.ray.choose_trial_to_run(self.controller)
        got = self.ours.choose_trial_to_run(list(self.trials.values()), lambda resources: True)
        assert (got and got.trial_id) == (expected and expected.trial_id)
        if got is not None:
            exploit = self.ours.take_exploit(got.trial_id)  # a synch perturbation cloned into it
            if exploit is not None:
                assert exploit.new_config == expected.config
                assert exploit.donor_checkpoint.path == expected.checkpoint
            self.apply(exploit)
            self.set_status(got.trial_id, TrialStatus.RUNNING)
        return got

    def apply(self, exploit: Exploit | None):
        """What the runner does: the donor's checkpoint and config, the donor's progress."""
        if exploit is None:
            return
        trial = self.trials[exploit.trial_id]
        donor, at = exploit.donor_checkpoint.path.split("@")
        assert donor == exploit.donor_trial_id
        trial.config = exploit.new_config
        trial.checkpoint_manager.on_checkpoint(
            CheckpointRecord(exploit.donor_checkpoint.path, int(at))
        )
        self.progress[trial.trial_id] = int(at)
        self.level[trial.trial_id] = self.level[donor]

    def step(self, trial_id):
        self.progress[trial_id] += 1
        it = self.progress[trial_id]
        roll = self.stream.random()
        score = (
            math.nan
            if roll < 0.03
            else float(self.stream.randint(0, 3))
            if roll < 0.2
            else (self.level[trial_id] * it + self.stream.gauss(0, 1))
        )
        result = {"training_iteration": it, "score": score}
        if self.saves[trial_id]:
            self.trials[trial_id].checkpoint_manager.on_checkpoint(
                CheckpointRecord(self.token(trial_id), it)
            )
        ray_trial = self.ray_trials[trial_id]
        expected = self.ray.on_trial_result(self.controller, ray_trial, dict(result))
        got = self.ours.on_trial_result(self.trials[trial_id], dict(result))
        self.decisions += 1
        exploit = self.ours.take_exploit(trial_id)
        if expected == "NOOP":  # Ray paused it itself: it cloned a donor
            assert got is Decision.PAUSE and exploit is not None, f"{trial_id} at {it}"
            donor = ray_trial.run_metadata.checkpoint_manager._latest_checkpoint_result.checkpoint
            assert exploit.donor_checkpoint.path == donor and exploit.new_config == ray_trial.config
            self.exploits += 1
        else:
            assert (got, exploit) == (expected, None), f"{trial_id} at {it}"
        if got is Decision.PAUSE:
            self.set_status(trial_id, TrialStatus.PAUSED)
            self.apply(exploit)
            if exploit is None:  # the pause's checkpoint, as Ray's controller saves one
                token = self.token(trial_id, pausing=True)
                self.trials[trial_id].checkpoint_manager.on_checkpoint(CheckpointRecord(token, it))
                ray_trial.run_metadata.checkpoint_manager._latest_checkpoint_result = (
                    _TrainingResult(checkpoint=token, metrics=result)
                )
            assert self.ours.decision_reason(trial_id).startswith(
                "paused by PBT at training_iteration="
            )
        if got is not Decision.PAUSE and it >= 12:
            self.ray.on_trial_complete(self.controller, ray_trial, dict(result))
            self.ours.on_trial_complete(self.trials[trial_id], dict(result))
            self.set_status(trial_id, TrialStatus.TERMINATED)
        return got

    def play(self, concurrency, steps):
        running = []
        while len(running) < concurrency and (chosen := self.start_next()) is not None:
            running.append(chosen.trial_id)
        for _ in range(steps):
            if not running:
                break
            trial_id = self.stream.choice(running)
            if (
                self.step(trial_id) is not Decision.CONTINUE
                or self.trials[trial_id].status.is_terminal()
            ):
                running.remove(trial_id)
                while len(running) < concurrency and (chosen := self.start_next()) is not None:
                    running.append(chosen.trial_id)


def play(seed, synch):
    stream = random.Random(seed)
    n = stream.randint(2, 9)
    replay = Replay(seed, n, synch, stream.choice([0.0, 0.25, 0.5, 0.3]))
    replay.play(concurrency=stream.randint(1, n), steps=120)
    return replay


@pytest.mark.parametrize("synch", [False, True])
def test_pbt_pauses_and_exploits_as_ray_tune(synch):
    exploits = decisions = 0
    for seed in range(150):
        replay = play(seed, synch)
        exploits += replay.exploits
        decisions += replay.decisions
    assert exploits > 50 and decisions > 3000  # the streams reach the exploit path often


# -- behaviour the replay does not show ------------------------------------------------------------


def population(n=4, **kwargs):
    settings = dict(
        metric="score",
        mode="max",
        perturbation_interval=60,
        hyperparam_mutations={"lr": [0.001, 0.01, 0.1]},
        rng=random.Random(0),
    )
    scheduler = PopulationBasedTraining(**{**settings, **kwargs})
    trials = [Trial("tests.trainables:counting", {"lr": 0.01}, trial_id=f"t-{i}") for i in range(n)]
    for trial in trials:
        scheduler.on_trial_add(trial)
        trial.set_status(TrialStatus.RUNNING)
    return scheduler, trials


def report(scheduler, trial, time, score, checkpoint_at=None):
    if checkpoint_at is not None:
        trial.checkpoint_manager.on_checkpoint(
            CheckpointRecord(f"/ckpt/{trial.trial_id}/{checkpoint_at}", checkpoint_at)
        )
    return scheduler.on_trial_result(
        trial, {"time_total_s": time, "training_iteration": time // 10, "score": score}
    )


def test_a_bottom_trial_clones_a_top_one_says_why_and_keeps_its_lineage():
    scheduler, (a, b, c, d) = population(
        hyperparam_mutations={"lr": lambda: 0.5}, resample_probability=0
    )
    # A trial becomes a donor when it is in the top quantile at its own perturbation.
    for trial, score in ((c, 2.0), (b, 3.0), (a, 4.0)):
        assert report(scheduler, trial, 60, score, checkpoint_at=6) is Decision.CONTINUE
    assert report(scheduler, d, 60, 1.0) is Decision.PAUSE
    exploit = scheduler.take_exploit("t-3")
    assert exploit.donor_trial_id == "t-0" and exploit.donor_checkpoint.path == "/ckpt/t-0/6"
    assert exploit.new_config["lr"] in (0.01 * 1.2, 0.01 * 0.8) and exploit.time == 60
    factor = exploit.operations["lr"].split(" * ")[1]
    assert scheduler.decision_reason("t-3") == (
        f"paused by PBT at time_total_s=60: in the bottom 25%, it continues from t-0's checkpoint "
        f"with lr={format(exploit.new_config['lr'], '.4g')} (0.01 * {factor})"
    )
    assert scheduler.take_exploit("t-3") is None  # taken once
    assert scheduler.lineage("t-3") == [exploit] and scheduler.lineage("t-0") == []


def test_a_donor_without_a_checkpoint_since_its_perturbation_is_not_cloned_but_a_later_one_is():
    scheduler, (a, b) = population(n=2, quantile_fraction=0.5)
    report(scheduler, b, 60, 1.0)
    report(scheduler, a, 60, 5.0, checkpoint_at=3)  # top at iteration 6, its checkpoint older
    assert (
        report(scheduler, b, 120, 1.0) is Decision.CONTINUE
        and scheduler.take_exploit("t-1") is None
    )
    assert "no checkpoint since its last perturbation" not in (
        scheduler.decision_reason("t-1") or ""
    )
    report(scheduler, a, 120, 5.0)  # top again at iteration 12, no checkpoint yet
    a.checkpoint_manager.on_checkpoint(
        CheckpointRecord("/ckpt/t-0/13", 13)
    )  # a checkpoint_freq one
    assert report(scheduler, b, 180, 1.0) is Decision.PAUSE
    assert scheduler.take_exploit("t-1").donor_checkpoint.iteration == 13


def test_a_waiting_trial_gets_a_turn_and_the_least_trained_fitting_one_runs_next():
    scheduler, (a, b, c) = population(n=3)
    c.set_status(TrialStatus.PAUSED)
    assert report(scheduler, a, 60, 1.0, checkpoint_at=6) is Decision.PAUSE
    assert (
        "so that waiting trials get a turn (it is not in the bottom 25%)"
        in scheduler.decision_reason("t-0")
    )
    a.set_status(TrialStatus.PAUSED)
    assert scheduler.choose_trial_to_run([a, b, c], lambda resources: True) is c
    assert scheduler.choose_trial_to_run([a, b, c], lambda resources: False) is None


def test_keys_missing_from_a_config_are_sampled_from_the_mutations():
    scheduler = PopulationBasedTraining(
        metric="score",
        mode="min",
        rng=random.Random(1),
        hyperparam_mutations={
            "lr": loguniform(1e-4, 1e-1),
            "bs": [16, 32],
            "opt": {"m": lambda: 0.9},
        },
    )
    trial = Trial("tests.trainables:counting", {"bs": 64}, trial_id="t-0")
    scheduler.on_trial_add(trial)
    assert (
        1e-4 <= trial.config["lr"] < 1e-1
        and trial.config["bs"] == 64
        and trial.config["opt"] == {"m": 0.9}
    )


def test_a_missing_attribute_raises_naming_it_unless_require_attrs_is_false():
    scheduler, (a, *_) = population()
    with pytest.raises(ValueError, match=r"Trial t-0 reported a result without 'score'"):
        scheduler.on_trial_result(a, {"time_total_s": 60})
    lenient, (b, *_) = population(require_attrs=False)
    assert lenient.on_trial_result(b, {"time_total_s": 60}) is Decision.CONTINUE


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        (
            {"hyperparam_mutations": None},
            ValueError,
            r"neither hyperparam_mutations nor custom_explore_fn.*give",
        ),
        (
            {"quantile_fraction": 0.6},
            ValueError,
            r"quantile_fraction=0.6: it must be between 0 and 0.5",
        ),
        ({"quantile_fraction": -0.1}, ValueError, r"quantile_fraction=-0.1"),
        ({"perturbation_interval": 0}, ValueError, r"perturbation_interval=0: it must be > 0"),
        (
            {"hyperparam_mutations": {"bs": []}},
            ValueError,
            r"\['bs'\] = \[\]: an empty list.*leave the key out",
        ),
        (
            {"hyperparam_mutations": {"o": {"m": ()}}},
            ValueError,
            r"\['o'\]\['m'\] = \(\): an empty list",
        ),
        (
            {"hyperparam_mutations": {"x": {"sample_from": "m:f"}}},
            ValueError,
            r"sample_from cannot be resampled",
        ),
        (
            {"hyperparam_mutations": {"x": {"uniform": [1, 0]}}},
            ValueError,
            r"\['x'\].*lower < upper",
        ),
        (
            {"hyperparam_mutations": {"x": {"choice": []}}},
            ValueError,
            r"choice needs a non-empty list",
        ),
        ({"hyperparam_mutations": {"x": 3}}, TypeError, r"\['x'\] = 3, of type int; use a list"),
        ({"resample_probability": 1.5}, ValueError, r"resample_probability=1.5"),
        ({"perturbation_factors": ()}, ValueError, r"perturbation_factors=\(\)"),
        ({"metric": ""}, ValueError, r"metric='': name the result key"),
        ({"mode": "best"}, ValueError, r"mode='best'.*mode='min'"),
    ],
)
def test_bad_settings_are_refused_with_the_parameter_and_the_fix(kwargs, error, message):
    settings = {
        "metric": "score",
        "mode": "max",
        "hyperparam_mutations": {"lr": [0.1, 0.01]},
        **kwargs,
    }
    with pytest.raises(error, match=message):
        PopulationBasedTraining(**settings)


def test_a_scheduler_without_metric_or_mode_refuses_trials():
    with pytest.raises(ValueError, match=r"cannot take trial t-0.*set_search_properties"):
        PopulationBasedTraining(hyperparam_mutations={"lr": [0.1]}).on_trial_add(
            Trial("tests.trainables:counting", trial_id="t-0")
        )
