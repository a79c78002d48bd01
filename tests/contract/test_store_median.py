"""Contract of TrialStore.record_median_point (the median stopping rule on the Airflow path) and of
MedianJudge over it, run unchanged against in-memory SQLite, a SQLite file and PostgreSQL."""

from __future__ import annotations

import functools
import math
import random
import threading
from typing import Any

import pytest
from alembic import command
from sqlalchemy import inspect

from airflow_trials import Decision, MedianStoppingRule, StoreError, Trial, TrialNotFoundError
from airflow_trials.core.fate import Transition
from airflow_trials.core.status import TrialStatus
from airflow_trials.schedulers.median.median_judging import MedianJudge
from airflow_trials.schedulers.median.median_rule import MedianRule
from airflow_trials.schedulers.median.median_stopping import MeanList
from airflow_trials.schedulers.trial_judge import MissingSchedulerKey
from airflow_trials.store import RestartFromScratch, TrialStore
from airflow_trials.store.median import AT_END_REASON
from airflow_trials.store.migration import alembic_config
from airflow_trials.store.models import TrialMedianPointRow
from tests.contract.conftest import MEMORY, POSTGRESQL, SQLITE_FILE
from tests.contract.test_store import count, run_in_threads
from tests.contract.test_store_rungs import new_run
from tests.factories import add_results
from tests.scheduler_writes import OneWriteEach, judge, judge_end, write_judged

#: Random streams per backend, and the fewest results judged and stops they make (seeded: the
#: same every run). In-memory SQLite replays the most; the file and PostgreSQL a sample.
STREAMS = {MEMORY: 100, SQLITE_FILE: 40, POSTGRESQL: 40}
AT_LEAST = {MEMORY: (800, 40), SQLITE_FILE: (850, 30), POSTGRESQL: (850, 30)}
RULE = MedianRule(
    metric="loss",
    mode="min",
    time_attr="training_iteration",
    grace_period=1,
    min_samples_required=2,
)


def never(means):
    raise AssertionError(f"decide must not be called again, got {means}")


def sample(means) -> tuple[int, float | None]:
    """What the rule reads of the means it was given: how many, and their median."""
    return means.count, (means.median() if means.count else None)


def expected(values) -> tuple[int, float | None]:
    return sample(MeanList(values))


def decide(best: float, time: float, rule: MedianRule = RULE):
    return functools.partial(rule.verdict, best, time)


def _value(rng: random.Random, level: float, step: int, infinities: bool) -> float:
    roll = rng.random()
    if roll < 0.04:
        return math.nan
    if infinities and roll < 0.06:
        return rng.choice([math.inf, -math.inf])
    if roll < 0.25:
        return float(rng.randint(0, 4))  # ties between trials and with medians
    return level * step + rng.gauss(0, 1)


