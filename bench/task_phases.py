"""Where a DAG run's tasks spend their time, from Airflow's task logs (bench/airflow_vs_runner).

Each task's log (``<AIRFLOW_HOME>/logs/dag_id=.../run_id=.../task_id=...[/map_index=N]/
attempt=1.log``, JSON lines) marks its steps with a timestamp; a deferred task's trigger writes its
own log beside it (``attempt=1.log.trigger.<id>.log``), and its resumed run (``execute_complete``)
logs into the same file again. ``phases`` returns, per step, the seconds each task of a task id
took over it; ``print_phases`` prints their medians and maxima.
"""

from __future__ import annotations

import datetime as dt
import json
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

#: The log lines that mark a task's steps, in order: (mark, the text its event holds). A mark seen
#: again after the deferral is the resumed run's, named ``resumed_<mark>``.
MARKS: tuple[tuple[str, str], ...] = (
    ("runner", "::group::Pre Execute"),  # the task process runs (the executor forked it)
    ("details", "DAG bundles loaded"),  # the api-server said the task may start (its /run)
    ("parsed", "Worker startup parse complete"),  # the DAG file parsed in the task process
    ("ray", "Connected to Ray cluster"),
    ("launched", "Started trial"),
    ("deferred", "Pausing task as DEFERRED"),
    ("done", "Done. Returned value"),
)

#: The steps printed: (label, from mark, to mark). ``start``/``end`` are the task instance's
#: start and end dates; ``trigger`` and ``fired`` its trigger's first and last log lines.
STEPS: tuple[tuple[str, str, str], ...] = (
    ("queued by the scheduler -> on a worker", "queued", "start"),
    ("on a worker -> task process runs", "start", "runner"),
    ("task process -> allowed to start (api)", "runner", "details"),
    ("allowed to start -> DAG file parsed", "details", "parsed"),
    ("DAG file parsed -> connected to Ray", "parsed", "ray"),
    ("connected to Ray -> trial launched", "ray", "launched"),
    ("trial launched -> deferred", "launched", "deferred"),
    ("deferred -> its trigger runs", "deferred", "trigger"),
    ("trainable's last result -> trigger fires", "last_result", "fired"),
    ("its trigger fires -> task process runs", "fired", "resumed_runner"),
    ("resumed: process -> DAG file parsed", "resumed_runner", "resumed_parsed"),
    ("resumed: DAG file parsed -> task ends", "resumed_parsed", "end"),
    ("DAG file parsed -> returned", "parsed", "done"),
)


def _when(value: str) -> dt.datetime:
    when = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def _marks(log: Path) -> dict[str, dt.datetime]:
    """The first time each of MARKS appears in one task log, and again after the deferral."""
    found: dict[str, dt.datetime] = {}
    for line in log.read_text(errors="replace").splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        event = str(entry.get("event", ""))
        for mark, text in MARKS:
            name = f"resumed_{mark}" if "deferred" in found else mark
            if name not in found and text in event and "timestamp" in entry:
                found[name] = _when(entry["timestamp"])
    return found


def _trigger(log: Path) -> dict[str, dt.datetime]:
    """When the task's first trigger started and when it fired (its log's first and last line)."""
    triggers = sorted(log.parent.glob(log.name + ".trigger.*.log"))
    if not triggers:
        return {}
    stamps = []
    for line in triggers[0].read_text(errors="replace").splitlines():
        try:
            stamps.append(_when(json.loads(line)["timestamp"]))
        except (ValueError, KeyError):
            continue
    return {"trigger": stamps[0], "fired": stamps[-1]} if stamps else {}


def phases(
    logs_folder: Path,
    dag_id: str,
    run_id: str,
    task_rows: Sequence[tuple[str, int, str, str, str]],
    last_results: Mapping[int, dt.datetime],
) -> dict[str, dict[str, list[float]]]:
    """Per task id (``suggest_configs``, ``trial``...), per step label, the seconds each of its
    task instances took. ``task_rows``: (task_id, map_index, queued_dttm, start_date, end_date)
    from Airflow's ``task_instance`` table (a resumed task's ``queued_dttm`` is its resume's);
    ``last_results``: when each mapped trial task's trainable reported its last result."""
    run = logs_folder / f"dag_id={dag_id}" / f"run_id={run_id}"
    out: dict[str, dict[str, list[float]]] = {}
    for task_id, map_index, queued, start, end in task_rows:
        folder = run / f"task_id={task_id}"
        log = (folder / f"map_index={map_index}" if map_index >= 0 else folder) / "attempt=1.log"
        if not log.exists():
            continue
        marks = {**_marks(log), **_trigger(log)}
        for name, value in (("queued", queued), ("start", start), ("end", end)):
            if value:
                marks[name] = _when(value)
        if "deferred" in marks:  # the resume's queueing, not the first start's
            marks.pop("queued", None)
        if map_index in last_results:
            marks["last_result"] = last_results[map_index]
        steps = out.setdefault(task_id.rsplit(".", 1)[-1], {})
        for label, begin, finish in STEPS:
            if begin in marks and finish in marks:
                seconds = (marks[finish] - marks[begin]).total_seconds()
                steps.setdefault(label, []).append(seconds)
    return out


def print_phases(found: Mapping[str, Mapping[str, Sequence[float]]]) -> None:
    """Median and maximum seconds of each step, per task id."""
    print("where each task's time went (s: median, max over its task instances):")
    for task, steps in found.items():
        for label, _, _ in STEPS:
            values = steps.get(label)
            if values:
                print(
                    f"  {task:<16} {label:<40} {statistics.median(values):6.1f} "
                    f"{max(values):6.1f}  (n={len(values)})"
                )
