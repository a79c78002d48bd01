"""The median stopping rule's running means in the trials store (one row per trial and result
from grace_period, judged once): the SQL of the median slice's trials-DB backend
(:mod:`airflow_trials.schedulers.median.stored_means`)."""

from __future__ import annotations

import functools
import math
import numbers
from typing import Any

from sqlalchemy import and_, false, func, or_, select, true, update
from sqlalchemy.orm import Session

from airflow_trials.core.scheduler import Decision
from airflow_trials.core.verdicts import MEDIAN_AT_END_REASON as AT_END_REASON
from airflow_trials.core.verdicts import MeanList, MeanSample, MedianDecide
from airflow_trials.store.base import StoreBase, _check_id
from airflow_trials.store.judged_once import JudgedOnce
from airflow_trials.store.mapping import median_point
from airflow_trials.store.models import TrialMedianPointRow, TrialRow
from airflow_trials.store.records import MedianPoint

__all__ = ["AT_END_REASON", "MedianDecide", "MedianStore"]

_POINTS = TrialMedianPointRow.__table__
_TRIALS = TrialRow.__table__


class MedianStore(StoreBase):
    """The median stopping rule's state for the Airflow path, where each trial has a trigger of
    its own.

    The rule is :class:`~airflow_trials.schedulers.median.median_rule.MedianRule`'s; this keeps what
    it reads, each trial's running sum of the metric per result from grace_period, and makes each
    verdict final through :class:`~airflow_trials.store.judged_once.JudgedOnce`. A decision
    reads one running mean per other trial of the run (two index probes each), never their
    results. ``schedulers/median/stored_means.py`` StoredMeans hands it to the rule as its
    :class:`~airflow_trials.schedulers.median.median_rule.MedianState`.
    """

    @functools.cached_property
    def _median_verdicts(self) -> JudgedOnce[MedianPoint]:
        return JudgedOnce(self)

    def record_median_point(
        self,
        session: Session,
        experiment_run_id: int,
        trial_id: str,
        *,
        iteration: int,
        time: float,
        value: float,
        decide: MedianDecide | None = None,
        at_end: bool = False,
    ) -> MedianPoint:
        """Add the trial's result ``iteration`` to its running mean and return the rule's verdict
        on it; exactly once.

        In the caller's transaction (``session``, holding the run's scheduler lock: see
        :class:`~airflow_trials.store.scheduler_state.SchedulerState`): when the trial has a row
        for this result already (a triggerer restart
        or a retry processing it again), that row is returned unchanged (``fresh=False``) and
        ``decide`` is not called. Otherwise ``decide`` gets the running means at ``time`` of the
        run's other trials whose latest result is at or past ``time`` (each over its results up to
        ``time``; NaN where that is not finite), and its verdict is stored with the trial's new
        running sum (``fresh=True``). Writers of a run take turns (its scheduler lock): each
        verdict sees every mean committed before it.

        :param experiment_run_id: the run (:meth:`create_experiment_run`).
        :param trial_id: a trial of it.
        :param iteration: training_iteration of the result.
        :param time: its ``time_attr`` (at or after grace_period); never below the trial's last.
        :param value: the metric; a NaN or an infinity makes the running mean non-finite for good.
        :param decide: the verdict, e.g.
            ``functools.partial(MedianRule.verdict, rule, best, time)``.
        :param at_end: the trial ended and this is its last result, added again (Ray Tune's
            ``on_trial_complete``); no verdict, so no ``decide``. Default False.
        :raises TrialNotFoundError: no such trial. StoreError: no such run. ValueError: bad
            arguments.
        """
        _check_id("Trial id", trial_id)
        time, value = _check_point_args(trial_id, iteration, time, value)
        if (decide is None) != at_end:
            raise ValueError(
                f"record_median_point for trial {trial_id}: pass decide= (or at_end=True, "
                "without it)."
            )
        operation = (
            f"record result {iteration} of trial {trial_id} for the median rule of experiment "
            f"run {experiment_run_id}"
        )
        point = _Point(
            self, experiment_run_id, trial_id, iteration, time, value, at_end, decide, operation
        )
        return self._median_verdicts.record(
            session, experiment_run_id, trial_id, point, at_end=at_end, operation=operation
        )


