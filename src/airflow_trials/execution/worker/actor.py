"""The per-trial Ray actor: runs one trainable, adds the engine's result fields, persists
checkpoints."""

from __future__ import annotations

import functools
import logging
import os
import socket
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from airflow_trials.core import result as R
from airflow_trials.core.checkpoint import CheckpointRecord
from airflow_trials.core.fate import Action, after_result
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.trial import Trial
from airflow_trials.exceptions import CheckpointNotFoundError, TrialError
from airflow_trials.execution.parameter_refs import parameters_key, resolve_parameters
from airflow_trials.execution.storage import TrialStorage
from airflow_trials.execution.trial_output import LogCapture, read_new_output
from airflow_trials.execution.worker.holds import Holds, HoldSpec
from airflow_trials.execution.worker.trainable import (
    ClassDriver,
    TrainableDriver,
    load_trainable,
    make_driver,
)

TrialSpec = dict[str, Any]
"""What an actor needs to run a trial: trial_id, experiment_name, trainable, config, and optionally
parameters (name -> ObjectRef of a ``with_parameters`` constant)."""

TrialSnapshot = dict[str, Any]
"""What ``TrialActor.poll`` returns: status, new results, checkpoints kept (and the version of that
set), error and counts; the new output lines when asked for, and where the logs were saved once
the trial ended."""

log = logging.getLogger(__name__)


