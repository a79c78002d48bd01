"""The per-trial Ray actor: runs one trainable, adds the engine's result fields, persists
checkpoints."""

from __future__ import annotations

import functools
import logging
import os
import socket
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, replace
from typing import Any

from airflow_trials.core import result as R
from airflow_trials.core.fate import ends_for_sure
from airflow_trials.core.jsonsafe import json_safe
from airflow_trials.core.stop_kind import StopKind
from airflow_trials.core.update import TrialUpdate
from airflow_trials.exceptions import TrialError
from airflow_trials.execution.actor_spec import HoldSpec, TrialSpec
from airflow_trials.execution.parameter_refs import parameters_key, resolve_parameters
from airflow_trials.execution.trainable_api import load_trainable
from airflow_trials.execution.worker.node import node_id, node_ip
from airflow_trials.execution.worker.self_driving import SelfDrivingRun, scalar_fields
from airflow_trials.execution.worker.trainable import (
    ClassDriver,
    TrainableDriver,
    host_trial_resources,
    make_driver,
)
from airflow_trials.storage.trial_output import LogCapture, read_new_output
from airflow_trials.storage.trial_storage import RESULTS_KEY, TrialStorage, discard_restored

log = logging.getLogger(__name__)

#: Results kept for the next checkpoint's metadata. A trainable that never checkpoints past this
#: many results leaves its next checkpoint with the newest ones only; a resume that finds such a
#: gap adopts no checkpoint past it (the trials DB's own results stand).
UNSAVED_RESULTS_MAX = 10_000


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
        self._storage.prepare_in_background()  # an object store's client, while the trial trains
        self._capture = LogCapture() if capture_output else None
        self._hostname = socket.gethostname()
        self._pid = os.getpid()
        self._node_ip = node_ip()
        self._node_id = node_id()
        self._driver: TrainableDriver | None = None
        self._trainable_path = ""
        self._parameters_key: tuple[tuple[str, str], ...] = ()
        # Autonomous mode (run()): the actor drives its own trial; poll() reads its progress.
        self._autonomous = SelfDrivingRun(self)
        self._log_files: dict[str, str] = {}  # the logs' copies on the storage, once stopped
        self._log_error: str | None = None
        # The checkpoint last restored, and what was read of it: a download to remove once the
        # trainable is done with it (a directory checkpoint in object storage).
        self._restored: tuple[str, Any] | None = None
        self._setup(spec)
        if autorun is not None:
            self.run(*autorun)

    # -- lifecycle -------------------------------------------------------------------------------
    def _setup(self, spec: TrialSpec) -> None:
        self.trial_id: str = spec["trial_id"]
        self.experiment_name: str = spec["experiment_name"]
        host_trial_resources(spec.get("resources"))
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
        self._discard_restored()  # the last trial's, if this process ran one
        self._iteration = 0
        self._ahead_since: float | None = None
        self._time_total = 0.0
        self._timesteps_total: float | None = None
        self._restore_counters()
        self._last_result: dict[str, Any] = {}
        self._unsaved: deque[dict[str, Any]] = deque(maxlen=UNSAVED_RESULTS_MAX)
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
        try:
            driver.restore(payload)  # stops what ran, trained ahead or not
        except BaseException:
            discard_restored(path, payload)
            raise
        self._discard_restored()  # what the trainable restored from before, if downloaded
        self._restored = (path, payload)
        self._ahead_since = None
        self._iteration = int(meta.get("iteration", 0))
        self._time_total = float(meta.get("time_total_s", 0.0))
        timesteps = meta.get("timesteps_total")
        self._timesteps_total = None if timesteps is None else float(timesteps)
        self._restore_counters()
        self._unsaved.clear()
        self._persisted = (payload, {"path": path, "iteration": self._iteration, "metrics": {}})
        return self._iteration

    def _discard_restored(self) -> None:
        """Remove the local copy of the directory checkpoint last restored from object storage
        (the trainable that read it has stopped or restored another)."""
        restored, self._restored = self._restored, None
        if restored is not None:
            discard_restored(*restored)

    def stop(self) -> None:
        """Stop the trainable (its cleanup runs), restore the process's stdout/stderr and copy the
        trial's log files to the storage."""
        try:
            if self._driver is not None:
                self._driver.stop()
        finally:
            self._discard_restored()
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
    def train(
        self,
        run_ahead_below: int = 0,
        successor: TrialSpec | None = None,
        hand_over_from: int = sys.maxsize,
    ) -> dict[str, Any]:
        """Run until the trainable's next result and return it with the engine's fields added.

        When that result's ``training_iteration`` is below ``run_ahead_below``, the trainable
        trains its next iteration at once, while the runner records this one: the runner knows
        it continues (``core.fate.run_ahead_below``), so no round trip to it is waited for.

        With ``successor`` (the next trial the runner offers this actor), a result that is sure to
        end this trial (``core.fate.ends_for_sure`` with ``hand_over_from``) is followed at once
        by the hand-over: this trial stops as the runner's stop would stop it, and the successor
        is set up and starts training its first iteration, before the result is returned. The
        result then carries ``HANDED_OVER`` (docs/engine.md, "Hand-over")."""
        driver = self._require_driver()
        # An iteration trained ahead started when it was let go, not when it was asked for.
        started, self._ahead_since = self._ahead_since or time.time(), None
        try:
            metrics, checkpoint, done = driver.next_result()
        finally:
            if self._capture is not None:
                self._capture.flush()
        if metrics.pop(R.DUPLICATE, False):
            result = {**self._last_result, R.DONE: True, R.DUPLICATE: True}
        else:
            result = self._add_fields(metrics, done, started, driver.reported_at)
            self._unsaved.append(result)
            if checkpoint is not None:
                result[R.CHECKPOINT] = self._persist(checkpoint, reported=True)["path"]
        if successor is not None and ends_for_sure(result, hand_over_from):
            result[R.HANDED_OVER] = self._hand_over(successor)
        elif not result[R.DONE] and self._iteration < run_ahead_below:
            let_go = time.time()
            if driver.run_ahead():
                self._ahead_since = let_go
        return result

    def _add_fields(
        self, metrics: dict[str, Any], done: bool, started: float, reported_at: float | None
    ) -> dict[str, Any]:
        """The trainable's metrics with the engine's fields; advances the counters."""
        now = reported_at or time.time()
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
                R.NODE_ID: self._node_id,
            }
        )
        if self._timesteps_total is not None:
            result[R.TIMESTEPS_TOTAL] = self._timesteps_total
            result[R.TIMESTEPS_SINCE_RESTORE] = self._timesteps_since_restore
        self._last_result = result
        return result

    def _hand_over(self, successor: TrialSpec) -> dict[str, Any]:
        """Stop this trial and start ``successor`` in its place (what the runner's stop, then
        ``reset`` and the first ``train`` would do, without the round trips); what the result's
        ``HANDED_OVER`` says. Never raises: a failure is reported to the runner, which then
        retires this actor and starts the successor elsewhere, so an error of either trial is
        never put on the other."""
        ended = self.trial_id
        try:
            self.stop()
            self._setup(successor)
            let_go = time.time()
            if self._require_driver().start_ahead():
                self._ahead_since = let_go
        except Exception as e:  # noqa: BLE001 - reported in the result, the runner decides
            error = (
                f"Trial actor of {ended} could not hand itself over to trial "
                f"{successor['trial_id']} ({type(e).__name__}: {e}); the runner retires it and "
                f"starts {successor['trial_id']} again elsewhere.\n{traceback.format_exc()}"
            )
            log.warning("%s", error)
            return {"error": error}
        return {"trial_id": self.trial_id}

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

    def _persist(self, payload: Any, reported: bool = False) -> dict[str, Any]:
        """Store ``payload`` as the checkpoint of the current iteration, with the results since
        the previous one in its metadata (written last, so they are durable exactly when the
        checkpoint is complete: a resume backfills what the trials DB missed,
        :mod:`~airflow_trials.execution.resume`). ``reported``: the trainable reported it with
        the current result, which then names it, as the result a poll returns does."""
        results = [json_safe(r) for r in self._unsaved]  # as the trials DB would store them
        if reported and results:
            target = self._storage.checkpoint_dir(
                self.experiment_name, self.trial_id, self._iteration
            )
            results[-1][R.CHECKPOINT] = target
        meta = {
            "time_total_s": self._time_total,
            "timesteps_total": self._timesteps_total,
            RESULTS_KEY: results,
        }
        path = self._storage.persist_checkpoint(
            self.experiment_name, self.trial_id, self._iteration, payload, meta
        )
        self._unsaved.clear()
        record = {
            "path": path,
            "iteration": self._iteration,
            "metrics": scalar_fields(self._last_result),
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
        its scheduler's verdict, which :meth:`decide` gives. The loop is
        :class:`~airflow_trials.execution.worker.self_driving.SelfDrivingRun`'s.
        """
        self._autonomous.start(trial_state, restore_from, holds)
        return self.trial_id

    def decide(
        self,
        iteration: int,
        decision: str,
        reason: str | None = None,
        stop_kind: str = StopKind.SCHEDULER.value,
    ) -> bool:
        """The scheduler's verdict on result ``iteration`` (from the trial's trigger), with the
        kind of the trial's end when it is STOP; whether the trial takes verdicts (it runs with
        holds)."""
        return self._autonomous.decide(iteration, decision, reason, stop_kind)

    def release_checkpoints(self, recorded_version: int) -> list[str]:
        """Delete the dropped checkpoints that no record names any more, now that the trial's
        watcher wrote the kept set of ``recorded_version`` (a poll's ``checkpoints_version``)
        to the trials DB; returns their paths. A deletion that fails is logged and not retried:
        the checkpoint is only left on the storage."""
        released = self._autonomous.release(recorded_version)
        return self._storage.delete_released(self.trial_id, (record.path for record in released))

    def poll(
        self,
        since: int = 0,
        wait_s: float = 0.0,
        output_from: dict[str, int] | None = None,
        recorded_version: int | None = None,
    ) -> TrialUpdate:
        """Progress of an autonomous trial, as a :class:`~airflow_trials.core.update.TrialUpdate`:
        the results after the first ``since``, and its state.

        With ``recorded_version`` (the ``checkpoints_version`` of the last poll whose
        checkpoints the watcher wrote to the trials DB), the checkpoints dropped up to that version
        are deleted first (:meth:`release_checkpoints`).

        With ``wait_s``, it first waits up to that long for the trial to end, so a poller that
        polls every ``wait_s`` seconds learns of the end at once (and frees its resources sooner)
        while results still arrive in batches.

        With ``output_from`` (``{"stdout": offset, "stderr": offset}``; a stream left out starts
        where this trial's output starts), the update's ``output`` holds each stream's new
        lines since that byte offset, bounded per poll (:func:`~.output.read_new_output`), and
        the offsets to ask from next time.
        """
        if recorded_version is not None:
            self.release_checkpoints(recorded_version)
        self._autonomous.wait(wait_s)
        # The progress read before the log files: the loop saved them before it set a terminal
        # status.
        update = replace(
            self._autonomous.progress(self.trial_id, since),
            pid=self._pid,
            log_files=dict(self._log_files),
            log_error=self._log_error,
        )
        if output_from is not None:
            # Read after the status: a terminal one was set after the output was closed, so
            # this read is the last and may end with an unfinished line.
            update = replace(update, output=self._new_output(output_from, update.ended))
        return update

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
        self._autonomous.request_stop()

    def drain(self) -> dict[str, Any]:
        """A graceful stop's request: checkpoint after the current iteration and pause; answers
        at once with where the trial is (``SelfDrivingRun.drain``), so ask again to wait."""
        return {"trial_id": self.trial_id, **asdict(self._autonomous.drain())}

    def resume_drained(self) -> None:
        """Train on after a drain (the stop was called off)."""
        self._autonomous.resume()

    def mark_drained(self, iteration: int | None) -> None:
        """Mark in the storage that this trial paused at ``iteration`` for a stop (None: it
        trains again). A storage that fails is logged: the drain goes on without the mark."""
        try:
            self._storage.mark_drained(self.experiment_name, self.trial_id, iteration)
        except Exception as e:  # noqa: BLE001 - fsspec backends raise their own error types
            log.warning("Trial %s: could not mark its drain on the storage: %s", self.trial_id, e)

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