class _Point:
    """A result added to a trial's running mean, as
    :class:`~airflow_trials.store.judged_once.JudgedOnce` records it."""

    def __init__(
        self,
        store: MedianStore,
        experiment_run_id: int,
        trial_id: str,
        iteration: int,
        time: float,
        value: float,
        at_end: bool,
        decide: MedianDecide | None,
        operation: str,
    ) -> None:
        self._store = store
        self._run, self._trial_id, self._iteration = experiment_run_id, trial_id, iteration
        self._time, self._value, self._at_end = time, value, at_end
        self._decide, self._operation = decide, operation
        self._last: Any = None

    def stored(self, session: Session) -> MedianPoint | None:
        stored, self._last = _stored_and_last(
            session, self._trial_id, self._iteration, self._at_end
        )
        return stored

    def decide(self, session: Session) -> tuple[Decision, str | None]:
        last = self._last
        if last is not None and self._time < last.time:
            raise ValueError(
                f"Cannot {self._operation}: its time {self._time!r} is before the trial's last "
                f"recorded {last.time!r}; the median stopping rule needs a time_attr that never "
                "decreases within a trial (training_iteration or time_total_s)."
            )
        if self._decide is None:
            return Decision.CONTINUE, AT_END_REASON
        same_time = last is not None and last.time == self._time
        return self._decide(
            _means_at(session, self._run, self._trial_id, self._time, probe_all=same_time)
        )

    def write(self, session: Session, verdict: dict[str, Any]) -> MedianPoint:
        last = self._last
        row = _new_row(
            self._run, self._trial_id, self._iteration, self._time, self._value, last, **verdict
        )
        # The trial's point at this time is now this one.
        if last is not None and last.time == self._time:
            session.execute(update(_POINTS).where(_POINTS.c.id == last.id).values(superseded=True))
        session.execute(self._store._insert(_POINTS).values(**row))
        return median_point(row, fresh=True)


def _means_at(
    session: Session, experiment_run_id: int, trial_id: str, time: float, *, probe_all: bool = False
) -> MeanSample:
    """The running means at ``time`` of the run's other trials whose latest result is at or past
    it, each over the trial's points up to ``time``. A trial with no point up to ``time`` is left
    out: its mean would be NaN, which the rule leaves out anyway.

    At an integer time, most trials' point with the greatest time up to it is *at* it (their
    times are consecutive integers, e.g. ``training_iteration``): those means are counted and
    read by rank from the (run, time, superseded, mean) index (:class:`_MeansAtTime`). The others
    skipped ``time``: their next point is a gap row whose previous time is before it, found
    through the (run, gap, time) index and probed one by one. When there are many (times that are
    not integers, such as ``time_total_s``), or ``probe_all`` (the deciding trial has a point at
    this time already), every trial is probed instead."""
    if float(time).is_integer() and not probe_all:
        skipped = list(
            session.connection()
            .execute(
                select(_POINTS.c.trial_id)
                .where(
                    _POINTS.c.experiment_run_id == experiment_run_id,
                    _POINTS.c.gap == true(),
                    _POINTS.c.time > time,
                    _POINTS.c.prev_time < time,
                    _POINTS.c.trial_id != trial_id,
                )
                .limit(_MAX_PROBED + 1)
            )
            .scalars()
        )
        if len(skipped) <= _MAX_PROBED:
            extra = _probed_means(session, _TRIALS.c.trial_id.in_(set(skipped)), time)
            return _MeansAtTime(session, experiment_run_id, time, extra)
    return MeanList(_probed_means(session, _trials_beyond(experiment_run_id, trial_id, time), time))


class _MeansAtTime:
    """:class:`~airflow_trials.core.verdicts.MeanSample` of the points at one time
    of a run (the trials' own latest there, finite means only) plus a few more means held here
    (trials that skipped the time): one count, then only the values the median needs, however many
    trials."""

    def __init__(
        self, session: Session, experiment_run_id: int, time: float, extra: list[float]
    ) -> None:
        self._connection = session.connection()
        self._where = (
            _POINTS.c.experiment_run_id == experiment_run_id,
            _POINTS.c.time == time,
            _POINTS.c.superseded == false(),
            _POINTS.c.mean.is_not(None),
        )
        self._extra = sorted(m for m in extra if math.isfinite(m))
        self._stored = int(
            self._connection.execute(select(func.count()).where(*self._where)).scalar_one()
        )
        self.count = self._stored + len(self._extra)

    def median(self) -> float:
        middle = self.count // 2
        ranks = (middle,) if self.count % 2 else (middle - 1, middle)
        # The value of rank r among stored + extra is among the stored ranks r - len(extra) to r.
        first = max(0, ranks[0] - len(self._extra))
        last = min(self._stored - 1, ranks[-1])
        window = (
            list(
                self._connection.execute(
                    select(_POINTS.c.mean)
                    .where(*self._where)
                    .order_by(_POINTS.c.mean)
                    .offset(first)
                    .limit(max(0, last - first + 1))
                ).scalars()
            )
            if last >= first
            else []
        )
        merged = sorted(window + self._extra)
        values = [merged[rank - first] for rank in ranks]
        return values[0] if len(values) == 1 else (values[0] + values[1]) / 2


