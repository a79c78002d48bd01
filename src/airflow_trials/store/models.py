"""SQLAlchemy models of the store's tables: experiments, runs, trials, results, checkpoints, rungs,
median points, exploits, extensions and approvals.

Every table name starts with ``at_`` so the store can share a database with other tools. The
Alembic revisions in ``migrations/versions/`` (0001_initial.py, then changes) create exactly
these tables; tests/contract/test_store.py checks that the two agree.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, ClassVar

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Dialect,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator, TypeEngine

from airflow_trials.store.history_indexes import history_indexes

# Explicit constraint names, so migrations and the models name them the same on every backend.
NAMING_CONVENTION = {
    "ix": "ix_%(column_0_N_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

ID_LENGTH = 128
AIRFLOW_ID_LENGTH = 250
PATH_LENGTH = 1024


def json_type(*, nullable: bool = False) -> TypeEngine[Any]:
    """JSON on SQLite, JSONB on PostgreSQL; a nullable column stores Python None as SQL NULL."""
    return JSON(none_as_null=nullable).with_variant(JSONB(none_as_null=nullable), "postgresql")


def big_int_type() -> TypeEngine[int]:
    """BIGINT, but INTEGER on SQLite, whose INTEGER holds 64 bits already.

    SQLite only auto-increments a column declared exactly INTEGER PRIMARY KEY, and declaring
    INTEGER there keeps migrations from rebuilding tables to change a name only.
    """
    return BigInteger().with_variant(Integer(), "sqlite")


def utcnow() -> datetime:
    return datetime.now(UTC)


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC datetime on every backend (SQLite keeps no offset, so it is UTC
    there)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        # A naive datetime is taken to be UTC already.
        value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)
    # Every model maps one Table (SQLAlchemy types it as any FromClause).
    __table__: ClassVar[Table]


class ExperimentRow(Base):
    """An experiment: a name that groups runs, with the metric and mode its leaderboard ranks by."""

    __tablename__ = "at_experiments"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(ID_LENGTH), unique=True)
    metric: Mapped[str | None] = mapped_column(String(AIRFLOW_ID_LENGTH), nullable=True)
    mode: Mapped[str | None] = mapped_column(String(8), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # A JSON list of constraint strings (migration 0011); NULL: none, every trial is feasible.
    constraints: Mapped[str | None] = mapped_column(Text, nullable=True)


class ExperimentRunRow(Base):
    """One run of an experiment, e.g. one Airflow DAG run; ``run_key`` is unique per experiment."""

    __tablename__ = "at_experiment_runs"
    __table_args__ = (UniqueConstraint("experiment_id", "run_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_id: Mapped[int] = mapped_column(ForeignKey("at_experiments.id", ondelete="CASCADE"))
    run_key: Mapped[str] = mapped_column(String(AIRFLOW_ID_LENGTH))
    dag_id: Mapped[str | None] = mapped_column(String(AIRFLOW_ID_LENGTH), nullable=True)
    run_id: Mapped[str | None] = mapped_column(String(AIRFLOW_ID_LENGTH), nullable=True)
    search_space: Mapped[Any] = mapped_column(json_type(nullable=True), nullable=True)
    # 64-bit (migration 0003): run_seed() gives values up to 2**32 - 1 and users may pass more.
    seed: Mapped[int | None] = mapped_column(big_int_type(), nullable=True)
    num_samples: Mapped[int | None] = mapped_column(Integer, nullable=True)
    status: Mapped[str] = mapped_column(
        String(16), default="RUNNING", server_default=text("'RUNNING'")
    )
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    # Its history line as computed when it ended (migration 0013, store/run_summaries.py); NULL
    # while it runs, before 0013, or once a trial of it was written after it ended. Deferred: only
    # the history reads it (undefer), so listing runs does not decode it.
    summary: Mapped[Any] = mapped_column(json_type(nullable=True), nullable=True, deferred=True)
    # The trial select_best picked (0013); NULL until it picked one.
    picked_trial_id: Mapped[str | None] = mapped_column(String(ID_LENGTH), nullable=True)
    # Why it was ended by hand (airflow-trials db end-run, migration 0019); NULL when it ended
    # on its own, or runs.
    end_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # The version of the data it tuned on (tuning_experiment(data_version=...), migration 0020);
    # NULL when it named none. Written once, when the run is created.
    data_version: Mapped[str | None] = mapped_column(String(AIRFLOW_ID_LENGTH), nullable=True)


class TrialRow(Base):
    """One trial: its config, status, failures, last result and the Airflow task that runs it."""

    __tablename__ = "at_trials"
    # history_indexes(): an experiment's history across runs reads indexes alone (migration 0012).
    __table_args__ = (
        Index("ix_at_trials_experiment_run_id", "experiment_run_id"),
        *history_indexes(),
    )

    trial_id: Mapped[str] = mapped_column(String(ID_LENGTH), primary_key=True)
    experiment_run_id: Mapped[int | None] = mapped_column(
        ForeignKey("at_experiment_runs.id", ondelete="SET NULL"), nullable=True
    )
    trainable: Mapped[str] = mapped_column(String(PATH_LENGTH))
    config: Mapped[Any] = mapped_column(json_type())
    resources: Mapped[Any] = mapped_column(json_type())
    status: Mapped[str] = mapped_column(String(16))
    num_failures: Mapped[int] = mapped_column(Integer, default=0, server_default=text("0"))
    max_failures: Mapped[int] = mapped_column(Integer)
    error_msg: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Why it ended TERMINATED (migration 0005); NULL while it has not, or when nobody said.
    stop_reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Why it ended TERMINATED, as a core.stop_kind.StopKind value (migration 0017); NULL while it
    # has not, or when nobody said. Written only by trial_writes.change_status.
    stop_kind: Mapped[str | None] = mapped_column(String(16), nullable=True)
    # Why its status last changed, as a core.status_cause.StatusCause value (migration 0018);
    # NULL for a change recorded before. Written only by trial_writes.change_status (and
    # upsert_trial's registration).
    status_cause: Mapped[str | None] = mapped_column(String(24), nullable=True)
    # Stopped from Airflow (its task cleared, marked or killed), and not started since (0009).
    stopped_from_airflow: Mapped[bool] = mapped_column(
        Boolean, default=False, server_default=false()
    )
    last_result: Mapped[Any] = mapped_column(json_type(nullable=True), nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    dag_id: Mapped[str | None] = mapped_column(String(AIRFLOW_ID_LENGTH), nullable=True)
    run_id: Mapped[str | None] = mapped_column(String(AIRFLOW_ID_LENGTH), nullable=True)
    task_id: Mapped[str | None] = mapped_column(String(AIRFLOW_ID_LENGTH), nullable=True)
    map_index: Mapped[int] = mapped_column(Integer, default=-1, server_default=text("-1"))
    try_number: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # Where a warm-started trial came from (migration 0008): {"run_key", "experiment_run_id",
    # "trial_id", "value", "checkpoint"}; NULL for any other trial.
    warm_start: Mapped[Any] = mapped_column(json_type(nullable=True), nullable=True)
    # The trial's best value of its experiment's metric, kept up to date by add_results so the
    # leaderboard reads one row per trial. best_metric/best_mode say what it was computed for;
    # NULL best_metric with results stored means "unknown" (the leaderboard then scans results).
    best_metric: Mapped[str | None] = mapped_column(String(250), nullable=True)
    best_mode: Mapped[str | None] = mapped_column(String(8), nullable=True)
    best_value: Mapped[float | None] = mapped_column(Float, nullable=True)
    best_iteration: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # The best of best_metric in the other mode than best_mode (its highest value when best_mode
    # is "min"), and the first iteration that reached it (migration 0015): maintained with the
    # columns above and valid when they are, so a ranking in the other mode reads no result.
    other_mode_best_value: Mapped[float | None] = mapped_column(Float, nullable=True)
    other_mode_best_iteration: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # With an experiment of several metrics (best_metric its stored metrics, best_mode NULL): the
    # best of each metric in both modes (migration 0021), {metric: {"min": [value, iteration],
    # "max": [...]}}; NULL otherwise. The four columns above stay NULL for such a trial.
    metric_bests: Mapped[Any] = mapped_column(json_type(nullable=True), nullable=True)


class ResultRow(Base):
    """One reported result of a trial, stored once per (trial_id, iteration).

    The unique constraint is also the (trial_id, iteration) index that reads go through.
    """

    __tablename__ = "at_results"
    __table_args__ = (UniqueConstraint("trial_id", "iteration"),)

    id: Mapped[int] = mapped_column(big_int_type(), primary_key=True)
    trial_id: Mapped[str] = mapped_column(ForeignKey("at_trials.trial_id", ondelete="CASCADE"))
    iteration: Mapped[int] = mapped_column(Integer)
    timestamp: Mapped[float] = mapped_column(Float)
    metrics: Mapped[Any] = mapped_column(json_type())


class CheckpointRow(Base):
    """A persisted checkpoint of a trial; ``deleted`` once the keep policy dropped it."""

    __tablename__ = "at_checkpoints"
    __table_args__ = (
        UniqueConstraint("trial_id", "path"),
        # The newest kept checkpoint of a trial without a sort (the leaderboard asks per trial).
        Index("ix_at_checkpoints_trial_id_iteration", "trial_id", "iteration", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    trial_id: Mapped[str] = mapped_column(ForeignKey("at_trials.trial_id", ondelete="CASCADE"))
    path: Mapped[str] = mapped_column(String(PATH_LENGTH))
    iteration: Mapped[int] = mapped_column(Integer)
    score: Mapped[float | None] = mapped_column(Float, nullable=True)
    deleted: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class TrialRungRow(Base):
    """ASHA's record of one trial at one rung: the value it reached the rung with and the verdict.

    The Airflow path keeps ASHA's state here, since each trial is watched by a trigger of its own
    (``TrialStore.record_rung``). One row per (trial, milestone), so a result judged twice gets its
    first verdict again. ``value`` is the metric in its own units; NULL stands for NaN (SQLite
    stores NaN as NULL anyway), which ASHA records but leaves out of cutoffs. A decision reads one
    rung's values through the (experiment_run_id, bracket, milestone, value) index alone.
    """

    __tablename__ = "at_trial_rungs"
    __table_args__ = (
        UniqueConstraint("trial_id", "milestone"),
        Index(
            "ix_at_trial_rungs_rung_values", "experiment_run_id", "bracket", "milestone", "value"
        ),
    )

    id: Mapped[int] = mapped_column(big_int_type(), primary_key=True)
    experiment_run_id: Mapped[int] = mapped_column(
        ForeignKey("at_experiment_runs.id", ondelete="CASCADE")
    )
    trial_id: Mapped[str] = mapped_column(ForeignKey("at_trials.trial_id", ondelete="CASCADE"))
    bracket: Mapped[int] = mapped_column(Integer)
    milestone: Mapped[float] = mapped_column(Float)
    # training_iteration of the result that reached the rung; None when the caller did not say.
    iteration: Mapped[int | None] = mapped_column(Integer, nullable=True)
    value: Mapped[float | None] = mapped_column(Float, nullable=True)
    decision: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    # Recorded when the trial ended (ASHA keeps a trial's last value); its verdict was not acted on.
    at_end: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    # MOASHA's rows: the trial's metric values at the rung, a JSON list in the order of its metrics
    # (null for NaN), with ``value`` NULL; NULL on ASHA's rows.
    metric_values: Mapped[str | None] = mapped_column(Text, nullable=True)


class TrialMedianPointRow(Base):
    """The median stopping rule's record of one trial's result from ``grace_period`` on.

    The Airflow path keeps the rule's state here (``TrialStore.record_median_point``): ``total`` is
    the running sum of the metric over the trial's results from grace_period up to this one and
    ``seq`` their count, so a running mean at any time is one index probe. One row per (trial,
    iteration, at_end): a result judged twice gets its first verdict again. ``at_end`` rows repeat
    a trial's last result when it ends, as Ray Tune's rule appends it again. ``total`` NULL: not
    finite, left out of medians.
    """

    __tablename__ = "at_trial_median_points"
    __table_args__ = (
        UniqueConstraint("trial_id", "iteration", "at_end"),
        Index("ix_at_trial_median_points_trial_id_time_seq", "trial_id", "time", "seq"),
        Index(
            "ix_at_trial_median_points_run_time_mean",
            "experiment_run_id",
            "time",
            "superseded",
            "mean",
        ),
        Index(
            "ix_at_trial_median_points_run_gaps", "experiment_run_id", "gap", "time", "prev_time"
        ),
    )

    id: Mapped[int] = mapped_column(big_int_type(), primary_key=True)
    experiment_run_id: Mapped[int] = mapped_column(
        ForeignKey("at_experiment_runs.id", ondelete="CASCADE")
    )
    trial_id: Mapped[str] = mapped_column(ForeignKey("at_trials.trial_id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    time: Mapped[float] = mapped_column(Float)
    # The trial's previous point's time; gap: the two are not consecutive integers, so a decision
    # between them finds no point of this trial at its time.
    prev_time: Mapped[float | None] = mapped_column(Float, nullable=True)
    gap: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    iteration: Mapped[int] = mapped_column(Integer)
    at_end: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    total: Mapped[float | None] = mapped_column(Float, nullable=True)
    # total / seq, NULL when not finite; superseded: a later point of the trial has the same time.
    mean: Mapped[float | None] = mapped_column(Float, nullable=True)
    superseded: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    decision: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class TrialExploitRow(Base):
    """A PBT exploit: the trial continued from its donor's checkpoint with an explored config.

    ``TrialStore.record_exploit`` writes it and the trial's new config in one transaction, once
    per trial and ``digest`` (of the call's values: not the trial, not the results it moved): a
    repeated call is stored once, while a trial may clone the same donor checkpoint twice (the donor
    paused in between) with two explored configs, two rows. ``iteration`` is the donor checkpoint's
    training_iteration, the one the trial reports on from; the trial's results after it move into
    ``replaced_results``. ``donor_trial_id`` has no foreign key, so the exploit stays on record if
    the donor's row goes. Read per trial in the order recorded, newest first for a
    lineage, through the (trial_id, id) index.
    """

    __tablename__ = "at_trial_exploits"
    __table_args__ = (
        UniqueConstraint("trial_id", "digest"),
        Index("ix_at_trial_exploits_trial_id_id", "trial_id", "id"),
    )

    id: Mapped[int] = mapped_column(big_int_type(), primary_key=True)
    trial_id: Mapped[str] = mapped_column(ForeignKey("at_trials.trial_id", ondelete="CASCADE"))
    experiment_run_id: Mapped[int | None] = mapped_column(
        ForeignKey("at_experiment_runs.id", ondelete="SET NULL"), nullable=True
    )
    iteration: Mapped[int] = mapped_column(Integer)
    donor_trial_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    donor_checkpoint: Mapped[str] = mapped_column(String(PATH_LENGTH))
    old_config: Mapped[Any] = mapped_column(json_type())
    new_config: Mapped[Any] = mapped_column(json_type())
    # Dotted config key -> what PBT's explore did to it, e.g. {"lr": "0.01 * 1.2"}.
    operations: Mapped[Any] = mapped_column(json_type())
    # The trial's results after ``iteration`` when it was recorded, in iteration order: the state it
    # gave up. Moved here out of at_results, where the new state's results at those iterations go.
    replaced_results: Mapped[Any] = mapped_column(json_type())
    digest: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)


class RunExtensionRow(Base):
    """One extension of a finished experiment run (migration 0014, ``airflow-trials extend``): the
    DAG run that extended it, when, and what changed. Its trials stay in the extended run.

    ``stop_before``/``stop_after``: the stopping criterion before and after (NULL: unchanged).
    ``trials_continued``: ids of the TERMINATED trials that continue from their latest checkpoint
    under ``stop_after``; ``trials_added``: ids of the new trials. ``status``: RUNNING until the
    extension's ``select_best`` ends it SUCCESS or FAILED.
    """

    __tablename__ = "at_run_extensions"
    __table_args__ = (UniqueConstraint("experiment_run_id", "dag_run_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_run_id: Mapped[int] = mapped_column(
        ForeignKey("at_experiment_runs.id", ondelete="CASCADE")
    )
    dag_run_id: Mapped[str] = mapped_column(String(AIRFLOW_ID_LENGTH))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
    ended_at: Mapped[datetime | None] = mapped_column(UTCDateTime(), nullable=True)
    num_samples_added: Mapped[int] = mapped_column(Integer)
    stop_before: Mapped[Any] = mapped_column(json_type(nullable=True), nullable=True)
    stop_after: Mapped[Any] = mapped_column(json_type(nullable=True), nullable=True)
    trials_continued: Mapped[Any] = mapped_column(json_type())
    trials_added: Mapped[Any] = mapped_column(json_type())
    status: Mapped[str] = mapped_column(String(16), default="RUNNING")


class RunApprovalRow(Base):
    """The answer to one DAG run's ``approve_best`` (migration 0016,
    ``tuning_experiment(approval=True)``): who answered, when, why, the user who triggered the DAG
    run, and the outcome (``core/approval_rule.py``). A REJECTED row is final: no later answer of
    the same DAG run replaces it."""

    __tablename__ = "at_run_approvals"
    __table_args__ = (UniqueConstraint("experiment_run_id", "dag_run_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    experiment_run_id: Mapped[int] = mapped_column(
        ForeignKey("at_experiment_runs.id", ondelete="CASCADE")
    )
    dag_run_id: Mapped[str] = mapped_column(String(AIRFLOW_ID_LENGTH))
    trial_id: Mapped[str] = mapped_column(String(ID_LENGTH))
    outcome: Mapped[str] = mapped_column(String(16))
    responded_by_id: Mapped[str] = mapped_column(String(AIRFLOW_ID_LENGTH))
    responded_by_name: Mapped[str] = mapped_column(String(AIRFLOW_ID_LENGTH))
    responded_at: Mapped[datetime] = mapped_column(UTCDateTime())
    reason: Mapped[str] = mapped_column(Text)
    triggered_by: Mapped[str | None] = mapped_column(String(AIRFLOW_ID_LENGTH), nullable=True)
    recorded_at: Mapped[datetime] = mapped_column(UTCDateTime(), default=utcnow)
