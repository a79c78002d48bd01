"""Benchmark: a trial that runs Ray Train inside it, started by our engine and by Ray Tune.

One trial of ``airflow_trials.examples.torch_train``: a ``TorchTrainer`` with 2 gloo workers at
0.25 CPU each, a tiny MLP, ``--epochs`` reports. Ours runs the example's trainable through
``TrialRunner`` (its ``TrialReportCallback`` hands Train's reports to the trial); Ray Tune runs a
function trainable through ``Tuner.fit()`` that builds the same trainer on the same train loop
(``torch_train._train_loop``, one owner) and reports through Ray Tune's own Train V2 adapter,
``ray.tune.integration.ray_train.TuneReportCallback``. Both drivers (the trial's actor, Tune's
trainable) take 1 CPU; Train's controller and both queues take none.

Both sides share one local Ray (``--cpus``): a fresh cluster per side would add Ray's start to
neither figure and only make the rounds slower, and the rounds alternate (ours, Tune, ours, ...)
so a warmer or busier moment is not given to one side. Every round starts new processes anyway:
the trial's actor, Train's controller and its workers are actors, which Ray never reuses.

Per side and round: the time from ``add_trial`` (ours) or ``Tuner.fit()`` (Tune) to the first
result reaching the driver (an ``on_trial_result`` callback in each), and the median gap between
later results. The table gives the medians over the rounds and the ratio ours / Tune, beside the
20-million-addition loop's time at the start and the end (the machine's speed) and the load.

    .venv/bin/python -m bench.ray_train_trial                 # 3 rounds, about 4 minutes
    .venv/bin/python -m bench.ray_train_trial --rounds 5 --epochs 12
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
TRAINABLE = "airflow_trials.examples.torch_train:train"

Timing = tuple[float, float]  # (seconds to the first result, median seconds between results)


def addition_loop_seconds() -> float:
    started = time.perf_counter()
    total = 0
    for i in range(20_000_000):
        total += i
    return time.perf_counter() - started


def _config(epochs: int) -> dict[str, Any]:
    return {
        "lr": 0.05,
        "hidden": 16,
        "n_samples": 600,
        "seed": 1,
        "epochs": epochs,
        "num_workers": 2,
        "cpu_per_worker": 0.25,
    }


def _timing(started: float, arrivals: list[float], epochs: int, side: str) -> Timing:
    if len(arrivals) != epochs:
        raise SystemExit(f"{side}: {len(arrivals)} results reached the driver, not {epochs}")
    gaps = [later - earlier for earlier, later in zip(arrivals, arrivals[1:], strict=False)]
    return arrivals[0] - started, statistics.median(gaps)


def run_ours(epochs: int, storage: str, round_number: int) -> Timing:
    from airflow_trials import Callback, Trial, TrialRunner, TrialStatus

    arrivals: list[float] = []

    class Arrivals(Callback):
        def on_trial_result(self, trial: Any, result: Any) -> None:
            arrivals.append(time.perf_counter())

    name = f"bench-train-ours-{round_number}"
    runner = TrialRunner(name, storage_path=storage, callbacks=[Arrivals()])
    started = time.perf_counter()
    trial = Trial(TRAINABLE, _config(epochs), experiment_name=name, resources={"cpu": 1})
    runner.add_trial(trial)
    runner.run()
    if trial.status != TrialStatus.TERMINATED:
        raise SystemExit(f"ours: the trial ended {trial.status.value}: {trial.error_msg}")
    return _timing(started, arrivals, epochs, "ours")


def tune_trainable(config: dict[str, Any]) -> None:
    """Ray Tune's function trainable: the same TorchTrainer, reported through Tune's adapter."""
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    from airflow_trials.examples.torch_train import _train_loop

    scratch = tempfile.mkdtemp(prefix="bench-train-tune-")  # removed as ours removes its own
    trainer = TorchTrainer(
        _train_loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(
            num_workers=int(config["num_workers"]),
            use_gpu=False,
            resources_per_worker={"CPU": float(config["cpu_per_worker"])},
        ),
        run_config=RunConfig(
            storage_path=scratch,
            callbacks=[TuneReportCallback()],
        ),
    )
    try:
        trainer.fit()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_tune(epochs: int, storage: str, round_number: int) -> Timing:
    from ray import tune

    arrivals: list[float] = []

    class Arrivals(tune.Callback):
        def on_trial_result(self, iteration: int, trials: Any, trial: Any, result: Any, **_: Any):
            arrivals.append(time.perf_counter())

    tuner = tune.Tuner(
        tune.with_resources(tune_trainable, {"cpu": 1}),
        param_space=_config(epochs),
        run_config=tune.RunConfig(
            name=f"bench-train-tune-{round_number}",
            storage_path=storage,
            callbacks=[Arrivals()],
            verbose=0,
        ),
    )
    started = time.perf_counter()
    results = tuner.fit()
    if results.num_errors:
        raise SystemExit(f"tune: the trial failed: {results.errors}")
    return _timing(started, arrivals, epochs, "tune")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds per side, alternated")
    parser.add_argument("--epochs", type=int, default=8, help="Train reports per trial")
    parser.add_argument("--cpus", type=int, default=2, help="the local Ray's logical CPUs")
    args = parser.parse_args(argv)
    if args.epochs < 2:
        parser.error("--epochs must be at least 2: the gaps need two results")

    # A Ray of our own even when another runs on this machine (RAY_ADDRESS would join it).
    os.environ["RAY_ADDRESS"] = "local"
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])
    )
    sys.path.insert(0, str(REPO))
    import ray

    load_start = os.getloadavg()
    loop_start = addition_loop_seconds()
    print(f"20M-addition loop: {loop_start:.2f} s; load average {load_start[0]:.2f}", flush=True)
    ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    storage = tempfile.mkdtemp(prefix="airflow_trials_bench_train_")
    timings: dict[str, list[Timing]] = {"ours": [], "tune": []}
    try:
        for round_number in range(1, args.rounds + 1):
            for side, run in (("ours", run_ours), ("tune", run_tune)):
                first, per_result = run(args.epochs, storage, round_number)
                timings[side].append((first, per_result))
                print(
                    f"round {round_number} {side}: first result {first:.2f} s, "
                    f"then {per_result:.3f} s per result",
                    flush=True,
                )
    finally:
        ray.shutdown()
        shutil.rmtree(storage, ignore_errors=True)
    loop_end = addition_loop_seconds()
    load_end = os.getloadavg()

    medians = {
        side: (
            statistics.median(first for first, _ in rounds),
            statistics.median(per for _, per in rounds),
        )
        for side, rounds in timings.items()
    }
    print()
    print(
        f"1 trial, TorchTrainer with 2 gloo workers at 0.25 CPU, {args.epochs} epochs, "
        f"{args.rounds} rounds per side (medians), {args.cpus} Ray CPUs"
    )
    print(f"{'':<12} {'first result':>14} {'per result':>12}")
    for side, (first, per) in medians.items():
        print(f"{side:<12} {first:12.2f} s {per:10.3f} s")
    (ours_first, ours_per), (tune_first, tune_per) = medians["ours"], medians["tune"]
    print(f"{'ours / tune':<12} {ours_first / tune_first:14.2f} {ours_per / tune_per:12.2f}")
    print(f"20M-addition loop: {loop_start:.2f} s at the start, {loop_end:.2f} s at the end")
    print(
        "load average (1, 5, 15 min): "
        f"{', '.join(f'{x:.2f}' for x in load_start)} at the start, "
        f"{', '.join(f'{x:.2f}' for x in load_end)} at the end"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
