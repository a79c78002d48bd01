"""Benchmark: does tuning learn? Four tuners on one real task, side by side on one local Ray.

The task: scikit-learn's digits (1,797 8x8 images, a fixed stratified 75/25 split seeded 0), an
MLPClassifier trained with ``partial_fit``, one epoch per reported result (``val_acc``,
``val_loss``), at most ``--max-t`` epochs per trial (``bench/_sklearn_trainables.py``). The space:
learning_rate_init loguniform(1e-4, 1e-1), alpha loguniform(1e-6, 1e-2), hidden_units (one layer)
choice([32, 64, 128]), batch_size choice([32, 64, 128]).

For every seed, ``--num-samples`` trials of 1 CPU each through each arm:

1. ours FIFO + random: ``generate_configs(space, num_samples, seed)`` added to a ``TrialRunner``;
2. ours ASHA + random: the same configs, ``ASHAScheduler(max_t, grace_period=1,
   reduction_factor=3)``;
3. ours ASHA + TPE: ``OptunaSearch(seed=seed)`` behind ``ConcurrencyLimiter(num_cpus)``, same ASHA;
4. Ray Tune ASHA + TPE: ``Tuner.fit()`` with Ray's ASHAScheduler, OptunaSearch(seed=seed) and
   ConcurrencyLimiter, same settings (Ray's random search if its OptunaSearch fails, said so).

Each run records its best val_acc, the trial-iterations (results) it used, its wall time, and how
many trial-iterations it took for its best-so-far to first reach the FIFO run's best of the same
seed, less ``--tolerance-pp`` percentage points. The script prints a table per arm (mean and std
over seeds) and three ratios against their targets: (a) ASHA's trial-iterations to FIFO's best /
FIFO's total (<= 0.35), (b) ours ASHA + TPE best vs Ray Tune's (within one std), (c) ours ASHA +
TPE wall time / Ray Tune's (<= 0.8).

Needs scikit-learn, a dev dependency (``./scripts/test.sh`` or ``scripts/bootstrap.sh`` installs
it).

    .venv/bin/python -m bench.tuning_quality --quick   # smoke run: 2 seeds x 8 trials x 9 epochs
    .venv/bin/python -m bench.tuning_quality           # full run: 5 seeds x 32 trials x 27 epochs
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAINABLE = "bench._sklearn_trainables:ours"
METRIC, MODE = "val_acc", "max"
FIFO, ASHA, ASHA_TPE, TUNE = (
    "ours FIFO + random",
    "ours ASHA + random",
    "ours ASHA + TPE",
    "Ray Tune ASHA + TPE",
)
GRACE_PERIOD, REDUCTION_FACTOR = 1, 3


@dataclasses.dataclass(frozen=True)
class Settings:
    """What every arm of one benchmark run shares."""

    num_samples: int
    max_t: int
    num_cpus: int
    reuse_actors: bool
    storage_root: str

    def storage(self, name: str) -> str:
        """A fresh directory of its own for one arm's run."""
        return tempfile.mkdtemp(prefix=f"{name}_", dir=self.storage_root)


@dataclasses.dataclass
class RunRecord:
    """One arm's run for one seed: ``curve`` is the metric of every result, in the order the
    tuner processed them, so its index is the trial-iterations spent so far."""

    arm: str
    seed: int
    wall_s: float
    curve: list[float]
    note: str = ""  # set when the arm did not run as named (Ray Tune's search fell back to random)

    def __post_init__(self) -> None:
        if not self.curve:
            raise SystemExit(
                f"{self.arm}, seed {self.seed}: the run recorded no {METRIC} results; nothing to "
                "compare."
            )

    @property
    def best(self) -> float:
        return max(self.curve)

    @property
    def trial_iterations(self) -> int:
        return len(self.curve)

    def iterations_to_reach(self, target: float) -> int | None:
        """The trial-iterations after which the best-so-far first was >= target; None if never."""
        return next((i for i, value in enumerate(self.curve, 1) if value >= target), None)


Records = dict[str, dict[int, RunRecord]]
"""Arm -> seed -> its run."""


# -- search spaces ---------------------------------------------------------------------------------
def our_space(max_t: int, seed: int) -> dict[str, Any]:
    from airflow_trials.core.search import choice, loguniform

    return {
        "learning_rate_init": loguniform(1e-4, 1e-1),
        "alpha": loguniform(1e-6, 1e-2),
        "hidden_units": choice([32, 64, 128]),
        "batch_size": choice([32, 64, 128]),
        "max_t": max_t,  # fixed values: every config gets them
        "seed": seed,  # the network's initialisation and shuffling
    }


