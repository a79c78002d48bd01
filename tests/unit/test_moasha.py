"""MOASHA's settings, hooks, reasons and stored verdicts (its decisions against Syne Tune's are in
test_moasha_conformance.py)."""

from __future__ import annotations

import math

import pytest

from airflow_trials import MOASHA, ASHAScheduler, Decision, OptunaSearch, Trial
from airflow_trials.core.search import uniform
from airflow_trials.core.searcher import agree_on_metric
from airflow_trials.schedulers.asha.asha_rungs import AshaRungs
from airflow_trials.schedulers.asha.stored_rungs import StoredVectorRungs
from airflow_trials.schedulers.moasha.moasha_judging import VectorRungJudge
from airflow_trials.schedulers.moasha.moasha_scheduler import (
    MemoryVectorRungs,
    MOASHARungs,
    moasha_rung_decision,
)
from airflow_trials.schedulers.registry import judge_for, judged_from_dict, judged_scheduler
from airflow_trials.schedulers.trial_judge import MissingSchedulerKey
from airflow_trials.store import TrialStore
from tests.contract.test_store import register
from tests.scheduler_writes import OneWriteEach, judge, judge_end

METRIC, MODE = ["acc", "loss"], ["max", "min"]


def trial(name: str) -> Trial:
    return Trial("tests.trainables:counting", trial_id=name)


def result(iteration: float, acc: float, loss: float) -> dict[str, float]:
    return {"training_iteration": iteration, "acc": acc, "loss": loss}


def test_moasha_refuses_a_single_metric_naming_asha():
    with pytest.raises(ValueError, match=r"several metrics, got metric='loss'.*ASHAScheduler"):
        MOASHA(metric="loss", mode="min")
    with pytest.raises(ValueError, match=r"one metric; use ASHAScheduler\(metric='loss'"):
        MOASHA(metric=["loss"], mode=["min"])


def test_moasha_refuses_modes_that_do_not_match_the_metrics():
    with pytest.raises(ValueError, match=r"has 2 metrics but mode=\['max'\] has 1 modes"):
        MOASHA(metric=METRIC, mode=["max"])
    with pytest.raises(ValueError, match=r"mode='max' is not; give mode as a list of 2"):
        MOASHA(metric=METRIC, mode="max")
    with pytest.raises(ValueError, match=r"gives metric 'loss' the mode 'low'"):
        MOASHA(metric=METRIC, mode=["max", "low"])


def test_moasha_refuses_settings_asha_refuses():
    with pytest.raises(ValueError, match=r"MOASHA got reduction_factor=1"):
        MOASHA(metric=METRIC, mode=MODE, reduction_factor=1)
    with pytest.raises(ValueError, match=r"MOASHA got grace_period=5 > max_t=3"):
        MOASHA(metric=METRIC, mode=MODE, max_t=3, grace_period=5)


def test_moasha_takes_its_metrics_late_and_refuses_trials_without_them():
    scheduler = MOASHA()
    with pytest.raises(ValueError, match=r"no metrics.*set_search_properties"):
        scheduler.on_trial_add(trial("t1"))
    assert scheduler.set_search_properties(METRIC, MODE)
    assert not scheduler.set_search_properties(["x", "y"], ["min", "min"])
    scheduler.on_trial_add(trial("t1"))
    assert scheduler.on_trial_result(trial("t1"), result(1, 0.5, 1.0)) is Decision.CONTINUE


def test_moasha_names_a_missing_metric_and_an_unknown_trial():
    scheduler = MOASHA(metric=METRIC, mode=MODE)
    with pytest.raises(ValueError, match=r"trial t9, which it was never given"):
        scheduler.on_trial_result(trial("t9"), result(1, 0.5, 1.0))
    scheduler.on_trial_add(trial("t1"))
    with pytest.raises(ValueError, match=r"without 'loss'.*\(the result has: acc, "):
        scheduler.on_trial_result(trial("t1"), {"training_iteration": 1, "acc": 0.5})
    with pytest.raises(ValueError, match=r"reported acc='high', but MOASHA needs a number"):
        scheduler.on_trial_result(trial("t1"), {"training_iteration": 1, "acc": "high", "loss": 1})


def test_moasha_stops_a_dominated_trial_at_its_rung_and_any_trial_at_max_t():
    scheduler = MOASHA(metric=METRIC, mode=MODE, max_t=9, grace_period=1, reduction_factor=3)
    for name in ("good", "bad"):
        scheduler.on_trial_add(trial(name))
    assert scheduler.on_trial_result(trial("good"), result(1, 0.8, 0.2)) is Decision.CONTINUE
    assert scheduler.on_trial_result(trial("bad"), result(1, 0.6, 0.5)) is Decision.STOP
    assert scheduler.decision_reason("bad") == (
        "stopped by MOASHA at training_iteration=1 (rung 1 of 3): acc 0.6, loss 0.5; its rank "
        "score among the rung's 2 trials (Syne Tune 0.16's non-dominated sort) is 0.5, above 1/3"
    )
    # Between rungs nothing is judged; at max_t the trial stops.
    assert scheduler.on_trial_result(trial("good"), result(2, 0.1, 9.0)) is Decision.CONTINUE
    assert scheduler.on_trial_result(trial("good"), result(9, 0.9, 0.1)) is Decision.STOP
    assert scheduler.decision_reason("good") == (
        "stopped by MOASHA at training_iteration=9: it reached max_t=9"
    )
    assert scheduler.decision_reason("never") is None


