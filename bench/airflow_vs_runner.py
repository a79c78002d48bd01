"""Benchmark: one 16-trial experiment through the real Airflow stack, and through TrialRunner
directly.

Both run on the same local Ray head (``--num-cpus`` logical CPUs, default 2) with the same trials:
``--trials`` configs of a sleep-bound trainable, ``--iterations`` results of ``--sleep`` seconds
each, ``--cpus-per-trial`` CPU each (default 0.5: 4 trials at a time, so 16 trials run in 4 waves
and most of them wait, queued on Ray, while their Airflow tasks are deferred).

- TrialRunner: ``runner.run()`` wall time (no actor reuse, as the Airflow path: one actor per
  trial).
- Airflow: ``airflow standalone`` (scheduler, dag-processor, triggerer, api-server, LocalExecutor,
  SQLite) runs a ``tuning_experiment`` DAG of the same trials; the time is the DAG run's
  ``end_date - queued_at`` from Airflow's DB, that is suggest_configs, 16 deferred trial tasks
  and select_best, everything the scheduler does included.

The runner goes first, before Airflow starts, so Airflow's idle load does not slow it down. The
script prints both times, the theoretical minimum, and the ratio Airflow / TrialRunner (target
<= 1.15, issue 53); and where the DAG run's time went: a timeline, then each task's steps from its
own Airflow log (``bench/task_phases.py``).

    .venv/bin/python -m bench.airflow_vs_runner                 # about 4 minutes
    .venv/bin/python -m bench.airflow_vs_runner --sleep 0.5     # shorter trials: overhead weighs
    more
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bench.task_phases import phases, print_phases

REPO = Path(__file__).resolve().parent.parent
TARGET_RATIO = 1.15  # issue 53, item 4 (1.25 before)
EXPERIMENT = "bench_airflow_vs_runner"

DAG_TEMPLATE = """
import datetime
from airflow.sdk import DAG
from airflow_trials.core.search import grid_search
from airflow_trials.experiment import tuning_experiment

with DAG({name!r}, schedule=None, start_date=datetime.datetime(2026, 1, 1), catchup=False,
         max_active_tasks=64) as dag:
    tuning_experiment(
        experiment_name={name!r},
        trainable="bench._sleep_trainables:ours",
        search_space={{"x": grid_search(list(range({trials}))), "iterations": {iterations},
                      "sleep_s": {sleep}}},
        metric="loss",
        mode="min",
        resources_per_trial={{"cpu": {cpus}}},
        checkpoint_at_end=False,
        poll_interval_seconds=0.5,
    )
"""


def run_runner(address: str, storage: str, args: argparse.Namespace) -> float:
    import ray

    from airflow_trials import Trial, TrialRunner

    ray.init(address=address, log_to_driver=False, namespace="bench")
    try:
        runner = TrialRunner(f"{EXPERIMENT}_runner", storage_path=storage, reuse_actors=False)
        for i in range(args.trials):
            runner.add_trial(
                Trial(
                    "bench._sleep_trainables:ours",
                    {"x": i, "iterations": args.iterations, "sleep_s": args.sleep},
                    experiment_name=f"{EXPERIMENT}_runner",
                    resources={"cpu": args.cpus_per_trial},
                    checkpoint_at_end=False,
                )
            )
        start = time.perf_counter()
        trials = runner.run()
        elapsed = time.perf_counter() - start
    finally:
        ray.shutdown()
    bad = [t.trial_id for t in trials if t.status.value != "TERMINATED"]
    if bad:
        raise SystemExit(f"TrialRunner left trials unfinished: {bad}")
    return elapsed


def _parse(value: str) -> dt.datetime:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))


def timed_run(stack: object, timeout_s: float) -> tuple[str, str, str]:
    """Trigger the benchmark DAG on the main job's started stack and wait for its success; its
    run id, ``queued_at`` and ``end_date`` from Airflow's DB."""
    from airflow_trials import mainjob

    run_id = mainjob.trigger(stack, EXPERIMENT)
    state = mainjob.wait_for(
        lambda: (
            (s := mainjob.dag_run_state(stack, EXPERIMENT, run_id)) in mainjob.TERMINAL_RUN_STATES
            and s
        ),
        timeout_s,
        f"the DAG run {run_id}",
        stack,
    )
    if state != "success":
        raise SystemExit(f"The benchmark DAG run {run_id} ended {state}; see {stack.log_path}.")
    ((queued, ended),) = mainjob._airflow_db(
        stack,
        "SELECT queued_at, end_date FROM dag_run WHERE dag_id = ? AND run_id = ?",
        EXPERIMENT,
        run_id,
    )
    return run_id, queued, ended


