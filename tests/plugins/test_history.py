"""An experiment's history across runs: the store read (SQLite and PostgreSQL), the JSON endpoint,
the experiment page and who may see them."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import text

from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import CRITERION_MET, TRAINABLE_FINISHED, Transition
from airflow_trials.core.goal import Goal
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.stop_kind import StopKind
from airflow_trials.store import TrialStore
from airflow_trials.store.history_indexes import (
    RUN_STATUS_INDEX,
    RUN_STOPPED_EARLY_INDEX,
    RUN_WARM_STARTED_INDEX,
)
from airflow_trials.store.run_history import (
    changed_config_keys,
    run_counts_query,
    stopped_early_counts_query,
    warm_started_query,
)
from tests.factories import add_results
from tests.plugins.conftest import seed_store
from tests.plugins.history_seed import AT_MAX_T, EARLY, EXPERIMENT, seed_nightly


@pytest.fixture
def nightly(trials_store):
    return seed_nightly(trials_store)


@pytest.fixture
def history_dashboard(make_dashboard, trials_store, nightly):
    seed_store(trials_store)  # mnist on tune_mnist, secret on other_dag (bob's only DAG)
    return make_dashboard(trials_store)


def _check_lines(lines, nights) -> None:
    assert [line.run.id for line in lines] == [night.run for night in nights]
    for line, night in zip(lines, nights, strict=True):
        assert line.best_value == pytest.approx(night.best_value)
        assert line.best_trial_id == night.best_trial
        assert line.best_config == night.best_config
        assert line.num_trials == night.trials
        assert line.num_errored == night.errored
        assert line.num_failed_tries == night.failed_tries
        assert line.stop_kinds == {
            "completed": night.completed,
            "early_stopped": night.early_stopped,
            "errored": night.errored,
            "unfinished": night.unfinished,
        }


def _check_store_history(store: TrialStore) -> None:
    nights = seed_nightly(store)
    found = store.reader.experiment_history(EXPERIMENT)
    assert (found.metric, found.mode, found.several_metrics) == ("loss", "min", False)
    _check_lines(found.runs, nights.nights)
    changed = [line.changed_keys for line in found.runs]
    assert changed == [[], [], ["lr"], ["dropout", "layers"]]
    assert [line.previous_run_id for line in found.runs] == [None] + [
        n.run for n in nights.nights[:-1]
    ]
    warm = found.runs[-1].warm_started_from
    assert warm is not None and warm.experiment_run_id == nights.nights[-2].run
    assert warm.run_key == nights.nights[-2].run_key
    assert all(line.warm_started_from is None for line in found.runs[:-1])
    # --last 2: the oldest shown still compares with the run before it.
    last_two = store.reader.experiment_history(EXPERIMENT, last=2)
    _check_lines(last_two.runs, nights.nights[-2:])
    assert last_two.runs[0].changed_keys == ["lr"]
    assert last_two.runs[0].previous_best_config == nights.nights[1].best_config
    # The history's best is the board's (store/board.py), in either mode.
    board = store.reader.board(nights.nights[-1].run, Goal.of("loss", "min"))
    assert board.best is not None and (board.best_trial_id, board.best.value) == ("n3-best", 0.31)
    board = store.reader.board(nights.nights[-1].run, Goal.of("loss", "max"))
    assert board.best is not None and board.best.value == pytest.approx(0.93)


def test_history_of_nightly_runs_on_sqlite(trials_store):
    _check_store_history(trials_store)


def test_history_of_nightly_runs_on_postgresql():
    from tests.contract.conftest import new_postgres_schema

    with new_postgres_schema("at_history") as url:
        store = TrialStore(url, create=True)
        try:
            _check_store_history(store)
        finally:
            store.dispose()


# (stop reason, stop kind): the kind decides, whatever the reason's words.
REASONS = [
    (None, None),
    ("", None),
    (TRAINABLE_FINISHED, StopKind.FINISHED),
    (CRITERION_MET, StopKind.CRITERION),
    (AT_MAX_T, StopKind.MAX_T),
    ("stopped by MOASHA at training_iteration=8: it reached max_t=8", StopKind.MAX_T),
    (EARLY.format(loss=0.9, cut=0.7), StopKind.SCHEDULER),
    ("stopped by the median stopping rule at 3: 0.5 is worse than the median 0.4", "scheduler"),
    ("the scheduler stopped it", StopKind.SCHEDULER),
    ("stopped by MyRule: it reached max_t=4 of its patience", StopKind.SCHEDULER),
    ("it's got a 'quote'", StopKind.SCHEDULER),
    ("stopped by the sweep's end", StopKind.EXPERIMENT),
    (None, StopKind.AIRFLOW),
]


def _check_stop_kinds_agree_with_fate(store: TrialStore) -> None:
    """The SQL predicate of the partial index counts exactly the trials of kind SCHEDULER
    (:attr:`StopKind.early`)."""
    from airflow_trials.core.end import TrialEnd
    from airflow_trials.core.status import TrialStatus

    store.ensure_experiment("reasons", metric="loss", mode="min")
    run = store.create_experiment_run("reasons", "r1", dag_id="d", run_id="r1")
    for i, (reason, kind) in enumerate(REASONS):
        store.upsert_trial(
            f"reason-{i}", trainable="m:f", config={}, resources={}, max_failures=0,
            experiment_run_id=run,
        )  # fmt: skip
        store.record_end(
            TrialEnd(
                f"reason-{i}",
                "reasons",
                TrialStatus.TERMINATED,
                stop_reason=reason,
                stop_kind=kind,
            )
        )
    line = store.reader.experiment_history("reasons").runs[0]
    expected = sum(kind is not None and StopKind(kind).early for _, kind in REASONS)
    assert expected == 5
    assert line.stop_kinds["early_stopped"] == expected
    assert line.stop_kinds["completed"] == len(REASONS) - expected


def test_stop_kinds_agree_with_fate_on_sqlite(trials_store):
    _check_stop_kinds_agree_with_fate(trials_store)


def test_stop_kinds_agree_with_fate_on_postgresql():
    from tests.contract.conftest import new_postgres_schema

    with new_postgres_schema("at_history") as url:
        store = TrialStore(url, create=True)
        try:
            _check_stop_kinds_agree_with_fate(store)
        finally:
            store.dispose()


def test_history_reads_its_indexes_on_sqlite(trials_store, nightly):
    """The queries stay index-only at any size, and a run's best is a seek, not a scan: SQLite's
    plan names the history indexes (a partial index is only used when the query holds its
    predicate as written)."""
    from sqlalchemy.dialects import sqlite

    runs = [night.run for night in nightly.nights]
    expected = [
        (run_counts_query(runs), f"COVERING INDEX {RUN_STATUS_INDEX}"),
        (stopped_early_counts_query(runs), f"COVERING INDEX {RUN_STOPPED_EARLY_INDEX}"),
        (warm_started_query(runs), f"COVERING INDEX {RUN_WARM_STARTED_INDEX}"),
    ]
    with trials_store._engine.connect() as connection:
        for query, index in expected:
            sql = str(
                query.compile(dialect=sqlite.dialect(), compile_kwargs={"literal_binds": True})
            )
            plan = " ".join(row[3] for row in connection.execute(text(f"EXPLAIN QUERY PLAN {sql}")))
            assert index in plan, plan


def test_several_metrics_give_the_best_of_the_first(make_dashboard, trials_store):
    trials_store.ensure_experiment("multi", metric=["acc", "latency"], mode=["max", "min"])
    run = trials_store.create_experiment_run("multi", "r1", dag_id="tune_multi", run_id="r1")
    for i, (acc, latency) in enumerate([(0.8, 3.0), (0.9, 9.0), (0.7, 1.0)]):
        trials_store.upsert_trial(
            f"multi-{i}", trainable="m:f", config={"i": i}, resources={}, max_failures=0,
            experiment_run_id=run, dag_id="tune_multi",
        )  # fmt: skip
        add_results(
            trials_store, f"multi-{i}", [{"training_iteration": 1, "acc": acc, "latency": latency}]
        )
        # Only a trial that ended TERMINATED counts (docs/store.md "Which trials count").
        trials_store.record_transition(f"multi-{i}", Transition.PLACED)
        trials_store.record_end(TrialEnd(f"multi-{i}", "multi", TrialStatus.TERMINATED))
    found = trials_store.reader.experiment_history("multi")
    assert (found.metric, found.mode, found.several_metrics) == ("acc", "max", True)
    assert (found.runs[0].best_value, found.runs[0].best_trial_id) == (0.9, "multi-1")
    dashboard = make_dashboard(trials_store)
    body = dashboard.get("/api/experiments/multi/history").json()
    assert body["several_metrics"] is True and body["metric"] == "acc"
    assert "several metrics (acc, latency)" in body["note"]
    assert body["runs"][0]["best_value"] == 0.9
    page = dashboard.get("/experiments/multi")
    assert page.status_code == 200
    assert "best acc (max) alone, the first of them" in page.text


def test_an_experiment_without_a_metric_has_counts_only(make_dashboard, trials_store):
    run = trials_store.create_experiment_run("bare", "r1", dag_id="tune_bare", run_id="r1")
    trials_store.upsert_trial(
        "bare-0", trainable="m:f", config={}, resources={}, max_failures=0,
        experiment_run_id=run, dag_id="tune_bare",
    )  # fmt: skip
    add_results(trials_store, "bare-0", [{"training_iteration": 1, "loss": 0.1}])
    dashboard = make_dashboard(trials_store)
    body = dashboard.get("/api/experiments/bare/history").json()
    assert body["metric"] is None and "records no metric" in body["note"]
    assert body["runs"][0]["num_trials"] == 1 and body["runs"][0]["best_value"] is None
    page = dashboard.get("/experiments/bare")
    assert page.status_code == 200 and 'class="history-row"' in page.text


def test_api_history(history_dashboard, trials_store, nightly):
    trials_store.record_pick(nightly.nights[-1].run, "n3-criterion")  # select_best's, recorded
    response = history_dashboard.get(f"/api/experiments/{EXPERIMENT}/history")
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["metric"], body["mode"], body["note"]) == ("loss", "min", None)
    runs = body["runs"]
    assert [r["run"]["run_key"] for r in runs] == [n.run_key for n in nightly.nights]
    for out, night in zip(runs, nightly.nights, strict=True):
        assert out["best_value"] == night.best_value
        assert out["best_trial_id"] == night.best_trial
        assert out["best_config"] == night.best_config
        assert out["num_trials"] == out["run"]["num_trials"] == 6
        assert (out["num_errored"], out["num_failed_tries"]) == (1, 2)
        assert out["stop_kinds"] == {
            "completed": 3,
            "early_stopped": 1,
            "errored": 1,
            "unfinished": 1,
        }
        assert out["run"]["url"].endswith(f"/trials/runs/{night.run}")
    assert [r["changed_keys"] for r in runs] == [[], [], ["lr"], ["dropout", "layers"]]
    assert [r["picked_trial_id"] for r in runs] == [None, None, None, "n3-criterion"]
    assert runs[-1]["warm_started_from"] == {
        "experiment_run_id": nightly.nights[-2].run,
        "run_key": nightly.nights[-2].run_key,
        "url": f"/trials/runs/{nightly.nights[-2].run}",
    }
    last = history_dashboard.get(f"/api/experiments/{EXPERIMENT}/history?last=1").json()
    assert [r["run"]["run_key"] for r in last["runs"]] == [nightly.nights[-1].run_key]
    assert last["runs"][0]["previous_best_config"] == nightly.nights[-2].best_config
    assert history_dashboard.get(f"/api/experiments/{EXPERIMENT}/history?last=0").status_code == 422


def test_experiment_page_shows_the_history(history_dashboard, nightly):
    response = history_dashboard.get(f"/experiments/{EXPERIMENT}")
    assert response.status_code == 200, response.text
    page = response.text
    rows = re.findall(r'<tr class="history-row" data-run-key="([^"]+)"', page)
    assert rows == [n.run_key for n in reversed(nightly.nights)]  # newest first
    points = re.findall(r'<circle class="trend-point[^"]*" data-run="([^"]+)"', page)
    assert points == [n.run_key for n in nightly.nights]
    assert 'class="trend-point best" data-run="scheduled__2026-11-04"' in page
    changed = re.findall(r'<span class="config-key changed" data-key="([^"]+)"', page)
    assert sorted(changed) == ["dropout", "layers", "lr"]
    assert page.count('aria-label="changed">Δ</span>') == 3
    assert "(was 0.01)" in page and "(was 2)" in page
    warm_link = f'<a class="warm-link" href="/trials/runs/{nightly.nights[-2].run}">'
    assert warm_link in page
    assert "early-stopped 1" in page and "errored 1" in page and "unfinished 1" in page
    short = history_dashboard.get(f"/experiments/{EXPERIMENT}?last=2").text
    assert len(re.findall(r'<tr class="history-row"', short)) == 2


@pytest.mark.parametrize(
    "path", [f"/experiments/{EXPERIMENT}", f"/api/experiments/{EXPERIMENT}/history"]
)
def test_a_user_without_the_dag_gets_not_found(history_dashboard, path):
    response = history_dashboard.get(path, user="bob")
    assert response.status_code == 404
    assert "scheduled__" not in response.text and "n3-best" not in response.text
    assert history_dashboard.get(path, user=None).status_code == 401
    assert history_dashboard.get(path, user="alice").status_code == 200


def test_unknown_experiment_is_not_found(history_dashboard):
    assert history_dashboard.get("/api/experiments/nope/history").status_code == 404
    assert history_dashboard.get("/experiments/nope").status_code == 404


def test_changed_config_keys():
    assert changed_config_keys({"a": 1, "b": 2}, {"a": 1, "b": 3, "c": 0}) == ["b", "c"]
    assert changed_config_keys({"a": 1}, {}) == ["a"]
    assert changed_config_keys({"a": [1]}, {"a": [1]}) == []