def test_moasha_keeps_syne_tunes_rank_score_which_can_stop_a_dominating_trial():
    # Syne Tune 0.16 reads the list of row indices its non-dominated sort returns as if it were
    # each row's priority: the new trial's "rank" is the index of the row listed last, over the
    # count. Here the 4th trial dominates the three before it, yet stops, as in Syne Tune
    # (fronts [3], [0, 1], [2]: the list is 3, 0, 1, 2 and its last entry, 2, over 4 is 1/2).
    before = [(3.0, 3.0), (2.0, 4.0), (5.0, 5.0)]
    verdict = moasha_rung_decision(before, (0.0, 0.0), 3, ["min", "min"])
    assert (verdict.decision, verdict.cutoff) == (Decision.STOP, 0.5)
    # The first trial at a rung always goes on; with 2 trials, a non-dominated newcomer goes on
    # when it is the better on the first metric.
    assert moasha_rung_decision([], (9.0, 9.0), 3, ["min", "min"]).decision is Decision.CONTINUE
    assert moasha_rung_decision([(2.0, 1.0)], (1.0, 2.0), 3, ["min", "min"]).decision is (
        Decision.CONTINUE
    )
    assert moasha_rung_decision([(1.0, 2.0)], (2.0, 1.0), 3, ["min", "min"]).decision is (
        Decision.STOP
    )


def test_moasha_records_a_trials_last_result_at_a_rung_it_skipped():
    # t1 jumps from iteration 1 to 5, past rung 3: its end is recorded at rung 3, where t2 is then
    # compared with it.
    state = MemoryVectorRungs()
    scheduler = MOASHA(metric=METRIC, mode=MODE, max_t=9, reduction_factor=3, state=state)
    for name in ("t1", "t2"):
        scheduler.on_trial_add(trial(name))
    scheduler.on_trial_result(trial("t1"), result(1, 0.9, 0.1))
    scheduler.on_trial_result(trial("t1"), result(5, 0.9, 0.1))
    assert state.rung_vectors(0, 3) == [(0.9, 0.1)]
    scheduler.on_trial_complete(trial("t1"), result(5, 0.9, 0.1))
    scheduler.on_trial_remove(trial("t1"))
    assert state.rung_vectors(0, 3) == [(0.9, 0.1)]
    assert scheduler.on_trial_result(trial("t2"), result(1, 0.5, 0.5)) is Decision.STOP
    assert state.rung_vectors(0, 1) == [(0.9, 0.1), (0.5, 0.5)]


def test_moasha_rule_round_trips_through_plain_settings():
    rule = MOASHA(metric=METRIC, mode=MODE, max_t=27, brackets=2).rule()
    assert rule.to_dict() == {
        "rule": "moasha",
        "metric": METRIC,
        "mode": MODE,
        "time_attr": "training_iteration",
        "max_t": 27,
        "grace_period": 1,
        "reduction_factor": 3,
        "brackets": 2,
    }
    assert judged_from_dict(rule.to_dict()) == rule
    assert rule.milestones(1) == (27, 9, 3)
    assert rule.hold_spec(0) == {"time_attr": "training_iteration", "points": [1, 3, 9, 27]}
    with pytest.raises(ValueError, match=r"Bracket 2 is not one of MOASHA's 2"):
        rule.milestones(2)


def test_moasha_takes_the_metrics_of_a_searcher_of_several_and_refuses_others():
    searcher = OptunaSearch({"x": uniform(0, 1)}, metric=METRIC, mode=MODE)
    scheduler = MOASHA()
    agree_on_metric(scheduler, searcher)
    assert (scheduler.metric, scheduler.mode) == (METRIC, MODE)
    agree_on_metric(MOASHA(metric=METRIC, mode=MODE), searcher)
    with pytest.raises(ValueError, match=r"judges trials by \['loss', 'acc'\].*same order"):
        agree_on_metric(MOASHA(metric=["loss", "acc"], mode=["min", "max"]), searcher)
    with pytest.raises(ValueError, match=r"MOASHA judges trials by several metrics"):
        agree_on_metric(MOASHA(), OptunaSearch({"x": uniform(0, 1)}, metric="loss", mode="min"))