def replay_stream(store: TrialStore, seed: int) -> tuple[int, int]:
    """One random asynchronous stream through MedianStoppingRule and through MedianJudges over the
    store (a trial's judge is sometimes replaced by a new one, as after a triggerer restart, and
    each result is judged again by a new judge); asserts every decision and reason agree.
    Returns how many results it judged and how many stops."""
    rng = random.Random(seed)
    settings = {
        "metric": "score",
        "mode": rng.choice(["min", "max"]),
        "time_attr": rng.choice(["training_iteration", "time_total_s"]),
        "grace_period": rng.choice([1, 2, 3]),
        "min_samples_required": rng.choice([1, 2, 3]),
    }
    memory, rule = MedianStoppingRule(**settings), MedianRule(**settings)
    ids = [f"s{seed}-t{i}" for i in range(rng.randint(2, 7))]
    run = new_run(store, f"stream-{seed}", ids)
    # A new judge reads the trial's best back from its stored results, where JSON keeps no
    # infinity (it reads NaN): streams with restarts report none.
    restarts = rng.random() < 0.5
    trials, judges = {}, {}
    for trial_id in ids:
        trials[trial_id] = Trial("tests.trainables:counting", trial_id=trial_id)
        memory.on_trial_add(trials[trial_id])
        trials[trial_id].set_status(
            TrialStatus.RUNNING
        )  # none waits to run: too few means continue
        judges[trial_id] = MedianJudge(rule, run, trial_id)
    step, clock = dict.fromkeys(ids, 0), dict.fromkeys(ids, 0.0)
    level, limit = {t: rng.uniform(-1, 1) for t in ids}, {t: rng.randint(2, 14) for t in ids}
    live, judged, stops = list(ids), 0, 0
    while live:
        trial_id = rng.choice(live)
        step[trial_id] += rng.choice([1, 1, 2])
        clock[trial_id] += rng.choice([0.5, 1.0, 1.5, 3.0])
        result = {
            "training_iteration": step[trial_id],
            "time_total_s": clock[trial_id],
            "score": _value(rng, level[trial_id], step[trial_id], infinities=not restarts),
        }
        expected = memory.on_trial_result(trials[trial_id], dict(result))
        if restarts and rng.random() < 0.2:
            judges[trial_id] = MedianJudge(rule, run, trial_id)
        # The poller writes the result and its verdict in one transaction.
        write_judged(store, judges[trial_id], [result])
        verdict = judges[trial_id].verdict_for(step[trial_id])
        again = MedianJudge(rule, run, trial_id)
        judge(store, again, [result])
        assert (verdict.decision, again.verdict_for(step[trial_id])) == (expected, verdict), (
            seed,
            trial_id,
            result,
        )
        judged += 1
        if expected is Decision.STOP or step[trial_id] >= limit[trial_id]:
            if expected is Decision.STOP:
                stops += 1
                assert verdict.reason == memory.decision_reason(trial_id)
            live.remove(trial_id)
            memory.on_trial_complete(trials[trial_id], dict(result))
            judge_end(store, judges[trial_id], result)
    return judged, stops


