"""ResultGrid with several metrics, on a real SQLite trials DB: the Pareto front, the dataframe's
pareto_rank, get_best_result's refusal, and an experiment that records several metrics."""

from __future__ import annotations

import itertools

import pytest
from sqlalchemy import update

from airflow_trials import ResultGrid, TrialStatus
from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import after_failure
from airflow_trials.core.pareto import encode_metrics
from airflow_trials.results import TrialResult
from airflow_trials.store import TrialStore
from airflow_trials.store.models import ExperimentRow
from tests.factories import add_checkpoint, add_results

EXPERIMENT = "two-goals"
METRICS, MODES = ["val_acc", "latency"], ["max", "min"]

# trial id -> (val_acc, latency) of its last result; None: not reported
LAST = {
    "a": (0.90, 30.0),  # front: the most accurate
    "b": (0.80, 10.0),  # front: the fastest
    "c": (0.85, 20.0),  # front: between them
    "d": (0.80, 25.0),  # rank 1: b is as accurate and faster
    "e": (0.70, 40.0),  # rank 2: dominated by d (and all of the front)
    "f": (0.85, 20.0),  # front: equal to c, so neither dominates the other
    "g": (0.95, None),  # no latency: no rank
    "h": (float("nan"), 5.0),  # NaN: stored as missing, no rank
}
FRONT = ["a", "b", "c", "f"]


@pytest.fixture
def store(tmp_path):
    trial_store = TrialStore(f"sqlite:///{tmp_path / 'trials.db'}", create=True)
    yield trial_store
    trial_store.dispose()


def record_metrics(store, name, metric, mode):
    """What a writer of several metrics stores (core/pareto.py encode_metrics) in the
    experiment's columns; nothing in the package writes several yet."""
    stored_metric, stored_mode = encode_metrics(metric, mode)
    with store._engine.begin() as connection:
        connection.execute(
            update(ExperimentRow)
            .where(ExperimentRow.name == name)
            .values(metric=stored_metric, mode=stored_mode)
        )


def add_trial(store, run, trial_id, values, status=TrialStatus.TERMINATED, checkpoints=()):
    """A trial whose first result is worse on both metrics and whose last has ``values``."""
    store.upsert_trial(
        trial_id,
        trainable="pkg.mod:fn",
        config={"width": len(trial_id)},
        resources={"cpu": 1},
        max_failures=0,
        experiment_run_id=run,
    )
    last = {m: v for m, v in zip(METRICS, values, strict=True) if v is not None}
    add_results(
        store,
        trial_id,
        [
            {"training_iteration": 1, "val_acc": 0.1, "latency": 99.0, "aux": 1},
            {"training_iteration": 2, **last, "aux": 2},
        ],
    )
    for iteration in checkpoints:
        add_checkpoint(store, trial_id, f"/ckpt/{trial_id}/{iteration}", iteration)
    if status is not TrialStatus.PENDING:
        decision = None if status is TrialStatus.TERMINATED else after_failure(trial_id, 0, 0)
        store.record_end(TrialEnd(trial_id, EXPERIMENT, status, error=None), decision)


@pytest.fixture
def run(store):
    """A run of an experiment that records val_acc (max) and latency (min)."""
    store.ensure_experiment(EXPERIMENT)
    record_metrics(store, EXPERIMENT, METRICS, MODES)
    run = store.create_experiment_run(EXPERIMENT, "night-1")
    for trial_id, values in LAST.items():
        add_trial(store, run, trial_id, values, checkpoints=[1, 2])
    return run


def _dominates(a, b):
    signs = [1 if m == "max" else -1 for m in MODES]
    better_or_equal = all(s * x >= s * y for s, x, y in zip(signs, a, b, strict=True))
    return better_or_equal and a != b


def test_the_front_is_the_trials_no_other_beats_on_every_metric(store, run):
    grid = ResultGrid.from_db(EXPERIMENT, store=store)
    assert (grid.metric, grid.mode) == (METRICS, MODES)
    front = grid.get_pareto_front()  # the experiment's metrics and modes
    assert [r.trial_id for r in front] == FRONT  # by trial id
    # the definition, checked pairwise over the trials that reported both metrics
    reported = {k: v for k, v in LAST.items() if None not in v and v[0] == v[0]}
    assert sorted(FRONT) == sorted(
        k for k, v in reported.items() if not any(_dominates(o, v) for o in reported.values())
    )
    assert front[0].metrics["val_acc"] == 0.90 and front[0].config == {"width": 1}
    assert [r.trial_id for r in grid.get_pareto_front(METRICS, MODES)] == FRONT
    # other modes, other front: the least accurate and the fastest
    slow = grid.get_pareto_front(["val_acc", "latency"], ["min", "min"])
    assert [r.trial_id for r in slow] == ["b", "e"]