def test_stored_moasha_rungs_judge_each_result_once(tmp_path):
    store = TrialStore(f"sqlite:///{tmp_path / 'trials.db'}", create=True)
    try:
        run = store.create_experiment_run("moasha", "r1")
        for name in ("t1", "t2"):
            register(store, name, run)
        rule = MOASHA(metric=METRIC, mode=MODE, max_t=9).rule()
        state = StoredVectorRungs(OneWriteEach(store), run)
        judge = dict(bracket=0, time=1, iteration=1)
        assert rule.judge(state, "t1", values=(math.nan, 0.1), **judge) == (
            Decision.CONTINUE,
            None,
        )
        stopped = rule.judge(state, "t2", values=(0.5, 0.5), **judge)
        assert stopped[0] is Decision.STOP
        # A restarted trigger judging t2's result again gets the stored verdict, not a new one
        # (t2 alone at the rung would have gone on), and writes no second row.
        again = StoredVectorRungs(OneWriteEach(store), run)
        assert rule.judge(again, "t2", values=(0.9, 0.0), **judge) == stopped
        vectors = store.reader.rung_vectors(run, 0, 1)
        assert len(vectors) == 2 and math.isnan(vectors[0][0])
        assert vectors[0][1:] == (0.1,) and vectors[1] == (0.5, 0.5)
        assert [r.decision for r in store.reader.trial_rungs("t2")] == [Decision.STOP]
    finally:
        store.dispose()


def test_the_airflow_path_takes_moasha_with_the_experiment_s_metrics():
    expected = MOASHARungs(metric=METRIC, mode=MODE, max_t=9)
    # Without metrics of its own it takes the experiment's; with the same ones it keeps them; a
    # trial task given MOASHA without an experiment (RunTrialOperator) takes its own.
    assert judged_scheduler(MOASHA(max_t=9), METRIC, MODE) == expected
    assert judged_scheduler(MOASHA(metric=METRIC, mode=MODE, max_t=9), METRIC, MODE) == expected
    assert judged_scheduler(MOASHA(metric=METRIC, mode=MODE, max_t=9)) == expected
    # What a trial task and its trigger are given reads back as the same rule, told apart from
    # ASHA's settings (which carry no rule key).
    assert judged_from_dict(expected.to_dict()) == expected
    asha = judged_scheduler(ASHAScheduler(metric="acc", mode="max"))
    assert isinstance(judged_from_dict(asha.to_dict()), AshaRungs)
    with pytest.raises(ValueError, match=r"rule='hyperband', which is not a rule the Airflow"):
        judged_from_dict({**expected.to_dict(), "rule": "hyperband"})


@pytest.mark.parametrize(
    ("scheduler", "metric", "mode", "message"),
    [
        (
            MOASHA(metric=["loss", "acc"], mode=["min", "max"]),
            METRIC,
            MODE,
            r"The scheduler MOASHA judges trials by \['loss', 'acc'\] \(modes \['min', 'max'\]\) "
            r"but the experiment has \['acc', 'loss'\] \(modes \['max', 'min'\]\); give MOASHA "
            r"the experiment's metrics, in the same order",
        ),
        (
            MOASHA(metric=METRIC, mode=["max", "max"]),
            METRIC,
            MODE,
            r"MOASHA judges trials by \['acc', 'loss'\] \(modes \['max', 'max'\]\) but",
        ),
        (
            MOASHA(),
            "acc",
            "max",
            r"MOASHA judges trials by several metrics, but the experiment has metric='acc', "
            r"mode='max'; give the experiment lists.*or use ASHAScheduler",
        ),
        (MOASHA(), None, None, r"MOASHA has no metrics to judge trials by"),
    ],
)
def test_the_airflow_path_refuses_moasha_that_disagrees_with_the_experiment(
    scheduler, metric, mode, message
):
    with pytest.raises(ValueError, match=message):
        judged_scheduler(scheduler, metric, mode)


def test_a_trial_s_judge_names_a_missing_metric_and_records_nothing_for_it(tmp_path):
    store = TrialStore(f"sqlite:///{tmp_path / 'trials.db'}", create=True)
    try:
        run = store.create_experiment_run("moasha", "r1")
        register(store, "t1", run)
        settings = MOASHARungs(metric=METRIC, mode=MODE, max_t=9).to_dict()
        moasha_judge = judge_for(settings, 0, run, "t1")
        assert isinstance(moasha_judge, VectorRungJudge)
        with pytest.raises(
            MissingSchedulerKey,
            match=r"result 1: Trial t1 reported a result without 'loss', which MOASHA decides "
            r"by \(the result has: acc, training_iteration\)",
        ):
            judge(store, moasha_judge, [{"training_iteration": 1, "acc": 0.5}])
        with pytest.raises(MissingSchedulerKey, match=r"acc='high', but MOASHA needs a number"):
            judge(store, moasha_judge, [{"training_iteration": 1, "acc": "high", "loss": 1.0}])
        # A trial that ended without reporting both metrics has nothing to record at its end.
        judge_end(store, moasha_judge, {"training_iteration": 1, "acc": 0.5})
        judge_end(store, moasha_judge, None)
        assert store.reader.trial_rungs("t1") == []
        assert judge(store, moasha_judge, [result(1, 0.5, 1.0)]) is None
        assert store.reader.rung_vectors(run, 0, 1) == [(0.5, 1.0)]
    finally:
        store.dispose()
