"""TrialWatch: a trial trigger's hold on its trial's Ray actor, from a TrialWatchSpec to one end.

The triggerer's work for one trial (attach, poll through the poller, hand results to the judge,
release, the end), in plain Ray and trials-DB calls: the trigger
(:mod:`~airflow_trials.triggers.trial_trigger`) builds it, awaits it and yields its event, as
Databricks' trigger awaits its hook. It reaches the actor through the actor client the trigger's
hook hands out (``TrialsHook.get_actor_client``), never a runner's executor."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn, Protocol

from airflow_trials.core.end import TrialEnd
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.update import TrialUpdate
from airflow_trials.exceptions import StoreError
from airflow_trials.execution.triggerer.outage import (
    POLL_GRACE_SECONDS,
    RAY_OUTAGE_TIMEOUT_SECONDS,
    RayOutage,
    RayOutageTimeout,
)
from airflow_trials.execution.triggerer.task_log import TaskLogEcho
from airflow_trials.schedulers.registry import judge_for
from airflow_trials.schedulers.trial_judge import Judge, Judged, Verdict

if TYPE_CHECKING:
    from airflow_trials.execution.polls import TrialPolls
    from airflow_trials.store import TrialStore

# The least time between two polls after a verdict released a held actor (a poll answers at once
# while the actor still holds, until its thread takes the verdict).
RELEASED_PACE_SECONDS = 0.02


class ActorClient(Protocol):
    """What a watch asks of the actor client (``TrialActorClient``, which the trigger's hook hands
    out): find the trial's actor, give it a verdict, let it delete dropped checkpoints, free it;
    and its ``storage`` (``TrialStorage``), for a graceful stop's mark."""

    storage: Any

    def attach(self, experiment_name: str, trial_id: str) -> Any: ...

    def decide(
        self,
        actor: Any,
        iteration: int,
        decision: str,
        reason: str | None,
        stop_kind: str,
        timeout_s: float,
    ) -> None: ...

    def release_checkpoints(self, actor: Any, version: int, timeout_s: float) -> None: ...

    def release(
        self, experiment_name: str, trial_id: str, placement_group_id: str | None, actor: Any
    ) -> None: ...


@dataclass(frozen=True)
class TrialWatchSpec:
    """What a trial's watch watches, in plain values: its trigger's ``serialize()`` kwargs, which
    a deferred task keeps in Airflow's DB. The parameters are
    :class:`~airflow_trials.triggers.trial_trigger.TrialTrigger`'s, with its defaults; the
    connection ids have none here (the trigger gives them), only the trigger's hook reads them.
    """

    experiment_name: str
    trial_id: str
    ray_conn_id: str
    trials_conn_id: str
    poll_interval_seconds: float = 2.0
    ray_outage_timeout_seconds: float = RAY_OUTAGE_TIMEOUT_SECONDS
    ray_cluster_id: str | None = None
    scheduler: dict[str, Any] | None = field(default=None, hash=False)
    bracket: int = 0
    experiment_run_id: int | None = None

    def __post_init__(self) -> None:
        if self.scheduler is not None and self.experiment_run_id is None:
            raise ValueError(
                f"TrialTrigger for trial {self.trial_id}: a scheduler judges a trial against the "
                "other trials of its experiment run, so it needs experiment_run_id."
            )

    def to_kwargs(self) -> dict[str, Any]:
        """The trigger's ``serialize()`` kwargs."""
        return asdict(self)


class Ended(Exception):  # noqa: N818 - raised with the event that ends a watch
    """Raised inside a watch with the event that ends it."""

    def __init__(self, event: dict[str, Any]) -> None:
        super().__init__(event["status"])
        self.event = event