def test_an_experiment_with_one_metric_reads_as_before_and_takes_lists_when_given(store):
    store.ensure_experiment("one", metric="val_acc", mode="max")
    run = store.create_experiment_run("one", "r")
    for trial_id, values in LAST.items():
        add_trial(store, run, trial_id, values, checkpoints=[1, 2])
    grid = ResultGrid.from_db("one", store=store)
    assert (grid.metric, grid.mode) == ("val_acc", "max")
    assert grid.get_best_result().trial_id == "g"  # one metric: g's missing latency is no matter
    assert "pareto_rank" not in grid.get_dataframe().columns
    with pytest.raises(
        ValueError,
        match=r"get_pareto_front: experiment one records one metric, 'val_acc'; pass the metrics "
        r"and their modes as lists",
    ):
        grid.get_pareto_front()
    assert [r.trial_id for r in grid.get_pareto_front(METRICS, MODES)] == FRONT
    # the best checkpoint is still the best by the one metric: iteration 2 scored 0.9 > 0.1
    assert grid[0].best_checkpoint == "/ckpt/a/2"


def test_several_metrics_keep_the_newest_checkpoint_as_best_as_without_a_metric(store, run):
    """No one score ranks a trial's checkpoints: its best is its newest kept, not the one that
    scored best on the first metric."""
    store.upsert_trial(
        "k",
        trainable="pkg.mod:fn",
        config={},
        resources={"cpu": 1},
        max_failures=0,
        experiment_run_id=run,
    )
    add_results(
        store,
        "k",
        [
            {"training_iteration": 1, "val_acc": 0.99, "latency": 1.0},
            {"training_iteration": 2, "val_acc": 0.5, "latency": 50.0},
        ],
    )
    for iteration in (1, 2):
        add_checkpoint(store, "k", f"/ckpt/k/{iteration}", iteration)
    k = ResultGrid.from_db(EXPERIMENT, store=store)[-1]
    assert (k.trial_id, k.best_checkpoint, k.latest_checkpoint) == ("k", "/ckpt/k/2", "/ckpt/k/2")


def test_the_front_is_of_the_terminated_trials_unless_asked_for_every_status(store, run):
    add_trial(store, run, "i", (0.99, 1.0), status=TrialStatus.ERROR)  # dominates every trial
    add_trial(store, run, "j", (0.99, 1.0), status=TrialStatus.PENDING)
    grid = ResultGrid.from_db(EXPERIMENT, store=store)
    # The rule every front follows (docs/store.md "Which trials count"), as select_best's.
    assert [r.trial_id for r in grid.get_pareto_front()] == FRONT
    assert [r.trial_id for r in grid.get_pareto_front(terminated_only=False)] == ["i", "j"]
    ranks = grid.get_dataframe().set_index("trial_id")["pareto_rank"]
    assert ranks.isna()["i"] and ranks.isna()["j"]


def test_the_dataframe_ranks_every_trial_by_its_last_result(store, run):
    grid = ResultGrid.from_db(EXPERIMENT, store=store)
    frame = grid.get_dataframe()
    ranks = dict(zip(frame["trial_id"], frame["pareto_rank"], strict=True))
    assert {k: v for k, v in ranks.items() if v is not pd_na()} == {
        "a": 0,
        "b": 0,
        "c": 0,
        "d": 1,
        "e": 2,
        "f": 0,
    }
    assert ranks["g"] is pd_na() and ranks["h"] is pd_na()
    assert str(frame["pareto_rank"].dtype) == "Int64"
    assert list(frame.loc[frame["pareto_rank"] == 0, "trial_id"]) == [
        r.trial_id for r in grid.get_pareto_front()
    ]
    # given metrics: any experiment, any metrics; ranked on the rows shown
    by_aux = grid.get_dataframe(pareto_metric=["aux", "latency"], pareto_mode=["max", "min"])
    aux_ranks = dict(zip(by_aux["trial_id"], by_aux["pareto_rank"], strict=True))
    # aux ties at 2: latency decides, and h's NaN accuracy is no matter here
    assert {k: v for k, v in aux_ranks.items() if v is not pd_na()} == {
        "h": 0,
        "b": 1,
        "c": 2,
        "f": 2,
        "d": 3,
        "a": 4,
        "e": 5,
    }
    best_rows = grid.get_dataframe("latency", "max", pareto_metric=METRICS, pareto_mode=MODES)
    assert set(best_rows["latency"].dropna()) == {99.0}  # each trial's slowest result...
    assert set(best_rows["pareto_rank"].dropna()) == {0}  # ...all equal, all on the front
    with pytest.raises(ValueError, match="pareto_metric and pareto_mode together"):
        grid.get_dataframe(pareto_metric=METRICS)
    with pytest.raises(ValueError, match=r"get_dataframe: metric=\['val_acc', 'latency'\] has 2"):
        grid.get_dataframe(pareto_metric=METRICS, pareto_mode=["max"])


def pd_na():
    import pandas as pd

    return pd.NA