def _reported_as_trial_error(method: Callable[..., Any]) -> Callable[..., Any]:
    """Turn an exception from the trainable into a TrialError carrying the full local traceback."""

    @functools.wraps(method)
    def wrapper(self: TrialActor, *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except TrialError:
            raise
        except Exception as e:
            text = traceback.format_exc()
            raise TrialError(
                f"Trial {self.trial_id}: {method.__name__}() of trainable {self._trainable_path} "
                f"raised {type(e).__name__}: {e}\n{text}",
                trial_id=self.trial_id,
                traceback_text=text,
            ) from e

    return wrapper


class TrialActor:
    """Hosts one trial at a time; with actor reuse, ``reset`` hands it the next trial.

    The executor creates it as a Ray actor (``ray.remote(TrialActor)``); the class itself does
    not depend on Ray, so it can be exercised in-process too.

    :param spec: the first trial to run (see :data:`TrialSpec`).
    :param storage_path: the experiment storage root (local path or fsspec URL).
    :param local_log_path: where stdout/stderr files go on this node.
    :param capture_output: redirect the process's stdout/stderr into the trial's files; default
        True.
    :param autorun: ``(trial_state, restore_from, holds)`` to start :meth:`run` from the
        constructor;
        default None. A detached actor's construction is kept by Ray's GCS, so a trial started
        this way begins whenever Ray places it, even after the process that launched it exited.
    """

    def __init__(
        self,
        spec: TrialSpec,
        storage_path: str,
        local_log_path: str,
        capture_output: bool = True,
        autorun: tuple[Any, ...] | None = None,
    ) -> None:
        self._storage = TrialStorage(storage_path, local_log_path)
        self._capture = LogCapture() if capture_output else None
        self._hostname = socket.gethostname()
        self._pid = os.getpid()
        self._node_ip = _node_ip()
        self._driver: TrainableDriver | None = None
        self._trainable_path = ""
        self._parameters_key: tuple[tuple[str, str], ...] = ()
        # Autonomous mode (run()): the actor drives its own trial; poll() reads its progress.
        self._lock = threading.Lock()
        self._loop: threading.Thread | None = None
        self._trial: Trial | None = None
        self._status = TrialStatus.PENDING
        self._results: list[dict[str, Any]] = []
        self._error: str | None = None
        # The trial could not start from its checkpoint (gone from storage): not its own failure.
        self._infrastructure = False
        self._stop_requested = False
        self._ended = threading.Event()  # set when the autonomous loop has ended
        # Set when a poll should answer at once: the loop ended, or it holds for a verdict.
        self._attention = threading.Event()
        self._holds: Holds | None = None
        self._published: int | None = (
            None  # the result a hold published before after_result returned
        )
        self._stop_reason: str | None = None
        self._scheduler_reason: str | None = None
        self._log_files: dict[str, str] = {}  # the logs' copies on the storage, once stopped
        self._log_error: str | None = None
        self._setup(spec)
        if autorun is not None:
            self.run(*autorun)

    # -- lifecycle -------------------------------------------------------------------------------
    def _setup(self, spec: TrialSpec) -> None:
        self.trial_id: str = spec["trial_id"]
        self.experiment_name: str = spec["experiment_name"]
        if self._capture is not None:
            self._capture.start(*self._storage.log_paths(self.experiment_name, self.trial_id))
        config = dict(spec["config"])
        refs = spec.get("parameters") or {}
        if (
            self._driver is not None
            and spec["trainable"] == self._trainable_path
            and parameters_key(refs) == self._parameters_key
        ):
            self._driver.reset(config, self.trial_id)
        else:
            if self._driver is not None:
                self._driver.stop()
            self._driver = make_driver(
                load_trainable(spec["trainable"]), config, self.trial_id, resolve_parameters(refs)
            )
        self._trainable_path = spec["trainable"]
        self._parameters_key = parameters_key(refs)
        self._iteration = 0
        self._ahead_since: float | None = None
        self._time_total = 0.0
        self._timesteps_total: float | None = None
        self._restore_counters()
        self._last_result: dict[str, Any] = {}
        # The payload last persisted and its record: a function trainable's save() hands back the
        # checkpoint it already reported, which must not be stored twice.
        self._persisted: tuple[Any, dict[str, Any]] | None = None

    def _restore_counters(self) -> None:
        self._iterations_since_restore = 0
        self._time_since_restore = 0.0
        self._timesteps_since_restore = 0.0

    @_reported_as_trial_error
    def reset(self, spec: TrialSpec) -> str:
        """Take over a new trial in this process (actor reuse); returns the new trial id."""
        self._setup(spec)
        return self.trial_id

    @_reported_as_trial_error
    def restore(self, path: str) -> int:
        """Load the checkpoint at ``path``; training continues from its iteration, which is
        returned."""
        driver = self._require_driver()
        payload, meta = self._storage.load_checkpoint(path)
        driver.restore(payload)  # stops what ran, trained ahead or not
        self._ahead_since = None
        self._iteration = int(meta.get("iteration", 0))
        self._time_total = float(meta.get("time_total_s", 0.0))
        timesteps = meta.get("timesteps_total")
        self._timesteps_total = None if timesteps is None else float(timesteps)
        self._restore_counters()
        self._persisted = (payload, {"path": path, "iteration": self._iteration, "metrics": {}})
        return self._iteration

    def stop(self) -> None:
        """Stop the trainable (its cleanup runs), restore the process's stdout/stderr and copy the
        trial's log files to the storage."""
        try:
            if self._driver is not None:
                self._driver.stop()
        finally:
            if self._capture is not None:
                self._capture.stop()
                self._save_logs()

    def _save_logs(self) -> None:
        """Copy stdout.log and stderr.log next to the trial's checkpoints, so they outlive this
        node. A failure is logged and reported in the poll, never raised: the trial's results
        matter more than its logs."""
        try:
            self._log_files = self._storage.save_logs(self.experiment_name, self.trial_id)
            self._log_error = None
        except Exception as e:  # noqa: BLE001 - fsspec backends raise their own error types
            target = self._storage.logs_dir(self.experiment_name, self.trial_id)
            local = self._storage.log_paths(self.experiment_name, self.trial_id)[0]
            self._log_error = (
                f"Trial {self.trial_id} of experiment {self.experiment_name}: could not copy its "
                f"stdout/stderr to {target} ({type(e).__name__}: {e}); its results are "
                f"unaffected, and the files stay in {os.path.dirname(local)} on node "
                f"{self._node_ip}. Check that this node can write to the storage."
            )
            log.warning("%s", self._log_error)

    def ping(self) -> str:
        return self.trial_id

    # -- training --------------------------------------------------------------------------------
    @_reported_as_trial_error
    def train(self, run_ahead_below: int = 0) -> dict[str, Any]:
        """Run until the trainable's next result and return it with the engine's fields added.

        When that result's ``training_iteration`` is below ``run_ahead_below``, the trainable
        trains its next iteration at once, while the runner records this one: the runner knows
        it continues (``core.fate.run_ahead_below``), so no round trip to it is waited for."""
        driver = self._require_driver()
        # An iteration trained ahead started when it was let go, not when it was asked for.
        started, self._ahead_since = self._ahead_since or time.time(), None
        try:
            metrics, checkpoint, done = driver.next_result()
        finally:
            if self._capture is not None:
                self._capture.flush()
        if metrics.pop(R.DUPLICATE, False):
            return {**self._last_result, R.DONE: True, R.DUPLICATE: True}
        now = driver.reported_at or time.time()
        elapsed = float(metrics.get(R.TIME_THIS_ITER_S, now - started))
        self._iteration += 1
        self._iterations_since_restore += 1
        self._time_total += elapsed
        self._time_since_restore += elapsed
        timesteps = metrics.get(R.TIMESTEPS_THIS_ITER)
        if timesteps is not None:
            self._timesteps_total = (self._timesteps_total or 0.0) + timesteps
            self._timesteps_since_restore += timesteps
        result = dict(metrics)
        result.update(
            {
                R.TRIAL_ID: self.trial_id,
                R.TRAINING_ITERATION: self._iteration,
                R.TIME_THIS_ITER_S: elapsed,
                R.TIME_TOTAL_S: self._time_total,
                R.ITERATIONS_SINCE_RESTORE: self._iterations_since_restore,
                R.TIME_SINCE_RESTORE: self._time_since_restore,
                R.TIMESTAMP: now,
                R.DONE: done,
                R.HOSTNAME: self._hostname,
                R.PID: self._pid,
                R.NODE_IP: self._node_ip,
            }
        )
        if self._timesteps_total is not None:
            result[R.TIMESTEPS_TOTAL] = self._timesteps_total
            result[R.TIMESTEPS_SINCE_RESTORE] = self._timesteps_since_restore
        self._last_result = result
        if checkpoint is not None:
            result[R.CHECKPOINT] = self._persist(checkpoint)["path"]
        if not done and self._iteration < run_ahead_below:
            let_go = time.time()
            if driver.run_ahead():
                self._ahead_since = let_go
        return result

    @_reported_as_trial_error
    def save(self) -> dict[str, Any] | None:
        """Persist the trainable's current state; returns the checkpoint record, or None if it has
        none."""
        driver = self._require_driver()
        scratch = (
            self._storage.scratch_dir(self.experiment_name, self.trial_id)
            if isinstance(driver, ClassDriver)
            else ""
        )
        payload = driver.save(scratch)
        if payload is None:
            return None
        if self._persisted is not None and self._persisted[0] is payload:
            return self._persisted[1]
        return self._persist(payload)

    def _persist(self, payload: Any) -> dict[str, Any]:
        meta = {"time_total_s": self._time_total, "timesteps_total": self._timesteps_total}
        path = self._storage.persist_checkpoint(
            self.experiment_name, self.trial_id, self._iteration, payload, meta
        )
        record = {
            "path": path,
            "iteration": self._iteration,
            "metrics": _scalars(self._last_result),
        }
        self._persisted = (payload, record)
        return record

    # -- autonomous mode: the Airflow trigger polls a trial that drives itself ------------------
    def run(
        self,
        trial_state: dict[str, Any],
        restore_from: str | None = None,
        holds: HoldSpec | None = None,
    ) -> str:
        """Drive the trial to its end in a background thread, first restoring ``restore_from``;
        returns at once.

        ``trial_state`` is ``Trial.to_json_state()``: its stopping criterion, checkpoint_freq,
        checkpoint_at_end and keep_checkpoints_num apply here as in the TrialRunner. Failures end
        the loop in ERROR; retrying is the caller's decision (Airflow's retries). With ``holds``
        (see :mod:`~airflow_trials.execution.worker.holds`), the trial waits at each hold point for
        its
        scheduler's verdict, which :meth:`decide` gives.
        """
        if self._loop is not None:
            return self.trial_id
        self._trial = Trial.from_json_state(trial_state)
        self._holds = Holds.from_spec(holds)
        self._status = TrialStatus.RUNNING
        self._loop = threading.Thread(
            target=self._run_loop, args=(restore_from,), name=f"run-{self.trial_id}", daemon=True
        )
        self._loop.start()
        return self.trial_id

    def _run_loop(self, restore_from: str | None) -> None:
        trial = self._trial
        assert trial is not None
        status, error = TrialStatus.TERMINATED, None
        try:
            if restore_from:
                self._restore_or_give_up(restore_from)
            while not self._stop_requested:
                result = self.train()
                duplicate = bool(result.pop(R.DUPLICATE, False))
                decision = after_result(
                    trial,
                    result,
                    duplicate=duplicate,
                    scheduler=self._verdict if self._holds is not None else None,
                    scheduler_reason=lambda _: self._scheduler_reason,
                )
                if decision.fresh and self._published != result[R.TRAINING_ITERATION]:
                    self._publish(result)
                # After the result it came with: a poll never sees a checkpoint whose result it
                # does not see too, so a resume from the newest recorded one leaves no gap.
                if result.get(R.CHECKPOINT):
                    self._keep(
                        CheckpointRecord(result[R.CHECKPOINT], result[R.TRAINING_ITERATION], result)
                    )
                if decision.save_checkpoint:
                    self._save_and_keep()
                if decision.action is not Action.CONTINUE:
                    self._stop_reason = decision.reason
                    break
        except _CheckpointGone as e:
            status, error = TrialStatus.ERROR, str(e)
            self._infrastructure = True
        except TrialError as e:
            status, error = TrialStatus.ERROR, str(e)
        except Exception as e:  # a stopping criterion naming a missing metric, a storage failure
            status, error = (
                TrialStatus.ERROR,
                f"Trial {self.trial_id}: {e}\n{traceback.format_exc()}",
            )
        finally:
            self.stop()
            with self._lock:
                self._status, self._error = status, error
            self._ended.set()
            self._attention.set()

    def _restore_or_give_up(self, path: str) -> None:
        """Restore ``path``; a checkpoint that cannot be read from the storage is the storage's
        problem, not the trial's: it ends the loop as infrastructure, which the task's retry
        resumes from the newest checkpoint that exists, without counting a failure."""
        try:
            self.restore(path)
        except TrialError as e:
            if not isinstance(e.__cause__, CheckpointNotFoundError):
                raise
            raise _CheckpointGone(
                f"Trial {self.trial_id} of experiment {self.experiment_name} could not start from "
                "its "
                f"checkpoint {path}: {e.__cause__}. Not a failure of the trial: its next try "
                "resumes it from "
                "the newest checkpoint that exists on the storage."
            ) from e

    def _publish(self, result: dict[str, Any]) -> None:
        with self._lock:
            self._results.append(result)
        self._published = result[R.TRAINING_ITERATION]

    def _verdict(self, trial: Trial, result: dict[str, Any]) -> str:
        """The scheduler's decision on a fresh result, as the trigger gives it: waited for at a
        hold point (the result is published first, so that the trigger sees it), else a STOP it
        gave earlier, else CONTINUE."""
        holds = self._holds
        assert holds is not None
        iteration = int(result[R.TRAINING_ITERATION])
        if holds.holds_at(result):
            self._publish(result)
            self._attention.set()
            try:
                decision, reason = holds.hold(
                    iteration, float(result[holds.time_attr]), lambda: self._stop_requested
                )
            finally:
                if not self._ended.is_set():
                    self._attention.clear()
        else:
            decision, reason = holds.told(iteration)
        self._scheduler_reason = reason
        return decision.value

    def decide(self, iteration: int, decision: str, reason: str | None = None) -> bool:
        """The scheduler's verdict on result ``iteration`` (from the trial's trigger); whether the
        trial takes verdicts (it runs with holds)."""
        if self._holds is None:
            return False
        self._holds.give(iteration, decision, reason)
        return True

    def _save_and_keep(self) -> None:
        raw = self.save()
        if raw is not None:
            self._keep(CheckpointRecord.from_dict(raw))

    def _keep(self, record: CheckpointRecord) -> None:
        """Register a new checkpoint. Those it pushes out are not deleted here: the trials DB may
        still name one as the checkpoint to resume from, until its watcher records the kept set
        without it (:meth:`release_checkpoints`)."""
        assert self._trial is not None
        with self._lock:
            self._trial.checkpoint_manager.on_checkpoint(record)

    def release_checkpoints(self, recorded_version: int) -> list[str]:
        """Delete the dropped checkpoints that no record names any more, now that the trial's
        watcher wrote the kept set of ``recorded_version`` (a snapshot's ``checkpoints_version``)
        to the trials DB; returns their paths. A deletion that fails is logged and not retried:
        the checkpoint is only left on the storage."""
        trial = self._trial
        if trial is None:
            return []
        with self._lock:
            released = trial.checkpoint_manager.release(recorded_version)
        return self._storage.delete_released(self.trial_id, (record.path for record in released))

    def poll(
        self,
        since: int = 0,
        wait_s: float = 0.0,
        output_from: dict[str, int] | None = None,
        recorded_version: int | None = None,
    ) -> TrialSnapshot:
        """Progress of an autonomous trial: the results after the first ``since``, and its state.

        With ``recorded_version`` (the ``checkpoints_version`` of the last snapshot whose
        checkpoints the watcher wrote to the trials DB), the checkpoints dropped up to that version
        are deleted first (:meth:`release_checkpoints`).

        With ``wait_s``, it first waits up to that long for the trial to end, so a poller that
        polls every ``wait_s`` seconds learns of the end at once (and frees its resources sooner)
        while results still arrive in batches.

        With ``output_from`` (``{"stdout": offset, "stderr": offset}``; a stream left out starts
        where this trial's output starts), the snapshot's ``output`` holds each stream's new
        lines since that byte offset, bounded per poll (:func:`~.output.read_new_output`), and
        the offsets to ask from next time.
        """
        if recorded_version is not None:
            self.release_checkpoints(recorded_version)
        if wait_s > 0 and self._loop is not None:
            self._attention.wait(wait_s)
        with self._lock:
            trial = self._trial
            snapshot: TrialSnapshot = {
                "trial_id": self.trial_id,
                "status": self._status.value,
                "results": self._results[since:],
                "num_results": len(self._results),
                "last_result": _scalars(trial.last_result) if trial else None,
                "checkpoints": [
                    {**r.to_dict(), "score": trial.checkpoint_manager.score_value(r)}
                    for r in trial.checkpoint_manager.kept
                ]
                if trial
                else [],
                "checkpoints_version": trial.checkpoint_manager.version if trial else 0,
                "best_checkpoint": _best(trial),
                "error": self._error,
                "infrastructure": self._infrastructure,
                "stop_reason": self._stop_reason
                if self._status is TrialStatus.TERMINATED
                else None,
                "held": self._holds.held_at if self._holds is not None else None,
                "pid": self._pid,
                "output": None,
                "log_files": dict(self._log_files),
                "log_error": self._log_error,
            }
        if output_from is not None:
            # Read after the status: a terminal one was set after the output was closed, so
            # this read is the last and may end with an unfinished line.
            snapshot["output"] = self._new_output(
                output_from, TrialStatus(snapshot["status"]).is_terminal()
            )
        return snapshot

    def _new_output(self, output_from: dict[str, int], final: bool) -> dict[str, Any] | None:
        capture = self._capture
        if capture is None or not capture.paths:
            return None
        if not final:
            capture.flush()  # what the trainable printed since its last result
        return {
            stream: read_new_output(
                path, output_from.get(stream, capture.start_offsets[stream]), final=final
            ).to_dict()
            for stream, path in capture.paths.items()
        }

    def request_stop(self) -> None:
        """Let an autonomous trial end (TERMINATED) after its current iteration."""
        self._stop_requested = True
        if self._holds is not None:
            self._holds.wake()

    def execute(self, fn: Callable[[Any], Any]) -> Any:
        """Call ``fn`` with the live trainable object (class API) or driver; for debugging and
        tests."""
        driver = self._require_driver()
        return fn(driver.trainable if isinstance(driver, ClassDriver) else driver)

    def _require_driver(self) -> TrainableDriver:
        if self._driver is None:
            raise RuntimeError(
                f"Trial actor for {self.trial_id} has no trainable; it was not set up."
            )
        return self._driver


class _CheckpointGone(Exception):
    """The checkpoint a trial was to start from cannot be read from the storage."""


def _best(trial: Trial | None) -> dict[str, Any] | None:
    best = trial.checkpoint_manager.best() if trial is not None else None
    return best.to_dict() if best is not None else None


def _scalars(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if isinstance(v, (int, float, str, bool)) or v is None}


def _node_ip() -> str:
    try:
        import ray

        if ray.is_initialized():
            return str(ray.util.get_node_ip_address())
    except Exception:  # noqa: BLE001 - the node ip is informational only
        pass
    return "127.0.0.1"
