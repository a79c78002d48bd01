"""Benchmark: the same sleep-bound experiment through our TrialRunner and through Ray Tune's
Tuner.fit().

200 trials x 5 iterations of 0.05 s at 0.5 CPU each on 2 CPUs: 4 trials at a time, so the
theoretical minimum is 200 * 5 * 0.05 / 4 = 12.5 s. Each engine runs with and without actor reuse,
side by side on one local Ray, and the script prints the wall times and the ratios.

    .venv/bin/python -m bench.engine_vs_tune            # full run (about 5 minutes)
    .venv/bin/python -m bench.engine_vs_tune --trials 40 --skip-tune-no-reuse   # quicker look
    .venv/bin/python -m bench.engine_vs_tune --skip-tune --no-reuse-runs --breakdown
    .venv/bin/python -m bench.engine_vs_tune --no-reuse-runs --ray-start   # with Ray's own start-up

``--breakdown`` says where our run's time over the minimum goes, per actor (each serves one of
the four slots), from the timestamps in the results: the first result (the actor's start-up), the
gaps between a trial's results beyond the trainable's sleep (run-ahead), the gaps between the last
result of one trial and the first of the next on the same actor (the hand-over), and the tail from
the actor's last result to the end of ``run()``.

``--ray-start`` also measures what Ray alone takes to start the slots' actors, after the engines'
runs: on a local Ray started for that alone, right after its ``ray.init`` (the state both engines'
runs start from), as many bare actors as there are slots, each in its own placement group of one
bundle as our executor makes them and each given one small argument as a trial actor is; the mean
time from their creation to the return of a first call. The theoretical minimum counts no actor
start; the minimum plus that mean is the least a run on Ray's actors could take, printed beside
it (the target stays the theoretical minimum's).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from typing import Any

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_ours(
    num_trials: int,
    iterations: int,
    sleep_s: float,
    reuse: bool,
    storage: str,
    breakdown: bool = False,
) -> float:
    from airflow_trials import Trial, TrialRunner

    name = f"bench-ours-{'reuse' if reuse else 'noreuse'}"
    runner = TrialRunner(name, storage_path=storage, reuse_actors=reuse)
    for i in range(num_trials):
        runner.add_trial(
            Trial(
                "bench._sleep_trainables:ours",
                {"x": i, "iterations": iterations, "sleep_s": sleep_s},
                experiment_name=name,
                resources={"cpu": 0.5},
            )
        )
    start, started_at = time.perf_counter(), time.time()
    trials = runner.run()
    elapsed = time.perf_counter() - start
    if breakdown:
        print_breakdown(runner.results(), started_at, started_at + elapsed, sleep_s)
    bad = [
        t
        for t in trials
        if t.status.value != "TERMINATED" or t.last_result.get("training_iteration") != iterations
    ]
    if bad:
        raise SystemExit(f"our runner left {len(bad)} trials unfinished: {bad[:3]}")
    return elapsed


def print_breakdown(
    results: list[tuple[str, dict[str, Any]]], started_at: float, ended_at: float, sleep_s: float
) -> None:
    """Where each actor's time over its trainables' sleeps went, from its results' timestamps
    (when the trainable reported; the actor's own clock, on the same machine as the driver)."""
    by_actor: dict[int, list[tuple[float, str]]] = defaultdict(list)
    for trial_id, result in results:
        by_actor[result["pid"]].append((result["timestamp"], trial_id))
    parts: dict[str, list[float]] = defaultdict(list)
    within: list[float] = []
    between: list[float] = []
    for reported in by_actor.values():
        reported.sort()
        pairs = zip(reported, reported[1:], strict=False)
        gaps = [(b[0] - a[0] - sleep_s, a[1] == b[1]) for a, b in pairs]
        within += [gap for gap, same in gaps if same]
        between += [gap for gap, same in gaps if not same]
        parts["start-up (first result - sleep)"].append(reported[0][0] - started_at - sleep_s)
        parts["within trials (run-ahead)"].append(sum(gap for gap, same in gaps if same))
        parts["hand-overs (between trials)"].append(sum(gap for gap, same in gaps if not same))
        parts["tail (last result to the end)"].append(ended_at - reported[-1][0])
        parts["over (sum)"].append(ended_at - started_at - len(reported) * sleep_s)
    print(f"where the time over the minimum goes, per actor (mean of {len(by_actor)}):")
    for name, seconds in parts.items():
        print(f"  {name:<34} {statistics.mean(seconds):6.3f} s")
    for name, gaps in (("within trials", within), ("between trials", between)):
        if gaps:
            gaps.sort()
            median, p90 = gaps[len(gaps) // 2], gaps[int(len(gaps) * 0.9)]
            print(
                f"  gap {name} beyond the sleep: n={len(gaps)}, median {1000 * median:.2f} ms, "
                f"p90 {1000 * p90:.2f} ms, mean {1000 * statistics.mean(gaps):.2f} ms"
            )


class BareActor:
    """An actor that does nothing: what Ray's own start of an actor costs (``--ray-start``). It
    takes one small argument, as every trial actor does: a worker builds its serialization context
    (Ray imports pyarrow, pydantic and starlette for its own serializers, where installed) on the
    first argument it reads, 0.3 s on the idle machine; an actor created without one skips it."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec

    def ready(self) -> float:
        return time.time()


def ray_actor_start(slots: int, cpu: float, num_cpus: int) -> float:
    """Mean seconds from creating ``slots`` bare actors of ``cpu`` CPUs, each in its own
    placement group (as our executor creates a trial's actor), to the return of their first
    call; on a local Ray started for this alone, right after its ``ray.init``."""
    import ray
    from ray.util.placement_group import placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=False)
    try:
        remote = ray.remote(BareActor)
        start = time.time()
        actors = [
            remote.options(
                num_cpus=cpu,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group([{"CPU": cpu}]), placement_group_bundle_index=0
                ),
            ).remote({"trial_id": f"bare_{i}", "config": {"x": i}})
            for i in range(slots)
        ]
        ready = ray.get([actor.ready.remote() for actor in actors])
        return statistics.mean(at - start for at in ready)
    finally:
        ray.shutdown()


def run_tune(num_trials: int, iterations: int, sleep_s: float, reuse: bool, storage: str) -> float:
    from ray import tune

    from bench._sleep_trainables import ray_tune

    tuner = tune.Tuner(
        tune.with_resources(ray_tune, {"cpu": 0.5}),
        param_space={
            "x": tune.grid_search(list(range(num_trials))),
            "iterations": iterations,
            "sleep_s": sleep_s,
        },
        tune_config=tune.TuneConfig(reuse_actors=reuse),
        run_config=tune.RunConfig(
            name=f"bench-tune-{'reuse' if reuse else 'noreuse'}", storage_path=storage, verbose=0
        ),
    )
    start = time.perf_counter()
    results = tuner.fit()
    elapsed = time.perf_counter() - start
    if results.num_errors or len(results) != num_trials:
        raise SystemExit(f"Ray Tune run had {results.num_errors} errors of {len(results)} trials")
    return elapsed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--sleep-s", type=float, default=0.05)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--skip-tune", action="store_true", help="only run our engine")
    parser.add_argument(
        "--skip-tune-no-reuse", action="store_true", help="skip Ray Tune without reuse (slowest)"
    )
    parser.add_argument(
        "--no-reuse-runs", action="store_true", help="skip both runs without actor reuse"
    )
    parser.add_argument(
        "--breakdown", action="store_true", help="where our run's time over the minimum goes"
    )
    parser.add_argument(
        "--ray-start",
        action="store_true",
        help="also measure Ray's own start of the slots' actors, for a second floor",
    )
    args = parser.parse_args(argv)

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")]))
    sys.path.insert(0, REPO)
    import ray

    slots = args.cpus / 0.5
    ray.init(address="local", num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    minimum = args.trials * args.iterations * args.sleep_s / slots
    storage = tempfile.mkdtemp(prefix="airflow_trials_bench_")
    times: dict[str, float] = {}
    for reuse in (True,) if args.no_reuse_runs else (True, False):
        key = "reuse" if reuse else "no reuse"
        times[f"ours, {key}"] = run_ours(
            args.trials, args.iterations, args.sleep_s, reuse, storage, args.breakdown and reuse
        )
        print(f"ours, {key}: {times[f'ours, {key}']:.1f} s", flush=True)
        if args.skip_tune or (not reuse and args.skip_tune_no_reuse):
            continue
        times[f"tune, {key}"] = run_tune(args.trials, args.iterations, args.sleep_s, reuse, storage)
        print(f"tune, {key}: {times[f'tune, {key}']:.1f} s", flush=True)
    ray.shutdown()
    # After the engines' runs, so that neither runs beside a Ray still shutting down.
    ray_start = ray_actor_start(int(slots), 0.5, args.cpus) if args.ray_start else None
    if ray_start is not None:
        print(f"Ray's own start of {int(slots)} bare actors: {ray_start:.2f} s (mean)", flush=True)

    print()
    print(
        f"{args.trials} trials x {args.iterations} iterations x {args.sleep_s} s at 0.5 CPU on "
        f"{args.cpus} CPUs"
    )
    print(f"theoretical minimum: {minimum:.2f} s")
    if ray_start is not None:
        print(f"minimum + Ray's own actor start: {minimum + ray_start:.2f} s")
    for name, seconds in times.items():
        print(f"  {name:<16} {seconds:7.1f} s   {seconds / minimum:5.2f}x minimum")
    print("ratios (target):")
    print(f"  ours reuse / minimum          {times['ours, reuse'] / minimum:5.2f}   (<= 1.10)")
    if ray_start is not None:
        floor = minimum + ray_start
        print(f"  ours reuse / (minimum + Ray's actor start) {times['ours, reuse'] / floor:5.2f}")
    if "tune, reuse" in times:
        print(
            f"  ours reuse / tune reuse       {times['ours, reuse'] / times['tune, reuse']:5.2f}   "
            "(<= 0.80)"
        )
    if "tune, no reuse" in times:
        print(
            "  ours no reuse / tune no reuse "
            f"{times['ours, no reuse'] / times['tune, no reuse']:5.2f}   (<= 0.50)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
