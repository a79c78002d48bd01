"""Which database errors are transient, and how long the store waits before re-running a
transaction."""

from __future__ import annotations

import random
from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError

# SQLSTATEs worth a new attempt: class 08 (connection exception), the server shutting down or
# restarting (57P01 admin_shutdown, 57P02 crash_shutdown, 57P03 cannot_connect_now),
# serialization_failure and deadlock_detected (the transaction lost a race; run it again).
_TRANSIENT_SQLSTATE_CLASSES = ("08",)
_TRANSIENT_SQLSTATES = frozenset({"57P01", "57P02", "57P03", "40001", "40P01"})
# SQLite reports a writer that outwaited busy_timeout by message only.
_SQLITE_BUSY = ("database is locked", "database is busy", "database table is locked")
# libpq connection failures carry no SQLSTATE; these say the settings are wrong, not the network.
_PERMANENT_CONNECT_FAILURES = ("does not exist", "authentication failed", "pg_hba.conf")


def is_transient(error: BaseException) -> bool:
    """True when running the same transaction again may succeed: a lost connection, a busy
    SQLite file, a serialization failure or deadlock. Integrity, data and programming errors are
    not transient."""
    if not isinstance(error, DBAPIError):
        return False
    if error.connection_invalidated:
        return True
    cause = error.orig
    sqlstate = getattr(cause, "sqlstate", None) or getattr(cause, "pgcode", None)
    if sqlstate:
        return sqlstate.startswith(_TRANSIENT_SQLSTATE_CLASSES) or sqlstate in _TRANSIENT_SQLSTATES
    message = str(cause).lower()
    if type(cause).__module__.startswith("sqlite3"):
        return any(text in message for text in _SQLITE_BUSY)
    if type(cause).__module__.startswith("psycopg") and type(cause).__name__ == "OperationalError":
        # No SQLSTATE from psycopg: libpq could not reach the server or lost it mid-call.
        return not any(text in message for text in _PERMANENT_CONNECT_FAILURES)
    return False


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded exponential backoff with jitter for transactions that failed transiently.

    The wait before attempt ``n + 1`` is drawn uniformly from the upper half of
    ``min(max_backoff_seconds, initial_backoff_seconds * 2 ** (n - 1))``, so writers that failed
    together do not retry together. No attempt starts after ``timeout_seconds`` since the first.

    :param max_attempts: attempts in all, the first included; default 8.
    :param timeout_seconds: no new attempt once this long has passed since the first; default 30.
    :param initial_backoff_seconds: the longest wait after the first failure; default 0.1.
    :param max_backoff_seconds: the longest wait between two attempts; default 5.
    """

    max_attempts: int = 8
    timeout_seconds: float = 30.0
    initial_backoff_seconds: float = 0.1
    max_backoff_seconds: float = 5.0

    def __post_init__(self) -> None:
        if (
            isinstance(self.max_attempts, bool)
            or not isinstance(self.max_attempts, int)
            or self.max_attempts < 1
        ):
            raise ValueError(
                f"retry_max_attempts must be an integer of at least 1, got {self.max_attempts!r}."
            )
        for name in ("timeout_seconds", "initial_backoff_seconds", "max_backoff_seconds"):
            value = getattr(self, name)
            if not isinstance(value, int | float) or not 0 <= value < float("inf"):
                raise ValueError(
                    f"retry_{name} must be a finite number of at least 0, got {value!r}."
                )

    def delay_seconds(self, attempt: int, elapsed_seconds: float) -> float | None:
        """How long to wait after failed attempt ``attempt`` (1-based), or None to give up."""
        if attempt >= self.max_attempts:
            return None
        ceiling = min(self.max_backoff_seconds, self.initial_backoff_seconds * 2 ** (attempt - 1))
        delay = random.uniform(ceiling / 2, ceiling)
        if elapsed_seconds + delay > self.timeout_seconds:
            return None
        return delay
