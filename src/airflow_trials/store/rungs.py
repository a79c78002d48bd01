"""RungsStore: ASHA's rungs in the trials store, one row per trial and rung, judged once each."""

from __future__ import annotations

import math
import numbers
import zlib
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from airflow_trials.core.rungs import RungDecide, RungVerdict
from airflow_trials.core.scheduler import Decision
from airflow_trials.exceptions import StoreError
from airflow_trials.store.base import StoreBase, _check_id
from airflow_trials.store.models import TrialRungRow, utcnow
from airflow_trials.store.records import RungDecision

_RUNGS = TrialRungRow.__table__
_VERDICTS = (Decision.CONTINUE, Decision.STOP)


class RungsStore(StoreBase):
    """ASHA's state for the Airflow path, where each trial has a trigger of its own.

    The pure rules are :mod:`~airflow_trials.core.rungs`'; this keeps what they need, the values
    every trial of a run reached each rung with, and makes each (trial, rung) verdict final.
    """

    def record_rung(
        self,
        experiment_run_id: int,
        trial_id: str,
        *,
        bracket: int,
        milestone: float,
        value: float,
        decide: RungDecide,
        iteration: int | None = None,
        at_end: bool = False,
    ) -> RungDecision:
        """Record the trial's ``value`` at a rung and return ASHA's verdict on it; exactly once.

        In one transaction: when the trial has a row at ``milestone`` already (a triggerer restart
        or a retry processing the same result again), that row is returned unchanged
        (``fresh=False``) and ``decide`` is not called. Otherwise ``decide`` gets the values the
        run's trials recorded at this bracket and milestone (a RungValues: a count, then the
        values it asks for, read from the rung's index) and its verdict is stored (``fresh=True``).
        Writers of one rung take turns (a PostgreSQL advisory lock per rung; SQLite serialises
        writers), so each verdict sees every value committed before it, as in memory.

        :param experiment_run_id: the run, as :meth:`create_experiment_run` returned it.
        :param trial_id: a trial of that run.
        :param bracket: the trial's ASHA bracket, drawn once per trial (0 with one bracket).
        :param milestone: the rung, e.g. from :meth:`~airflow_trials.core.rungs.AshaRungs.rung_to_judge`.
        :param value: the metric in its own units; NaN is recorded (as NULL) and stops nothing.
        :param decide: the pure verdict, e.g. :meth:`~airflow_trials.core.rungs.AshaRungs.decide`.
        :param iteration: training_iteration of the result; default None. Give it: it is how
            :meth:`~airflow_trials.core.rungs.AshaRungs.milestone_for` knows a result judged already.
        :param at_end: the trial ended and this is its last value (not acted on); default False.
        :raises TrialNotFoundError: no such trial. StoreError: no such run.
        """
        _check_id("Trial id", trial_id)
        value = _check_rung_args(trial_id, bracket, milestone, value, iteration)
        operation = f"record trial {trial_id} at bracket {bracket}, milestone {milestone} of experiment run {experiment_run_id}"

        def work(session: Session) -> RungDecision:
            self._trial_of_run_locking_rung(session, experiment_run_id, trial_id, bracket, milestone, operation)
            stored = self._stored_rung(session, trial_id, milestone)
            if stored is not None:
                return _checked_bracket(stored, bracket, operation)
            verdict = decide(_StoredRung(session, experiment_run_id, bracket, milestone))
            _check_verdict(verdict, operation)
            row = {
                "experiment_run_id": experiment_run_id, "trial_id": trial_id, "bracket": bracket,
                "milestone": float(milestone), "iteration": iteration, "value": None if math.isnan(value) else value,
                "decision": verdict.decision.value, "reason": verdict.reason, "at_end": bool(at_end),
                "created_at": utcnow(),
            }
            return self._insert_rung(session, row, operation)

        return self._transaction(operation, work)

    def _insert_rung(self, session: Session, row: dict[str, Any], operation: str) -> RungDecision:
        inserted = session.execute(
            self._insert(_RUNGS).values(**row)
            .on_conflict_do_nothing(index_elements=[_RUNGS.c.trial_id, _RUNGS.c.milestone])
            .returning(_RUNGS.c.id)
        ).scalar_one_or_none()
        if inserted is not None:
            return _rung_decision(row, fresh=True)
        # The same trial's other writer, holding another bracket's lock, won.
        stored = self._stored_rung(session, row["trial_id"], row["milestone"])
        if stored is None:  # and its trial was deleted since
            self._find_or_raise(session, row["trial_id"], operation)
            raise StoreError(f"Cannot {operation}: the trial's row at this milestone vanished meanwhile; retry.")
        return _checked_bracket(stored, row["bracket"], operation)

    def trial_rungs(self, trial_id: str) -> list[RungDecision]:
        """The trial's rung records, lowest milestone first; raises TrialNotFoundError for an unknown id."""
        operation = f"read the rungs of trial {trial_id}"

        def work(session: Session) -> list[RungDecision]:
            self._find_or_raise(session, trial_id, operation)
            rows = session.execute(
                select(_RUNGS).where(_RUNGS.c.trial_id == trial_id).order_by(_RUNGS.c.milestone)
            )
            return [_rung_decision(row._mapping, fresh=False) for row in rows]

        return self._transaction(operation, work, write=False)

    def _trial_of_run_locking_rung(
        self, session: Session, experiment_run_id: int, trial_id: str, bracket: int, milestone: float, operation: str
    ) -> None:
        """Check the trial belongs to the run and, on PostgreSQL, take the rung's lock."""
        rung_key = zlib.crc32(f"{bracket}:{float(milestone)!r}".encode()) - 2**31
        self._trial_of_run_locking(session, experiment_run_id, trial_id, rung_key, operation)

    @staticmethod
    def _stored_rung(session: Session, trial_id: str, milestone: float) -> RungDecision | None:
        row = session.execute(
            select(_RUNGS).where(_RUNGS.c.trial_id == trial_id, _RUNGS.c.milestone == milestone)
        ).one_or_none()
        return None if row is None else _rung_decision(row._mapping, fresh=False)


