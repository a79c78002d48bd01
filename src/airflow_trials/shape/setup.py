"""What :class:`~airflow_trials.shape.local.LocalShape` sets up around its processes, and the small
helpers it runs them with: its two PostgreSQL databases, the checkpoint bucket, the migrations and
the GPU pool, and reads of Airflow's metadata DB (the launcher's own checks; tasks and triggers
never touch it)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow_trials.shape import spec
from airflow_trials.shape.spec import Addresses


class ShapeError(RuntimeError):
    """A part of the shape did not start, or exited while it should run."""


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid runs: it exists (``kill(pid, 0)``) and is no zombie. A
    killed multi-threaded process's leader shows as a zombie as soon as its own thread has
    exited: it runs no more, though it cannot be reaped until its other threads are gone."""
    import psutil

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's: it exists
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return _exists(pid)
    except psutil.Error:
        return True


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def write_private(path: Path, text: str) -> None:
    """Write ``path`` readable by its owner only (0600), atomically: the text goes to a new file
    created 0600 beside it, which then replaces it, so the secrets are never in a looser file, a
    reader never sees half of them, and a looser file from before is replaced, not reused."""
    tmp = path.with_name(f".{path.name}.{os.urandom(4).hex()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


#: The programs the shape runs: the venv's (the ``dev`` extra: ``moto[server]``), and Redis,
#: which no Python package installs: ``redis-server`` from the machine's PATH.
PROGRAMS = ("airflow", "ray", "moto_server", "redis-server")
#: The packages its processes and its set-up import (the ``dev`` extra: ``s3``, ``celery``,
#: ``postgres``).
MODULES = {
    "psycopg": "psycopg[binary] (the postgres extra)",
    "s3fs": "s3fs (the s3 extra)",
    "airflow.providers.celery": "apache-airflow-providers-celery (the celery extra)",
}


def missing_prerequisites() -> list[str]:
    """What ``shape up`` needs and does not find, each said with where it comes from; empty when
    nothing is missing. Found before anything is started or written."""
    import importlib.util

    missing = []
    for name in PROGRAMS:
        if not Path(command(name)).is_file():
            missing.append(
                "redis-server on PATH (e.g. apt-get install redis-server)"
                if name == "redis-server"
                else f"{name} beside this Python ({Path(sys.executable).parent}; the dev extra)"
            )
    for module, package in MODULES.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(package)
    return missing


def check_server(postgres_url: str) -> None:
    """ShapeError unless the PostgreSQL server of ``postgres_url`` answers and its user may
    create databases (``CREATEDB`` or superuser): ``shape up`` creates its two there."""
    from airflow_trials.store.engine import safe_url

    shown = safe_url(postgres_url)
    try:
        with _server(postgres_url) as conn:
            row = conn.execute(
                "SELECT rolcreatedb OR rolsuper FROM pg_roles WHERE rolname = current_user"
            ).fetchone()
    except Exception as e:  # noqa: BLE001 - psycopg's errors, a bad URL: said in one line
        cause = " ".join(str(e).split())
        raise ShapeError(
            f"No PostgreSQL server answers at {shown} (--postgres-url): {type(e).__name__}: "
            f"{cause}; start one, or pass --postgres-url with a server whose user may create "
            "databases"
        ) from e
    if not (row and row[0]):
        raise ShapeError(
            f"The user of {shown} (--postgres-url) may not create databases, and the shape "
            "creates its two there; grant it CREATEDB (ALTER ROLE ... CREATEDB) or pass "
            "--postgres-url with another user"
        )


def command(name: str) -> str:
    """The venv's command ``name`` when it has one (``airflow``, ``ray``, ``moto_server``), else
    the one on PATH (``redis-server``)."""
    here = Path(sys.executable).with_name(name)
    return str(here) if here.exists() else (shutil.which(name) or name)


def log_says(path: Path, text: str) -> bool:
    """Whether the log of a process's current start (each start has a file of its own) holds
    ``text`` anywhere: a line it logged once at its start stays found however much it logged
    after (a Celery worker's broker reconnections)."""
    try:
        return text in path.read_text(errors="replace")
    except OSError:
        return False


def log_tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def run(argv: Iterable[str], env: Mapping[str, str], what: str) -> None:
    """Run a set-up command to its end; ShapeError with its output's tail if it fails."""
    argv = list(argv)
    done = subprocess.run(argv, env=dict(env), capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise ShapeError(
            f"Could not {what} ({' '.join(argv[:3])} exited {done.returncode}): {' | '.join(tail)}"
        )


@contextlib.contextmanager
def _server(postgres_url: str) -> Iterator[Any]:
    """An autocommit connection to the PostgreSQL server of ``postgres_url``."""
    import psycopg
    from sqlalchemy.engine import make_url

    url = make_url(postgres_url)
    conn = psycopg.connect(
        host=url.host or "127.0.0.1",
        port=url.port or 5432,
        user=url.username or "postgres",
        password=url.password,
        dbname=url.database or "postgres",
        autocommit=True,
    )
    try:
        yield conn
    finally:
        conn.close()


def create_databases(postgres_url: str, names: Sequence[str]) -> None:
    """The databases ``names`` on the server, unless they exist."""
    with _server(postgres_url) as conn:
        for name in names:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
            if not exists.fetchone():
                conn.execute(f'CREATE DATABASE "{name}"')


def drop_databases(postgres_url: str, names: Sequence[str]) -> None:
    with _server(postgres_url) as conn:
        for name in names:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def create_bucket(addresses: Addresses) -> None:
    """The checkpoint bucket on the S3 endpoint (kept if it exists)."""
    import s3fs

    settings = spec.s3_settings(addresses)
    fs = s3fs.S3FileSystem(
        key=settings["AWS_ACCESS_KEY_ID"],
        secret=settings["AWS_SECRET_ACCESS_KEY"],
        endpoint_url=addresses.s3_endpoint_url,
        skip_instance_cache=True,
    )
    if not fs.exists(spec.BUCKET):
        fs.mkdir(spec.BUCKET)


def migrate(airflow_env: Mapping[str, str], trials_db_url: str) -> None:
    """Airflow's metadata DB and the trials DB migrated; the GPU pool (deferred tasks hold their
    slots) sized to the GPU node."""
    run([command("airflow"), "db", "migrate"], airflow_env, "migrate Airflow's metadata DB")
    from airflow_trials.store import migrate as migrate_trials_db

    migrate_trials_db(trials_db_url)
    slots = spec.GPU_NODE_GPUS * spec.SLOTS_PER_GPU
    description = f"GPUs of the shape's GPU node ({spec.SLOTS_PER_GPU} slots per GPU)"
    run(
        [command("airflow"), "pools", "set", spec.GPU_POOL, str(slots), description]
        + ["--include-deferred"],
        airflow_env,
        "create the GPU pool",
    )


def metadata_query(metadata_db_url: str, sql: str, **params: Any) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` on Airflow's metadata DB; none when it cannot be read (yet)."""
    import sqlalchemy as sa

    engine = sa.create_engine(metadata_db_url)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(sa.text(sql), params)]
    except sa.exc.SQLAlchemyError:
        return []
    finally:
        engine.dispose()