def test_get_best_result_of_several_points_to_the_front(store, run):
    grid = ResultGrid.from_db(EXPERIMENT, store=store)
    with pytest.raises(
        ValueError,
        match=r"no single best trial of several \(the given \['val_acc', 'latency'\]\): use "
        r"get_pareto_front\(\)",
    ):
        grid.get_best_result(METRICS, MODES)
    with pytest.raises(
        ValueError, match=r"the experiment two-goals's \['val_acc', 'latency'\]\): use get_pareto"
    ):
        grid.get_best_result()
    # one of the experiment's metrics alone is ranked in its recorded mode
    assert grid.get_best_result("latency").trial_id == "h"  # h's NaN accuracy is not in the way
    assert grid.get_best_result("val_acc").trial_id == "g"
    assert grid.get_best_result("val_acc", "min").trial_id == "e"
    assert grid.get_best_result("latency", scope="all").trial_id == "h"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"metric": "val_acc", "mode": "max"},
            r"get_pareto_front: metric='val_acc' is one metric; pass several as a list",
        ),
        (
            {"metric": METRICS, "mode": ["max"]},
            r"get_pareto_front: metric=\['val_acc', 'latency'\] has 2 metrics but mode=\['max'\] "
            r"has 1 modes",
        ),
        ({"metric": ["val_acc", "aux"]}, r"is a list but mode=None is not"),
        ({"metric": METRICS, "mode": ["max", "fast"]}, r"mode 'fast'; each mode must be"),
        (
            {"scope": "all"},
            r"compares each trial's last result \(scope='last'\), got scope='all'.*"
            r"get_best_result\(metric=\.\.\., scope='all'\)",
        ),
        (
            {"metric": ["val_acc", "los"], "mode": ["max", "min"]},
            r"reported every one of metrics \['val_acc', 'los'\] as a finite number; its trials "
            r"report aux, latency, val_acc\. Pass metric= with a list of them",
        ),
    ],
)
def test_bad_arguments_and_unreported_metrics_are_refused_naming_the_fix(
    store, run, kwargs, message
):
    with pytest.raises(ValueError, match=message):
        ResultGrid.from_db(EXPERIMENT, store=store).get_pareto_front(**kwargs)


def test_terminated_only_names_the_statuses_when_none_that_reported_ended_terminated(store):
    store.ensure_experiment(EXPERIMENT)
    run = store.create_experiment_run(EXPERIMENT, "night-2")
    add_trial(store, run, "x", (0.5, 1.0), status=TrialStatus.ERROR)
    add_trial(store, run, "y", (0.6, 2.0), status=TrialStatus.PENDING)
    grid = ResultGrid.from_db(EXPERIMENT, store=store)
    assert [r.trial_id for r in grid.get_pareto_front(METRICS, MODES, terminated_only=False)] == [
        "x",
        "y",
    ]
    with pytest.raises(
        ValueError,
        match=r"that reported metrics \['val_acc', 'latency'\] ended TERMINATED \(1 ERROR, "
        r"1 PENDING\); pass terminated_only=False",
    ):
        grid.get_pareto_front(METRICS, MODES)


def test_infinities_are_compared_only_when_not_filtered(store, run):
    """The trials DB stores NaN and infinities as missing values, so a grid read from it has
    none; a grid of results in memory may."""
    grid = ResultGrid.from_db(EXPERIMENT, store=store)
    results = [
        TrialResult(tid, TrialStatus.TERMINATED, {}, metrics, None, None, None, 0, _store=None)
        for tid, metrics in [
            ("p", {"val_acc": 0.99, "latency": float("inf")}),  # most accurate, endlessly slow
            ("q", {"val_acc": 0.5, "latency": 1.0}),
            ("r", {"val_acc": 0.4, "latency": 2.0}),
        ]
    ]
    memory = ResultGrid(grid._store, grid.run, METRICS, MODES, results)
    assert [r.trial_id for r in memory.get_pareto_front()] == ["q"]
    assert [r.trial_id for r in memory.get_pareto_front(filter_nan_and_inf=False)] == ["p", "q"]


def test_many_trials_match_the_pairwise_definition(store):
    """A bigger run with ties: the front is every trial no other dominates."""
    store.ensure_experiment(EXPERIMENT)
    record_metrics(store, EXPERIMENT, METRICS, MODES)
    run = store.create_experiment_run(EXPERIMENT, "big")
    values = {
        f"t{i:03d}": (acc / 4, float(lat))
        for i, (acc, lat) in enumerate(itertools.product(range(5), range(6)))
        if (acc * 7 + lat * 3) % 4  # drop some, so the front is not one corner
    }
    for trial_id, value in values.items():
        add_trial(store, run, trial_id, value)
    front = [r.trial_id for r in ResultGrid.from_db(EXPERIMENT, store=store).get_pareto_front()]
    expected = sorted(
        k for k, v in values.items() if not any(_dominates(o, v) for o in values.values())
    )
    assert front == expected and len(expected) >= 2
