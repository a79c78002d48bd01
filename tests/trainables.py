"""Trainables the tests run on real Ray actors (importable as tests.trainables:<name>)."""

from __future__ import annotations

import os
import sys
import time

import airflow_trials
from airflow_trials import Trainable


class FakeTrainable(Trainable):
    """A class trainable like Ray Tune's MockTrainable: 10 timesteps per step, optional errors.

    config: ``sleep`` seconds per step; ``mock_error`` raises at iteration 2 the first time (every
    time with ``persistent_error``); ``fail_marker`` is a file path: fail once while it is absent.
    """

    def setup(self, config):
        self.iteration = 0
        self.info = None
        self.restored = False
        self.resets = 0

    def step(self):
        self.iteration += 1
        time.sleep(self.config.get("sleep", 0.0))
        if self.config.get("mock_error") and self.iteration == 2:
            if self.config.get("persistent_error") or not self.restored:
                raise RuntimeError("mock error at iteration 2")
        return {"episode_reward_mean": float(self.iteration), "timesteps_this_iter": 10}

    def save_checkpoint(self, checkpoint_dir):
        return {"iteration": self.iteration, "info": self.info}

    def load_checkpoint(self, checkpoint):
        self.iteration = checkpoint["iteration"]
        self.info = checkpoint["info"]
        self.restored = True

    def reset_config(self, new_config):
        self.config = new_config
        self.iteration = 0
        self.resets += 1
        return True

    def set_info(self, info):
        self.info = info
        return info

    def get_info(self):
        return self.info


class DirCheckpointTrainable(FakeTrainable):
    """Writes its checkpoint as files into the directory the engine gives it."""

    def save_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "state.txt"), "w") as f:
            f.write(str(self.iteration))
        return None

    def load_checkpoint(self, checkpoint):
        with open(os.path.join(checkpoint, "state.txt")) as f:
            self.iteration = int(f.read())
        self.restored = True


def counting(config):
    """Reports ``score = i * scale`` forever (a stopping criterion ends it), checkpointing a dict
    each step;
    with ``hold_at``, it waits before that iteration until the file ``gate`` exists (and again
    before ``hold_again_at`` until ``gate_again`` exists)."""
    start = 0
    ckpt = airflow_trials.get_checkpoint()
    if ckpt is not None:
        start = ckpt["i"]
    for i in range(start + 1, 10_000):
        time.sleep(config.get("sleep", 0.0))
        holds = {config.get("hold_at"): "gate", config.get("hold_again_at"): "gate_again"}
        if i in holds:  # a test holds the trial here until it opens the gate
            while not os.path.exists(config[holds[i]]):
                time.sleep(0.05)
        if config.get("crash_at") == i and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            raise ValueError(f"crash at iteration {i}")
        airflow_trials.report(score=i * config.get("scale", 1.0), checkpoint={"i": i})


def sleepy(config):
    """The benchmark's trainable: ``iterations`` results, sleeping ``sleep`` seconds before each."""
    for _ in range(config["iterations"]):
        time.sleep(config["sleep"])
        airflow_trials.report(loss=config.get("x", 0.0))


def quadratic(config):
    """Reports ``loss = (x - 0.3) ** 2`` three times: a search's objective with its optimum at x =
    0.3."""
    for _ in range(3):
        airflow_trials.report(loss=(config["x"] - 0.3) ** 2)


def failing(config):
    airflow_trials.report(score=1.0)
    raise KeyError("broken trainable: key 'missing'")


def silent(config):
    return None


def returns_dict(config):
    return {"score": 42.0}


def report_after_done(config):
    for i in range(10):
        airflow_trials.report(score=float(i), done=(i == 2))


def dir_checkpoint(config):
    ckpt = airflow_trials.get_checkpoint()
    start = 0
    if ckpt is not None:
        with open(os.path.join(ckpt, "step.txt")) as f:
            start = int(f.read())
    for i in range(start + 1, config.get("iterations", 3) + 1):
        path = os.path.join(config["scratch"], f"ckpt-{i}")
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "step.txt"), "w") as f:
            f.write(str(i))
        airflow_trials.report(step=i, checkpoint=path)


def chatty(config):
    print(f"hello from trial {airflow_trials.get_trial_id()}", flush=True)
    print("a warning on stderr", file=sys.stderr, flush=True)
    airflow_trials.report(score=1.0)


NOT_A_TRAINABLE = 42


def ray2_style(config):
    """Ray Tune 2's form: the metrics dict positionally, the checkpoint as a keyword."""
    start = (airflow_trials.get_checkpoint() or {"i": 0})["i"]
    for i in range(start + 1, 4):
        airflow_trials.report({"loss": 1.0 / i, "step": i}, checkpoint={"i": i} if i == 2 else None)


