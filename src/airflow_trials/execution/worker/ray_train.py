"""Ray Train inside a trial: hand each Train report to the trial's ``report()``.

Ray Train V2's pattern (on by default since Ray 2.51): the trainable is the Train *driver*. It
builds a ``TorchTrainer`` and calls ``fit()``; Train starts its controller (an actor of its own,
``num_cpus=0``, on this node) and its workers, in a placement group Train reserves itself. Train's
workers report through ``ray.train.report(metrics, checkpoint=...)``; the controller passes every
report to the ``UserCallback`` objects in ``RunConfig(callbacks=[...])``. That callback runs in the
controller, not in the trial's actor, so :class:`TrialReportCallback` puts rank 0's metrics and the
checkpoint's directory on a Ray queue (one item deep, as Ray Tune's ``TuneReportCallback`` does),
and :meth:`TrialReportCallback.fit` runs ``trainer.fit()`` on a thread while the trainable's own
thread takes each item off the queue and calls :func:`airflow_trials.report` with it. The engine
then keeps the checkpoint (keep-N, best) and the trial's scheduler judges the result as any other.

When the trial is stopped (a scheduler's verdict, a stopping criterion), ``report()`` raises in the
trainable's thread; :meth:`fit` then kills the queue, so the controller's next report fails, Train
ends the run and frees its workers, and the stop goes on up. Killing the trial's actor ends Train
with it: the controller, and through it the workers, are owned by the actor.
"""

from __future__ import annotations

import queue
import shutil
import tempfile
import threading
from typing import Any

from ray.train import Checkpoint, UserCallback
from ray.util.queue import Empty, Queue

from airflow_trials.core.train_resources import RayTrainResources
from airflow_trials.execution.worker.trainable import get_trial_id, get_trial_resources, report

_POLL_SECONDS = 1.0
#: What each Train worker may report as its node's id (``ray.get_runtime_context().get_node_id()``).
WORKER_NODE_ID = "worker_node_id"
_STOP_WAIT_SECONDS = 60.0


class TrialReportCallback(UserCallback):
    """A Ray Train V2 ``UserCallback`` that turns Train's reports into the trial's results.

    Create it in the trainable, give it to the trainer's ``RunConfig`` along with its scratch
    ``storage_path`` (where Train persists its own copy of each checkpoint until the trial copied
    it), and run the trainer through :meth:`fit`::

        callback = TrialReportCallback()
        trainer = TorchTrainer(loop, scaling_config=..., run_config=RunConfig(
            storage_path=callback.storage_path, callbacks=[callback]))
        callback.fit(trainer)
    """

    def __init__(self) -> None:
        self._queue: Queue = Queue(1, actor_options={"num_cpus": 0})
        self.storage_path = tempfile.mkdtemp(prefix="airflow-trials-train-")

    def after_report(
        self,
        run_context: Any,
        metrics: list[dict[str, Any]],
        checkpoint: Checkpoint | None,
    ) -> None:
        """In Train's controller: queue rank 0's metrics and the checkpoint's directory. Where the
        workers report their node (``worker_node_id``), the result gets every worker's, as the
        sorted list ``worker_node_ids``: where the trial's training ran."""
        result = dict(metrics[0])
        nodes = {m[WORKER_NODE_ID] for m in metrics if WORKER_NODE_ID in m}
        if nodes:
            result.pop(WORKER_NODE_ID, None)
            result["worker_node_ids"] = sorted(nodes)
        self._queue.put((result, checkpoint.path if checkpoint else None))

    def fit(self, trainer: Any) -> Any:
        """Run ``trainer.fit()`` and report each of its results from the trainable's thread;
        Train's ``Result``. Train's error, if its run failed, is raised here."""
        outcome: dict[str, Any] = {}
        fitting = threading.Thread(
            target=_fit_into, args=(trainer, outcome), name="ray-train-fit", daemon=True
        )
        fitting.start()
        try:
            self._pump(fitting)
        except BaseException:
            self._queue.shutdown(force=True)  # the controller's next report fails: the run ends
            fitting.join(_STOP_WAIT_SECONDS)
            raise
        finally:
            shutil.rmtree(self.storage_path, ignore_errors=True)
        if "error" in outcome:
            raise outcome["error"]
        self._queue.shutdown(force=True)
        return outcome["result"]

    def _pump(self, fitting: threading.Thread) -> None:
        """Report every queued item until Train's run ended and the queue is empty."""
        while True:
            try:
                metrics, checkpoint_path = self._queue.get(timeout=_POLL_SECONDS)
            except (Empty, queue.Empty):
                if fitting.is_alive() or not self._queue.empty():
                    continue
                return
            report(metrics, checkpoint=checkpoint_path)


def trial_scaling_config(**overrides: Any) -> Any:
    """Ray Train's ``ScalingConfig`` of the workers the running trial declared with
    ``RayTrainResources`` (``overrides`` go to it as they are): one declaration sizes the trainer
    and what the runner and a GPU pool count."""
    from ray.train import ScalingConfig

    resources = get_trial_resources()
    if not isinstance(resources, RayTrainResources):
        raise TypeError(
            f"Trial {get_trial_id()} asked for {resources.summary_string()}, which declares no "
            "Ray Train workers; give it resources_per_trial=RayTrainResources(driver=..., "
            "num_workers=..., resources_per_worker=...) or build Train's ScalingConfig yourself."
        )
    return ScalingConfig(**{**resources.scaling_settings(), **overrides})


def _fit_into(trainer: Any, outcome: dict[str, Any]) -> None:
    try:
        outcome["result"] = trainer.fit()
    except Exception as e:  # handed to the trainable's thread, which raises it
        outcome["error"] = e
