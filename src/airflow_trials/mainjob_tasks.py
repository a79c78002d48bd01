"""How the main job's Airflow stack starts its tasks sooner: what the LocalExecutor's workers
import before they fork a task process, and whether the execution API is set up to start tasks.

Both were measured on ``bench/airflow_vs_runner.py`` (docs/benchmarks.md, "Where the Airflow
path's time goes").
"""

from __future__ import annotations

import urllib.error
import urllib.request

#: What each LocalExecutor worker has imported before it forks a task process: the task's own
#: start (the DAG file's imports, ``airflow_trials.experiment`` with Ray, SQLAlchemy and the
#: operators) is then inherited, not imported again by each of a run's tasks. The workers are
#: forked from Python's forkserver, which imports these once (a module it cannot import it skips).
TASK_PRELOAD = (
    "airflow.executors.local_executor",
    "airflow.sdk.execution_time.supervisor",
    "airflow.sdk.execution_time.task_runner",
    # A trial task connects to Ray and asks for its actor's state when it starts; parsing a DAG
    # file imports neither (the DAG processor's parse stays without Ray), so both come here.
    "ray",
    "airflow_trials.execution.ray_state",
    "airflow_trials.experiment",
    "airflow_trials.mainjob_forkserver",  # last: freezes what the others imported (gc.freeze)
)


def task_start_settings() -> dict[str, str]:
    """Airflow's settings (environment variables) that fork the scheduler's LocalExecutor workers
    from a forkserver holding :data:`TASK_PRELOAD`."""
    return {
        "AIRFLOW__SCHEDULER__MP_START_METHOD": "forkserver",
        "AIRFLOW__SCHEDULER__MP_FORKSERVER_PRELOAD": ",".join(TASK_PRELOAD),
    }


def execution_api_answers(url: str, timeout_s: float = 300) -> bool:
    """Does the execution API at ``url`` (``.../execution/``) answer its health check? The main
    job asks before it triggers a run: the API sets itself up on its first request, which took 15
    to 50 s on a loaded 2-core machine and held every other request meanwhile, so the run's first
    task waited for it, and its client's retries could run out and fail the task."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/health", timeout=timeout_s) as response:
            return bool(response.status == 200)
    except (urllib.error.URLError, OSError):
        return False  # not listening yet