class MedianContract:
    backend: str
    concurrent_writers = True

    def test_records_once_and_returns_the_first_verdict_again(self, store):
        run = new_run(store, "r1", ["a", "b", "c"])
        for trial_id, values in (("a", [0.2, 0.4]), ("b", [0.3, 0.3])):
            for iteration, value in enumerate(values, start=1):
                OneWriteEach(store).record_median_point(
                    run,
                    trial_id,
                    iteration=iteration,
                    time=iteration,
                    value=value,
                    decide=decide(value, iteration),
                )
        worse = OneWriteEach(store).record_median_point(
            run, "c", iteration=2, time=2, value=0.9, decide=decide(0.9, 2)
        )
        assert (worse.decision, worse.fresh, worse.seq, worse.mean) == (Decision.STOP, True, 1, 0.9)
        assert worse.reason == (
            "stopped by the median stopping rule at training_iteration=2: best loss 0.9 above the "
            "median 0.3 "
            "of 2 other trials' running means"
        )
        # A triggerer restart processes the same result again: the same verdict, decide not asked.
        again = OneWriteEach(store).record_median_point(
            run, "c", iteration=2, time=2, value=0.0, decide=never
        )
        assert (again.decision, again.reason, again.fresh, again.mean) == (
            Decision.STOP,
            worse.reason,
            False,
            0.9,
        )
        assert count(store, TrialMedianPointRow) == 5
        assert [(p.iteration, p.seq, p.mean) for p in store.reader.trial_median_points("a")] == [
            (1, 1, 0.2),
            (2, 2, 0.30000000000000004),
        ]

    def test_the_median_is_over_other_trials_at_or_past_the_time_each_up_to_it(self, store):
        run = new_run(store, "r1", ["a", "b", "short", "me"])
        for trial_id, values in (("a", [1.0, 3.0, 5.0]), ("b", [2.0, 2.0, 2.0]), ("short", [0.0])):
            for iteration, value in enumerate(values, start=1):
                OneWriteEach(store).record_median_point(
                    run,
                    trial_id,
                    iteration=iteration,
                    time=iteration,
                    value=value,
                    decide=lambda means: (Decision.CONTINUE, None),
                )
        seen: list[tuple[int, float | None]] = []

        def capture(means):
            seen.append(sample(means))
            return Decision.CONTINUE, None

        OneWriteEach(store).record_median_point(
            run, "me", iteration=2, time=2.0, value=9.0, decide=capture
        )
        # "short" ended before time 2; a's mean up to 2 is 2.0, b's 2.0 (not a's mean over all of
        # it).
        assert seen == [expected([2.0, 2.0])]
        OneWriteEach(store).record_median_point(
            run,
            "b",
            iteration=4,
            time=4,
            value=math.nan,
            decide=lambda m: (Decision.CONTINUE, None),
        )
        OneWriteEach(store).record_median_point(
            run, "me", iteration=3, time=3.0, value=9.0, decide=capture
        )
        assert seen[-1] == expected(
            [2.0, 3.0]
        )  # b's NaN comes after time 3: its mean up to 3 is finite
        OneWriteEach(store).record_median_point(
            run, "me", iteration=4, time=4.0, value=9.0, decide=capture
        )
        assert (
            seen[-1] == expected([math.nan]) == (0, None)
        )  # b's mean is NaN now: left out, as Ray leaves it out
        assert (
            RULE.verdict(9.0, 4.0, [3.0, math.nan])[0] is Decision.CONTINUE
        )  # one finite mean < min_samples_required

    @pytest.mark.parametrize("skipping", [3, 70], ids=["few-skip-the-time", "many-skip-the-time"])
    def test_means_at_an_integer_time_count_every_trial_past_it_whether_or_not_it_has_a_point_there(
        self, store, skipping
    ):
        # Trials with a point at every iteration, trials that skipped iteration 3 (points at 2
        # and 5), one with non-integer times, and one that stopped before 3: at time 3 the means
        # are those of every trial but the last, however many skipped it (a few are probed one
        # by one; past 64, every trial is).
        ids = (
            [f"every{i}" for i in range(5)]
            + [f"skip{i}" for i in range(skipping)]
            + ["float", "short", "me"]
        )
        run = new_run(store, "r1", ids)
        means = []
        for i in range(5):
            for step in range(1, 6):
                OneWriteEach(store).record_median_point(
                    run,
                    f"every{i}",
                    iteration=step,
                    time=step,
                    value=float(i + step),
                    decide=lambda means: (Decision.CONTINUE, None),
                )
            means.append(sum(i + step for step in (1, 2, 3)) / 3)
        for i in range(skipping):
            for step, value in ((2, 10.0 + i), (5, 0.0)):
                OneWriteEach(store).record_median_point(
                    run,
                    f"skip{i}",
                    iteration=step,
                    time=step,
                    value=value,
                    decide=lambda means: (Decision.CONTINUE, None),
                )
            means.append(10.0 + i)
        for step, time in ((1, 0.5), (2, 2.5), (3, 3.5)):
            OneWriteEach(store).record_median_point(
                run,
                "float",
                iteration=step,
                time=time,
                value=4.0,
                decide=lambda means: (Decision.CONTINUE, None),
            )
        means.append(4.0)
        OneWriteEach(store).record_median_point(
            run,
            "short",
            iteration=1,
            time=2,
            value=1.0,
            decide=lambda means: (Decision.CONTINUE, None),
        )
        seen: list[tuple[int, float | None]] = []

        def capture(means):
            seen.append(sample(means))
            return Decision.CONTINUE, None

        OneWriteEach(store).record_median_point(
            run, "me", iteration=3, time=3, value=0.0, decide=capture
        )
        assert seen == [sample(MeanList(means))]

    def test_a_trial_s_last_result_is_added_again_when_it_ends(self, store):
        run = new_run(store, "r1", ["a"])
        OneWriteEach(store).record_median_point(
            run, "a", iteration=1, time=1, value=1.0, decide=decide(1.0, 1)
        )
        OneWriteEach(store).record_median_point(
            run, "a", iteration=2, time=2, value=4.0, decide=decide(1.0, 2)
        )
        end = OneWriteEach(store).record_median_point(
            run, "a", iteration=2, time=2, value=4.0, at_end=True
        )
        assert (end.seq, end.mean, end.decision, end.reason, end.at_end) == (
            3,
            3.0,
            Decision.CONTINUE,
            AT_END_REASON,
            True,
        )
        assert (
            OneWriteEach(store)
            .record_median_point(run, "a", iteration=2, time=2, value=4.0, at_end=True)
            .fresh
            is False
        )

    def test_a_time_that_goes_back_is_refused_and_nothing_is_written(self, store):
        run = new_run(store, "r1", ["a"])
        OneWriteEach(store).record_median_point(
            run, "a", iteration=2, time=5.0, value=1.0, decide=decide(1.0, 5)
        )
        with pytest.raises(
            ValueError,
            match=r"its time 4.0 is before the trial's last recorded 5.0; the median "
            r"stopping rule needs a time_attr that never decreases",
        ):
            OneWriteEach(store).record_median_point(
                run, "a", iteration=3, time=4.0, value=1.0, decide=never
            )
        assert count(store, TrialMedianPointRow) == 1

    def test_bad_arguments_unknown_trials_and_wrong_runs_are_refused_and_nothing_is_written(
        self, store
    ):
        run = new_run(store, "r1", ["a"])
        other = new_run(store, "r2", ["x"])
        with pytest.raises(TrialNotFoundError, match="trial ghost is not in the trial store"):
            OneWriteEach(store).record_median_point(
                run, "ghost", iteration=1, time=1, value=1.0, decide=never
            )
        with pytest.raises(ValueError, match="the trial belongs to experiment run"):
            OneWriteEach(store).record_median_point(
                other, "a", iteration=1, time=1, value=1.0, decide=never
            )
        with pytest.raises(
            ValueError, match="iteration of trial a's median point must be an integer >= 0"
        ):
            OneWriteEach(store).record_median_point(
                run, "a", iteration=-1, time=1, value=1.0, decide=never
            )
        with pytest.raises(ValueError, match="time of trial a's median point must be finite"):
            OneWriteEach(store).record_median_point(
                run, "a", iteration=1, time=math.inf, value=1.0, decide=never
            )
        with pytest.raises(ValueError, match="pass decide="):
            OneWriteEach(store).record_median_point(run, "a", iteration=1, time=1, value=1.0)
        with pytest.raises(ValueError, match="not CONTINUE or STOP"):
            OneWriteEach(store).record_median_point(
                run, "a", iteration=1, time=1, value=1.0, decide=lambda m: (Decision.PAUSE, None)
            )
        assert count(store, TrialMedianPointRow) == 0

    def test_a_trial_restarted_from_scratch_is_judged_afresh_and_its_points_go_with_it(self, store):
        run = new_run(store, "r1", ["a", "b"])
        OneWriteEach(store).record_median_point(
            run, "a", iteration=1, time=1, value=0.1, decide=decide(0.1, 1)
        )
        rule = MedianRule(
            metric="loss",
            mode="min",
            time_attr="training_iteration",
            grace_period=1,
            min_samples_required=1,
        )
        assert (
            OneWriteEach(store)
            .record_median_point(
                run, "b", iteration=1, time=1, value=0.9, decide=decide(0.9, 1, rule)
            )
            .decision
            is Decision.STOP
        )
        store.record_transition("b", Transition.STOPPED, why="stopped by the median stopping rule")
        store.record_transition("b", RestartFromScratch())
        assert (
            store.reader.trial_median_points("b") == []
            and len(store.reader.trial_median_points("a")) == 1
        )
        assert (
            OneWriteEach(store)
            .record_median_point(
                run, "b", iteration=1, time=1, value=0.05, decide=decide(0.05, 1, rule)
            )
            .fresh
        )
        with store._engine.begin() as connection:
            connection.exec_driver_sql("DELETE FROM at_trials WHERE trial_id = 'a'")
        assert [p.trial_id for p in store.reader.trial_median_points("b")] == ["b"]
        assert count(store, TrialMedianPointRow) == 1

    def test_a_judge_reads_earlier_results_for_the_best_and_refuses_a_result_without_the_metric(
        self, store
    ):
        run = new_run(store, "r1", ["a", "b"])
        rule = MedianRule(
            metric="loss",
            mode="min",
            time_attr="training_iteration",
            grace_period=3,
            min_samples_required=1,
        )
        for iteration, loss in ((1, 0.5), (2, 0.6), (3, 0.5), (4, 0.5)):
            write_judged(
                store,
                MedianJudge(rule, run, "a"),
                [{"training_iteration": iteration, "loss": loss}],
            )
        # b's best so far counts its results before grace_period: 0.1 at iteration 1.
        add_results(
            store,
            "b",
            [{"training_iteration": i, "loss": v} for i, v in ((1, 0.1), (2, 0.9), (3, 0.9))],
        )
        b = MedianJudge(rule, run, "b")  # a new trigger: it reads b's results once
        assert judge(store, b, [{"training_iteration": 3, "loss": 0.9}]) is None
        with pytest.raises(
            MissingSchedulerKey,
            match=r"result 4 of trial b has no 'loss', which MedianStoppingRule judges by",
        ):
            judge(store, b, [{"training_iteration": 4, "score": 1.0}])

    def test_random_streams_decide_exactly_as_the_in_memory_rule(self, store):
        judged, stops = map(
            sum,
            zip(
                *(replay_stream(store, seed) for seed in range(STREAMS[self.backend])), strict=True
            ),
        )
        least_judged, least_stops = AT_LEAST[self.backend]
        assert judged > least_judged and stops > least_stops, (judged, stops)

    def test_a_store_error_leaves_nothing_half_written(self, store):
        run = new_run(store, "r1", ["a"])

        def fails(means):
            raise RuntimeError("the verdict failed")

        with pytest.raises((RuntimeError, StoreError)):
            OneWriteEach(store).record_median_point(
                run, "a", iteration=1, time=1, value=1.0, decide=fails
            )
        assert count(store, TrialMedianPointRow) == 0

    def test_downgrade_to_0006_drops_the_table_and_upgrade_brings_it_back(self, store):
        with store._write_engine.begin() as connection:
            command.downgrade(alembic_config(connection), "0006")
            assert "at_trial_median_points" not in inspect(connection).get_table_names()
            command.upgrade(alembic_config(connection), "head")
            assert "at_trial_median_points" in inspect(connection).get_table_names()

    def test_24_concurrent_trials_each_see_every_mean_committed_before_them(self, store, store_url):
        if not self.concurrent_writers:
            pytest.skip(
                "in-memory SQLite shares one connection; concurrency runs on the file and "
                "PostgreSQL"
            )
        writers = 24
        ids = [f"w{w}" for w in range(writers)]
        run = new_run(store, "r1", ids)
        rule = MedianRule(
            metric="score",
            mode="max",
            time_attr="training_iteration",
            grace_period=1,
            min_samples_required=1,
        )
        barrier = threading.Barrier(writers, timeout=60)
        seen: dict[tuple[str, int], tuple[int, float | None]] = {}

        def write(w: int) -> None:
            writer = TrialStore(store_url)
            rng, best = random.Random(w), -math.inf
            try:
                barrier.wait()
                for iteration in (1, 2, 3):
                    value = rng.gauss(0, 1)
                    best = max(best, value)

                    def judged(means, key=(f"w{w}", iteration), best=best):
                        seen[key] = sample(means)
                        return rule.verdict(best, float(key[1]), means)

                    for _ in range(2):  # the second is a retry: the same verdict, no second row
                        OneWriteEach(writer).record_median_point(
                            run,
                            f"w{w}",
                            iteration=iteration,
                            time=iteration,
                            value=value,
                            decide=judged,
                        )
            finally:
                writer.dispose()

        assert (
            run_in_threads(
                [functools.partial(write, w) for w in range(writers)], timeout_seconds=120
            )
            == []
        )
        assert count(store, TrialMedianPointRow) == 3 * writers
        # Replayed in commit order, each decision saw exactly the means committed before it.
        with store._engine.connect() as connection:
            rows = connection.execute(
                TrialMedianPointRow.__table__.select().order_by(TrialMedianPointRow.id)
            ).all()
        committed: dict[str, list[Any]] = {}  # each trial's rows committed so far
        for row in rows:
            means = [
                upto[-1].total / upto[-1].seq
                for trial_id, points in committed.items()
                if trial_id != row.trial_id and points[-1].time >= row.time
                for upto in ([p for p in points if p.time <= row.time],)
                if upto
            ]
            assert seen[(row.trial_id, row.iteration)] == expected(means), row
            committed.setdefault(row.trial_id, []).append(row)


class TestInMemorySQLite(MedianContract):
    backend = MEMORY
    concurrent_writers = False


class TestSQLiteFile(MedianContract):
    backend = SQLITE_FILE


@pytest.mark.postgres
class TestPostgreSQL(MedianContract):
    backend = POSTGRESQL
