"""``airflow-trials shape``: the production shape on this machine (Celery workers, two triggerers,
a three-node Ray cluster, PostgreSQL, checkpoints on an S3 API), started and stopped as processes,
without docker (docs/deploy.md)."""

from __future__ import annotations

import os
import shlex
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from airflow_trials.cli.common import app, fail, out

shape_app = typer.Typer(
    help="The production shape on this machine: up, status, env, restart, supervise, down.",
    no_args_is_help=True,
)
app.add_typer(shape_app, name="shape")

Home = Annotated[
    str, typer.Option("--home", help="The shape's directory (state, Airflow home, logs).")
]
PostgresUrl = Annotated[
    str,
    typer.Option(
        help="A PostgreSQL server URL (any database on it), whose user may create databases: "
        "the shape creates its metadata and trials databases there."
    ),
]


@shape_app.command("up")
def up(
    home: Home = ".shape",
    dags_folder: Annotated[str, typer.Option(help="The DAGs Airflow runs.")] = "dags",
    postgres_url: PostgresUrl = "postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
    ray_cpus: Annotated[int, typer.Option(help="Logical CPUs of each Ray worker node.")] = 4,
) -> None:
    """Start the shape and wait until every part answers; it keeps running after this command
    returns (stop it with `airflow-trials shape down`).

    It needs, and checks before it starts anything: a PostgreSQL server, given by
    --postgres-url, whose user may create databases (the shape creates its two there:
    Airflow's metadata DB and the trials DB); `redis-server` on PATH (the Celery broker; e.g.
    apt-get install redis-server); and this venv with the dev extra (moto_server, s3fs, psycopg,
    the Celery provider), as ./scripts/test.sh or ./scripts/run.sh set it up."""
    from airflow_trials.shape import setup
    from airflow_trials.shape.local import LocalShape, ShapeError
    from airflow_trials.store.engine import safe_url

    if not Path(dags_folder).is_dir():
        fail(
            f"DAGs folder {dags_folder} does not exist; run from the repository or pass "
            "--dags-folder."
        )
    shape = LocalShape(
        Path(home), dags_folder=Path(dags_folder), postgres_url=postgres_url, ray_cpus=ray_cpus
    )
    if any(shape.status().values()):
        fail(f"The shape in {shape.home} is running already; `airflow-trials shape down` first.")
    missing = setup.missing_prerequisites()
    if missing:
        fail(f"shape up needs {'; '.join(missing)}; nothing was started.")
    try:
        setup.check_server(postgres_url)
    except ShapeError as e:
        fail(f"{e}; nothing was started.")
    started = time.monotonic()
    try:
        shape.up()
    except (ShapeError, OSError) as e:
        shape.down()
        fail(f"The shape did not come up, and what had started was stopped: {e}")
    except Exception as e:  # noqa: BLE001 - e.g. PostgreSQL gone meanwhile: say so, leave nothing
        shape.down()
        cause = " ".join(str(e).split())
        fail(
            f"The shape did not come up ({type(e).__name__}: {cause}); what had started was "
            f"stopped. Check that PostgreSQL answers at {safe_url(postgres_url)} "
            "(--postgres-url)."
        )
    out.print(f"The shape is up in {time.monotonic() - started:.0f} s (state: {shape.home}).")
    out.print(f"Airflow UI: {shape.addresses.api_url} (admin / {shape_admin_password()})")
    out.print(f'Use it from a shell: eval "$(airflow-trials shape env --home {home})"')


def shape_admin_password() -> str:
    from airflow_trials.shape.local import ADMIN_PASSWORD

    return ADMIN_PASSWORD


@shape_app.command("status")
def status(home: Home = ".shape") -> None:
    """Each process of the shape, and whether it runs."""
    from airflow_trials.shape.local import STATE_FILE, LocalShape

    if not (Path(home) / STATE_FILE).exists():
        fail(f"No shape in {home}: start one with `airflow-trials shape up --home {home}`.")
    shape = LocalShape(Path(home))
    for name, alive in shape.status().items():
        out.print(f"{name:24} {'running' if alive else 'stopped'}")