def run_airflow(stack: object, args: argparse.Namespace) -> tuple[float, float]:
    """The DAG run's time (queued -> end) and the trials' span (first start -> last end) in
    seconds."""
    from airflow_trials import mainjob
    from airflow_trials.store import TrialStore

    mainjob.start_airflow(stack)
    run_id, queued, ended = timed_run(stack, args.timeout_s)
    store = TrialStore(stack.trials_db_url)
    try:
        trials = store.reader.list_trials(experiment_name=EXPERIMENT)
        if len(trials) != args.trials or any(t.status.value != "TERMINATED" for t in trials):
            raise SystemExit(
                f"Airflow finished {len(trials)} trials, not {args.trials} TERMINATED ones."
            )
        # When the trainables really ran, from their results (the first one's timestamp less its
        # duration); the store's started_at is when the trigger first saw the trial.
        results = [store.reader.get_results(t.trial_id) for t in trials]
    finally:
        store.dispose()
    first_start = dt.datetime.fromtimestamp(
        min(r[0]["timestamp"] - r[0]["time_this_iter_s"] for r in results), dt.UTC
    )
    last_end = dt.datetime.fromtimestamp(max(r[-1]["timestamp"] for r in results), dt.UTC)
    _print_timeline(stack, run_id, _parse(queued), first_start, last_end, _parse(ended))
    last_results = {
        t.map_index: dt.datetime.fromtimestamp(r[-1]["timestamp"], dt.UTC)
        for t, r in zip(trials, results, strict=True)
    }
    _print_phases(stack, run_id, last_results)
    recorded_ends = [t.ended_at.timestamp() for t in trials if t.ended_at is not None]
    _print_handovers(results, int(args.num_cpus / args.cpus_per_trial), recorded_ends)
    return (_parse(ended) - _parse(queued)).total_seconds(), (
        last_end - first_start
    ).total_seconds()


def _print_handovers(results: list[list[dict]], slots: int, recorded_ends: list[float]) -> None:
    """Each slot's hand-over, from the trainables' own results: the k-th trainable to start after
    the first wave took the slot of the k-th to end, so its start less that end is the time the
    slot stood idle between two trainables (the trial's end seen, its actor freed, the next
    actor placed and started). ``recorded_ends``: when the trials DB recorded each trial's end
    (its trigger writes it after it freed the actor), which splits a hand-over in two: the end
    seen and the actor freed, then the next actor's placement and start."""
    starts = sorted(r[0]["timestamp"] - r[0]["time_this_iter_s"] for r in results)
    ends = sorted(r[-1]["timestamp"] for r in results)
    gaps = [starts[i] - ends[i - slots] for i in range(slots, len(starts))]
    if not gaps:
        return
    first = starts[slots - 1] - starts[0] if len(starts) >= slots else 0.0
    print(
        f"hand-overs between trainables ({len(gaps)}, {slots} slots): median "
        f"{statistics.median(gaps):.2f} s, max {max(gaps):.2f} s, sum {sum(gaps):.1f} s; the "
        f"first wave started over {first:.2f} s"
    )
    print("  each: " + " ".join(f"{gap:.2f}" for gap in gaps))
    recorded = sorted(recorded_ends)
    if len(recorded) == len(ends):
        seen = [recorded[k] - ends[k] for k in range(len(gaps))]
        rest = [starts[k + slots] - recorded[k] for k in range(len(gaps))]
        print(
            f"  of which: to the end's record (its trigger saw it, freed its actor, then wrote it) "
            f"median {statistics.median(seen):.2f} s; from there to the next trainable's start "
            f"median {statistics.median(rest):.2f} s"
        )