def ray_space(max_t: int, seed: int) -> dict[str, Any]:
    from ray import tune

    return {
        "learning_rate_init": tune.loguniform(1e-4, 1e-1),
        "alpha": tune.loguniform(1e-6, 1e-2),
        "hidden_units": tune.choice([32, 64, 128]),
        "batch_size": tune.choice([32, 64, 128]),
        "max_t": max_t,
        "seed": seed,
    }


# -- our engine ------------------------------------------------------------------------------------
def _our_asha(max_t: int) -> Any:
    from airflow_trials import ASHAScheduler

    return ASHAScheduler(
        metric=METRIC,
        mode=MODE,
        max_t=max_t,
        grace_period=GRACE_PERIOD,
        reduction_factor=REDUCTION_FACTOR,
    )


def run_ours_random(settings: Settings, seed: int, asha: bool) -> RunRecord:
    """Arms 1 and 2: the seed's random configs, all added up front, FIFO or ASHA."""
    from airflow_trials import Trial, TrialRunner
    from airflow_trials.core.search import generate_configs

    name = f"{'asha' if asha else 'fifo'}-random-seed{seed}"
    runner = TrialRunner(
        name,
        storage_path=settings.storage(name),
        scheduler=_our_asha(settings.max_t) if asha else None,
        reuse_actors=settings.reuse_actors,
    )
    for config in generate_configs(
        our_space(settings.max_t, seed), settings.num_samples, seed=seed
    ):
        runner.add_trial(Trial(TRAINABLE, config, experiment_name=name, resources={"cpu": 1}))
    return _run_ours(runner, ASHA if asha else FIFO, seed)


def run_ours_tpe(settings: Settings, seed: int) -> RunRecord:
    """Arm 3: Optuna's TPE suggests each trial, ASHA stops the poor ones."""
    from airflow_trials import ConcurrencyLimiter, OptunaSearch, TrialRunner

    name = f"asha-tpe-seed{seed}"
    search = ConcurrencyLimiter(
        OptunaSearch(our_space(settings.max_t, seed), metric=METRIC, mode=MODE, seed=seed),
        max_concurrent=settings.num_cpus,
    )
    runner = TrialRunner(
        name,
        storage_path=settings.storage(name),
        scheduler=_our_asha(settings.max_t),
        search_alg=search,
        num_samples=settings.num_samples,
        trainable=TRAINABLE,
        trial_kwargs={"resources": {"cpu": 1}},
        reuse_actors=settings.reuse_actors,
    )
    return _run_ours(runner, ASHA_TPE, seed)


def _run_ours(runner: Any, arm: str, seed: int) -> RunRecord:
    start = time.perf_counter()
    trials = runner.run()
    wall_s = time.perf_counter() - start
    failed = [t for t in trials if t.status.value == "ERROR"]
    if failed:
        raise SystemExit(
            f"{arm}, seed {seed}: {len(failed)} of {len(trials)} trials failed; the first: "
            f"{failed[0].trial_id}: {failed[0].error_msg}"
        )
    return RunRecord(arm, seed, wall_s, [float(result[METRIC]) for _, result in runner.results()])


# -- Ray Tune --------------------------------------------------------------------------------------
def _tune_recorder() -> Any:
    """A Ray Tune callback that keeps the metric of every result in the order Tune processed
    them."""
    from ray import tune

    class ResultOrder(tune.Callback):
        def __init__(self) -> None:
            self.curve: list[float] = []

        def on_trial_result(
            self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
        ) -> None:
            self.curve.append(float(result[METRIC]))

    return ResultOrder()


def tune_searcher(settings: Settings, seed: int) -> tuple[Any, str]:
    """Ray's OptunaSearch (TPE, seeded) behind a ConcurrencyLimiter, after a dry suggest/report/
    complete round trip with the installed Optuna; Ray's random search (None) if that fails."""
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    try:
        probe = OptunaSearch(seed=seed)
        probe.set_search_properties(METRIC, MODE, ray_space(settings.max_t, seed))
        probe.suggest("probe")
        probe.on_trial_result("probe", {METRIC: 0.5, "training_iteration": 1})
        probe.on_trial_complete("probe", {METRIC: 0.5, "training_iteration": 1})
    except Exception as e:  # any incompatibility with the installed Optuna: fall back, and say so
        return None, f"Ray Tune ASHA + random (Ray's OptunaSearch failed: {type(e).__name__}: {e})"
    return ConcurrencyLimiter(OptunaSearch(seed=seed), max_concurrent=settings.num_cpus), TUNE


