"""Errors raised by airflow_trials; every one derives from AirflowTrialsError.

InsufficientResourcesError, which carries Resources, lives beside them in
:mod:`airflow_trials.core.resources`, so that this module imports nothing of the package."""

from __future__ import annotations


class AirflowTrialsError(Exception):
    """Base class of every error airflow_trials raises on purpose."""


class InvalidTransitionError(AirflowTrialsError, ValueError):
    """A trial was asked to move to a status its current status cannot reach."""


class TrainableNotFoundError(AirflowTrialsError, ImportError):
    """A trainable import path ("pkg.module:name") does not resolve to a callable or class."""


class TrialError(AirflowTrialsError):
    """A trial failed: its trainable raised, returned without reporting, or its actor died.

    :param trial_id: the failed trial.
    :param traceback_text: the full remote traceback, when there is one.
    :param infrastructure: the trial was lost with its node, not through its own code; such a
        loss does not count against ``max_failures``. Default False.
    """

    def __init__(
        self,
        message: str,
        trial_id: str | None = None,
        traceback_text: str | None = None,
        infrastructure: bool = False,
    ):
        super().__init__(message)
        self.trial_id = trial_id
        self.traceback_text = traceback_text
        self.infrastructure = infrastructure

    def __reduce__(self):  # type: ignore[no-untyped-def]
        # Keep trial_id and the traceback when Ray ships the error from the actor to the driver.
        return (type(self), (str(self), self.trial_id, self.traceback_text, self.infrastructure))


class RayUnavailableError(AirflowTrialsError):
    """Ray did not answer: its head is down or restarting, or the address is wrong."""


class RegressionError(AirflowTrialsError):
    """A run's best is worse than the previous successful run's by more than the experiment's
    ``regression_tolerance`` (the ``check_regression`` task)."""


class ExportError(AirflowTrialsError):
    """A run could not be exported to another tool (MLflow): the tool is not installed, not
    reachable, or refused what was sent."""


class RunnerFinishedError(AirflowTrialsError):
    """``TrialRunner.step()`` was called after every trial had finished."""


class SearcherError(AirflowTrialsError):
    """A search algorithm raised or broke its contract; the runner ended the experiment."""


class CheckpointError(AirflowTrialsError):
    """A checkpoint could not be written, read, copied or deleted."""


class CheckpointNotFoundError(CheckpointError):
    """A checkpoint is not on the storage (deleted, or never there): a storage matter, never a
    failure of the trial that was to start from it."""


class CheckpointStorageError(CheckpointError):
    """The checkpoint storage did not take a checkpoint: an object store that did not answer
    within its client's retries. A storage matter, never a failure of the trial: the trial's
    task resumes it from its last saved checkpoint without spending one of its max_failures."""


class OutsideStorageRootError(AirflowTrialsError, PermissionError):
    """A path a record or a trainable named is not inside the storage root, or is a symlink or
    not a regular file: it is not read, served, deleted or uploaded."""


class ExperimentStateError(AirflowTrialsError):
    """Saved experiment state is missing or unreadable, so the experiment cannot resume."""


class StoreError(AirflowTrialsError):
    """The metadata store could not read or write: the database failed or refused the change.

    :param message: the whole error, for logs and the operator's CLI; it may name the database's
        host, user and driver (never its password).
    :param fix: what to do, naming none of those, for a user who may not see them (the
        dashboard); default None, a generic fix.
    """

    def __init__(self, message: str, *, fix: str | None = None):
        super().__init__(message)
        self.fix = fix


class ExperimentNotFoundError(AirflowTrialsError, LookupError):
    """The metadata store has no such experiment, or the experiment has no such run."""


class TrialNotFoundError(StoreError, KeyError):
    """The metadata store has no trial with this id.

    :param trial_id: the id that was looked up.
    """

    def __init__(self, message: str, trial_id: str | None = None):
        super().__init__(message)
        self.trial_id = trial_id

    def __str__(self) -> str:
        # KeyError would print the message quoted, as if it were the missing key.
        return str(self.args[0]) if self.args else ""

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (type(self), (str(self), self.trial_id))


class ExtensionRefusedError(AirflowTrialsError, ValueError):
    """An extension of a finished experiment run was refused (``airflow-trials extend``): the
    message says which run, why, and what to do; nothing was written."""
