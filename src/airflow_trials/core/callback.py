"""Callbacks the trial runner calls as trials start, report, checkpoint and end."""

from __future__ import annotations

from typing import Any

from airflow_trials.core.checkpoint import CheckpointRecord
from airflow_trials.core.result import Result
from airflow_trials.core.scheduler import Exploit
from airflow_trials.core.trial import Trial


class Callback:
    """Override the hooks you need; each gets the live :class:`Trial` (read it, don't change it)."""

    def on_trial_start(self, trial: Trial) -> None:
        pass

    def on_trial_result(self, trial: Trial, result: Result) -> None:
        """Called once per recorded result (replays after a restore are not passed again)."""

    def on_checkpoint(self, trial: Trial, checkpoint: CheckpointRecord) -> None:
        pass

    def checkpoints_recorded(self, trial: Trial) -> int | None:
        """For a callback that records checkpoints where a resume reads them (the trials DB): the
        ``checkpoint_manager.version`` of the trial's kept set it has durably written. The runner
        deletes a checkpoint the trial dropped only once every such record was rewritten without
        it. Default None: this callback names no checkpoint."""
        return None

    def on_trial_exploit(self, trial: Trial, exploit: Exploit, old_config: dict[str, Any]) -> None:
        """PopulationBasedTraining's exploit was applied: the paused ``trial`` now continues from
        a copy of ``exploit.donor_checkpoint`` with ``exploit.new_config`` (its config already);
        ``old_config`` is the config it had before."""

    def on_trial_pause(self, trial: Trial) -> None:
        """Its scheduler paused the trial (PAUSED: checkpointed, its resources freed); it resumes
        later, with :meth:`on_trial_start` again (PopulationBasedTraining, HyperBand)."""

    def on_trial_recover(self, trial: Trial) -> None:
        """The trial failed and goes back to PENDING to retry from its latest checkpoint."""

    def on_trial_error(self, trial: Trial) -> None:
        pass

    def on_trial_complete(self, trial: Trial) -> None:
        pass

    def on_step_end(self, trials: list[Trial]) -> None:
        pass

    def on_experiment_end(self, trials: list[Trial]) -> None:
        pass
