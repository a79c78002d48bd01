"""The standalone experiment the README's first command runs: a real grid search on local Ray.

    python -m airflow_trials.demo [--epochs 15] [--storage DIR] [--db-url URL]

Joins the cluster ``RAY_ADDRESS`` names, or one running on this machine; else (or with
``RAY_ADDRESS=local``) starts a local Ray of its own, sized to this machine. Prints progress, then
the leaderboard; exits non-zero when no trial finished. The run is recorded in the trials DB
(``--db-url``, else ``AIRFLOW_TRIALS_DB_URL``, else the default SQLite file), so
``airflow-trials leaderboard regression-demo`` and the dashboard show it as they show a DAG run.
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
import tempfile
import time
from typing import Any

from airflow_trials import Callback, Trial, TrialsDbCallback, TrialStatus

TRAINABLE = "airflow_trials.examples.regression:train"
METRIC = "val_loss"


class _Progress(Callback):
    def __init__(self) -> None:
        self.start = time.monotonic()

    def on_trial_complete(self, trial: Trial) -> None:
        self._line(trial, "finished")

    def on_trial_error(self, trial: Trial) -> None:
        self._line(trial, "FAILED: " + (trial.error_msg or "").splitlines()[0])

    def on_trial_recover(self, trial: Trial) -> None:
        self._line(trial, f"failed, retrying from its checkpoint (failure {trial.num_failures})")

    def _line(self, trial: Trial, what: str) -> None:
        best = _best(trial)
        print(
            f"[{time.monotonic() - self.start:6.1f}s] trial {trial.trial_id} {what}; "
            f"{trial.last_result.get('training_iteration', 0)} epochs, best {METRIC} {best:.4f}",
            flush=True,
        )


def _best(trial: Trial) -> float:
    return trial.metric_analysis[METRIC].min if METRIC in trial.metric_analysis else math.inf


def leaderboard(trials: list[Trial]) -> str:
    """The trials ranked by their best validation loss, as a text table."""
    header = (
        f"{'rank':>4}  {'trial':<12} {'lr':>6} {'l2':>7}  {'status':<10} {'epochs':>6}  "
        f"{'best val_loss':>13}  {'val_acc':>7}  best checkpoint"
    )
    lines = [header, "-" * len(header)]
    for rank, trial in enumerate(sorted(trials, key=_best), start=1):
        best_ckpt = trial.checkpoint_manager.best()
        acc = (
            trial.metric_analysis["val_accuracy"].max
            if "val_accuracy" in trial.metric_analysis
            else math.nan
        )
        lines.append(
            f"{rank:>4}  {trial.trial_id:<12} {trial.config['lr']:>6g} {trial.config['l2']:>7g}  "
            f"{trial.status.value:<10} {trial.last_result.get('training_iteration', 0):>6}  "
            f"{_best(trial):>13.4f}  {acc:>7.3f}  {best_ckpt.path if best_ckpt else '-'}"
        )
    return "\n".join(lines)


def _init_ray(num_cpus: int | None) -> None:
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    from airflow_trials.hooks.trials import local_ray_running

    address = os.environ.get("RAY_ADDRESS")
    if address != "local" and (address or local_ray_running()):
        # A cluster is there (RAY_ADDRESS, or one started with `ray start` on this machine): join
        # it as it is; its size is its own, so --num-cpus does not apply.
        if num_cpus is not None:
            print(
                f"--num-cpus {num_cpus} ignored: joining the running Ray cluster, which has its "
                "own size."
            )
        ray.init(address=address or "auto", log_to_driver=False)
    else:
        # No cluster, or RAY_ADDRESS=local (as Ray reads it): a new local Ray of this job's own.
        ray.init(
            address="local",
            num_cpus=num_cpus or os.cpu_count(),
            include_dashboard=False,
            log_to_driver=False,
        )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--epochs", type=int, default=15, help="epochs per trial (default 15)")
    parser.add_argument(
        "--storage", default=None, help="where checkpoints go (default: a temporary directory)"
    )
    parser.add_argument("--experiment", default="regression-demo")
    parser.add_argument(
        "--num-cpus", type=int, default=None, help="CPUs of the local Ray (default: all)"
    )
    parser.add_argument(
        "--db-url",
        default=None,
        help="trials DB to record the run in (default: as the DAGs find it: the trials_default "
        "connection, else AIRFLOW_TRIALS_DB_URL, else the default file)",
    )
    return parser


def _add_grid(runner: Any, experiment: str, epochs: int) -> None:
    """The demo's trials: a grid over the learning rate and the L2 weight."""
    grid = itertools.product([1.0, 0.3, 0.1, 0.03], [0.0, 0.01])
    for lr, l2 in grid:
        runner.add_trial(
            Trial(
                TRAINABLE,
                {"lr": lr, "l2": l2, "batch_size": 128, "seed": 0},
                experiment_name=experiment,
                resources={"cpu": 0.5},
                stopping_criterion={"training_iteration": epochs},
                keep_checkpoints_num=2,
                checkpoint_score_attr=f"min-{METRIC}",
                max_failures=1,
            )
        )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)

    import ray

    from airflow_trials import TrialRunner

    _init_ray(args.num_cpus)
    storage = args.storage or tempfile.mkdtemp(prefix="airflow_trials_demo_")
    recorder = TrialsDbCallback(
        metric=METRIC,
        mode="min",
        db_url=args.db_url,
        run_key=f"demo__{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime())}",
    )
    runner = TrialRunner(
        args.experiment, storage_path=storage, callbacks=[_Progress(), recorder], reuse_actors=True
    )
    _add_grid(runner, args.experiment, args.epochs)
    print(
        f"Running {len(runner.get_trials())} trials of {TRAINABLE} on Ray; storage: {storage}",
        flush=True,
    )
    try:
        trials = runner.run()
    finally:
        ray.shutdown()
    print()
    print(leaderboard(trials))
    finished = [t for t in trials if t.status == TrialStatus.TERMINATED]
    print(
        f"\n{len(finished)} of {len(trials)} trials finished; experiment state: "
        f"{runner.experiment_dir}/experiment_state.json"
    )
    if finished:
        best = recorder.result_grid().get_best_result(scope="all")
        print(
            f"Best trial {best.trial_id} ({best.config}): load its model with "
            f"airflow_trials.load_checkpoint({best.best_checkpoint!r})."
        )
    db_option = f" --db-url {args.db_url}" if args.db_url else ""
    print(
        f"Recorded as run {recorder.run_key} in {recorder.store!r}: "
        f"airflow-trials leaderboard {args.experiment}{db_option}"
    )
    return 0 if finished else 1


if __name__ == "__main__":
    sys.exit(main())
