"""What a sweep driver resumes from the trials DB, on every backend: the trials to run again, the
searcher's ids still to ask, and what its searcher learns before its first suggestion. No Ray: the
driver's own functions (``resumable_trials``, ``sweep_search``) on a real store."""

from __future__ import annotations

import dataclasses

import pytest

from airflow_trials import OptunaSearch
from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import Transition, after_failure
from airflow_trials.core.search import uniform
from airflow_trials.core.status import TrialStatus
from airflow_trials.execution.driver.sweep_driver import SweepSpec, resumable_trials, sweep_search
from airflow_trials.storage.trial_storage import TrialStorage
from tests.contract.conftest import MEMORY, POSTGRESQL, SQLITE_FILE
from tests.factories import add_checkpoint, add_results

TRAINABLE = "tests.trainables:quadratic"
IDS = [f"run1-{i:04d}" for i in range(6)]


def spec(store_url: str, run_pk: int, search_alg=None, warm_points=()) -> SweepSpec:
    """Six trials: a warm seed first (its config given), the others the searcher's ({})."""
    return SweepSpec(
        experiment_name="exp",
        run_key="run1",
        experiment_run_id=run_pk,
        trainable=TRAINABLE,
        trials=[(IDS[0], {"x": 0.35})] + [(i, {}) for i in IDS[1:]],
        metric="loss",
        mode="min",
        db_url=store_url,
        storage_path=None,
        namespace="ns",
        search_alg=search_alg,
        warm_points=warm_points,
    )


def searcher() -> OptunaSearch:
    return OptunaSearch(
        {"x": uniform(0, 1)},
        metric="loss",
        mode="min",
        seed=3,
        points_to_evaluate=[{"x": 0.1}, {"x": 0.2}, {"x": 0.7}],
    )


def started(store, run_pk: int, trial_id: str, config: dict) -> None:
    store.upsert_trial(
        trial_id,
        trainable=TRAINABLE,
        config=config,
        resources={"cpu": 1},
        max_failures=0,
        experiment_run_id=run_pk,
    )
    store.record_transition(trial_id, Transition.PLACED)


def ended(store, run_pk: int, trial_id: str, config: dict, loss: float | None) -> None:
    started(store, run_pk, trial_id, config)
    add_results(
        store, trial_id, [{"loss": loss if loss is not None else 1.0, "training_iteration": 1}]
    )
    if loss is None:  # failed for good: its only try (max_failures=0)
        end = TrialEnd(trial_id, "exp", TrialStatus.ERROR, error="boom")
        store.record_end(end, after_failure(trial_id, 0, 0))
    else:
        store.record_end(
            TrialEnd(
                trial_id,
                "exp",
                TrialStatus.TERMINATED,
                last_result={"loss": loss, "training_iteration": 1},
            )
        )


def checkpointed(store, storage: TrialStorage, trial_id: str, iteration: int) -> str:
    """A real checkpoint of ``trial_id`` at ``iteration`` on ``storage``, recorded in the store."""
    path = storage.persist_checkpoint("exp", trial_id, iteration, {"iteration": iteration}, {})
    add_checkpoint(store, trial_id, path, iteration)
    return path


@pytest.fixture
def storage(tmp_path) -> TrialStorage:
    return TrialStorage(str(tmp_path / "results"))


