"""The typed changes ``TrialStore.record_transition`` takes beyond a plain
:class:`~airflow_trials.core.fate.Transition`, and what it answers."""

from __future__ import annotations

from dataclasses import dataclass

from airflow_trials.core.fate import Transition
from airflow_trials.core.status import TrialStatus


@dataclass(frozen=True)
class StopForTry:
    """:attr:`Transition.STOPPED <airflow_trials.core.fate.Transition.STOPPED>` as one Airflow try
    of the trial's task asks for it: fenced by that try.

    The fence of a cleared task: its old try's trigger runs ``on_kill`` while its next try may
    already run ``execute``. Checked and written under the row lock, so either the stop is
    recorded first (the new try then starts the trial again from its latest checkpoint) or the new
    try's registration is (the stop is skipped, ``Recorded.applied`` is False, and the new try
    keeps the live trial). A trial that has ended already keeps its end.

    :param why: the message the stopped trial keeps.
    :param try_number: the try that stops it; None stops it whatever try registered it.
    """

    why: str
    try_number: int | None


@dataclass(frozen=True)
class RestartFromScratch:
    """A finished trial starts over from scratch: PENDING, with no failures, error, stop reason,
    last or best result, and its results, checkpoint rows, ASHA rungs, median points and PBT
    exploits deleted (its values leave the rungs and medians; verdicts other trials got meanwhile
    stand, and so do exploits that cloned it).

    For a task cleared after its trial ended: Airflow re-runs a cleared task, replacing its
    XComs, and the trial's results are replaced the same way. The caller deletes the files of
    ``Recorded.dropped_checkpoints``. A trial that has not ended raises InvalidTransitionError.

    :param try_number: the Airflow try that re-runs it; default None (unchanged). Fenced as a
        StopForTry is: from a try older than the registered one nothing changes (``applied``
        False), so the registered try never goes down.
    """

    try_number: int | None = None


@dataclass(frozen=True)
class ContinueWithRaisedStop:
    """A TERMINATED trial continues under a raised stopping criterion (an extension of its
    finished run, ``airflow-trials extend``): PENDING, keeping its results, checkpoints, best
    value, ASHA rungs and median points, so its next try resumes from its latest checkpoint and
    is judged at the rungs it has not reached. Its stop reason and end time are cleared.

    A trial that is not TERMINATED is left as it is (``Recorded.applied`` False): the extension
    continued it already (a retry), or it failed and is not the extension's to continue.

    :param extension: the DAG run that extends the trial's run (for the logs and errors).
    """

    extension: str


TrialTransition = Transition | StopForTry | RestartFromScratch | ContinueWithRaisedStop
"""What ``record_transition`` records: a plain transition, a fenced stop, a restart or a
continuation."""


@dataclass(frozen=True)
class Recorded:
    """What ``record_transition`` did.

    :param status: the status the trial has now.
    :param applied: False when a :class:`StopForTry` or a :class:`RestartFromScratch` was fenced
        off by a later try; default True.
    :param dropped_checkpoints: the checkpoint paths a :class:`RestartFromScratch` deleted the
        rows of, whose files the caller deletes; default none.
    """

    status: TrialStatus
    applied: bool = True
    dropped_checkpoints: tuple[str, ...] = ()