class _StoredRung:
    """:class:`~airflow_trials.core.rungs.RungValues` of one rung, answered by the rung's index:
    one count, then only the values a cutoff interpolates between, however many are stored."""

    def __init__(self, session: Session, experiment_run_id: int, bracket: int, milestone: float) -> None:
        self._connection = session.connection()
        self._where = (
            _RUNGS.c.experiment_run_id == experiment_run_id,
            _RUNGS.c.bracket == bracket,
            _RUNGS.c.milestone == milestone,
        )
        counts = self._connection.execute(
            select(func.count(), func.count(_RUNGS.c.value)).where(*self._where)
        ).one()
        self.total, self.numeric = int(counts[0]), int(counts[1])

    def ranked(self, first: int, last: int, descending: bool) -> list[float]:
        # OFFSET walks the index: walk it from the nearer end (ASHA's cutoffs sit near one end).
        if first > self.numeric - 1 - last:
            first, last, descending, flipped = self.numeric - 1 - last, self.numeric - 1 - first, not descending, True
        else:
            flipped = False
        order = _RUNGS.c.value.desc() if descending else _RUNGS.c.value.asc()
        values = list(
            self._connection.execute(
                select(_RUNGS.c.value).where(*self._where, _RUNGS.c.value.is_not(None))
                .order_by(order).offset(first).limit(last - first + 1)
            ).scalars()
        )
        return values[::-1] if flipped else values


def _check_rung_args(trial_id: str, bracket: Any, milestone: Any, value: Any, iteration: Any) -> float:
    """``value`` as a float, once the arguments are known to be what a rung row takes (ValueError)."""
    for name, number in (("bracket", bracket), ("iteration", iteration)):
        if number is None and name == "iteration":
            continue
        if isinstance(number, bool) or not isinstance(number, numbers.Integral) or number < 0:
            raise ValueError(f"The {name} of trial {trial_id}'s rung must be an integer >= 0, got {number!r}.")
    for name, number in (("milestone", milestone), ("value", value)):
        if isinstance(number, bool) or not isinstance(number, numbers.Real):
            raise ValueError(f"The {name} of trial {trial_id}'s rung must be a number, got {number!r}.")
    if not (math.isfinite(milestone) and milestone > 0):
        raise ValueError(f"The milestone of trial {trial_id}'s rung must be a finite number > 0, got {milestone!r}.")
    return float(value)


def _check_verdict(verdict: Any, operation: str) -> None:
    if not isinstance(verdict, RungVerdict) or verdict.decision not in _VERDICTS:
        raise ValueError(
            f"Cannot {operation}: decide returned {verdict!r}, not a RungVerdict of CONTINUE or STOP; "
            "pass AshaRungs.decide(...) or a function like it. Nothing was written."
        )


def _checked_bracket(stored: RungDecision, bracket: int, operation: str) -> RungDecision:
    if stored.bracket != bracket:
        raise ValueError(
            f"Cannot {operation}: the trial was recorded there in bracket {stored.bracket}; a trial stays "
            "in the bracket it was drawn into, so pass the bracket its earlier rungs have."
        )
    return stored


def _rung_decision(row: Any, *, fresh: bool) -> RungDecision:
    value = row["value"]
    return RungDecision(
        experiment_run_id=row["experiment_run_id"],
        trial_id=row["trial_id"],
        bracket=row["bracket"],
        milestone=row["milestone"],
        iteration=row["iteration"],
        value=math.nan if value is None else value,
        decision=Decision(row["decision"]),
        reason=row["reason"],
        at_end=bool(row["at_end"]),
        created_at=row["created_at"],
        fresh=fresh,
    )

