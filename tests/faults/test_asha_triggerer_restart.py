"""Case 8: ASHA on the Airflow path while the triggerer is SIGKILLed.

Three trials (``score = iteration * x``, x = 1, 2, 3; mode max) with ASHA's rungs at iterations 4
and 8 (grace_period 4, reduction_factor 2, max_t 12). The triggerer is killed while the trials
wait at the gate before iteration 4, and started again once every trial reached rung 4 with no
trigger to judge it: each actor holds there, and the new triggers judge the held results and
release them. No decision is lost (every trial has its rung-4 verdict, taken once, after the
restart) or taken twice (a replay of the verdicts in the order they were recorded gives the
same ones), and a trial ASHA stopped reported nothing past its rung.
"""

from __future__ import annotations

import time

import pytest

from airflow_trials.schedulers.asha.asha_rungs import AshaRungs
from tests.faults.trainables import read_journal

pytestmark = pytest.mark.timeout(900)

ASHA = "ASHAScheduler(max_t=12, grace_period=4, reduction_factor=2)"
RUNGS = AshaRungs(metric="score", mode="max", max_t=12, grace_period=4, reduction_factor=2)


def test_asha_decides_each_rung_once_across_a_triggerer_restart(stack, experiment):
    run = experiment("faults_asha_triggerer", trials=3, max_failures=0, scheduler=ASHA)
    run.trigger()
    run.wait_until_trials_deferred()  # each holds at the gate after iteration 3, below every rung
    stack.kill("triggerer")
    run.open_gate()
    # With no triggerer, each trial reports iteration 4 (rung 4) and its actor holds there.
    stack.wait_for(
        lambda: all(
            4 in inc.iterations
            for trial_id in run.trial_ids
            for inc in read_journal(run.journal_dir, trial_id)
        ),
        120,
        "every trial to report iteration 4 with no triggerer",
    )
    restarted_at = time.time()
    stack.start("triggerer")
    assert run.finish() == "success"
    run.assert_tasks_end()  # each on its first try
    records = run.assert_trials_end("TERMINATED")

    store = run.store()
    try:
        rungs = {t: [r for r in store.reader.trial_rungs(t) if not r.at_end] for t in run.trial_ids}
        results = {
            t: [r["training_iteration"] for r in store.reader.get_results(t)] for t in run.trial_ids
        }
    finally:
        store.dispose()
    at_4 = sorted(
        (r for rows in rungs.values() for r in rows if r.milestone == 4), key=lambda r: r.created_at
    )
    assert sorted(r.trial_id for r in at_4) == sorted(run.trial_ids)  # no verdict lost
    before: list[float] = []
    for row in at_4:
        assert row.created_at.timestamp() > restarted_at  # judged by the new triggerer
        verdict = RUNGS.decide(0, 4, 4, row.value)(_values(before))
        assert (row.decision, row.reason) == (verdict.decision, verdict.reason), (
            row
        )  # taken once, as ASHA takes it
        before.append(row.value)
    assert {r.decision.value for r in at_4} != {"STOP"}  # the first to arrive always goes on
    for trial_id in run.trial_ids:
        (incarnation,) = read_journal(run.journal_dir, trial_id)  # nothing restarted
        stop = next((r for r in rungs[trial_id] if r.decision.value == "STOP"), None)
        if stop is None:
            assert results[trial_id] == list(range(1, 13)), (trial_id, results[trial_id])
            assert (
                records[trial_id].stop_reason == "it met its stopping criterion"
            )  # stop= ends it at 12 first
        else:
            assert results[trial_id] == list(range(1, stop.iteration + 1)), (trial_id, stop)
            assert incarnation.iterations == results[trial_id]  # it trained nothing past its rung
            assert records[trial_id].stop_reason == stop.reason
            assert stop.reason.startswith(
                f"stopped by ASHA at training_iteration={stop.iteration} (rung "
            )
        if 5 in incarnation.iterations:  # released from its hold at rung 4 by a new trigger
            assert incarnation.beat_times[incarnation.iterations.index(5)] > restarted_at
    stack.assert_triggerer_responsive(since=run.triggered_at)


def _values(values: list[float]):
    from airflow_trials.schedulers.asha.asha_rungs import ValueList

    return ValueList(values)
