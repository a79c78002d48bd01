"""Benchmark: does a warm-started night reach last night's best sooner? Side by side with a cold
night
and with Optuna's own warm start, on the tuning-quality task (bench/tuning_quality.py).

The task: scikit-learn's digits, an MLP trained epoch by epoch (``bench/_sklearn_trainables.py``),
``val_acc`` maximised, the space of bench/tuning_quality.py with a fixed network seed (a nightly DAG
keeps its DAG file from one night to the next). Each night runs ``--num-samples`` trials of
``--max-t`` epochs, with random search seeded by its DAG run (so each night draws other configs).

- ours, through Airflow (the real operators and triggers under ``dag.test``, a SQLite trials DB):
  night 1 cold; night 2 with ``warm_start=WarmStart(top_k=3)``; and, as the cold anchor, another
  night 2 of a twin experiment without warm start.
- Optuna: a TPE study for night 2 warm-started the way Optuna does it: night 1's trials added with
  ``study.add_trials`` and its top 3 enqueued with ``enqueue_trial``; the same trainable, in
  process, one trial after another.

For each night 2 the script counts trial-iterations (results, in the order they were reported)
until the best so far reaches night 1's best less ``--tolerance-pp`` percentage points, and prints
that count over night 1's trial-iterations (target for ours warm: <= 0.30).

    .venv/bin/python -m bench.warm_start              # about 4 minutes
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
METRIC = "val_acc"

DAG = """
import datetime
from airflow.sdk import DAG
from airflow_trials import WarmStart
from airflow_trials.core.search import choice, loguniform
from airflow_trials.experiment import tuning_experiment

with DAG({name!r}, schedule=None, start_date=datetime.datetime(2026, 1, 1), catchup=False) as dag:
    tuning_experiment(
        experiment_name={name!r},
        trainable="bench._sklearn_trainables:ours",
        search_space={{"learning_rate_init": loguniform(1e-4, 1e-1),
                       "alpha": loguniform(1e-6, 1e-2),
                       "hidden_units": choice([32, 64, 128]), "batch_size": choice([32, 64, 128]),
                       "max_t": {max_t}, "seed": 0}},
        num_samples={num_samples},
        metric="val_acc", mode="max",
        stop={{"training_iteration": {max_t}}},
        resources_per_trial={{"cpu": 1}},
        poll_interval_seconds=0.05,
        warm_start={warm},
    )
