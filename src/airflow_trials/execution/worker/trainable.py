"""The function API (``report``, ``get_checkpoint``) and the in-actor drivers that run a trainable
step by step; the class API and loading by path, which the driver uses too, are in
:mod:`airflow_trials.execution.trainable_api`.

Nothing here imports ray: the same code runs inside a Ray actor and in plain unit tests.
"""

from __future__ import annotations

import inspect
import os
import queue
import threading
import time
import traceback
from collections.abc import Callable, Mapping
from typing import Any

from airflow_trials.core import result as R
from airflow_trials.core.resources import Resources
from airflow_trials.exceptions import TrialError
from airflow_trials.execution.trainable_api import Trainable

# -- the function API's session ------------------------------------------------------------------


class _StopTraining(BaseException):
    """Raised inside a function trainable's thread at its next report() once the trial stopped.

    A BaseException so that a user's ``except Exception`` does not swallow it.
    """


class _Session:
    """Connects ``report`` / ``get_checkpoint`` calls in the trainable's thread to its driver."""

    def __init__(self, trial_id: str, checkpoint: Any) -> None:
        self.trial_id = trial_id
        self.checkpoint = (
            checkpoint  # of the last result the driver handed out: what save() returns
        )
        self.reported_checkpoint = (
            checkpoint  # the trainable's own latest: what get_checkpoint() returns
        )
        # (metrics, checkpoint, when reported)
        self.results: queue.Queue[tuple[dict[str, Any], Any, float | None]] = queue.Queue(maxsize=1)
        self.continue_event = threading.Semaphore(0)
        self.stopped = False
        self.reported = 0

    def report(self, metrics: dict[str, Any], checkpoint: Any) -> None:
        if self.stopped:
            raise _StopTraining()
        self.reported += 1
        if checkpoint is not None:
            self.reported_checkpoint = checkpoint
        self.results.put((metrics, checkpoint, time.time()))
        # Lockstep with the driver: the trainable waits until its result was consumed and the
        # runner decided to continue (or knew it would: FunctionDriver.run_ahead), so a stopped
        # trial never trains on past its last result.
        self.continue_event.acquire()
        if self.stopped:
            raise _StopTraining()


_local = threading.local()


def _current_session(caller: str) -> _Session:
    session: _Session | None = getattr(_local, "session", None)
    if session is None:
        raise RuntimeError(
            f"airflow_trials.{caller}() was called outside a trial; call it from the function "
            f"trainable that the engine runs (a def train(config) passed as a trial's trainable)."
        )
    return session


def report(
    metrics: Mapping[str, Any] | None = None, *, checkpoint: Any = None, **kwargs: Any
) -> None:
    """Report one iteration's metrics from a function trainable, optionally with a checkpoint.

    Ray Tune's form: ``report({"loss": 0.1}, checkpoint={"w": w})``. The metrics may also be
    given as keywords, ``report(loss=0.1, checkpoint=...)``, but not both ways in one call.
    Pass ``done=True`` (in either form) to end the trial after this result.

    :param metrics: the iteration's metrics, a dict with string keys.
    :param checkpoint: keyword only: a dict of picklable state, the path of a directory you
        wrote (``str`` or ``os.PathLike``), or an object with a ``path`` to one (a Ray Train
        ``Checkpoint.from_directory(...)``). It is persisted to the experiment's storage before
        the runner sees the result.
    """
    _current_session("report").report(_metrics_of(metrics, kwargs), _checkpoint_of(checkpoint))


