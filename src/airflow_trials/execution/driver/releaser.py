"""CheckpointReleaser: deletes the checkpoints a runner's trials dropped once no record names them.

A runner's trials are resumed from records written after the fact: its experiment state (saved
every ``checkpoint_period_s``) and the trials DB
(:class:`~airflow_trials.execution.driver.trials_db_callback.
TrialsDbCallback`, which may write behind). A checkpoint the keep policy dropped may be the one
such a record still names, so it is deleted only once every record was rewritten without it:
each recorder says which version of a trial's kept set it holds
(:meth:`~airflow_trials.core.callback.Callback.checkpoints_recorded`), and the trial's retired
checkpoints up to the lowest of those versions are deleted
(:meth:`~airflow_trials.core.checkpoint.CheckpointManager.release`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from airflow_trials.core.callback import Callback
from airflow_trials.core.trial import Trial
from airflow_trials.storage.trial_storage import TrialStorage


class CheckpointReleaser:
    """Which of a runner's trials hold retired checkpoints, and what its own saved state names.

    :param storage: where the checkpoints are.
    :param saves_state: the runner saves its experiment state periodically, so that state is a
        record a resume reads (False for a sweep's driver, which resumes from the trials DB).
    """

    def __init__(self, storage: TrialStorage, saves_state: bool) -> None:
        self.storage = storage
        self.saves_state = saves_state
        self._retiring: dict[str, Trial] = {}
        self._state_versions: dict[str, int] = {}

    def note(self, trial: Trial) -> None:
        """``trial`` registered a checkpoint: remember it if that retired others."""
        if trial.checkpoint_manager.retired:
            self._retiring[trial.trial_id] = trial

    def state_saved(self, trials: Iterable[Trial]) -> None:
        """The runner's experiment state now names each trial's kept set as it is."""
        if self.saves_state:
            self._state_versions = {t.trial_id: t.checkpoint_manager.version for t in trials}

    def release(self, callbacks: Sequence[Callback], trials: Iterable[Trial] = ()) -> list[str]:
        """Delete what the noted trials (and ``trials``) retired and no record names any more;
        returns the paths deleted. A deletion that fails is logged: the checkpoint only stays."""
        for trial in trials:
            self.note(trial)
        deleted: list[str] = []
        for trial_id, trial in list(self._retiring.items()):
            released = trial.checkpoint_manager.release(self._recorded_version(trial, callbacks))
            deleted += self.storage.delete_released(trial_id, (record.path for record in released))
            if not trial.checkpoint_manager.retired:
                del self._retiring[trial_id]
        return deleted

    def _recorded_version(self, trial: Trial, callbacks: Sequence[Callback]) -> int | None:
        """The lowest version of the trial's kept set that a record holds (None: no record names
        its checkpoints)."""
        versions = [
            v for callback in callbacks if (v := callback.checkpoints_recorded(trial)) is not None
        ]
        if self.saves_state:
            versions.append(self._state_versions.get(trial.trial_id, 0))
        return min(versions) if versions else None