def _print_timeline(
    stack: object,
    run_id: str,
    queued: dt.datetime,
    first_start: dt.datetime,
    last_end: dt.datetime,
    ended: dt.datetime,
) -> None:
    """Where the DAG run's time went, in seconds after it was queued."""
    from airflow_trials import mainjob

    rows = mainjob._airflow_db(
        stack,
        "SELECT task_id, MIN(start_date), MAX(end_date) FROM task_instance "
        "WHERE dag_id = ? AND run_id = ? GROUP BY task_id",
        EXPERIMENT,
        run_id,
    )

    def at(when: dt.datetime) -> float:
        return (
            when.replace(tzinfo=dt.UTC) if when.tzinfo is None else when
        ).timestamp() - queued.timestamp()

    print("timeline (s after the DAG run was queued):")
    for task_id, start, end in sorted(rows, key=lambda r: r[1] or ""):
        print(f"  {task_id:<48} {at(_parse(start)):6.1f} -> {at(_parse(end)):6.1f}")
    print(
        f"  {'trainables running (first start -> last result)':<48} {at(first_start):6.1f} -> "
        f"{at(last_end):6.1f}"
    )
    print(f"  {'DAG run ended':<48} {at(ended):6.1f}")


def _print_phases(stack: object, run_id: str, last_results: dict[int, dt.datetime]) -> None:
    """Each task's steps, from its log (bench/task_phases.py)."""
    from airflow_trials import mainjob

    task_rows = mainjob._airflow_db(
        stack,
        "SELECT task_id, map_index, queued_dttm, start_date, end_date FROM task_instance "
        "WHERE dag_id = ? AND run_id = ?",
        EXPERIMENT,
        run_id,
    )
    logs = stack.airflow_home / "logs"  # type: ignore[attr-defined]
    print_phases(phases(logs, EXPERIMENT, run_id, task_rows, last_results))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--sleep", type=float, default=1.0, help="seconds per iteration")
    parser.add_argument("--cpus-per-trial", type=float, default=0.5)
    parser.add_argument("--num-cpus", type=int, default=2, help="logical CPUs of the Ray head")
    parser.add_argument(
        "--parallelism",
        type=int,
        default=None,
        help="Airflow's [core] parallelism; default the main job's, two per core",
    )
    parser.add_argument("--timeout-s", type=float, default=900)
    args = parser.parse_args()

    from airflow_trials import mainjob
    from airflow_trials.ports import free_port

    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])
    )
    with tempfile.TemporaryDirectory(prefix="bench_airflow_") as tmp:
        dags = Path(tmp) / "dags"
        dags.mkdir()
        (dags / f"{EXPERIMENT}.py").write_text(
            DAG_TEMPLATE.format(
                name=EXPERIMENT,
                trials=args.trials,
                iterations=args.iterations,
                sleep=args.sleep,
                cpus=args.cpus_per_trial,
            )
        )
        stack = mainjob.Stack(home=Path(tmp) / "state", dags_folder=dags)
        try:
            mainjob.prepare(stack, parallelism=args.parallelism, api_port=free_port())
            address = mainjob.start_ray(stack, args.num_cpus)
            runner_s = run_runner(address, str(stack.storage), args)
            airflow_s, span_s = run_airflow(stack, args)
        finally:
            mainjob.stop(stack)

    concurrent = int(args.num_cpus / args.cpus_per_trial)
    waves = -(-args.trials // concurrent)
    minimum = waves * args.iterations * args.sleep
    print(
        f"{args.trials} trials x {args.iterations} iterations x {args.sleep:g} s, "
        f"{args.cpus_per_trial:g} CPU "
        f"each on {args.num_cpus} CPUs ({concurrent} at a time): minimum {minimum:.1f} s"
    )
    print(f"TrialRunner directly          {runner_s:7.1f} s   {runner_s / minimum:5.2f}x minimum")
    print(
        f"Airflow scheduler + triggerer {airflow_s:7.1f} s   {airflow_s / minimum:5.2f}x minimum "
        f"(first trial start -> last trial end: {span_s:.1f} s)"
    )
    ratio = airflow_s / runner_s
    print(
        f"ratio Airflow / TrialRunner: {ratio:.2f} (target <= {TARGET_RATIO}: "
        f"{'met' if ratio <= TARGET_RATIO else 'missed'})"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