def _metrics_of(metrics: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    if metrics is None:
        return dict(kwargs)
    if not isinstance(metrics, Mapping):
        raise TypeError(
            "report() takes the metrics dict as its positional argument, got "
            f"{type(metrics).__name__}; "
            f"pass a checkpoint as report(metrics, checkpoint=...)."
        )
    if kwargs:
        raise TypeError(
            f"report() got metrics both as a dict and as keywords ({', '.join(sorted(kwargs))}): "
            "pass "
            f"them one way, e.g. report({{**metrics, ...}}). If the dict is a checkpoint, pass it "
            "as "
            f"report(..., checkpoint=state)."
        )
    bad = [key for key in metrics if not isinstance(key, str)]
    if bad:
        raise TypeError(f"report() metric names must be strings, got {bad[:5]!r}.")
    return dict(metrics)


def _checkpoint_of(checkpoint: Any) -> Mapping[str, Any] | str | None:
    if checkpoint is None or isinstance(checkpoint, (Mapping, str)):
        return checkpoint
    if isinstance(checkpoint, os.PathLike):
        return os.fspath(checkpoint)
    path = getattr(checkpoint, "path", None)  # a Ray Train Checkpoint, say
    if isinstance(path, (str, os.PathLike)):
        return os.fspath(path)
    raise TypeError(
        f"report(checkpoint=...) takes a dict, a directory path or an object with a .path to one, "
        f"got {type(checkpoint).__name__}."
    )


def get_checkpoint() -> dict[str, Any] | str | None:
    """The checkpoint to resume from (a dict or a local directory path), or None on a fresh
    start."""
    return _current_session("get_checkpoint").reported_checkpoint


def get_trial_id() -> str:
    return _current_session("get_trial_id").trial_id


#: The resources of the trial this process hosts (an actor hosts one trial at a time).
_hosted: dict[str, Resources] = {}


def host_trial_resources(spec: Mapping[str, Any] | None) -> None:
    """Called by the trial's actor as it takes a trial: what :func:`get_trial_resources` answers."""
    _hosted["resources"] = Resources.from_dict(spec)


def get_trial_resources() -> Resources:
    """The resources the running trial asked for, as Ray Tune's
    ``tune.get_context().get_trial_resources()``: a ``Resources``, a ``PlacementGroupFactory`` or
    a ``RayTrainResources`` (whose ``scaling_config()`` sizes a Ray Train trainer)."""
    if "resources" not in _hosted:
        raise RuntimeError(
            "airflow_trials.get_trial_resources() was called outside a trial; call it from the "
            "trainable that the engine runs."
        )
    return _hosted["resources"]


# -- drivers that turn either API into "give me the next result" ---------------------------------

StepOutput = tuple[dict[str, Any], Any, bool]
"""(metrics, checkpoint reported with them or None, done)."""


class TrainableDriver:
    """Runs one trainable object inside an actor, one result at a time."""

    #: When the trainable reported the result ``next_result`` last returned; None when it was
    #: made as it was asked for (the class API). A result trained ahead is older than the call.
    reported_at: float | None = None

    def next_result(self) -> StepOutput:
        raise NotImplementedError

    def save(self, checkpoint_dir: str) -> Any:
        """The state to persist now: a dict, a directory path, or None when there is none."""
        raise NotImplementedError

    def restore(self, checkpoint: Any) -> None:
        raise NotImplementedError

    def reset(self, config: dict[str, Any], trial_id: str) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def run_ahead(self) -> bool:
        """Let the trainable train its next iteration now, before it is asked for that result
        (the runner knows it will continue: ``core.fate.run_ahead_below``); whether it does.
        Not by default: the class API trains only when asked."""
        return False

    def start_ahead(self) -> bool:
        """Start training the first iteration now, before it is asked for (a trial that took over
        this actor: the runner starts it anyway, and a first iteration is always trained); whether
        it does. Not by default: the class API trains only when asked."""
        return False


class ClassDriver(TrainableDriver):
    """Drives a :class:`Trainable` subclass."""

    def __init__(
        self,
        cls: type[Trainable],
        config: dict[str, Any],
        trial_id: str,
        parameters: Mapping[str, Any],
    ) -> None:
        self.cls = cls
        self.parameters = dict(parameters)
        self.trainable = cls(config, trial_id, **self.parameters)

    def next_result(self) -> StepOutput:
        metrics = self.trainable.step()
        if not isinstance(metrics, Mapping):
            raise TypeError(
                f"{self.cls.__name__}.step() must return a dict of metrics, got "
                f"{type(metrics).__name__}."
            )
        metrics = dict(metrics)
        return metrics, None, bool(metrics.get("done", False))

    def save(self, checkpoint_dir: str) -> Any:
        state = self.trainable.save_checkpoint(checkpoint_dir)
        return dict(state) if state is not None else checkpoint_dir

    def restore(self, checkpoint: Any) -> None:
        self.trainable.load_checkpoint(checkpoint)

    def reset(self, config: dict[str, Any], trial_id: str) -> None:
        self.trainable.trial_id = trial_id
        if self.trainable.reset_config(dict(config)):
            self.trainable.config = dict(config)
            return
        self.trainable.cleanup()
        self.trainable = self.cls(config, trial_id, **self.parameters)

    def stop(self) -> None:
        self.trainable.cleanup()


class FunctionDriver(TrainableDriver):
    """Drives ``def train(config)`` in a thread, in lockstep with the runner (as Ray Tune's
    FunctionRunner)."""

    # How long next_result waits between checks that the function's thread is still alive.
    _POLL_S = 0.5

    def __init__(
        self,
        fn: Callable[..., Any],
        config: dict[str, Any],
        trial_id: str,
        parameters: Mapping[str, Any],
    ) -> None:
        self.fn = fn
        self.parameters = dict(parameters)
        self.name = getattr(fn, "__qualname__", repr(fn))
        self.config = dict(config)
        self.trial_id = trial_id
        self._restored: Any = None
        self._session: _Session | None = None
        self._thread: threading.Thread | None = None
        self._error: str | None = None
        self._returned: Any = None
        self._finished = threading.Event()
        self._last_metrics: dict[str, Any] = {}
        self._ahead = False  # run_ahead released the thread: next_result must not release it again

    def _start(self) -> None:
        session = _Session(self.trial_id, self._restored)
        self._session = session
        self._finished = threading.Event()
        self._error = None
        self._returned = None
        finished = self._finished

        def entrypoint() -> None:
            _local.session = session
            try:
                self._returned = self.fn(self.config, **self.parameters)
            except _StopTraining:
                pass
            except BaseException:
                self._error = traceback.format_exc()
            finally:
                finished.set()
                # Wake a driver blocked on the results queue.
                try:
                    session.results.put_nowait(({}, None, None))
                except queue.Full:
                    pass

        self._thread = threading.Thread(
            target=entrypoint, name=f"trial-{self.trial_id}", daemon=True
        )
        self._thread.start()

    def next_result(self) -> StepOutput:
        session = self._session
        if session is None or self._thread is None:
            self._start()
            session = self._session
        elif self._ahead:
            self._ahead = False
        else:
            session.continue_event.release()
        assert session is not None
        while True:
            try:
                metrics, checkpoint, self.reported_at = session.results.get(timeout=self._POLL_S)
            except queue.Empty:
                continue
            if metrics or checkpoint is not None or not self._finished.is_set():
                # The session's checkpoint is that of the last result handed out, never of one
                # trained ahead: a save() between the two must not return the newer state.
                if checkpoint is not None:
                    session.checkpoint = checkpoint
                self._last_metrics = metrics
                return metrics, checkpoint, bool(metrics.get("done", False))
            break  # the thread ended: it returned, raised or was stopped
        if self._error is not None:
            raise TrialError(
                f"Trial {self.trial_id}: trainable {self.name} raised an exception:\n{self._error}",
                trial_id=self.trial_id,
                traceback_text=self._error,
            )
        if isinstance(self._returned, Mapping):
            # A returned dict is the final result, as Ray Tune's function API did.
            return dict(self._returned), None, True
        if session.reported == 0:
            raise TrialError(
                f"Trial {self.trial_id}: trainable {self.name} returned without reporting any "
                "result; "
                f"call airflow_trials.report(metric=value) at least once per iteration.",
                trial_id=self.trial_id,
            )
        # Returned after reporting: the trial is done; repeat the last metrics as its final result.
        return {**self._last_metrics, R.DUPLICATE: True}, None, True

    def run_ahead(self) -> bool:
        session = self._session
        if session is None or self._thread is None or self._ahead or self._finished.is_set():
            return False
        self._ahead = True
        session.continue_event.release()
        return True

    def start_ahead(self) -> bool:
        if self._session is not None or self._thread is not None:
            return False  # already started
        self._start()
        self._ahead = True
        return True

    def save(self, checkpoint_dir: str) -> Any:
        return None if self._session is None else self._session.checkpoint

    def restore(self, checkpoint: Any) -> None:
        self.stop()
        self._restored = checkpoint

    def reset(self, config: dict[str, Any], trial_id: str) -> None:
        self.stop()
        self.config = dict(config)
        self.trial_id = trial_id
        self._restored = None
        self._last_metrics = {}

    def stop(self) -> None:
        session, thread = self._session, self._thread
        self._session, self._thread = None, None
        self._ahead = False
        if session is None or thread is None:
            return
        session.stopped = True
        session.continue_event.release()
        # Drain a result the thread may be blocked putting, so it reaches its next report and stops.
        try:
            session.results.get_nowait()
        except queue.Empty:
            pass
        thread.join(timeout=5.0)


def make_driver(
    trainable: Callable[..., Any] | type[Trainable],
    config: dict[str, Any],
    trial_id: str,
    parameters: Mapping[str, Any] | None = None,
) -> TrainableDriver:
    """The driver of ``trainable``, which gets ``parameters`` (with_parameters constants) as
    keywords."""
    if inspect.isclass(trainable) and issubclass(trainable, Trainable):
        return ClassDriver(trainable, config, trial_id, parameters or {})
    return FunctionDriver(trainable, config, trial_id, parameters or {})
