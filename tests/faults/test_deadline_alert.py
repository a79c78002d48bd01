"""A tuning run's deadline passes mid-run, on the real stack (scheduler, triggerer).

``deadline=ExperimentDeadline(1 s, callback=...)``: the trials hold at HOLD_AT until the gate
opens, and only the team's callback opens it, so the run cannot end before the scheduler has
found the missed deadline and the triggerer has run the provider's notifier, whatever the speed
of the machine. The run then ends as any run does: select_best publishes the best.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.faults.trainables import gate

pytestmark = pytest.mark.timeout(900)


def open_gate_on_deadline(*, journal_dir: str, experiment_name: str, context: Any) -> None:
    """The team's callback: record what it was told, then let the held trials go on."""
    record = {"experiment_name": experiment_name, "dag_run": context["dag_run"]}
    (Path(journal_dir) / "deadline.json").write_text(json.dumps(record))
    gate(journal_dir).touch()


def test_a_deadline_that_passes_mid_run_alerts_and_the_run_still_publishes(stack, experiment):
    dag_id = "faults_deadline_alert"
    journal = stack.home / "journal" / dag_id
    callback = f"{__name__}.open_gate_on_deadline"
    run = experiment(
        dag_id,
        trials=2,
        extra=(
            "deadline=ExperimentDeadline(datetime.timedelta(seconds=1), "
            f"callback={callback!r}, callback_kwargs={{'journal_dir': {str(journal)!r}}}),"
        ),
    )
    dag_file = stack.dags_folder / f"{dag_id}.py"
    source = dag_file.read_text().replace(
        "import tuning_experiment", "import ExperimentDeadline, tuning_experiment"
    )
    dag_file.write_text(source)
    run_id = run.trigger()
    assert run.finish() == "success"

    told = json.loads((journal / "deadline.json").read_text())
    assert told["experiment_name"] == dag_id
    assert told["dag_run"]["dag_id"] == dag_id and told["dag_run"]["dag_run_id"] == run_id
    run.assert_trials_end("TERMINATED")
    run.assert_experiment_run("SUCCESS")
    triggerer_log = stack.log_path("triggerer").read_text()
    assert f"Experiment {dag_id}, DAG run {run_id} of DAG {dag_id}, missed its deadline" in (
        triggerer_log
    ), triggerer_log[-4000:]