@shape_app.command("env")
def env(home: Home = ".shape") -> None:
    """``export`` lines that point ``airflow``, ``airflow-trials``, Ray and s3fs at the shape."""
    from airflow_trials.shape.local import STATE_FILE, LocalShape

    if not (Path(home) / STATE_FILE).exists():
        fail(f"No shape in {home}: start one with `airflow-trials shape up --home {home}`.")
    shape = LocalShape(Path(home))
    for key, value in shape.client_env().items():
        out.print(f"export {key}={shlex.quote(value)}", soft_wrap=True, highlight=False)


@shape_app.command("restart")
def restart(
    names: Annotated[
        list[str], typer.Argument(help="Processes to restart, as `shape status` names them.")
    ],
    home: Home = ".shape",
) -> None:
    """Stop the named processes if they run, and start them again with their own settings."""
    from airflow_trials.shape.local import STATE_FILE, LocalShape, ShapeError
    from airflow_trials.shape.supervisor import restart as restart_processes

    if not (Path(home) / STATE_FILE).exists():
        fail(f"No shape in {home}: start one with `airflow-trials shape up --home {home}`.")
    shape = LocalShape(Path(home))
    try:
        restart_processes(shape, *names)
    except ShapeError as e:
        fail(str(e))
    out.print(f"Restarted {', '.join(names)} in {shape.home}.")


@shape_app.command("supervise")
def supervise(
    home: Home = ".shape",
    interval_s: Annotated[float, typer.Option(help="Seconds between two looks.")] = 2.0,
) -> None:
    """Watch the shape's processes and start again each one that dies, with its own settings,
    until Ctrl-C (what systemd, Kubernetes or Celery's supervisor does in a deployment)."""
    from airflow_trials.shape.local import STATE_FILE, LocalShape
    from airflow_trials.shape.supervisor import Supervisor

    if not (Path(home) / STATE_FILE).exists():
        fail(f"No shape in {home}: start one with `airflow-trials shape up --home {home}`.")
    shape = LocalShape(Path(home))
    supervisor = Supervisor(
        shape,
        interval_s=interval_s,
        on_restart=lambda name: out.print(f"{time.strftime('%H:%M:%S')} restarted {name}"),
    )
    if not shape.expected:
        fail(f"Nothing runs in the shape in {home}: `airflow-trials shape up --home {home}`.")
    out.print(f"Supervising {len(shape.expected)} processes of {shape.home}; Ctrl-C to stop.")
    try:
        supervisor.run()
    except KeyboardInterrupt:
        out.print("Stopped supervising; the shape runs on.")


@shape_app.command("down")
def down(
    home: Home = ".shape",
    drop: Annotated[
        bool,
        typer.Option(
            help="Also drop its databases and forget its state (checkpoints on the S3 "
            "stand-in are in memory and go with it)."
        ),
    ] = False,
    drain_timeout_s: Annotated[
        float | None,
        typer.Option(
            help="How long the running trials get to checkpoint and pause first; 0: no drain. "
            "Default: \\[airflow_trials] drain_timeout_seconds (30)."
        ),
    ] = None,
) -> None:
    """Stop every process of the shape: first the running trials checkpoint after their current
    iteration and pause (bounded), then SIGTERM, then SIGKILL what is left."""
    from airflow_trials.shape.local import STATE_FILE, LocalShape

    if not (Path(home) / STATE_FILE).exists():
        fail(f"No shape in {home}.")
    shape = LocalShape(Path(home))
    _drain(shape, drain_timeout_s)
    shape.down(drop_databases=drop)
    out.print(f"The shape in {home} is stopped.")


def _drain(shape: Any, timeout_s: float | None) -> None:
    """The graceful stop's drain (``execution/driver/drain.py``) on the shape's Ray cluster, when
    its head runs. A drain that fails is said, and the stop goes on."""
    from airflow_trials.execution.driver.drain import drain_cluster, drain_failed

    if not shape.status().get("ray-head"):
        return
    os.environ["RAY_AUTH_MODE"] = shape.client_env()["RAY_AUTH_MODE"]
    try:
        report = drain_cluster(shape.addresses.ray_address, timeout_s)
    except Exception as e:  # noqa: BLE001 - the stop must go on; the resume re-runs more
        out.print(drain_failed(e), highlight=False, soft_wrap=True)
        return
    if report is not None and report.states:
        out.print(report.summary(), highlight=False, soft_wrap=True)