class SweepResumeContract:
    backend: str

    def test_a_run_registered_in_the_store_resumes_as_its_listed_trials_do(
        self, store, store_url, storage
    ):
        """A sweep's suggest_configs registers the run's trials (the seed with its config, the
        searcher's with {}) and its driver reads them by the run's id (``trials=None``). Fresh,
        each is planned or asked for; a searched trial takes its config when it starts; after the
        same history as the test below, the driver resumes exactly what the listed trials give."""
        store.ensure_experiment("exp", metric="loss", mode="min")
        run_pk = store.create_experiment_run("exp", "run1")
        origin = {"run_key": "run0", "trial_id": "earlier"}
        planned = [(IDS[0], {"x": 0.35}, origin)] + [(i, {}, None) for i in IDS[1:]]
        store.register_trials(
            run_pk, planned, trainable=TRAINABLE, resources={"cpu": 1}, max_failures=0
        )
        origins = {IDS[0]: {"warm_start": origin, "restore_path": None}}
        listed = dataclasses.replace(spec(store_url, run_pk, searcher()), origins=origins)
        registered = dataclasses.replace(listed, trials=None)
        states = store.reader.run_trial_states(run_pk)
        assert [(s.trial_id, s.config, s.never_started) for s in states] == [
            (t, c, True) for t, c, _ in planned
        ]
        assert store.reader.get_trial(IDS[0]).warm_start == origin

        fresh = resumable_trials(registered, store, storage)
        assert [(t.trial_id, t.config) for t in fresh.trials] == [(IDS[0], {"x": 0.35})]
        assert (fresh.to_ask, fresh.asked, fresh.done, fresh.total) == (IDS[1:], 0, 0, 6)

        ended(store, run_pk, IDS[0], {"x": 0.35}, 0.0025)
        ended(store, run_pk, IDS[1], {"x": 0.1}, 0.04)
        ended(store, run_pk, IDS[2], {"x": 0.2}, None)
        started(store, run_pk, IDS[3], {"x": 0.7})
        path = checkpointed(store, storage, IDS[3], 2)
        store.register_trials(  # a retry of suggest_configs changes nothing registered
            run_pk, planned, trainable=TRAINABLE, resources={"cpu": 1}, max_failures=0
        )
        assert store.reader.get_trial(IDS[1]).config == {"x": 0.1}  # as it started
        assert store.reader.get_trial(IDS[0]).status is TrialStatus.TERMINATED

        mine, theirs = (resumable_trials(s, store, storage) for s in (registered, listed))
        assert [(t.trial_id, t.config, t.restore_source()) for t in mine.trials] == [
            (IDS[3], {"x": 0.7}, path)
        ]
        assert [(t.trial_id, t.config) for t in theirs.trials] == [(IDS[3], {"x": 0.7})]
        assert (mine.to_ask, mine.asked, mine.done, mine.best, mine.ended, mine.total) == (
            theirs.to_ask,
            theirs.asked,
            theirs.done,
            theirs.best,
            theirs.ended,
            theirs.total,
        )
        assert mine.to_ask == IDS[4:] and mine.asked == 3 and mine.done == 3

    def test_a_resumed_run_keeps_its_asked_configs_and_asks_only_for_the_rest(
        self, store, store_url, storage
    ):
        """Before the driver died: the seed and the searcher's first two trials ended (one failed),
        its third was running with a checkpoint. The next driver resumes the third with its stored
        config from its checkpoint and asks for the last two; its searcher knows the warm start's
        point and the run's three ended trials first."""
        store.ensure_experiment("exp", metric="loss", mode="min")
        run_pk = store.create_experiment_run("exp", "run1")
        ended(store, run_pk, IDS[0], {"x": 0.35}, 0.0025)
        ended(store, run_pk, IDS[1], {"x": 0.1}, 0.04)
        ended(store, run_pk, IDS[2], {"x": 0.2}, None)
        started(store, run_pk, IDS[3], {"x": 0.7})
        path = checkpointed(store, storage, IDS[3], 2)
        the_spec = spec(store_url, run_pk, searcher(), warm_points=[[{"x": 0.3}, 0.001]])

        resumable = resumable_trials(the_spec, store, storage)

        assert [(t.trial_id, t.config, t.restore_source()) for t in resumable.trials] == [
            (IDS[3], {"x": 0.7}, path)
        ]
        assert resumable.to_ask == IDS[4:] and resumable.asked == 3 and resumable.done == 3
        assert resumable.best == (0.0025, IDS[0])
        # Each with its last result, which a searcher with constraints computes their values from.
        assert resumable.ended == [
            (IDS[0], {"x": 0.35}, 0.0025, {"loss": 0.0025, "training_iteration": 1}),
            (IDS[1], {"x": 0.1}, 0.04, {"loss": 0.04, "training_iteration": 1}),
            (IDS[2], {"x": 0.2}, None, {"loss": 1.0, "training_iteration": 1}),
        ]

        search = sweep_search(the_spec, resumable)
        study = search.searcher.study
        assert [(t.params, t.value, t.state.name) for t in study.trials] == [
            ({"x": 0.3}, 0.001, "COMPLETE"),
            ({"x": 0.35}, 0.0025, "COMPLETE"),
            ({"x": 0.1}, 0.04, "COMPLETE"),
            ({"x": 0.2}, None, "FAIL"),
        ]
        assert search.num_samples == 2
        new = search.next_trial([], lambda resources: True)
        assert new.trial_id == IDS[4]  # the run's id, not a new one
        assert new.config["x"] not in (
            0.1,
            0.2,
            0.7,
        )  # the three points were handed out before the resume

    def test_a_trial_resumes_from_its_newest_recorded_checkpoint_that_is_on_the_storage(
        self, store, store_url, storage
    ):
        """The store names checkpoints 2, 3 and 4; 4 and 3 are gone from the storage (a lifecycle
        rule): the trial resumes from 2, and 3 and 4 are marked deleted, without a failure."""
        store.ensure_experiment("exp", metric="loss", mode="min")
        run_pk = store.create_experiment_run("exp", "run1")
        started(store, run_pk, IDS[0], {"x": 0.35})
        kept = checkpointed(store, storage, IDS[0], 2)
        for iteration in (3, 4):
            storage.delete(checkpointed(store, storage, IDS[0], iteration))

        resumable = resumable_trials(spec(store_url, run_pk), store, storage)

        trial = next(t for t in resumable.trials if t.trial_id == IDS[0])
        assert trial.restore_source() == kept and [
            c.iteration for c in trial.checkpoint_manager.kept
        ] == [2]
        assert [c.path for c in store.reader.live_checkpoints(IDS[0])] == [kept]
        assert store.reader.latest_checkpoint(IDS[0]).path == kept
        assert store.reader.get_trial(IDS[0]).num_failures == 0

    def test_a_trial_whose_every_checkpoint_is_gone_starts_from_scratch(
        self, store, store_url, storage
    ):
        store.ensure_experiment("exp", metric="loss", mode="min")
        run_pk = store.create_experiment_run("exp", "run1")
        started(store, run_pk, IDS[0], {"x": 0.35})
        storage.delete(checkpointed(store, storage, IDS[0], 1))

        resumable = resumable_trials(spec(store_url, run_pk), store, storage)

        trial = next(t for t in resumable.trials if t.trial_id == IDS[0])
        assert trial.restore_source() is None and store.reader.latest_checkpoint(IDS[0]) is None

    def test_a_run_that_asked_nothing_yet_starts_the_search_from_the_top(
        self, store, store_url, storage
    ):
        store.ensure_experiment("exp", metric="loss", mode="min")
        run_pk = store.create_experiment_run("exp", "run1")
        the_spec = spec(store_url, run_pk, searcher())

        resumable = resumable_trials(the_spec, store, storage)

        assert [t.trial_id for t in resumable.trials] == [IDS[0]]  # the seed: its config is fixed
        assert resumable.to_ask == IDS[1:] and (
            resumable.asked,
            resumable.done,
            resumable.ended,
        ) == (0, 0, [])
        search = sweep_search(the_spec, resumable)
        assert search.next_trial([], lambda resources: True).config == {
            "x": 0.1
        }  # points_to_evaluate[0]

    def test_without_a_searcher_every_trial_runs_with_its_given_config(
        self, store, store_url, storage
    ):
        store.ensure_experiment("exp", metric="loss", mode="min")
        run_pk = store.create_experiment_run("exp", "run1")
        ended(store, run_pk, IDS[0], {"x": 0.35}, 0.0025)
        the_spec = spec(store_url, run_pk)

        resumable = resumable_trials(the_spec, store, storage)

        assert [t.trial_id for t in resumable.trials] == IDS[1:] and resumable.to_ask == []
        assert sweep_search(the_spec, resumable) is None


class TestInMemorySQLite(SweepResumeContract):
    backend = MEMORY


class TestSQLiteFile(SweepResumeContract):
    backend = SQLITE_FILE


@pytest.mark.postgres
class TestPostgreSQL(SweepResumeContract):
    backend = POSTGRESQL