class TrialWatch:
    """One trigger run's hold on its trial: the actor, its registration with the poller, and how
    to free it. It knows its trial through a :class:`TrialWatchSpec`, never through the trigger.

    Every Ray call runs on the poller's thread or in a thread of its own, is awaited with a bound,
    and reads the GCS only in ways that survive a GCS restart, so neither a hung Ray nor a
    restarted one stalls or kills the triggerer: an actor that stops answering is re-attached
    (reconnecting to a restarted cluster); one that is gone ends the watch with an ERROR event.

    :param spec: the trial, and how to watch it.
    :param connect: the actor client on the trigger's Ray connection (``TrialsHook``'s
        ``get_actor_client``; ``connect(True)`` makes sure first that the connection is to the
        cluster now at Ray's address). Called in a thread: it may wait on Ray.
    :param store: the trials store, opened by the trigger.
    :param log: the trigger's logger: the trial's output and progress land in the task's log.
    :param try_number: the Airflow try whose trigger watches; the end it records is fenced by it
        (a later try that took the trial over keeps it). Default None: not fenced.
    """

    def __init__(
        self,
        spec: TrialWatchSpec,
        connect: Callable[..., ActorClient],
        store: TrialStore,
        log: Any,
        try_number: int | None = None,
    ) -> None:
        self.spec = spec
        self.try_number = try_number
        self.connect = connect
        self.store = store
        self.log = log
        self.client: ActorClient | None = None
        self.actor: Any = None
        self.placement_group_id: str | None = None
        self.placed = False
        self.polls: TrialPolls | None = None
        self.outage = RayOutage(
            f"Trial {spec.trial_id}",
            spec.ray_outage_timeout_seconds,
            spec.poll_interval_seconds,
            log,
        )
        self.echo = TaskLogEcho(log, spec.trial_id)
        self.judge: Judge | None = None
        # TrialWatchSpec refuses a scheduler without experiment_run_id.
        if spec.scheduler is not None and spec.experiment_run_id is not None:
            self.judge = judge_for(
                spec.scheduler, spec.bracket, spec.experiment_run_id, spec.trial_id
            )

    async def until_end(self) -> dict[str, Any]:
        """Record the trial's results until it ends; the end event (TERMINATED, or ERROR)."""
        try:
            await self._attach()
            while True:
                asked = time.monotonic()
                poll, update = await self._next_update()
                judged = await self._record(poll)
                released = await self._act_on(update, judged)
                self.echo.report(update)
                if update.ended:
                    return await self._ended(update)
                # The actor waits for us; if it answered early (it is not running its loop), pace.
                # Not after a verdict released it from a hold: its next result may be held already.
                pace = RELEASED_PACE_SECONDS if released else poll.wait_seconds
                await asyncio.sleep(max(0.0, pace - (time.monotonic() - asked)))
        except Ended as end:
            return end.event

    def close(self) -> None:
        """Stop polling (the trial keeps running); safe to call more than once."""
        if self.polls is not None:
            self.polls.close()
            self.polls = None

    async def release(self) -> None:
        """Kill the trial's actor and remove its placement group (best effort)."""
        spec = self.spec
        try:
            client = self.client
            if client is None:
                client = await asyncio.to_thread(self.connect)
            await asyncio.to_thread(
                client.release,
                spec.experiment_name,
                spec.trial_id,
                self.placement_group_id,
                self.actor,
            )
        except Exception as e:  # Ray down: its restart frees the trial's resources anyway
            self.log.warning("Could not stop trial %s on Ray: %s", spec.trial_id, e)

    async def _attach(self) -> None:
        spec = self.spec
        self.actor = await self._find_actor()
        if self.actor is None:
            finished = await asyncio.to_thread(self._finished_in_store)
            # Gone after it finished (this trigger ran again after the triggerer restarted, and
            # its first run had freed the actor): report the stored end, not a failure.
            if finished:
                raise Ended(finished)
            if await self._cluster_replaced():
                raise Ended(
                    self._lost(
                        "the Ray cluster it was launched on is gone (a new cluster answers at "
                        "Ray's "
                        "address); its task resumes it from its latest checkpoint",
                        infrastructure=True,
                        released=True,
                    )
                )
            drained = await asyncio.to_thread(self._drained_at)
            if drained is not None:  # removed after a graceful stop paused it: no failure
                why = f"its Ray actor is gone: a graceful stop paused it after iteration {drained}"
                raise Ended(self._lost(f"{why}; its task resumes it", infrastructure=True))
            raise Ended(self._lost("its Ray actor is gone (node lost or killed)"))
        from airflow_trials.execution.ray_state import actor_info

        info = await asyncio.to_thread(actor_info, self.actor)
        self.placement_group_id = info.placement_group_id or self.placement_group_id
        from airflow_trials.execution.polls import ensure_lag_probe
        from airflow_trials.execution.triggerer.poller import watch_trial

        ensure_lag_probe()
        wait_s = spec.poll_interval_seconds
        # What the store names now: what the actor dropped while nobody recorded is marked deleted
        # with the first write (a watch before this one may have died in between).
        recorded = [
            c.path
            for c in await asyncio.to_thread(self.store.reader.live_checkpoints, spec.trial_id)
        ]
        self.polls = watch_trial(
            spec.trial_id, self.actor, self.store.url, wait_s, recorded, self.judge
        )

    async def _cluster_replaced(self) -> bool:
        """Is this process now connected to another Ray cluster than the trial was launched on?"""
        from airflow_trials.execution.ray_state import current_cluster_id

        launched_on = self.spec.ray_cluster_id
        now = await asyncio.to_thread(current_cluster_id)
        return launched_on is not None and now is not None and now != launched_on

    async def _find_actor(self) -> Any:
        """The trial's actor, or None when it is gone, once Ray answers (reconnecting this process
        if the cluster at Ray's address restarted)."""
        spec = self.spec
        while True:
            try:
                self.client = client = await asyncio.to_thread(self.connect, True)
                return await asyncio.to_thread(client.attach, spec.experiment_name, spec.trial_id)
            except Exception as e:  # Ray down, or answering with errors while it restarts
                await self._ray_not_answering(e)

    async def _next_update(self) -> tuple[Any, TrialUpdate]:
        """The next poll that Ray answered, and the actor's update."""
        from ray.exceptions import ActorUnavailableError, RayActorError

        from airflow_trials.execution.polls import RayNotAnswering

        if self.polls is None:
            raise RuntimeError(f"The watch of trial {self.spec.trial_id} polls before it attached.")
        while True:
            # Answered once Ray has placed the actor (a queued trial waits here, deferred), then
            # after the poll's wait_seconds (poll_interval_seconds, or longer when the poller
            # watches many trials) or as soon as the trial ends or holds. A poll that times out is
            # awaited again rather than sent again, so a queued actor's calls do not pile up.
            poll = self.polls.poll()
            wait_s = poll.wait_seconds
            answered, _ = await asyncio.wait({poll.answered}, timeout=wait_s + POLL_GRACE_SECONDS)
            try:
                if not answered:
                    raise TimeoutError(
                        f"no answer to a poll within {wait_s + POLL_GRACE_SECONDS:.0f} s"
                    )
                update: TrialUpdate = poll.answered.result()
            except TimeoutError as e:
                if self.placed:  # a queued trial is not expected to answer: only check Ray is there
                    await self._ray_not_answering(e)
                await self._reattach()
                continue
            except (ActorUnavailableError, RayNotAnswering) as e:
                await self._ray_not_answering(e)
                await self._reattach()
                continue
            except RayActorError as e:  # the actor died under us
                raise Ended(await self._died(e)) from e
            self.outage.answered()
            return poll, update

    async def _ray_not_answering(self, error: BaseException) -> None:
        """Wait a little, or stop the trial and end the watch once Ray has not answered for too
        long."""
        try:
            await self.outage.wait(error)
        except RayOutageTimeout as e:
            await self.release()
            raise Ended(
                self._lost(
                    f"{e}; its task resumes the trial from its latest checkpoint once Ray is back",
                    infrastructure=True,
                    released=True,
                )
            ) from e

    async def _reattach(self) -> None:
        """Find the trial's actor again after Ray stopped answering; end the watch if it is gone."""
        actor = await self._find_actor()
        if actor is None:
            await self.release()
            raise Ended(
                self._lost(
                    "its Ray actor is gone: the Ray cluster restarted or the trial's node was "
                    "lost; "
                    "its task resumes it from its latest checkpoint",
                    infrastructure=True,
                    released=True,
                )
            )
        if self.polls is not None:
            self.polls.set_actor(actor)
        self.actor = actor

    async def _died(self, error: BaseException) -> dict[str, Any]:
        from airflow_trials.execution.ray_state import ActorInfo, actor_info

        try:
            info = await asyncio.to_thread(actor_info, self.actor)
        except Exception:  # the GCS is gone too: the cluster went down with the actor
            info = ActorInfo("DEAD", None, "NODE_DIED", "The Ray GCS does not answer either.")
        self.placement_group_id = info.placement_group_id or self.placement_group_id
        await self.release()
        cause = f"{info.death_reason}: {info.death_message}" if info.death_reason else str(error)
        return self._lost(
            f"its Ray actor died while it ran ({cause})",
            infrastructure=info.lost_to_infrastructure,
            released=True,
        )

    async def _record(self, poll: Any) -> Judged | None:
        """Wait until the poller wrote the poll's new results and checkpoints (and RUNNING, the
        first time) with the verdicts the scheduler gave on them; what the scheduler found (None
        when nothing was written). A DB that fails past the store's retries stops the trial, so
        that its task's retry resumes it from its latest recorded checkpoint."""
        try:
            judged: Judged | None = await poll.recorded
        except StoreError as e:
            await self._store_failed(
                "its results and its scheduler's verdicts could not be written to the trials DB",
                e,
            )
        self.placed = True
        return judged

    async def _store_failed(self, what: str, error: StoreError) -> NoReturn:
        """A DB that failed past the store's retries: stop the trial on Ray and end the watch, so
        that its task's retry resumes it from its latest recorded checkpoint."""
        await self.release()
        raise Ended(
            self._lost(
                f"{what} ({error}); the trial was stopped on Ray so that its task's retry resumes "
                "it "
                "from its latest recorded checkpoint",
                released=True,
            )
        ) from error

    async def _act_on(self, update: TrialUpdate, judged: Judged | None) -> bool:
        """Tell the actor what the scheduler decided on the update's new results (judged as
        they were written): the first STOP, and the verdict on the result it holds at. Whether
        the actor was held (and so released)."""
        judge = self.judge
        if judge is None:
            return False
        if judged is not None and judged.error is not None:
            await self.release()
            raise Ended(self._lost(str(judged.error), released=True)) from judged.error
        stop = judged.stop if judged is not None else None
        if update.ended:
            # It ended on its own (its criterion): nothing to tell it (its end records the rest).
            return False
        held = update.held_at
        verdicts = [stop] if stop is not None else []
        if held is not None and (stop is None or stop.iteration != held):
            verdicts.append(judge.verdict_for(held))
        for verdict in verdicts:
            if verdict.reason:
                self.log.info("Trial %s: %s.", self.spec.trial_id, verdict.reason)
            await asyncio.to_thread(self._tell, verdict)
        return held is not None

    def _tell(self, verdict: Verdict) -> None:
        """Give the actor a verdict; a failed call is only logged (the next poll finds a dead actor,
        and a trigger that runs again tells a held actor once more)."""
        try:
            assert self.client is not None, "a watch tells its actor only after it attached"
            self.client.decide(
                self.actor,
                verdict.iteration,
                verdict.decision.value,
                verdict.reason,
                verdict.stop_kind.value,
                POLL_GRACE_SECONDS,
            )
        except Exception as e:  # noqa: BLE001 - Ray's errors for a dead or unreachable actor vary
            self.log.warning(
                "Trial %s: could not give its actor the verdict on result %d (%s: %s).",
                self.spec.trial_id,
                verdict.iteration,
                type(e).__name__,
                e,
            )

    async def _release_checkpoints(self) -> None:
        """Let the ended trial's actor delete what it dropped since the last poll, now that the
        store holds its last kept set; a failure only leaves those checkpoints on the storage."""
        version = self.polls.tracker.recorded_version if self.polls is not None else None
        if version is None:
            return
        try:
            assert self.client is not None, "a watch sees the end only after it attached"
            await asyncio.to_thread(
                self.client.release_checkpoints, self.actor, version, POLL_GRACE_SECONDS
            )
        except Exception as e:  # noqa: BLE001 - Ray's errors for a dead or unreachable actor vary
            self.log.warning(
                "Trial %s: its dropped checkpoints were not deleted (%s: %s); they "
                "stay on the storage.",
                self.spec.trial_id,
                type(e).__name__,
                e,
            )

    def _drained_at(self) -> int | None:
        assert self.client is not None
        return self.client.storage.drained_at(self.spec.experiment_name, self.spec.trial_id)

    def _finished_in_store(self) -> dict[str, Any] | None:
        record = self.store.reader.get_trial(self.spec.trial_id)
        if record.status is not TrialStatus.TERMINATED:
            return None
        return stored_end_event(self.store, self.spec.experiment_name, record)

    def _lost(
        self, why: str, *, infrastructure: bool = False, released: bool = False
    ) -> dict[str, Any]:
        """The ERROR event of a trial whose actor is gone (``infrastructure``: with its node or its
        cluster, not because of the trial) or that this watch had to stop."""
        return TrialEnd.lost(
            self.spec.trial_id,
            self.spec.experiment_name,
            why,
            infrastructure=infrastructure,
            released=released,
        ).to_event()

    async def _ended(self, update: TrialUpdate) -> dict[str, Any]:
        # Free the trial's resources now rather than when a worker runs execute_complete, so a
        # trial queued behind it starts at once; the event carries all execute_complete needs.
        self.echo.ended(update)
        await self._release_checkpoints()
        await self.release()
        end = update.end(self.spec.experiment_name, released=True)
        if end.finished:
            # The one record of a finished end: shown as finished at once, and found by a task
            # whose worker died before execute_complete (its retry reports the stored end).
            # execute_complete only reads it; a failed end is the worker's to record, with the
            # decision only the task can make (its retries left). In the same transaction, ASHA,
            # MOASHA and the median rule record a finished trial's last value (Ray Tune's and
            # Syne Tune's on_trial_complete); a failed trial's, never.
            update = TrialUpdate.of_end(end, try_number=self.try_number)
            judges = None
            if self.judge is not None:
                judges = {end.trial_id: self.judge.ending(end.last_result)}
            await asyncio.to_thread(self.store.record_progress, [update], judges=judges)
            if judges:
                judges[end.trial_id].settle()
        return end.to_event()


def stored_end_event(store: TrialStore, experiment_name: str, record: Any) -> dict[str, Any]:
    """The TERMINATED event of a trial whose end the store holds (its actor is already gone)."""
    latest = store.reader.latest_checkpoint(record.trial_id)
    return TrialEnd.stored(
        record.trial_id,
        experiment_name,
        record.last_result,
        latest.path if latest else None,
        stop_reason=record.stop_reason,
        stop_kind=record.stop_kind,
    ).to_event()
