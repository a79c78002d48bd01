"""The history lines stored when runs end (at_experiment_runs.summary, migration 0013): equal to the
lines computed from the trials for every seeded run, read instead of them, and forgotten by every
store write that changes a trial of an ended run; on SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session

from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import TRAINABLE_FINISHED, Transition
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.update import TrialUpdate
from airflow_trials.store import TrialStore
from airflow_trials.store.models import ExperimentRunRow
from airflow_trials.store.run_history import history_goal, line_from_summary, run_lines
from airflow_trials.store.transitions import RestartFromScratch, StopForTry
from tests.contract.conftest import new_postgres_schema
from tests.factories import add_results, update_trial
from tests.plugins.history_seed import EXPERIMENT, seed_nightly


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store(request, tmp_path) -> Iterator[TrialStore]:
    if request.param == "sqlite":
        opened = TrialStore(f"sqlite:///{tmp_path / 'trials.db'}", create=True)
        yield opened
        opened.dispose()
        return
    with new_postgres_schema("at_summary") as url:
        opened = TrialStore(url, create=True)
        try:
            yield opened
        finally:
            opened.dispose()


def _summaries(store: TrialStore) -> dict[int, object]:
    with store._engine.connect() as connection:
        rows = connection.execute(select(ExperimentRunRow.id, ExperimentRunRow.summary))
        return dict(rows.all())


def _live_history(store: TrialStore):
    """The history as computed from the trials alone."""
    return _live(store, lambda: store.reader.experiment_history(EXPERIMENT))


def _live(store: TrialStore, read: Callable[[], Any]) -> Any:
    """``read()`` with every stored line set aside (then put back): computed from the trials."""
    stored = _summaries(store)
    with store._write_engine.begin() as connection:
        connection.execute(update(ExperimentRunRow).values(summary=None))
    try:
        return read()
    finally:
        with store._write_engine.begin() as connection:
            for run_pk, summary in stored.items():
                connection.execute(
                    update(ExperimentRunRow)
                    .where(ExperimentRunRow.id == run_pk)
                    .values(summary=summary)
                )


def test_every_stored_line_equals_the_live_one(store):
    nights = seed_nightly(store, big_night_trials=40)
    running = store.create_experiment_run(EXPERIMENT, "manual__running")
    store.upsert_trial(
        "r-0",
        trainable="pkg:fn",
        config={"lr": 0.2},
        resources={"cpu": 1},
        max_failures=0,
        experiment_run_id=running,
    )
    add_results(store, "r-0", [{"training_iteration": 1, "loss": 0.2}])
    summaries = _summaries(store)
    ended = [night.run for night in nights.nights]
    assert all(summaries[run_pk] is not None for run_pk in ended)
    assert summaries[running] is None
    found = store.reader.experiment_history(EXPERIMENT)
    assert found.runs == _live_history(store).runs
    trend = store.reader.experiment_trend(EXPERIMENT)
    assert trend == _live(store, lambda: store.reader.experiment_trend(EXPERIMENT))
    assert [point.best_value for point in trend] == [line.best_value for line in found.runs]
    # Line by line: each stored line is the one run_lines computes now.
    experiment = store.reader.get_experiment(EXPERIMENT)
    records = {line.run.id: line.run for line in found.runs}
    with Session(store._engine) as session:
        live = run_lines(session, store._db.dialect, list(records.values()), "loss", "min")
    for run_pk in ended:
        stored = line_from_summary(records[run_pk], summaries[run_pk], *history_goal(experiment))
        assert stored == live[run_pk]
    # r-0 has a value but has not ended: no trial of the run counts yet (docs/store.md).
    assert found.runs[-1].best_trial_id is None and found.runs[-1].run.id == running


def test_the_history_reads_the_stored_line_of_an_ended_run(store):
    nights = seed_nightly(store, nights=2)
    first = nights.nights[0].run
    with store._write_engine.begin() as connection:
        summary = dict(_summaries(store)[first])
        summary["num_trials"] = 999  # only a read of the stored line can show this
        connection.execute(
            update(ExperimentRunRow).where(ExperimentRunRow.id == first).values(summary=summary)
        )
    lines = {line.run.id: line for line in store.reader.experiment_history(EXPERIMENT).runs}
    assert lines[first].num_trials == 999
    assert lines[nights.nights[1].run].num_trials == 6


def test_a_run_set_running_again_forgets_its_line_and_stores_it_when_it_ends(store):
    run = seed_nightly(store, nights=1).nights[0].run
    store.finish_experiment_run(run, "RUNNING")
    assert _summaries(store)[run] is None
    store.finish_experiment_run(run, "FAILED")
    assert _summaries(store)[run] is not None
    assert store.reader.experiment_history(EXPERIMENT).runs == _live_history(store).runs


def test_a_changed_metric_recomputes_the_stored_lines(store):
    seed_nightly(store, nights=2)
    store.ensure_experiment(EXPERIMENT, metric="loss", mode="max")
    found = store.reader.experiment_history(EXPERIMENT)
    assert found.mode == "max"
    assert [line.best_value for line in found.runs] == pytest.approx([0.9, 0.91])
    assert found.runs == _live_history(store).runs


def _register(store: TrialStore, trial_id: str, run: int) -> None:
    store.upsert_trial(
        trial_id,
        trainable="pkg:fn",
        config={"lr": 0.5},
        resources={"cpu": 1},
        max_failures=2,
        experiment_run_id=run,
    )


def _end(store: TrialStore, trial_id: str) -> None:
    store.record_end(
        TrialEnd(trial_id, EXPERIMENT, TrialStatus.TERMINATED, stop_reason=TRAINABLE_FINISHED)
    )


# Every store write that changes a trial of a run (of run 0, seeded by seed_nightly: n0-running is
# RUNNING, n0-best TERMINATED with results, n0-early TERMINATED); each after the run ended.
WRITES: dict[str, Callable[[TrialStore, int], object]] = {
    "upsert_trial": lambda store, run: _register(store, "n0-late", run),
    "add_results": lambda store, run: add_results(
        store, "n0-running", [{"training_iteration": 1, "loss": 0.01}]
    ),
    "record_progress": lambda store, run: store.record_progress(
        [TrialUpdate("n0-running", results=[{"training_iteration": 2, "loss": 0.02}])]
    ),
    "record_end": lambda store, run: _end(store, "n0-running"),
    "record_transition": lambda store, run: store.record_transition("n0-failed", Transition.RESET),
    "update_trial": lambda store, run: update_trial(store, "n0-failed", num_failures=5),
    "stop_for_try": lambda store, run: store.record_transition(
        "n0-failed", StopForTry("stopped from Airflow", None)
    ),
    "restart": lambda store, run: store.record_transition("n0-best", RestartFromScratch()),
    "record_exploit": lambda store, run: store.record_exploit(
        "n0-early",
        iteration=0,
        donor_trial_id="n0-maxt",
        donor_checkpoint="/ckpt/n0-maxt/0",
        old_config={"lr": 0.1, "layers": 1},
        new_config={"lr": 0.2, "layers": 1},
        operations={"lr": "x2"},
    ),
    "recompute_best": lambda store, run: store.recompute_best(run),
}


def test_every_trial_write_after_the_end_forgets_the_line(store):
    run = seed_nightly(store, nights=1).nights[0].run
    for name, write in WRITES.items():
        assert _summaries(store)[run] is not None, name
        write(store, run)
        assert _summaries(store)[run] is None, f"{name} left the run's stale line stored"
        # What the history shows is what the trials say now.
        assert store.reader.experiment_history(EXPERIMENT).runs == _live_history(store).runs
        store.finish_experiment_run(run, "SUCCESS")
        assert store.reader.experiment_history(EXPERIMENT).runs == _live_history(store).runs


def test_a_write_to_a_running_run_leaves_the_ended_ones_stored(store):
    nights = seed_nightly(store, nights=2)
    first, second = (night.run for night in nights.nights)
    store.finish_experiment_run(second, "RUNNING")
    add_results(store, "n1-running", [{"training_iteration": 1, "loss": 0.05}])
    summaries = _summaries(store)
    assert summaries[first] is not None and summaries[second] is None


def test_the_pick_shows_in_the_history_and_keeps_the_stored_line(store):
    run = seed_nightly(store, nights=1).nights[0].run
    store.record_pick(run, "n0-maxt")
    assert _summaries(store)[run] is not None
    (line,) = store.reader.experiment_history(EXPERIMENT).runs
    assert (line.run.picked_trial_id, line.best_trial_id) == ("n0-maxt", "n0-best")
