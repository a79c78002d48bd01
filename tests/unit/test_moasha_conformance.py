"""Our MOASHA decides as Syne Tune 0.16's MOASHA, result by result, over each place its rungs live.

The streams and Syne Tune's decisions are in fixtures/moasha_syne_tune_0_16.json, written by
bench/moasha_streams.py under a Python with Syne Tune 0.16 (kept out of this venv). Each is
replayed hook for hook through our MOASHA, its rungs in memory (the runner's) and in a trials DB
(SQLite, and PostgreSQL when AIRFLOW_TRIALS_TEST_POSTGRES_URL is set), and result by result
through the Airflow path's judges (one per trial, as each trial's trigger judges it).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from airflow_trials import MOASHA, Decision, Trial
from airflow_trials.schedulers.asha.stored_rungs import StoredVectorRungs
from airflow_trials.schedulers.moasha.moasha_judging import VectorRungJudge
from airflow_trials.schedulers.moasha.moasha_scheduler import MemoryVectorRungs, syne_tune_order
from airflow_trials.schedulers.registry import judge_for, judged_scheduler
from airflow_trials.store import TrialStore
from tests.contract.conftest import new_postgres_schema
from tests.contract.test_store import register
from tests.scheduler_writes import OneWriteEach, judge, judge_end

FIXTURE = json.loads(
    (Path(__file__).parent / "fixtures" / "moasha_syne_tune_0_16.json").read_text()
)
STREAMS = FIXTURE["streams"]
TIME_ATTR = FIXTURE["time_attr"]
IN_MEMORY, SQLITE, POSTGRESQL = "memory", "sqlite", "postgresql"


@contextmanager
def trials_store(backend: str, tmp_path_factory) -> Iterator[TrialStore]:
    """A new trials store on ``backend`` (SQLITE or POSTGRESQL)."""
    if backend == SQLITE:
        url = f"sqlite:///{tmp_path_factory.mktemp('moasha') / 'trials.db'}"
        trials = TrialStore(url, create=True)
        yield trials
        trials.dispose()
        return
    with new_postgres_schema("at_moasha") as url:
        trials = TrialStore(url, create=True)
        yield trials
        trials.dispose()


@pytest.fixture(scope="module", params=[IN_MEMORY, SQLITE, POSTGRESQL])
def store(request, tmp_path_factory):
    """None for rungs in memory; else a trials store whose runs hold the rungs."""
    if request.param == IN_MEMORY:
        yield None
        return
    with trials_store(request.param, tmp_path_factory) as trials:
        yield trials


@pytest.fixture(scope="module", params=[SQLITE, POSTGRESQL])
def trials_db(request, tmp_path_factory):
    """A trials store, for the Airflow path's judges."""
    with trials_store(request.param, tmp_path_factory) as trials:
        yield trials


def test_fixture_covers_the_rule():
    """The streams exercise what the rule depends on: stops at rungs and at max_t, brackets,
    ties, trials ending early and removed."""
    assert FIXTURE["syne_tune"] == "0.16.0"
    events = [e for s in STREAMS for e in s["events"]]
    decisions = [e[-1] for e in events if e[0] == "result"]
    assert 100 < decisions.count("STOP") < len(decisions) / 2
    assert any(e[0] == "remove" for e in events)
    assert {e[2] for e in events if e[0] == "add"} == {0, 1}
    assert {tuple(s["mode"]) for s in STREAMS} == {("max", "min"), ("min", "max")}
    vectors = [tuple(e[3]) for e in events if e[0] == "result"]
    assert len(set(vectors)) < len(vectors)  # equal vectors meet at rungs


