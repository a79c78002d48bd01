"""RunDecisionsReader: what a run's schedulers decided, for the whole run in one query each: the
rungs ASHA, HyperBand and MOASHA judged its trials at, and PBT's exploits between its trials."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import and_, func, select

from airflow_trials.core.scheduler import Decision
from airflow_trials.store.database import Database
from airflow_trials.store.models import TrialExploitRow, TrialRow, TrialRungRow
from airflow_trials.store.rungs import _decode_vector

_RUNGS = TrialRungRow.__table__
_EXPLOITS = TrialExploitRow.__table__
_TRIALS = TrialRow.__table__


@dataclass(frozen=True)
class RunRung:
    """One trial's record at one rung, as the run-level views read it.

    :param trial_id: the trial.
    :param bracket: its ASHA bracket (0 with one bracket).
    :param milestone: the rung, in the scheduler's ``time_attr`` units.
    :param iteration: training_iteration of the result that reached it; None when not recorded.
    :param value: the metric it reached the rung with (NaN for NaN); MOASHA's rows: its first
        metric.
    :param values: MOASHA's metric vector at the rung (NaN for NaN); None on ASHA's rows.
    :param decision: STOP or CONTINUE.
    :param reason: why, as the scheduler said it; a STOP's names the rung's cutoff then.
    :param at_end: recorded when the trial ended (its last value); the verdict was not acted on.
    """

    trial_id: str
    bracket: int
    milestone: float
    iteration: int | None
    value: float
    values: tuple[float, ...] | None
    decision: Decision
    reason: str | None
    at_end: bool

    @property
    def stopped(self) -> bool:
        """The rung stopped the trial (a verdict recorded at the trial's end stops nothing)."""
        return self.decision is Decision.STOP and not self.at_end


@dataclass(frozen=True)
class RunExploit:
    """One PBT exploit between a run's trials: ``trial_id`` continued from ``donor_trial_id``'s
    checkpoint at ``iteration`` with ``new_config`` (the record without the results it replaced).

    :param id: the exploit's id; later exploits have larger ids.
    :param trial_id: the trial that took over the donor's state.
    :param donor_trial_id: the trial it copied.
    :param iteration: training_iteration of the donor's checkpoint.
    :param donor_checkpoint: its path.
    :param old_config: the trial's config before.
    :param new_config: its config after: the donor's, explored.
    :param operations: dotted config key -> what explore did, e.g. ``{"lr": "0.01 * 1.2"}``.
    :param created_at: when it was recorded (UTC).
    """

    id: int
    trial_id: str
    donor_trial_id: str
    iteration: int
    donor_checkpoint: str
    old_config: dict[str, Any]
    new_config: dict[str, Any]
    operations: dict[str, str]
    created_at: datetime


@dataclass(frozen=True)
class RunDecisionCounts:
    """How much a run's schedulers recorded, for a page to say whether it has decisions to show.

    :param rungs: rung records of its trials (ASHA, HyperBand, MOASHA).
    :param stopped: of those, the verdicts that stopped a trial.
    :param exploits: PBT exploits of its trials.
    """

    rungs: int
    stopped: int
    exploits: int

    def __bool__(self) -> bool:
        return bool(self.rungs or self.exploits)


class RunDecisionsReader:
    """The run-level reads of scheduler decisions, one query and one attempt each (a page is asked
    for again); :class:`~airflow_trials.store.TrialReader` hands out its methods as its own.

    :param db: the reader's database.
    """

    def __init__(self, db: Database) -> None:
        self._db = db

    def run_rungs(self, run_pk: int) -> list[RunRung]:
        """Every rung record of the run's trials, by bracket, milestone, then in the order
        recorded (so a rung's last STOP holds its latest cutoff); empty for an unknown run."""
        query = (
            select(
                _RUNGS.c.trial_id,
                _RUNGS.c.bracket,
                _RUNGS.c.milestone,
                _RUNGS.c.iteration,
                _RUNGS.c.value,
                _RUNGS.c.metric_values,
                _RUNGS.c.decision,
                _RUNGS.c.reason,
                _RUNGS.c.at_end,
            )
            .where(_RUNGS.c.experiment_run_id == run_pk)
            .order_by(_RUNGS.c.bracket, _RUNGS.c.milestone, _RUNGS.c.id)
        )
        with self._db.session_scope(f"read the rungs of experiment run {run_pk}", write=False) as s:
            return [_run_rung(row) for row in s.execute(query)]

    def run_exploits(self, run_pk: int) -> list[RunExploit]:
        """Every PBT exploit of the run's trials, oldest first; empty for an unknown run."""
        query = (
            select(
                _EXPLOITS.c.id,
                _EXPLOITS.c.trial_id,
                _EXPLOITS.c.donor_trial_id,
                _EXPLOITS.c.iteration,
                _EXPLOITS.c.donor_checkpoint,
                _EXPLOITS.c.old_config,
                _EXPLOITS.c.new_config,
                _EXPLOITS.c.operations,
                _EXPLOITS.c.created_at,
            )
            .join(_TRIALS, _TRIALS.c.trial_id == _EXPLOITS.c.trial_id)
            .where(_TRIALS.c.experiment_run_id == run_pk)
            .order_by(_EXPLOITS.c.id)
        )
        with self._db.session_scope(
            f"read the exploits of experiment run {run_pk}", write=False
        ) as session:
            return [RunExploit(**row._mapping) for row in session.execute(query)]

    def run_decision_counts(self, run_pk: int) -> RunDecisionCounts:
        """How many rung records, stopping verdicts and exploits the run's trials have, in one
        query of counts (the rungs' run index, the trials' run index)."""
        of_run = _RUNGS.c.experiment_run_id == run_pk
        stopped = and_(of_run, _RUNGS.c.decision == Decision.STOP.value, ~_RUNGS.c.at_end)
        query = select(
            select(func.count()).select_from(_RUNGS).where(of_run).scalar_subquery(),
            select(func.count()).select_from(_RUNGS).where(stopped).scalar_subquery(),
            select(func.count())
            .select_from(_EXPLOITS.join(_TRIALS, _TRIALS.c.trial_id == _EXPLOITS.c.trial_id))
            .where(_TRIALS.c.experiment_run_id == run_pk)
            .scalar_subquery(),
        )
        with self._db.session_scope(
            f"count the scheduler decisions of experiment run {run_pk}", write=False
        ) as session:
            rungs, stops, exploits = session.execute(query).one()
        return RunDecisionCounts(int(rungs), int(stops), int(exploits))


def _run_rung(row: Any) -> RunRung:
    values = None if row.metric_values is None else _decode_vector(row.metric_values)
    if values is not None:
        value = values[0] if values else math.nan
    else:
        value = math.nan if row.value is None else float(row.value)
    return RunRung(
        trial_id=row.trial_id,
        bracket=int(row.bracket),
        milestone=float(row.milestone),
        iteration=row.iteration,
        value=value,
        values=values,
        decision=Decision(row.decision),
        reason=row.reason,
        at_end=bool(row.at_end),
    )
