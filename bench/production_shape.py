"""Benchmark: the 16-trial experiment of bench/airflow_vs_runner.py on the production shape and on
the LocalExecutor shape, side by side, and the takeover time after a triggerer is killed.

- LocalExecutor shape: the main job's stack (``airflow standalone``: LocalExecutor, SQLite
  metadata DB, one triggerer) and one local Ray head with ``2 * --ray-cpus`` logical CPUs,
  checkpoints on local disk.
- Production shape: ``airflow_trials.shape.local.LocalShape`` (``airflow-trials shape up``): the
  CeleryExecutor with two workers and Redis, two triggerers, PostgreSQL for Airflow and the trials
  DB, a Ray head with no CPUs and two worker nodes of ``--ray-cpus`` each, checkpoints on the S3
  stand-in (moto's server).

Both run the same DAG (``--trials`` sleep-bound trials, ``--cpus-per-trial`` each, so the same
number at a time on the same logical CPUs); the time is the DAG run's ``end_date - queued_at``
from Airflow's DB. The script prints both, the ratio production / LocalExecutor (target <= 1.10),
and then, on the production shape, kills the triggerer holding a second run's triggers and prints
how long the other one took to hold them all (target <= 30 s).

    .venv/bin/python -m bench.production_shape      # about 6 minutes; needs PostgreSQL
    (--postgres-url, default postgresql+psycopg://postgres@127.0.0.1:5432/postgres)
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.airflow_vs_runner import DAG_TEMPLATE, EXPERIMENT, REPO, _parse, timed_run

TAKEOVER_DAG = "bench_shape_takeover"
# Where a DAG run's time goes, in the order printed.
PHASES = ("to the first trial", "trials", "after the last trial")
# Each task's first start and last end (a mapped task's over its map indexes), for the timeline.
TASK_SPANS = (
    "SELECT task_id, MIN(start_date), MAX(end_date) FROM task_instance "
    "WHERE dag_id = {dag} AND run_id = {run} GROUP BY task_id"
)


def phases(
    trials_db_url: str, queued: dt.datetime, ended: dt.datetime, tasks: list[tuple[Any, ...]]
) -> dict[str, float]:
    """A DAG run's time in parts, from the trials' own results (when the trainables really ran):
    queued -> first trial start, the trials' span, last trial end -> run end; and each task's
    first start and last end (``TASK_SPANS`` rows), as ``<task_id> start`` and ``<task_id> end``,
    all in seconds after the run was queued."""
    from airflow_trials.store import TrialStore

    store = TrialStore(trials_db_url)
    try:
        trials = store.reader.list_trials(experiment_name=EXPERIMENT)
        results = [store.reader.get_results(t.trial_id) for t in trials]
    finally:
        store.dispose()
    first = min(r[0]["timestamp"] - r[0]["time_this_iter_s"] for r in results)
    last = max(r[-1]["timestamp"] for r in results)
    spans = {
        f"{task_id.rsplit('.', 1)[-1]} {edge}": (_when(when) - queued).total_seconds()
        for task_id, start, end in tasks
        for edge, when in (("start", start), ("end", end))
        if when is not None
    }
    return {
        "to the first trial": first - queued.timestamp(),
        "trials": last - first,
        "after the last trial": ended.timestamp() - last,
        **dict(sorted(spans.items(), key=lambda item: item[1])),
    }


def _when(value: Any) -> dt.datetime:
    when = value if isinstance(value, dt.datetime) else _parse(str(value))
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def _dag(name: str, args: argparse.Namespace, *, sleep: float | None = None) -> str:
    return DAG_TEMPLATE.format(
        name=name,
        trials=args.trials,
        iterations=args.iterations,
        sleep=args.sleep if sleep is None else sleep,
        cpus=args.cpus_per_trial,
    )


def run_local(args: argparse.Namespace, tmp: Path) -> tuple[float, dict[str, float]]:
    """The DAG run's time on the LocalExecutor shape (the main job's stack), and its phases."""
    from airflow_trials import mainjob
    from airflow_trials.ports import free_port

    dags = tmp / "local_dags"
    dags.mkdir()
    (dags / f"{EXPERIMENT}.py").write_text(_dag(EXPERIMENT, args))
    stack = mainjob.Stack(home=tmp / "local", dags_folder=dags)
    try:
        mainjob.prepare(stack, api_port=free_port())
        mainjob.start_ray(stack, 2 * args.ray_cpus)
        mainjob.start_airflow(stack)
        run_id, queued, ended = timed_run(stack, args.timeout_s)
        start, end = _when(queued), _when(ended)
        tasks = mainjob._airflow_db(stack, TASK_SPANS.format(dag="?", run="?"), EXPERIMENT, run_id)
        return (end - start).total_seconds(), phases(stack.trials_db_url, start, end, tasks)
    finally:
        mainjob.stop(stack)


class ShapeClient:
    """Airflow's REST API on the shape, as its admin."""

    def __init__(self, shape: Any) -> None:
        import httpx

        from airflow_trials.shape.local import ADMIN_PASSWORD

        base = shape.addresses.api_url
        token = shape.wait_for(
            lambda: _token(base, ADMIN_PASSWORD), 300, "the api-server to issue a token"
        )
        self.shape = shape
        self.http = httpx.Client(
            base_url=f"{base}/api/v2", headers={"Authorization": f"Bearer {token}"}, timeout=60
        )

    def trigger(self, dag_id: str) -> str:
        self.shape.wait_for(
            lambda: self.http.get(f"/dags/{dag_id}").status_code == 200, 300, f"DAG {dag_id}"
        )
        body = {"dag_run_id": f"bench_{time.time_ns()}", "logical_date": None}
        response = self.http.post(f"/dags/{dag_id}/dagRuns", json=body)
        response.raise_for_status()
        return str(response.json()["dag_run_id"])

    def wait(self, dag_id: str, run_id: str, timeout_s: float) -> str:
        def ended() -> str | None:
            state = self.http.get(f"/dags/{dag_id}/dagRuns/{run_id}").json().get("state")
            return state if state in ("success", "failed") else None

        return str(self.shape.wait_for(ended, timeout_s, f"run {run_id} of {dag_id}"))

    def deferred(self, dag_id: str, run_id: str) -> int:
        tis = self.http.get(
            f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances", params={"limit": 100}
        ).json()["task_instances"]
        return sum(ti["state"] == "deferred" for ti in tis)