def run_tune(settings: Settings, seed: int) -> RunRecord:
    """Arm 4: Ray Tune's Tuner on the same Ray."""
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler

    from bench._sklearn_trainables import ray_tune

    search_alg, label = tune_searcher(settings, seed)
    recorder = _tune_recorder()
    name = f"tune-asha-tpe-seed{seed}"
    scheduler = ASHAScheduler(
        max_t=settings.max_t, grace_period=GRACE_PERIOD, reduction_factor=REDUCTION_FACTOR
    )
    tuner = tune.Tuner(
        tune.with_resources(ray_tune, {"cpu": 1}),
        param_space=ray_space(settings.max_t, seed),
        tune_config=tune.TuneConfig(
            metric=METRIC,
            mode=MODE,
            scheduler=scheduler,
            search_alg=search_alg,
            num_samples=settings.num_samples,
            reuse_actors=settings.reuse_actors,
        ),
        run_config=tune.RunConfig(
            name=name, storage_path=settings.storage(name), verbose=0, callbacks=[recorder]
        ),
    )
    start = time.perf_counter()
    results = tuner.fit()
    wall_s = time.perf_counter() - start
    if results.num_errors or len(results) != settings.num_samples:
        raise SystemExit(
            f"{label}, seed {seed}: {results.num_errors} errors in {len(results)} trials: "
            f"{results.errors[:1]}"
        )
    return RunRecord(TUNE, seed, wall_s, recorder.curve, note="" if label == TUNE else label)


# -- the report ------------------------------------------------------------------------------------
def mean_std(values: Sequence[float]) -> tuple[float, float]:
    if not values:
        return math.nan, math.nan
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def _fmt(values: Sequence[float], digits: int) -> str:
    mean, std = mean_std(values)
    return f"{mean:.{digits}f} ± {std:.{digits}f}"


def print_table(records: Records, tolerance: float) -> None:
    fifo = records[FIFO]
    print(
        f"{'arm':<22} {'best val_acc':>17} {'trial-iterations':>17} {'wall s':>13}   to FIFO's "
        "best (seeds)"
    )
    for arm, runs in records.items():
        reached = [r.iterations_to_reach(fifo[s].best - tolerance) for s, r in runs.items()]
        hits = [float(n) for n in reached if n is not None]
        print(
            f"{arm:<22} {_fmt([r.best for r in runs.values()], 4):>17} "
            f"{_fmt([r.trial_iterations for r in runs.values()], 1):>17} "
            f"{_fmt([r.wall_s for r in runs.values()], 1):>13}   "
            f"{_fmt(hits, 1) if hits else 'never':>13} ({len(hits)}/{len(runs)})"
        )


def reach_ratio(records: Records, arm: str, tolerance: float) -> str:
    """Ratio (a) for one arm: its trial-iterations to FIFO's best / FIFO's total, per seed."""
    ratios: list[float] = []
    missed: list[int] = []
    for seed, run in records[arm].items():
        fifo = records[FIFO][seed]
        reached = run.iterations_to_reach(fifo.best - tolerance)
        if reached is None:
            missed.append(seed)
        else:
            ratios.append(reached / fifo.trial_iterations)
    if not ratios:
        return f"never reached FIFO's best within {tolerance * 100:g} pp (seeds {missed}): missed"
    mean, std = mean_std(ratios)
    verdict = "met" if mean <= 0.35 and not missed else "missed"
    note = f"; never within {tolerance * 100:g} pp in seeds {missed}" if missed else ""
    return f"{mean:5.2f} ± {std:.2f} over {len(ratios)} seeds (<= 0.35: {verdict}{note})"


def print_ratios(records: Records, tolerance: float) -> None:
    print(f"ratios (target), FIFO's best less {tolerance * 100:g} percentage points:")
    for arm in (ASHA, ASHA_TPE, TUNE):
        if arm in records:
            print(
                f"  (a) {arm} trial-iterations to FIFO's best / FIFO's total: "
                f"{reach_ratio(records, arm, tolerance)}"
            )
    if TUNE not in records:
        print("  (b), (c): Ray Tune skipped")
        return
    ours_mean, _ = mean_std([r.best for r in records[ASHA_TPE].values()])
    tune_mean, tune_std = mean_std([r.best for r in records[TUNE].values()])
    within = abs(ours_mean - tune_mean) <= tune_std
    print(
        f"  (b) ours ASHA + TPE best {ours_mean:.4f} vs Ray Tune {tune_mean:.4f} ± {tune_std:.4f}: "
        f"difference {ours_mean - tune_mean:+.4f} (within one std: {'met' if within else 'missed'})"
    )
    ours_wall, _ = mean_std([r.wall_s for r in records[ASHA_TPE].values()])
    tune_wall, _ = mean_std([r.wall_s for r in records[TUNE].values()])
    ratio = ours_wall / tune_wall
    print(
        f"  (c) ours ASHA + TPE wall / Ray Tune wall: {ratio:5.2f} (<= 0.80: "
        f"{'met' if ratio <= 0.8 else 'missed'})"
    )