@pytest.mark.parametrize("stream", STREAMS, ids=[f"seed{s['seed']}" for s in STREAMS])
def test_moasha_decides_as_syne_tune(stream, store):
    run = None if store is None else store.create_experiment_run("moasha", f"s{stream['seed']}")
    state = MemoryVectorRungs() if store is None else StoredVectorRungs(OneWriteEach(store), run)
    scheduler = MOASHA(
        metric=stream["metric"],
        mode=stream["mode"],
        time_attr=TIME_ATTR,
        rng=np.random.RandomState(stream["seed"]),
        state=state,
        **stream["settings"],
    )
    trials: dict[int, Trial] = {}
    last: dict[int, dict] = {}
    for step, event in enumerate(stream["events"]):
        kind, number = event[0], event[1]
        if kind == "add":
            trial_id = f"s{stream['seed']}-t{number}" if store is None else f"r{run}-t{number}"
            if store is not None:
                register(store, trial_id, run)
            trials[number] = Trial("tests.trainables:counting", trial_id=trial_id)
            scheduler.on_trial_add(trials[number])
            assert scheduler._trial_bracket[trial_id] == event[2], f"bracket of t{number}"
        elif kind == "result":
            _, _, time, values, expected = event
            last[number] = {TIME_ATTR: time, **dict(zip(stream["metric"], values, strict=True))}
            got = scheduler.on_trial_result(trials[number], dict(last[number]))
            assert got == Decision(expected), (
                f"step {step}: t{number} at {time} with {values}: Syne Tune says {expected}"
            )
            if got is Decision.STOP:
                assert scheduler.decision_reason(trials[number].trial_id).startswith(
                    "stopped by MOASHA"
                )
        elif kind == "complete":
            scheduler.on_trial_complete(trials[number], dict(last[number]))
        else:
            scheduler.on_trial_remove(trials[number])


@pytest.mark.parametrize("stream", STREAMS, ids=[f"seed{s['seed']}" for s in STREAMS])
def test_the_airflow_path_s_judges_decide_as_syne_tune(stream, trials_db):
    """Each trial judged by its own judge (its trigger's), from the settings a trial task is
    given (``judged_scheduler(...).to_dict()``), in the bracket Syne Tune drew; each result is
    judged again by a fresh judge (a triggerer restart) and gets the stored verdict."""
    store = trials_db
    run = store.create_experiment_run("moasha-airflow", f"s{stream['seed']}")
    scheduler = MOASHA(time_attr=TIME_ATTR, **stream["settings"])
    settings = judged_scheduler(scheduler, stream["metric"], stream["mode"]).to_dict()
    judges: dict[int, VectorRungJudge] = {}
    brackets: dict[int, int] = {}
    last: dict[int, dict] = {}

    def judge_of(number: int) -> VectorRungJudge:
        judge = judge_for(settings, brackets[number], run, f"r{run}-t{number}")
        assert isinstance(judge, VectorRungJudge)
        return judge

    for step, event in enumerate(stream["events"]):
        kind, number = event[0], event[1]
        if kind == "add":
            register(store, f"r{run}-t{number}", run)
            brackets[number] = event[2]
            judges[number] = judge_of(number)
        elif kind == "result":
            _, _, time, values, expected = event
            last[number] = {TIME_ATTR: time, **dict(zip(stream["metric"], values, strict=True))}
            judge(store, judges[number], [last[number]])
            verdict = judges[number].verdict_for(time)
            assert verdict.decision == Decision(expected), (
                f"step {step}: t{number} at {time} with {values}: Syne Tune says {expected}"
            )
            again = judge_of(number)
            judge(store, again, [last[number]])
            assert again.verdict_for(time) == verdict
        elif kind == "complete":
            judge_end(store, judges[number], last.get(number))


@pytest.mark.parametrize("case", FIXTURE["orders"], ids=[f"rows{i}" for i in range(60)])
def test_rung_ranking_is_syne_tunes(case):
    """The order a rung is ranked in, on wide fronts with ties (2 and 3 metrics), is the one Syne
    Tune 0.16's ``NonDominatedPriority()`` gives."""
    assert syne_tune_order(case["costs"]) == case["order"]