def _token(base: str, password: str) -> str | None:
    import httpx

    try:
        response = httpx.post(
            f"{base}/auth/token", json={"username": "admin", "password": password}, timeout=10
        )
    except httpx.HTTPError:
        return None
    return response.json()["access_token"] if response.status_code == 201 else None


def run_shape(args: argparse.Namespace, tmp: Path) -> tuple[float, dict[str, float], float, int]:
    """The DAG run's time on the production shape and its phases; then the takeover: seconds
    until the other triggerer holds the triggers of a killed one, and how many it took over."""
    from airflow_trials.shape import triggerers
    from airflow_trials.shape.local import LocalShape

    dags = tmp / "shape_dags"
    dags.mkdir()
    (dags / f"{EXPERIMENT}.py").write_text(_dag(EXPERIMENT, args))
    # The takeover run's trials last long enough to be watched when the triggerer is killed.
    (dags / f"{TAKEOVER_DAG}.py").write_text(_dag(TAKEOVER_DAG, args, sleep=6.0))
    shape = LocalShape(
        tmp / "shape",
        dags_folder=dags,
        postgres_url=args.postgres_url,
        ray_cpus=args.ray_cpus,
        env={"PYTHONPATH": str(REPO)},
    )
    try:
        shape.up()
        client = ShapeClient(shape)
        run_id = client.trigger(EXPERIMENT)
        if client.wait(EXPERIMENT, run_id, args.timeout_s) != "success":
            raise SystemExit(f"The production-shape run ended badly; see {shape.logs}.")
        ((queued, ended),) = shape.metadata_query(
            "SELECT queued_at, end_date FROM dag_run WHERE dag_id = :dag AND run_id = :run",
            dag=EXPERIMENT,
            run=run_id,
        )
        shape_s = (ended - queued).total_seconds()
        tasks = shape.metadata_query(
            TASK_SPANS.format(dag=":dag", run=":run"), dag=EXPERIMENT, run=run_id
        )
        shape_phases = phases(shape.addresses.trials_db_url, _when(queued), _when(ended), tasks)

        takeover_run = client.trigger(TAKEOVER_DAG)
        concurrent = int(2 * args.ray_cpus / args.cpus_per_trial)
        shape.wait_for(
            lambda: client.deferred(TAKEOVER_DAG, takeover_run) >= concurrent,
            args.timeout_s,
            "the takeover run's tasks to defer",
        )
        takeover = triggerers.kill_the_busiest(shape)
        if client.wait(TAKEOVER_DAG, takeover_run, args.timeout_s) != "success":
            raise SystemExit(f"The takeover run ended badly; see {shape.logs}.")
        return shape_s, shape_phases, takeover.seconds, takeover.moved
    finally:
        shape.down(drop_databases=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--sleep", type=float, default=1.0, help="seconds per iteration")
    parser.add_argument("--cpus-per-trial", type=float, default=0.5)
    parser.add_argument(
        "--ray-cpus", type=int, default=1, help="logical CPUs of each of the shape's worker nodes"
    )
    parser.add_argument(
        "--postgres-url", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
    )
    parser.add_argument("--timeout-s", type=float, default=900)
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")])
    )
    with tempfile.TemporaryDirectory(prefix="bench_shape_") as tmp:
        local_s, local_phases = run_local(args, Path(tmp))
        shape_s, shape_phases, takeover_s, moved = run_shape(args, Path(tmp))
    concurrent = int(2 * args.ray_cpus / args.cpus_per_trial)
    minimum = -(-args.trials // concurrent) * args.iterations * args.sleep
    print(
        f"{args.trials} trials x {args.iterations} iterations x {args.sleep:g} s, "
        f"{args.cpus_per_trial:g} CPU each on {2 * args.ray_cpus} CPUs ({concurrent} at a time): "
        f"minimum {minimum:.1f} s"
    )
    print(f"LocalExecutor shape   {local_s:7.1f} s   {local_s / minimum:5.2f}x minimum")
    print(f"production shape      {shape_s:7.1f} s   {shape_s / minimum:5.2f}x minimum")
    print(f"{'where the time went (s)':<24}{'LocalExecutor':>14}{'production':>12}")
    for name in PHASES:
        print(f"  {name:<22}{local_phases[name]:14.1f}{shape_phases[name]:12.1f}")
    print("  timeline (s after the run was queued):")
    for name in [n for n in local_phases if n not in PHASES]:
        print(
            f"    {name:<20}{local_phases[name]:14.1f}{shape_phases.get(name, float('nan')):12.1f}"
        )
    ratio = shape_s / local_s
    print(
        f"ratio production / LocalExecutor: {ratio:.2f} (target <= 1.10: "
        f"{'met' if ratio <= 1.10 else 'missed'})"
    )
    print(
        f"triggerer takeover: {moved} triggers held by the other triggerer {takeover_s:.1f} s "
        f"after the first was SIGKILLed (target <= 30 s: "
        f"{'met' if takeover_s <= 30 else 'missed'})"
    )
    print(f"(measured {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC)")


if __name__ == "__main__":
    main()