def ambiguous_report(config):
    """Metrics both as a dict and as keywords: the dict was a checkpoint in the old form."""
    airflow_trials.report({"w": [1.0, 2.0]}, loss=0.5)


def peaked(config):
    """Scores 1, 5, 2, 3 with a checkpoint at each step: its best model is not its latest."""
    start = (airflow_trials.get_checkpoint() or {"i": 0})["i"]
    for i, score in list(enumerate([1.0, 5.0, 2.0, 3.0], start=1))[start:]:
        airflow_trials.report({"score": score}, checkpoint={"i": i, "score": score})


def with_array(config, data):
    """Takes a with_parameters NumPy array: reports what it received, and whether it was the
    object store's read-only, zero-copy view rather than a copy made for this trial."""
    airflow_trials.report(
        total=float(data.sum()),
        length=int(data.shape[0]),
        dtype=str(data.dtype),
        read_only=not data.flags.writeable,
        scale=config["scale"] * float(data[1]),
    )


class WithArray(Trainable):
    """The class API's with_parameters form: the constants arrive in setup()."""

    def setup(self, config, data, offset=0.0):
        self.total = float(sum(data)) + offset

    def step(self):
        return {"total": self.total, "done": True}


class NoCheckpoints(Trainable):
    """A class trainable that cannot be checkpointed (PBT must refuse it)."""

    def step(self):
        return {"score": 1.0}


def logged(config):
    """Writes ``start <i>`` to the file ``log`` as each iteration starts, then reports ``score = i``
    with the checkpoint ``{"i": i}``: a test reads which iterations ran, asked for or not."""
    for i in range(1, config.get("iterations", 10_000) + 1):
        with open(config["log"], "a") as f:
            f.write(f"start {i}\n")
        time.sleep(config.get("sleep", 0.0))
        airflow_trials.report(score=float(i), checkpoint={"i": i})


def two_metrics(config):
    """Reports ``score = i * scale`` (to maximise) and a constant ``cost`` (to minimise) forever."""
    for i in range(1, 10_000):
        airflow_trials.report(score=i * config["scale"], cost=config["cost"])


def handed(config):
    """Prints ``<trial id> <i>`` and reports ``x`` at each of ``iterations`` iterations, then
    returns (its end comes with the runner's next call). ``fail_at``: raises at that iteration
    instead of reporting it (``iterations + 1``: after its last report, as it would return)."""
    trial_id = airflow_trials.get_trial_id()
    for i in range(1, config["iterations"] + 2):
        time.sleep(config.get("sleep", 0.0))
        if i == config.get("fail_at"):
            raise RuntimeError(f"{trial_id} fails at iteration {i}")
        if i > config["iterations"]:
            return
        print(trial_id, i, flush=True)
        airflow_trials.report(x=config["x"])


def in_placement_group(config):
    """Writes where it runs to the JSON file ``<out>/<trial id>.json`` (its placement group, what
    its actor holds and in which bundles, its node, and the same for one Ray task it starts, as a
    trainable's worker would, with ``task_cpus`` and ``task_gpus``; the node of each bundle),
    then reports ``score = i`` for ``iterations`` iterations, ``sleep`` seconds apart."""
    import json

    import ray
    from ray.util import get_current_placement_group

    def here() -> dict:
        group = get_current_placement_group()
        context = ray.get_runtime_context()
        return {
            "group": None if group is None else group.id.hex(),
            "node": context.get_node_id(),
            "resources": context.get_assigned_resources(),
            # Ray's own names of what it booked, which say the bundle: CPU_group_<index>_<group>.
            "booked": sorted(ray._private.worker.global_worker.core_worker.resource_ids()),
        }

    task = ray.remote(num_cpus=config.get("task_cpus", 1), num_gpus=config.get("task_gpus", 0))
    seen = {"started": time.time(), "actor": here(), "task": ray.get(task(here).remote())}
    group = get_current_placement_group()
    if group is not None:  # the node of each bundle, by index
        table = ray.util.placement_group_table(group)
        seen["bundle_nodes"] = [table["bundles_to_node_id"][i] for i in sorted(table["bundles"])]
    path = os.path.join(config["out"], f"{airflow_trials.get_trial_id()}.json")
    with open(path, "w") as f:
        json.dump(seen, f)
    for i in range(1, config.get("iterations", 1) + 1):
        time.sleep(config.get("sleep", 0.0))
        airflow_trials.report(score=float(i))
