"""RayOutage: how long Ray has not answered a trial's or a sweep's watch in the triggerer."""

from __future__ import annotations

import asyncio
import time
from typing import Any

# How long a watch keeps trying while Ray does not answer (its head restarting, say) before it
# gives what it watches up as lost to infrastructure; the task then resumes it from its latest
# checkpoint.
RAY_OUTAGE_TIMEOUT_SECONDS = 120.0
# Slack over a poll's own wait before an unanswered poll counts as Ray not answering.
POLL_GRACE_SECONDS = 30.0


class RayOutageTimeout(Exception):  # noqa: N818 - reads as what happened, like Ray's own errors
    """Ray did not answer a watch for longer than its outage timeout."""


class RayOutage:
    """How long Ray has not answered a watch (a trial's or a sweep's). Each failed call logs and
    waits a little; once Ray has been silent past ``timeout_seconds``, :meth:`wait` raises
    :class:`RayOutageTimeout` and the watch ends with its own lost event.

    :param subject: what is watched, for the log: ``"Trial t-1"``, ``"Sweep manual__1"``.
    :param timeout_seconds: how long Ray may stay silent.
    :param poll_interval_seconds: the watch's; the wait between tries, within 0.5 and 5 s.
    :param log: the trigger's logger.
    """

    def __init__(
        self, subject: str, timeout_seconds: float, poll_interval_seconds: float, log: Any
    ) -> None:
        self.subject = subject
        self.timeout_seconds = timeout_seconds
        self.poll_interval_seconds = poll_interval_seconds
        self.log = log
        self.since: float | None = None  # when Ray last stopped answering; None while it answers

    def answered(self) -> None:
        """Ray answered: the next failure starts a new outage."""
        self.since = None

    async def wait(self, error: BaseException) -> None:
        """Ray failed a call with ``error``: wait a little before the next try, or raise
        :class:`RayOutageTimeout` once it has not answered for too long."""
        now = time.monotonic()
        if self.since is None:
            self.since = now
        silent_s = now - self.since
        if silent_s > self.timeout_seconds:
            raise RayOutageTimeout(
                f"Ray did not answer for {silent_s:.0f} s ({type(error).__name__}: {error})"
            )
        self.log.warning(
            "%s: Ray does not answer (%s: %s); trying again (%.0f of %.0f s).",
            self.subject,
            type(error).__name__,
            error,
            silent_s,
            self.timeout_seconds,
        )
        await asyncio.sleep(min(5.0, max(0.5, self.poll_interval_seconds)))
