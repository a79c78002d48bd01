"""Issue 48's "Done when": on one seeded run with one metric and one with two, the history, the
CLI, ResultGrid, the dashboard's API and select_best name the same best trial and the same front
(the trials that count: TERMINATED, feasible first, docs/store.md "Which trials count")."""

from __future__ import annotations

import datetime as dt
import json

import pytest
from typer.testing import CliRunner

from airflow_trials.core.goal import Goal
from airflow_trials.experiment.regression_check import run_front_points
from tests.contract.conftest import postgres_schema_url  # noqa: F401  (a fixture)
from tests.one_best_seed import (
    CONSTRAINTS,
    ONE_BEST,
    ONE_GOAL,
    RUN_KEY,
    TWO_BEST,
    TWO_FRONT,
    TWO_GOAL,
    seed_one,
    seed_two,
)

START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def trials_url(request, tmp_path, airflow_home, monkeypatch) -> str:
    if request.param == "postgresql":
        url = request.getfixturevalue("postgres_schema_url")
    else:
        url = f"sqlite:///{tmp_path / 'trials.db'}"
    monkeypatch.setenv("AIRFLOW_TRIALS_DB_URL", url)
    return url


def _select_best(experiment: str, goal: dict, suggested, constraints=None) -> dict:
    from collections import defaultdict
    from types import SimpleNamespace

    from airflow.sdk import DAG

    from airflow_trials import OptunaSearch
    from airflow_trials.core.search import uniform
    from airflow_trials.experiment import tuning_experiment
    from tests.airflow.conftest import FakeTI

    search = {"search_alg": OptunaSearch(constraints=constraints)} if constraints else {}
    with DAG(experiment, schedule=None, start_date=START) as dag:
        tuning_experiment(
            experiment_name=experiment,
            trainable="tests.trainables:counting",
            group_id="tune",
            search_space={"x": uniform(0.0, 1.0)},
            **goal,
            **search,
        )
    task = dag.get_task("tune.select_best")
    events = defaultdict(lambda: SimpleNamespace(extra=None))
    best = task.python_callable(suggested, ti=FakeTI(run_id="run1"), outlet_events=events)
    # The Asset event (the experiment's best trial) carries select_best's answer as it is.
    [event] = [e.extra for e in events.values()]
    assert event["trial_id"] == best["trial_id"]
    return best