#: Trials that skipped a decision's time, probed one by one; more, and every trial is probed.
_MAX_PROBED = 64


def _trials_beyond(experiment_run_id: int, trial_id: str, time: float) -> Any:
    """The run's other trials whose latest point is at or past ``time``."""
    latest = _POINTS.alias("latest")
    last_time = (
        select(latest.c.time)
        .where(latest.c.trial_id == _TRIALS.c.trial_id)
        .order_by(latest.c.time.desc(), latest.c.seq.desc())
        .limit(1)
        .scalar_subquery()
    )
    return and_(
        _TRIALS.c.experiment_run_id == experiment_run_id,
        _TRIALS.c.trial_id != trial_id,
        last_time >= time,
    )


def _probed_means(session: Session, trials: Any, time: float) -> list[float]:
    """The running mean at ``time`` of each trial ``trials`` selects, one index probe each."""
    points = _POINTS.alias("p")
    mean = (
        select(points.c.mean)
        .where(points.c.trial_id == _TRIALS.c.trial_id, points.c.time <= time)
        .order_by(points.c.time.desc(), points.c.seq.desc())
        .limit(1)
        .scalar_subquery()
    )
    rows = session.connection().execute(select(mean).where(trials)).scalars()
    return [math.nan if m is None else float(m) for m in rows]


def _new_row(
    experiment_run_id: int,
    trial_id: str,
    iteration: int,
    time: float,
    value: float,
    last: Any,
    **verdict: Any,
) -> dict[str, Any]:
    """The point row of a result after the trial's ``last`` point (None for its first)."""
    total = value if last is None else (None if last.total is None else last.total + value)
    seq = 1 if last is None else last.seq + 1
    finite = total is not None and math.isfinite(total)
    return {
        "experiment_run_id": experiment_run_id,
        "trial_id": trial_id,
        "seq": seq,
        "time": time,
        "prev_time": None if last is None else last.time,
        "gap": last is not None and not _consecutive(last.time, time),
        "iteration": iteration,
        "total": total if finite else None,
        "mean": total / seq if finite and total is not None else None,
        "superseded": False,
        **verdict,
    }


def _consecutive(previous: float, time: float) -> bool:
    """Are two successive point times such that no integer lies strictly between them?"""
    return previous.is_integer() and time.is_integer() and time - previous <= 1


def _stored_and_last(
    session: Session, trial_id: str, iteration: int, at_end: bool
) -> tuple[MedianPoint | None, Any]:
    """In one statement: the trial's point for this result if it has one, and its latest point."""
    last_id = (
        select(_POINTS.c.id)
        .where(_POINTS.c.trial_id == trial_id)
        .order_by(_POINTS.c.time.desc(), _POINTS.c.seq.desc())
        .limit(1)
        .scalar_subquery()
    )
    this = and_(_POINTS.c.iteration == iteration, _POINTS.c.at_end == bool(at_end))
    rows = session.execute(
        select(_POINTS, this.label("is_this"), (_POINTS.c.id == last_id).label("is_last")).where(
            _POINTS.c.trial_id == trial_id, or_(this, _POINTS.c.id == last_id)
        )
    ).all()
    stored = next((median_point(row._mapping, fresh=False) for row in rows if row.is_this), None)
    return stored, next((row for row in rows if row.is_last), None)


def _check_point_args(trial_id: str, iteration: Any, time: Any, value: Any) -> tuple[float, float]:
    if isinstance(iteration, bool) or not isinstance(iteration, numbers.Integral) or iteration < 0:
        raise ValueError(
            f"The iteration of trial {trial_id}'s median point must be an integer >= 0, got "
            f"{iteration!r}."
        )
    for name, number in (("time", time), ("value", value)):
        if isinstance(number, bool) or not isinstance(number, numbers.Real):
            raise ValueError(
                f"The {name} of trial {trial_id}'s median point must be a number, got {number!r}."
            )
    if not math.isfinite(time):
        raise ValueError(
            f"The time of trial {trial_id}'s median point must be finite, got {time!r}."
        )
    return float(time), float(value)