"""


def prepare(tmp: Path) -> None:
    os.environ.update(
        {
            "AIRFLOW_HOME": str(tmp / "airflow_home"),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(tmp / "dags"),
            "AIRFLOW_TRIALS_DB_URL": f"sqlite:///{tmp}/trials.db",
            "AIRFLOW_TRIALS_STORAGE": str(tmp / "storage"),
            "RAY_AUTH_MODE": "disabled",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        }
    )
    (tmp / "dags").mkdir()
    (tmp / "storage").mkdir()
    subprocess.run(
        [str(Path(sys.executable).parent / "airflow"), "db", "migrate"],
        check=True,
        capture_output=True,
    )
    sys.path.insert(0, str(REPO))
    from airflow_trials.store import migrate

    migrate(os.environ["AIRFLOW_TRIALS_DB_URL"])  # as `airflow-trials db upgrade` does


def load_dag(tmp: Path, name: str, args: argparse.Namespace, warm: bool) -> Any:
    path = tmp / "dags" / f"{name}.py"
    path.write_text(
        DAG.format(
            name=name,
            max_t=args.max_t,
            num_samples=args.num_samples,
            warm="WarmStart(top_k=3)" if warm else "None",
        )
    )
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.dag


def night(dag: Any, name: str) -> list[float]:
    """One DAG run; the metric of each of its results, in the order they were reported."""
    from airflow_trials.store import TrialStore

    run = dag.test()
    if run.state != "success":
        raise SystemExit(f"{name}: DAG run {run.run_id} ended {run.state}")
    store = TrialStore(os.environ["AIRFLOW_TRIALS_DB_URL"])
    try:
        (exp_run,) = [r for r in store.reader.list_experiment_runs(name) if r.run_key == run.run_id]
        results = [
            r
            for t in store.reader.list_trials(experiment_run_id=exp_run.id)
            for r in store.reader.get_results(t.trial_id)
        ]
    finally:
        store.dispose()
    return [float(r[METRIC]) for r in sorted(results, key=lambda r: r["timestamp"])]


def reach(values: list[float], target: float) -> int | None:
    """Trial-iterations until the best so far reaches ``target``; None if it never does."""
    best = float("-inf")
    for i, value in enumerate(values, start=1):
        best = max(best, value)
        if best >= target:
            return i
    return None


def optuna_night2(
    night1: list[tuple[dict[str, Any], float]], args: argparse.Namespace
) -> list[float]:
    """Optuna's warm start of night 2: night 1's trials added, its top 3 enqueued; TPE, in
    process."""
    import optuna

    from bench._sklearn_trainables import train_epochs

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    distributions = {
        "learning_rate_init": optuna.distributions.FloatDistribution(1e-4, 1e-1, log=True),
        "alpha": optuna.distributions.FloatDistribution(1e-6, 1e-2, log=True),
        "hidden_units": optuna.distributions.CategoricalDistribution([32, 64, 128]),
        "batch_size": optuna.distributions.CategoricalDistribution([32, 64, 128]),
    }
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.TPESampler(seed=2))
    study.add_trials(
        [
            optuna.trial.create_trial(
                params={k: c[k] for k in distributions}, distributions=distributions, value=value
            )
            for c, value in night1
        ]
    )
    for config, _ in sorted(night1, key=lambda cv: -cv[1])[:3]:
        study.enqueue_trial({k: config[k] for k in distributions})
    values: list[float] = []
    for _ in range(args.num_samples):
        trial = study.ask(distributions)
        config = {**trial.params, "max_t": args.max_t, "seed": 0}
        mine: list[float] = []
        train_epochs(config, lambda metrics, out=mine: out.append(metrics[METRIC]))
        values.extend(mine)
        study.tell(trial, mine[-1])
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-samples", type=int, default=16)
    parser.add_argument("--max-t", type=int, default=9)
    parser.add_argument("--tolerance-pp", type=float, default=0.5)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench_warm_start_") as tmp_name:
        tmp = Path(tmp_name)
        prepare(tmp)
        from airflow_trials.store import TrialStore

        warm_dag, cold_dag = (
            load_dag(tmp, "bench_warm", args, True),
            load_dag(tmp, "bench_cold", args, False),
        )
        night1 = night(warm_dag, "bench_warm")  # the first night: nothing to warm-start from
        store = TrialStore(os.environ["AIRFLOW_TRIALS_DB_URL"])
        try:
            (run1,) = store.reader.list_experiment_runs("bench_warm")
            configs = [
                (t.config, float(t.last_result[METRIC]))
                for t in store.reader.list_trials(experiment_run_id=run1.id)
            ]
        finally:
            store.dispose()
        warm2 = night(warm_dag, "bench_warm")
        night(
            cold_dag, "bench_cold"
        )  # the twin's night 1, so that its night 2 is a second night too
        cold2 = night(cold_dag, "bench_cold")
        optuna2 = optuna_night2(configs, args)
    target = max(night1) - args.tolerance_pp / 100
    total = len(night1)
    print(
        f"{args.num_samples} trials x {args.max_t} epochs a night; night 1's best {METRIC} "
        f"{max(night1):.4f} "
        f"after {total} trial-iterations; target {target:.4f} (less {args.tolerance_pp} pp)"
    )
    print(f"{'night 2':<34} {'best':>7} {'to reach night 1':>17} {'/ night 1':>10}")
    for label, values in (
        ("ours, warm start (top 3)", warm2),
        ("ours, cold (twin experiment)", cold2),
        ("Optuna TPE, add_trials + enqueue", optuna2),
    ):
        hit = reach(values, target)
        print(
            f"{label:<34} {max(values):7.4f} {hit if hit is not None else 'never':>17} "
            f"{(f'{hit / total:10.2f}' if hit is not None else f'{chr(8212):>10}')}"
        )
    hit = reach(warm2, target)
    met = hit is not None and hit / total <= 0.30
    print(
        "target: ours warm reaches night 1's best within 0.30 of night 1's trial-iterations: "
        f"{'met' if met else 'missed'}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