def _cli_json(*args: str) -> dict:
    from airflow_trials.cli import app

    result = CliRunner().invoke(app, [*args, "--output", "json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def _history_best(url: str, experiment: str) -> str | None:
    [line] = _cli_json("history", experiment, "--db-url", url)["runs"]
    return line["best_trial_id"]


def _resumed_best(store, seeded, metric, mode, tmp_path) -> str | None:
    """The best a resumed sweep's driver starts its progress from (it named o-2, ERROR)."""
    from airflow_trials.execution.driver.sweep_driver import SweepSpec, resumable_trials
    from airflow_trials.storage.trial_storage import TrialStorage

    trials = [
        (r.trial_id, r.config) for r in store.reader.list_trials(experiment_run_id=seeded.run)
    ]
    spec = SweepSpec(
        experiment_name=seeded.experiment,
        run_key=RUN_KEY,
        experiment_run_id=seeded.run,
        trainable="tests.trainables:counting",
        trials=trials,
        metric=metric,
        mode=mode,
        db_url="unused",
        storage_path=None,
        namespace="ns",
    )
    best = resumable_trials(spec, store, TrialStorage(str(tmp_path / "results"))).best
    return None if best is None else best[1]


def _progress_best(store, seeded) -> list[str]:
    """The trials the main job's live table marks best (it marked none)."""
    from airflow_trials.cli.mainjob_cmd import _progress_table

    table = _progress_table(store.reader, seeded.experiment, RUN_KEY, "running")
    marks = table.columns[-1]._cells if len(table.columns) > 5 else [""] * table.row_count
    return [t for t, mark in zip(table.columns[0]._cells, marks, strict=True) if mark == "best"]


def _other_screens(store, seeded, metric, mode, tmp_path) -> dict:
    """The best as the board, the regression check (one metric: its value), warm start, the
    main job's report, the MLflow export (before select_best records its pick) and a resumed
    sweep's progress name it."""
    from airflow_trials.cli.mainjob_cmd import report_best
    from airflow_trials.experiment.regression_check import run_best_value
    from airflow_trials.experiment.warm_start_source import _pareto_ranked, _ranked
    from airflow_trials.export.mlflow import exported_best

    several = isinstance(metric, list)
    warm = (_pareto_ranked if several else _ranked)(store, seeded.run, metric, mode)
    board = store.reader.board(seeded.run, Goal.of(metric, mode))
    run = store.reader.resolve_run(seeded.experiment)
    return {
        "board": board.best_trial_id,
        "regression": None if several else run_best_value(store, seeded.run, metric, mode),
        "warm": warm[0].trial_id,
        "report": report_best(store.reader, seeded.experiment, seeded.run),
        "export": exported_best(
            run, store.reader.board(seeded.run, store.reader.get_experiment(seeded.experiment).goal)
        ),
        "resume": _resumed_best(store, seeded, metric, mode, tmp_path),
        "progress": _progress_best(store, seeded),
    }


def test_every_screen_names_the_same_best_trial_of_one_metric(trials_url, make_dashboard, tmp_path):
    from airflow_trials.results import ResultGrid
    from airflow_trials.store import TrialStore

    store = TrialStore(trials_url, create=True)
    try:
        seeded = seed_one(store)
        history_live = store.reader.experiment_history(seeded.experiment).runs[-1].best_trial_id
        others = _other_screens(store, seeded, "loss", "min", tmp_path)
        best = _select_best(seeded.experiment, ONE_GOAL, seeded.suggested, CONSTRAINTS)
        # select_best hands on the value and checkpoint of the result it judged feasible.
        assert best["trial_id"] == ONE_BEST and best["feasible"] is True
        assert best["value"] == 0.3 and best["best_checkpoint"] == f"/ckpt/{ONE_BEST}/1"
        board = make_dashboard(store).get(f"/api/runs/{seeded.run}/leaderboard").json()
        grid = ResultGrid.from_db(seeded.experiment, db_url=trials_url, constraints=CONSTRAINTS)
        rows = {r.trial_id: r for r in store.reader.leaderboard(seeded.run, "loss", "min")}
        history_ended = _history_best(trials_url, seeded.experiment)
        cli = _cli_json("leaderboard", seeded.experiment, "--db-url", trials_url, "--limit", "1")
    finally:
        store.dispose()
    # The regression check, warm start, the sweep's lineage, the main job's report, the export.
    assert others == {
        "board": ONE_BEST,
        "regression": 0.3,
        "warm": ONE_BEST,
        "report": ONE_BEST,
        "export": ONE_BEST,
        "resume": ONE_BEST,
        "progress": [ONE_BEST],
    }
    # The CLI names the board's best and front, whatever its limit shows (o-2, ERROR, is first).
    assert (cli["best_trial_id"], cli["front_trial_ids"]) == (ONE_BEST, [ONE_BEST])
    assert [r["trial_id"] for r in cli["rows"]] == ["o-2"]
    assert history_live == history_ended == ONE_BEST
    assert board["best_trial_id"] == ONE_BEST
    grid_best = grid.get_best_result(scope="all", terminated_only=True)
    assert (grid_best.trial_id, grid_best.best_checkpoint) == (ONE_BEST, best["best_checkpoint"])
    # o-0's best loss (0.1, iteration 2) breaks the constraint: it is judged on that result.
    assert rows["o-0"].best_value == 0.1 and rows["o-0"].feasible is False


def test_every_screen_names_the_same_best_trial_and_front_of_two_metrics(
    trials_url, make_dashboard, tmp_path
):
    from airflow_trials.results import ResultGrid
    from airflow_trials.store import TrialStore

    store = TrialStore(trials_url, create=True)
    try:
        seeded = seed_two(store)
        history_live = store.reader.experiment_history(seeded.experiment).runs[-1].best_trial_id
        others = _other_screens(store, seeded, TWO_GOAL["metric"], TWO_GOAL["mode"], tmp_path)
        best = _select_best(seeded.experiment, TWO_GOAL, seeded.suggested)
        board = make_dashboard(store).get(f"/api/runs/{seeded.run}/leaderboard").json()
        grid = ResultGrid.from_db(seeded.experiment, db_url=trials_url)
        history_ended = _history_best(trials_url, seeded.experiment)
        cli = _cli_json("leaderboard", seeded.experiment, "--db-url", trials_url, "--limit", "1")
        front_points = sorted(run_front_points(store, seeded.run, *TWO_GOAL.values()))
        ranked = store.reader.board(seeded.run, Goal.of(*TWO_GOAL.values()))
    finally:
        store.dispose()
    assert others == {
        "board": TWO_BEST,
        "regression": None,
        "warm": TWO_BEST,
        "report": TWO_BEST,
        "export": TWO_BEST,
        "resume": TWO_BEST,
        "progress": [TWO_BEST],
    }
    assert ranked.front_trial_ids == TWO_FRONT
    # The regression check's points are the counted trials' only (q-3 ended in ERROR).
    counted = sorted([*r.values.values()] for r in ranked.rows if r.counted)
    assert front_points == counted and len(counted) < len(ranked.rows)
    assert best["trial_id"] == TWO_BEST
    assert sorted(e["trial_id"] for e in best["pareto_front"]) == TWO_FRONT
    assert history_live == history_ended == TWO_BEST
    # The dashboard's API named no best with several metrics (null); it names the board's.
    assert (board["front_trial_ids"], board["best_trial_id"]) == (TWO_FRONT, TWO_BEST)
    assert (cli["front_trial_ids"], cli["best_trial_id"]) == (TWO_FRONT, TWO_BEST)
    assert sorted(r.trial_id for r in grid.get_pareto_front()) == TWO_FRONT
    ranks = grid.get_dataframe().set_index("trial_id")["pareto_rank"]
    assert sorted(t for t, rank in ranks.dropna().items() if rank == 0) == TWO_FRONT


def test_the_trial_page_hands_on_the_board_s_checkpoint_of_two_metrics(trials_url, make_dashboard):
    """With several metrics the board (and select_best) hands on a trial's newest kept checkpoint;
    the dashboard's trial API named the first metric's best one instead."""
    from airflow_trials.core.status import TrialStatus
    from airflow_trials.store import TrialStore
    from tests.one_best_seed import seed_run

    runs = {
        "c-0": (
            TrialStatus.TERMINATED,
            [{"val_acc": 0.9, "latency": 10.0}, {"val_acc": 0.5, "latency": 10.0}],
        )
    }
    store = TrialStore(trials_url, create=True)
    try:
        seeded = seed_run(store, "two_ckpt", TWO_GOAL, runs)
        [row] = store.reader.board(seeded.run, Goal.of(*TWO_GOAL.values())).rows
        trial = make_dashboard(store).get("/api/trials/c-0").json()
    finally:
        store.dispose()
    assert row.best_checkpoint == "/ckpt/c-0/2"
    assert trial["best_checkpoint"]["path"] == row.best_checkpoint


def test_the_parallel_coordinates_emphasise_only_trials_that_count(trials_url, make_dashboard):
    """The coordinates' top trials are the board's counted ones: they emphasised o-2 (ERROR)
    and o-3 (RUNNING) too, whose losses beat every TERMINATED trial's."""
    from airflow_trials.store import TrialStore

    store = TrialStore(trials_url, create=True)
    try:
        seeded = seed_one(store)
        body = make_dashboard(store).get(f"/api/runs/{seeded.run}/coordinates").json()
        board = store.reader.board(seeded.run, Goal.of("loss", "min"))
    finally:
        store.dispose()
    assert [(t["trial_id"], t["rank"]) for t in body["trials"]] == [
        (r.trial_id, r.rank) for r in board.rows
    ]
    assert sorted(t["trial_id"] for t in body["trials"] if t["top"]) == ["o-0", "o-1", "o-4"]


def test_the_leaderboard_json_reads_the_board_once_whatever_its_limit(trials_url, monkeypatch):
    """With --limit, `leaderboard -o json` read the run's leaderboard twice: the rows shown,
    then the whole board for its best and front."""
    from airflow_trials.store import TrialStore
    from airflow_trials.store.ranking_reads import RankingReads

    store = TrialStore(trials_url, create=True)
    try:
        seeded = seed_one(store)
    finally:
        store.dispose()
    reads = []
    leaderboard = RankingReads.leaderboard

    def counted(self, *args, **kwargs):
        reads.append(args)
        return leaderboard(self, *args, **kwargs)

    monkeypatch.setattr(RankingReads, "leaderboard", counted)
    cli = _cli_json("leaderboard", seeded.experiment, "--db-url", trials_url, "--limit", "2")
    assert len(reads) == 1
    assert (cli["best_trial_id"], cli["front_trial_ids"]) == (ONE_BEST, [ONE_BEST])
    assert [r["trial_id"] for r in cli["rows"]] == ["o-2", "o-3"]


def test_the_live_table_shows_the_board_s_best_value(trials_url):
    """The main job's live table marked the board's best, but its best value was any trial's:
    o-2's 0.05 (ERROR) is the lowest loss shown. Its caption gives the board's best and value."""
    from airflow_trials.cli.mainjob_cmd import _progress_table
    from airflow_trials.store import TrialStore

    store = TrialStore(trials_url, create=True)
    try:
        one = _progress_table(store.reader, seed_one(store).experiment, RUN_KEY, "running")
        two = _progress_table(store.reader, seed_two(store).experiment, RUN_KEY, "running")
    finally:
        store.dispose()
    assert one.caption == f"best: {ONE_BEST}, loss 0.3"
    assert [c.header for c in one.columns][3] == "loss"  # each trial's own best so far
    assert two.caption == f"best: {TWO_BEST}, val_acc 0.9, latency 30"


def test_the_live_table_before_the_first_task_recorded_the_experiment(trials_url):
    """The main job draws its live table from the moment it triggers the DAG run; it read the
    experiment's goal first and died (ExperimentNotFoundError) before the first task recorded
    the experiment. It shows an empty table until then."""
    from airflow_trials.cli.mainjob_cmd import _progress_table
    from airflow_trials.store import TrialStore

    store = TrialStore(trials_url, create=True)
    try:
        table = _progress_table(store.reader, "not_recorded_yet", RUN_KEY, None)
    finally:
        store.dispose()
    assert table.row_count == 0
    assert [c.header for c in table.columns][:4] == ["trial", "status", "iterations", "best"]