# -- main ------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--seeds", type=int, default=None, help="seeds 0..N-1 per arm (default 5; --quick 2)"
    )
    parser.add_argument(
        "--num-samples", type=int, default=None, help="trials per run (default 32; --quick 8)"
    )
    parser.add_argument(
        "--max-t", type=int, default=None, help="epochs per trial at most (default 27; --quick 9)"
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 2 seeds, 8 trials, 9 epochs"
    )
    parser.add_argument("--num-cpus", type=int, default=2, help="Ray's logical CPUs (default 2)")
    parser.add_argument(
        "--tolerance-pp",
        type=float,
        default=0.5,
        help="reaching FIFO's best means within this many percentage points (default 0.5)",
    )
    parser.add_argument(
        "--no-reuse-actors", action="store_true", help="a fresh actor per trial, in both engines"
    )
    parser.add_argument("--skip-tune", action="store_true", help="only run our engine's three arms")
    parser.add_argument(
        "--keep-storage", action="store_true", help="keep the runs' storage directory"
    )
    args = parser.parse_args(argv)
    quick = (
        {"seeds": 2, "num_samples": 8, "max_t": 9}
        if args.quick
        else {"seeds": 5, "num_samples": 32, "max_t": 27}
    )
    for key, value in quick.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if min(args.seeds, args.num_samples, args.max_t, args.num_cpus) < 1:
        parser.error("--seeds, --num-samples, --max-t and --num-cpus must be at least 1")
    return args


def prepare_environment() -> None:
    """Set what Ray's workers inherit, before Ray starts: the repo on their path, one BLAS thread
    each."""
    if importlib.util.find_spec("sklearn") is None:
        raise SystemExit(
            "This benchmark trains on scikit-learn's digits; install it: .venv/bin/pip install "
            "scikit-learn"
        )
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")  # a trial holds 1 CPU; more threads would oversubscribe
    sys.path.insert(0, REPO)


def run_all(settings: Settings, seeds: int, skip_tune: bool, tolerance: float) -> Records:
    """Every arm for every seed, arms interleaved per seed so drift hits them alike; FIFO first,
    so each later run can say when it reached FIFO's best."""
    records: Records = {FIFO: {}, ASHA: {}, ASHA_TPE: {}, **({} if skip_tune else {TUNE: {}})}
    for seed in range(seeds):
        jobs: list[Callable[[], RunRecord]] = [
            functools.partial(run_ours_random, settings, seed, asha=False),
            functools.partial(run_ours_random, settings, seed, asha=True),
            functools.partial(run_ours_tpe, settings, seed),
        ]
        if not skip_tune:
            jobs.append(functools.partial(run_tune, settings, seed))
        for job in jobs:
            run = job()
            records[run.arm][seed] = run
            reached = run.iterations_to_reach(records[FIFO][seed].best - tolerance)
            print(
                f"seed {seed} {run.arm:<22} best {run.best:.4f}  {run.trial_iterations:5d} "
                "trial-iterations  "
                f"{run.wall_s:6.1f} s  FIFO's best reached after {reached or 'never'}",
                flush=True,
            )
    return records


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    prepare_environment()
    import optuna
    import ray

    optuna.logging.set_verbosity(
        optuna.logging.WARNING
    )  # both OptunaSearches log every trial otherwise
    storage_root = tempfile.mkdtemp(prefix="airflow_trials_tuning_quality_")
    settings = Settings(
        args.num_samples, args.max_t, args.num_cpus, not args.no_reuse_actors, storage_root
    )
    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        records = run_all(settings, args.seeds, args.skip_tune, args.tolerance_pp / 100)
    finally:
        ray.shutdown()
        if not args.keep_storage:
            shutil.rmtree(storage_root, ignore_errors=True)

    print()
    print(
        f"{args.seeds} seeds x {args.num_samples} trials x at most {args.max_t} epochs (budget "
        f"{args.num_samples * args.max_t} trial-iterations per run), 1 CPU per trial on "
        f"{args.num_cpus} CPUs, "
        f"actor reuse {'on' if settings.reuse_actors else 'off'}"
    )
    for note in sorted(
        {run.note for runs in records.values() for run in runs.values() if run.note}
    ):
        print(f"NOTE: the Ray Tune arm ran as {note}")
    if args.keep_storage:
        print(f"storage: {storage_root}")
    print_table(records, args.tolerance_pp / 100)
    print_ratios(records, args.tolerance_pp / 100)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
