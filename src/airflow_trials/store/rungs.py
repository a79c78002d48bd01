"""ASHA's and MOASHA's rungs in the trials store: one row per trial and rung, judged once.

The SQL of the trials-DB backend of ASHA's and MOASHA's rungs; the backend the rules judge over
(StoredRungs, StoredVectorRungs) is the slice's own,
:mod:`airflow_trials.schedulers.asha.stored_rungs`, and reaches this through ``record_progress``'s
SchedulerState."""

from __future__ import annotations

import functools
import json
import math
import numbers
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from airflow_trials.core.scheduler import Decision
from airflow_trials.core.verdicts import RungDecide, RungVerdict, ValueList
from airflow_trials.exceptions import StoreError
from airflow_trials.store.base import StoreBase, _check_id
from airflow_trials.store.judged_once import VERDICTS, JudgedOnce
from airflow_trials.store.mapping import rung_decision
from airflow_trials.store.models import TrialRungRow
from airflow_trials.store.records import RungDecision

__all__ = ["RungsStore"]


_RUNGS = TrialRungRow.__table__


class RungsStore(StoreBase):
    """ASHA's state for the Airflow path, where each trial has a trigger of its own.

    The rule is :class:`~airflow_trials.schedulers.asha.asha_rungs.AshaRungs`'; this keeps what it
    needs, the values every trial of a run reached each rung with, and makes each (trial, rung)
    verdict final through :class:`~airflow_trials.store.judged_once.JudgedOnce`.
    ``schedulers/asha/stored_rungs.py`` StoredRungs hands it to the rule as its
    :class:`~airflow_trials.schedulers.asha.asha_rungs.RungState`.
    """

    @functools.cached_property
    def _rung_verdicts(self) -> JudgedOnce[RungDecision]:
        return JudgedOnce(self)

    def record_rung(
        self,
        session: Session,
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

        In the caller's transaction (``session``, which holds the run's scheduler lock: see
        :class:`~airflow_trials.store.scheduler_state.SchedulerState`): when the trial has a row
        at ``milestone`` already (a triggerer restart
        or a retry processing the same result again), that row is returned unchanged
        (``fresh=False``) and ``decide`` is not called. Otherwise ``decide`` gets the values the
        run's trials recorded at this bracket and milestone (a RungValues: a count, then the
        values it asks for, read from the rung's index) and its verdict is stored (``fresh=True``).
        Writers of a run take turns (its scheduler lock), so each verdict sees every value
        committed before it, as in memory.

        :param experiment_run_id: the run, as :meth:`create_experiment_run` returned it.
        :param trial_id: a trial of that run.
        :param bracket: the trial's ASHA bracket, drawn once per trial (0 with one bracket).
        :param milestone: the rung, e.g. from
            :meth:`~airflow_trials.schedulers.asha.asha_rungs.AshaRungs.rung_to_judge`.
        :param value: the metric in its own units; NaN is recorded (as NULL) and stops nothing.
        :param decide: the pure verdict, e.g. ASHA's ``AshaRungs.decide``.
        :param iteration: training_iteration of the result; default None. Give it: it is how
            :meth:`~airflow_trials.schedulers.asha.asha_rungs.AshaRungs.milestone_for` knows a
            result judged already.
        :param at_end: the trial ended and this is its last value (not acted on); default False.
        :raises TrialNotFoundError: no such trial. StoreError: no such run.
        """
        _check_id("Trial id", trial_id)
        value = _check_rung_args(trial_id, bracket, milestone, value, iteration)
        operation = (
            f"record trial {trial_id} at bracket {bracket}, milestone {milestone} of experiment "
            f"run {experiment_run_id}"
        )
        row = {
            "experiment_run_id": experiment_run_id,
            "trial_id": trial_id,
            "bracket": bracket,
            "milestone": float(milestone),
            "iteration": iteration,
            "value": None if math.isnan(value) else value,
        }
        return self._rung_verdicts.record(
            session,
            experiment_run_id,
            trial_id,
            _Rung(self, row, decide, operation),
            at_end=at_end,
            operation=operation,
        )

    def record_vector_rung(
        self,
        session: Session,
        experiment_run_id: int,
        trial_id: str,
        *,
        bracket: int,
        milestone: float,
        values: Sequence[float],
        decide: Callable[[list[tuple[float, ...]]], RungVerdict],
        iteration: int | None = None,
        at_end: bool = False,
    ) -> RungDecision:
        """MOASHA's :meth:`record_rung`: the trial's metric ``values`` (in the order of its
        metrics; NaN is kept) at a rung, judged exactly once, the same way. ``decide`` gets the
        vectors the run's trials recorded at this bracket and milestone before, in the order they
        were recorded (MOASHA's ranking depends on it). The row's ``value`` is NULL."""
        _check_id("Trial id", trial_id)
        numbers = [_check_rung_args(trial_id, bracket, milestone, v, iteration) for v in values]
        operation = (
            f"record trial {trial_id}'s metric values at bracket {bracket}, milestone {milestone} "
            f"of experiment run {experiment_run_id}"
        )
        row = {
            "experiment_run_id": experiment_run_id,
            "trial_id": trial_id,
            "bracket": bracket,
            "milestone": float(milestone),
            "iteration": iteration,
            "value": None,
            "metric_values": _encode_vector(numbers),
        }
        return self._rung_verdicts.record(
            session,
            experiment_run_id,
            trial_id,
            _VectorRung(self, row, decide, operation),
            at_end=at_end,
            operation=operation,
        )


def trial_rungs_query(trial_id: str) -> Any:
    """The query of a trial's rung rows, lowest milestone first."""
    return select(_RUNGS).where(_RUNGS.c.trial_id == trial_id).order_by(_RUNGS.c.milestone)


def trial_rungs_in(session: Session, trial_id: str) -> list[RungDecision]:
    """The trial's rung records, lowest milestone first (none for an unknown trial)."""
    rows = session.execute(trial_rungs_query(trial_id))
    return [rung_decision(row._mapping, fresh=False) for row in rows]


def rung_values(
    session: Session, experiment_run_id: int, bracket: int, milestone: float
) -> ValueList:
    """Every value the run's trials recorded at a rung (NaN for NaN), e.g. for a cutoff."""
    values = session.execute(
        select(_RUNGS.c.value).where(
            _RUNGS.c.experiment_run_id == experiment_run_id,
            _RUNGS.c.bracket == bracket,
            _RUNGS.c.milestone == float(milestone),
        )
    ).scalars()
    return ValueList(math.nan if v is None else float(v) for v in values)


def rung_vectors(
    session: Session, experiment_run_id: int, bracket: int, milestone: float
) -> list[tuple[float, ...]]:
    """The metric vectors the run's trials recorded at a rung, in the order recorded."""
    return _vectors_at(session, experiment_run_id, bracket, float(milestone))


class _Rung:
    """A result reaching a rung, as :class:`~airflow_trials.store.judged_once.JudgedOnce`
    records it."""

    def __init__(
        self, store: RungsStore, row: dict[str, Any], decide: RungDecide, operation: str
    ) -> None:
        self._store, self._row, self._decide, self._operation = store, row, decide, operation

    def stored(self, session: Session) -> RungDecision | None:
        stored = _stored_rung(session, self._row["trial_id"], self._row["milestone"])
        if stored is None:
            return None
        return _checked_bracket(stored, self._row["bracket"], self._operation)

    def decide(self, session: Session) -> tuple[Decision, str | None]:
        row = self._row
        verdict = self._decide(
            _RungValuesInDB(session, row["experiment_run_id"], row["bracket"], row["milestone"])
        )
        _check_verdict(verdict, self._operation)
        return verdict.decision, verdict.reason

    def write(self, session: Session, verdict: dict[str, Any]) -> RungDecision:
        row = {**self._row, **verdict}
        inserted = session.execute(
            self._store._insert(_RUNGS)
            .values(**row)
            .on_conflict_do_nothing(index_elements=[_RUNGS.c.trial_id, _RUNGS.c.milestone])
            .returning(_RUNGS.c.id)
        ).scalar_one_or_none()
        if inserted is not None:
            return rung_decision(row, fresh=True)
        # The same trial's other writer, holding another bracket's lock, won.
        stored = _stored_rung(session, row["trial_id"], row["milestone"])
        if stored is None:  # and its trial was deleted since
            self._store._find_or_raise(session, row["trial_id"], self._operation)
            raise StoreError(
                f"Cannot {self._operation}: the trial's row at this milestone vanished "
                "meanwhile; retry."
            )
        return _checked_bracket(stored, row["bracket"], self._operation)


def _stored_rung(session: Session, trial_id: str, milestone: float) -> RungDecision | None:
    row = session.execute(
        select(_RUNGS).where(_RUNGS.c.trial_id == trial_id, _RUNGS.c.milestone == milestone)
    ).one_or_none()
    return None if row is None else rung_decision(row._mapping, fresh=False)


class _RungValuesInDB:
    """:class:`~airflow_trials.schedulers.asha.rung_math.RungValues` of one rung, answered by the
    rung's index: one count, then only the values a cutoff interpolates between, however many are
    stored."""

    def __init__(
        self, session: Session, experiment_run_id: int, bracket: int, milestone: float
    ) -> None:
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
            first, last = self.numeric - 1 - last, self.numeric - 1 - first
            descending, flipped = not descending, True
        else:
            flipped = False
        order = _RUNGS.c.value.desc() if descending else _RUNGS.c.value.asc()
        values = list(
            self._connection.execute(
                select(_RUNGS.c.value)
                .where(*self._where, _RUNGS.c.value.is_not(None))
                .order_by(order)
                .offset(first)
                .limit(last - first + 1)
            ).scalars()
        )
        return values[::-1] if flipped else values


def _check_rung_args(
    trial_id: str, bracket: Any, milestone: Any, value: Any, iteration: Any
) -> float:
    """``value`` as a float, once the arguments are known to be what a rung row takes
    (ValueError)."""
    for name, number in (("bracket", bracket), ("iteration", iteration)):
        if number is None and name == "iteration":
            continue
        if isinstance(number, bool) or not isinstance(number, numbers.Integral) or number < 0:
            raise ValueError(
                f"The {name} of trial {trial_id}'s rung must be an integer >= 0, got {number!r}."
            )
    for name, number in (("milestone", milestone), ("value", value)):
        if isinstance(number, bool) or not isinstance(number, numbers.Real):
            raise ValueError(
                f"The {name} of trial {trial_id}'s rung must be a number, got {number!r}."
            )
    if not (math.isfinite(milestone) and milestone > 0):
        raise ValueError(
            f"The milestone of trial {trial_id}'s rung must be a finite number > 0, got "
            f"{milestone!r}."
        )
    return float(value)


def _check_verdict(verdict: Any, operation: str) -> None:
    if not isinstance(verdict, RungVerdict) or verdict.decision not in VERDICTS:
        raise ValueError(
            f"Cannot {operation}: decide returned {verdict!r}, not a RungVerdict of CONTINUE or "
            "STOP; pass AshaRungs.decide(...) or a function like it. Nothing was written."
        )


def _checked_bracket(stored: RungDecision, bracket: int, operation: str) -> RungDecision:
    if stored.bracket != bracket:
        raise ValueError(
            f"Cannot {operation}: the trial was recorded there in bracket {stored.bracket}; a "
            "trial stays in the bracket it was drawn into, so pass the bracket its earlier rungs "
            "have."
        )
    return stored


class _VectorRung(_Rung):
    """A result's metric values reaching a rung: judged from the rung's vectors in the order
    recorded."""

    def __init__(
        self,
        store: RungsStore,
        row: dict[str, Any],
        decide: Callable[[list[tuple[float, ...]]], RungVerdict],
        operation: str,
    ) -> None:
        self._store, self._row, self._decide_vector, self._operation = (
            store,
            row,
            decide,
            operation,
        )

    def decide(self, session: Session) -> tuple[Decision, str | None]:
        row = self._row
        before = _vectors_at(session, row["experiment_run_id"], row["bracket"], row["milestone"])
        verdict = self._decide_vector(before)
        _check_verdict(verdict, self._operation)
        return verdict.decision, verdict.reason


def _vectors_at(
    session: Session, experiment_run_id: int, bracket: int, milestone: float
) -> list[tuple[float, ...]]:
    # The id orders rows as they were committed: writers of one rung take turns under its lock.
    stored = session.execute(
        select(_RUNGS.c.metric_values)
        .where(
            _RUNGS.c.experiment_run_id == experiment_run_id,
            _RUNGS.c.bracket == bracket,
            _RUNGS.c.milestone == milestone,
            _RUNGS.c.metric_values.is_not(None),
        )
        .order_by(_RUNGS.c.id)
    ).scalars()
    return [_decode_vector(text) for text in stored]


def _encode_vector(values: Sequence[float]) -> str:
    # JSON has no NaN (PostgreSQL's parser refuses it): null stands for it.
    return json.dumps([None if math.isnan(v) else v for v in values], separators=(",", ":"))


def _decode_vector(text: str) -> tuple[float, ...]:
    return tuple(math.nan if v is None else float(v) for v in json.loads(text))
