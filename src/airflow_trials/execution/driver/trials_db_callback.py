"""TrialsDbCallback: records a TrialRunner's experiment in the trials DB, as a DAG run's trials are.

With it, an engine-only run (no Airflow) is one more experiment run in the trials DB: the CLI, the
dashboard and :class:`~airflow_trials.results.ResultGrid` read it exactly as they read a DAG run.

Example::

    from airflow_trials import ResultGrid, TrialRunner, TrialsDbCallback

    recorder = TrialsDbCallback(metric="val_loss", mode="min")
    runner = TrialRunner("mnist", callbacks=[recorder])
    ...                                    # runner.add_trial(...) for each config
    runner.run()
    best = recorder.result_grid().get_best_result()
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from airflow_trials.core.callback import Callback
from airflow_trials.core.constraints import Constraints
from airflow_trials.core.end import TrialEnd
from airflow_trials.core.fate import FailureDecision, Outcome
from airflow_trials.core.pareto import MetricSpec, ModeSpec, check_metrics
from airflow_trials.core.result import CHECKPOINT, DUPLICATE, Result
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.trial import Trial
from airflow_trials.core.update import KeptCheckpoint, TrialUpdate
from airflow_trials.execution.driver.write_behind import WriteBehind
from airflow_trials.execution.polls import TrialProgressTracker
from airflow_trials.schedulers.pbt.pbt_scheduler import Exploit
from airflow_trials.store.store import TrialStore

if TYPE_CHECKING:
    from airflow_trials.results import ResultGrid


class TrialsDbCallback(Callback):
    """Writes every trial of a :class:`~airflow_trials.TrialRunner` run to the trials DB.

    The run is created when its first trial starts, under the trials' experiment name. Results and
    checkpoints are written in one transaction per runner step (only the trials that changed), or
    at most every ``flush_interval_s`` when that is given,
    each trial's end as the Airflow path writes it (``TrialStore.record_progress``), and each PBT
    exploit, with the trial's new config, as it is applied (``TrialStore.record_exploit``). Store
    errors are not swallowed: after the store's own retries they stop the runner.

    :param metric: the metric the experiment's leaderboard ranks by; default none (then pass
        ``metric`` to the readers). A list records several at once
        (``metric=["val_acc", "latency"], mode=["max", "min"]``): ``ResultGrid.get_pareto_front``
        then defaults to them.
    :param mode: ``"min"`` or ``"max"``, or with several metrics a list of one per metric, in
        the same order; default none.
    :param constraints: the search's constraints on reported metrics (``["latency <= 5.0"]``,
        :mod:`airflow_trials.core.constraints`), recorded with the experiment so that its
        leaderboards and ``ResultGrid.from_db`` rank feasible trials first; default: those of the
        runner's ``search_alg`` (``OptunaSearch(constraints=...)``), which the
        :class:`~airflow_trials.TrialRunner` hands over (:meth:`take_constraints`), else none.
    :param db_url: the trials DB; default: found as the DAGs find it (the ``trials_default``
        connection, else ``AIRFLOW_TRIALS_DB_URL``, else the default SQLite file:
        :func:`airflow_trials.trials_db_url.trials_db_url`). Its schema is created or upgraded on
        first use.
    :param run_key: names this run among the experiment's runs; default ``runner__<UTC time>``.
        Give the same key when resuming a runner (``TrialRunner(resume=True)``) so the resumed
        trials continue their rows.
    :param store: an open :class:`~airflow_trials.store.TrialStore` to use instead of ``db_url``.
    :param flush_interval_s: write the changed trials' results and checkpoints at most this often,
        in one transaction for all of them, rather than after every step; a trial's end is written
        at once, after its last results. A sweep of short trials uses it (a step per result would
        make as many commits). Default 0: after every step.
    :param write_behind: apply the writes on a thread of its own
        (:class:`~airflow_trials.execution.driver.write_behind.WriteBehind`), in the same order, so
        that
        the runner's loop never waits for the DB; a sweep's driver uses it. A failed write still
        stops the runner, at its next event. Default False.
    """

    def __init__(
        self,
        *,
        metric: MetricSpec | None = None,
        mode: ModeSpec | None = None,
        db_url: str | None = None,
        run_key: str | None = None,
        store: TrialStore | None = None,
        flush_interval_s: float = 0.0,
        write_behind: bool = False,
        constraints: Sequence[str] | Constraints | None = None,
    ) -> None:
        if (metric is None) != (mode is None):
            raise ValueError(
                f"TrialsDbCallback got metric={metric!r} and mode={mode!r}; give both (e.g. "
                "metric='val_loss', mode='min') or neither."
            )
        if store is not None and db_url is not None:
            raise ValueError("TrialsDbCallback takes db_url or store, not both.")
        metric, mode = check_metrics("TrialsDbCallback", metric, mode)
        if isinstance(mode, str) and mode not in ("min", "max"):
            raise ValueError(
                f"TrialsDbCallback got mode={mode!r}; give 'min' (lower is better) or 'max'."
            )
        self.metric: MetricSpec | None = metric
        self.mode: ModeSpec | None = mode
        self.constraints: Constraints | None = (
            None if constraints is None else Constraints.parse(constraints, "TrialsDbCallback")
        )
        self.run_key = (
            run_key
            or f"runner__{datetime.datetime.now(datetime.UTC).isoformat(timespec='seconds')}"
        )
        self._db_url = db_url
        self._store = store
        self.experiment_name: str | None = None
        self.experiment_run_id: int | None = None
        self._trackers: dict[str, TrialProgressTracker] = {}
        # trial id -> the version of its kept checkpoints the trials DB holds (set once committed)
        self._recorded_versions: dict[str, int] = {}
        self._pending: dict[str, list[Result]] = {}
        self._dirty: dict[str, Trial] = {}
        self.flush_interval_s = flush_interval_s
        self._flushed_at = float("-inf")
        self._any_terminated = False  # a runner that forgets ended trials no longer lists them
        self._writer = WriteBehind(f"TrialsDbCallback {self.run_key}") if write_behind else None

    def _write(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Call the store now, or queue the call on the write-behind thread."""
        if self._writer is not None:
            self._writer.submit(fn, *args, **kwargs)
        else:
            fn(*args, **kwargs)

    def drain(self) -> None:
        """Return once every write so far is in the trials DB (at once without write-behind)."""
        if self._writer is not None:
            self._writer.drain()

    @property
    def store(self) -> TrialStore:
        if self._store is None:
            from airflow_trials.trials_db_url import trials_db_url

            self._store = TrialStore(self._db_url or trials_db_url()[0], create=True)
        return self._store

    # -- the runner's events -----------------------------------------------------------------
    def on_trial_start(self, trial: Trial) -> None:
        run_id = self._ensure_run(trial.experiment_name)
        self._write(
            self.store.upsert_trial,
            trial.trial_id,
            trainable=trial.trainable,
            config=dict(trial.config),
            resources=trial.resources,
            max_failures=trial.max_failures,
            experiment_run_id=run_id,
        )
        self._recorded_versions.setdefault(trial.trial_id, 0)  # names its checkpoints from now on
        tracker = self._trackers.setdefault(trial.trial_id, TrialProgressTracker(trial.trial_id))
        tracker.placed = False  # (again) RUNNING: a recovered trial was recorded PENDING
        self._dirty[trial.trial_id] = trial

    def on_trial_result(self, trial: Trial, result: Result) -> None:
        row = {k: v for k, v in result.items() if k != DUPLICATE}
        if isinstance(row.get(CHECKPOINT), dict):
            row[CHECKPOINT] = row[CHECKPOINT].get("path")
        self._pending.setdefault(trial.trial_id, []).append(row)
        self._dirty[trial.trial_id] = trial

    def on_checkpoint(self, trial: Trial, checkpoint: Any) -> None:
        self._dirty[trial.trial_id] = trial

    def checkpoints_recorded(self, trial: Trial) -> int | None:
        """The version of the trial's kept checkpoints the trials DB holds (committed, behind the
        writes queued); None for a trial this callback never recorded."""
        version = self._recorded_versions.get(trial.trial_id)
        if version is None:
            return None
        if trial.status.is_terminal() and version >= trial.checkpoint_manager.version:
            del self._recorded_versions[
                trial.trial_id
            ]  # final: keeps a 100,000-trial sweep's memory flat
        return version

    def on_trial_exploit(self, trial: Trial, exploit: Exploit, old_config: dict[str, Any]) -> None:
        """Recorded at once (``TrialStore.record_exploit``), with the trial's new config."""
        if trial.trial_id not in self._trackers:
            return  # never started under this callback: the store has no row to attach it to
        # Its results so far (the pausing one may still wait for the step's batch) belong to the
        # state it gives up: write them first, so that the exploit keeps them in its row.
        self._flush(trial)
        checkpoint = exploit.donor_checkpoint
        self._write(
            self.store.record_exploit,
            trial.trial_id,
            iteration=checkpoint.iteration,
            donor_trial_id=exploit.donor_trial_id,
            donor_checkpoint=checkpoint.path,
            old_config=old_config,
            new_config=exploit.new_config,
            operations=exploit.operations,
        )

    def on_trial_pause(self, trial: Trial) -> None:
        """Recorded at once: its results so far, then PAUSED (``TrialStore.record_progress``); it
        is recorded RUNNING again when it resumes (:meth:`on_trial_start`)."""
        if trial.trial_id not in self._trackers:
            return  # never started under this callback: the store has no row to pause
        self._flush(trial)
        self._write(
            self.store.record_progress, [TrialUpdate(trial.trial_id, status=TrialStatus.PAUSED)]
        )

    def on_step_end(self, trials: list[Trial]) -> None:
        if time.monotonic() - self._flushed_at >= self.flush_interval_s:
            self._flush()
            self._flushed_at = time.monotonic()

    def on_trial_recover(self, trial: Trial) -> None:
        self._record_end(
            trial,
            FailureDecision(
                Outcome.RETRY,
                trial.num_failures,
                False,
                f"Trial {trial.trial_id} failed; the runner retries it.",
            ),
        )

    def on_trial_error(self, trial: Trial) -> None:
        self._record_end(
            trial,
            FailureDecision(
                Outcome.FAIL, trial.num_failures, False, f"Trial {trial.trial_id} failed for good."
            ),
        )
        self._trackers.pop(
            trial.trial_id, None
        )  # ended: nothing more to track (10,000 trials in a sweep)
        self._write(self._forget_version, trial)

    def on_trial_complete(self, trial: Trial) -> None:
        self._any_terminated |= trial.status is TrialStatus.TERMINATED
        self._record_end(trial, None)
        self._trackers.pop(trial.trial_id, None)
        self._write(self._forget_version, trial)

    def _forget_version(self, trial: Trial) -> None:
        """Once its end is written: an ended trial that retired no checkpoint is never asked
        about again (:meth:`checkpoints_recorded` forgets the others when their last is
        released), so a 100,000-trial sweep keeps no entry per ended trial."""
        if not trial.checkpoint_manager.retired:
            self._recorded_versions.pop(trial.trial_id, None)

    def on_experiment_end(self, trials: list[Trial]) -> None:
        self._flush()
        if self.experiment_run_id is not None:
            finished = self._any_terminated or any(
                t.status is TrialStatus.TERMINATED for t in trials
            )
            self._write(
                self.store.finish_experiment_run,
                self.experiment_run_id,
                "SUCCESS" if finished else "FAILED",
            )
        try:
            self.drain()
        finally:
            self.close()

    def close(self) -> None:
        """End the write-behind thread once it applied what is queued (it raises nothing: a runner
        that failed keeps what it recorded before). A no-op without write-behind."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def take_constraints(self, constraints: Constraints) -> None:
        """The runner's searcher's constraints, recorded unless this callback was given its own
        (``constraints=``)."""
        if self.constraints is None and constraints:
            self.constraints = constraints

    # -- reading it back ---------------------------------------------------------------------
    def result_grid(self) -> ResultGrid:
        """This run's :class:`~airflow_trials.results.ResultGrid`, read from the trials DB."""
        from airflow_trials.results import ResultGrid

        if self.experiment_name is None:
            raise ValueError(
                "TrialsDbCallback has recorded no trial yet: run the TrialRunner first."
            )
        self.drain()
        return ResultGrid.from_db(self.experiment_name, self.run_key, store=self.store)

    # -- internals ---------------------------------------------------------------------------
    def _ensure_run(self, experiment_name: str) -> int:
        if self.experiment_run_id is None:
            self.store.ensure_experiment(
                experiment_name, metric=self.metric, mode=self.mode, constraints=self.constraints
            )
            self.experiment_run_id = self.store.create_experiment_run(experiment_name, self.run_key)
            self.experiment_name = experiment_name
        elif experiment_name != self.experiment_name:
            raise ValueError(
                f"TrialsDbCallback records run {self.run_key} of experiment "
                f"{self.experiment_name}, but trial "
                f"of experiment {experiment_name} started; use one callback per experiment."
            )
        return self.experiment_run_id

    def _progress(self, trial: Trial) -> TrialUpdate | None:
        manager = trial.checkpoint_manager
        update = TrialUpdate(
            trial.trial_id,
            results=self._pending.get(trial.trial_id, []),
            kept_checkpoints=[
                KeptCheckpoint(r.path, r.iteration, manager.score_value(r)) for r in manager.kept
            ],
        )
        return self._trackers[trial.trial_id].progress(update)

    def _flush(self, only: Trial | None = None) -> None:
        trials = [only] if only is not None else list(self._dirty.values())
        batch = [
            (t, item)
            for t in trials
            if t.trial_id in self._trackers
            for item in [self._progress(t)]
            if item is not None
        ]
        if batch:
            self._write(self.store.record_progress, [item for _, item in batch])
        for trial, item in batch:
            self._trackers[trial.trial_id].written(item)
        versions = {
            t.trial_id: t.checkpoint_manager.version for t in trials if t.trial_id in self._trackers
        }
        if versions:  # applied after the writes above, and only if they were
            self._write(self._recorded_versions.update, versions)
        for trial in trials:
            self._pending.pop(trial.trial_id, None)
            self._dirty.pop(trial.trial_id, None)

    def _record_end(self, trial: Trial, decision: FailureDecision | None) -> None:
        if trial.trial_id not in self._trackers:
            return  # ended before it ever started (a stopped PENDING trial): nothing recorded
        self._flush(trial)
        best = trial.checkpoint_manager.best()
        end = TrialEnd(
            trial_id=trial.trial_id,
            experiment_name=trial.experiment_name,
            status=TrialStatus.TERMINATED if decision is None else TrialStatus.ERROR,
            error=trial.error_msg if decision is not None else None,
            last_result={
                k: v
                for k, v in trial.last_result.items()
                if isinstance(v, (int, float, str, bool)) or v is None
            }
            or None,
            best_checkpoint=best.path if best is not None else None,
            stop_reason=trial.stop_reason if decision is None else None,
            stop_kind=trial.stop_kind if decision is None else None,
        )
        # The same write as the triggerer's poller and the trial's watch (record_progress).
        self._write(self.store.record_progress, [TrialUpdate.of_end(end, decision)])
