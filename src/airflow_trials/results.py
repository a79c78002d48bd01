"""ResultGrid: an experiment run's trials read back from the trials DB, in Ray Tune's Result API
shape.

One API for both paths: a DAG run's trials and an engine-only run recorded with
:class:`~airflow_trials.execution.driver.trials_db_callback.TrialsDbCallback` are read the same
way::

    from airflow_trials import ResultGrid, load_checkpoint

    grid = ResultGrid.from_db("regression_tuning")          # the latest run; or run="<run_id>"
    best = grid.get_best_result()                          # the experiment's metric and mode
    print(best.config, best.metrics["val_loss"])
    model = load_checkpoint(best.best_checkpoint)
    grid.get_dataframe()                                   # one row per trial
    best.metrics_dataframe                                 # that trial's every result

With several metrics there is no single best trial: ``grid.get_pareto_front(["val_acc",
"latency"], ["max", "min"])`` returns the trials no other trial beats on every metric.

With the search's constraints (``ResultGrid.from_db(..., constraints=["latency <= 5.0"])``),
``get_dataframe`` has a ``feasible`` column, and an infeasible trial neither wins
``get_best_result`` nor is on the Pareto front while a feasible one is there.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from airflow_trials.core.constraints import COUNTED_STATUSES, EVERY_STATUS, Constraints, front_ranks
from airflow_trials.core.goal import Goal
from airflow_trials.core.pareto import MetricSpec, ModeSpec, check_several, decode_metrics
from airflow_trials.core.status import TrialStatus
from airflow_trials.result_rows import (
    best_row,
    checked_board,
    frame_row,
    memory_board,
    run_board,
    with_checkpoints,
)

if TYPE_CHECKING:
    import pandas as pd

    from airflow_trials.store import ExperimentRunRecord, TrialReader, TrialRecord, TrialStore
    from airflow_trials.store.board import Board


@dataclass(frozen=True)
class TrialResult:
    """One trial of a :class:`ResultGrid` (Ray Tune's ``Result``).

    :param trial_id: the trial.
    :param status: TERMINATED, ERROR, or not ended yet.
    :param config: its hyperparameters.
    :param metrics: its last reported result (Ray Tune's ``Result.metrics``); empty before the
        first.
    :param best_checkpoint: path of the kept checkpoint that scored best on the experiment's
        metric (the model to publish); with several metrics, or none recorded, the newest kept
        one; None when none is kept. Load it with :func:`~airflow_trials.load_checkpoint`.
    :param latest_checkpoint: path of its newest kept checkpoint (what a restore resumes from).
    :param error: its last failure's message; None when it did not fail.
    :param num_failures: how often it failed.
    """

    trial_id: str
    status: TrialStatus
    config: dict[str, Any]
    metrics: dict[str, Any]
    best_checkpoint: str | None
    latest_checkpoint: str | None
    error: str | None
    num_failures: int
    _store: TrialReader = field(repr=False, compare=False)

    @classmethod
    def of(cls, trial: TrialRecord, store: TrialReader) -> TrialResult:
        """A trial as the trials DB holds it; no checkpoints yet (``with_checkpoints``)."""
        return cls(
            trial_id=trial.trial_id,
            status=trial.status,
            config=trial.config,
            metrics=dict(trial.last_result or {}),
            best_checkpoint=None,
            latest_checkpoint=None,
            error=trial.error_msg,
            num_failures=trial.num_failures,
            _store=store,
        )

    @property
    def metrics_dataframe(self) -> pd.DataFrame:
        """Every result the trial reported, one row per ``training_iteration``, read on each
        access."""
        import pandas as pd

        return pd.DataFrame(self._store.get_results(self.trial_id))


class ResultGrid(Sequence[TrialResult]):
    """The trials of one experiment run (Ray Tune's ``ResultGrid``); a sequence of
    :class:`TrialResult`.

    Open it with :meth:`from_db`. It is a snapshot taken when opened; open it again to see a run
    that is still going.

    :param store: the trials DB, read-only.
    :param run: the experiment run.
    :param metric: the experiment's metric (the default of the readers), or the list of its
        metrics when it optimises several (the default of :meth:`get_pareto_front`); None when
        not recorded.
    :param mode: its mode, ``"min"`` or ``"max"``, or the list of one per metric; None when not
        recorded.
    :param results: the trials, ordered by trial id.
    :param constraints: the search's constraints (``["latency <= 5.0"]``,
        :mod:`airflow_trials.core.constraints`), judged on each trial's last result: an
        infeasible trial does not win :meth:`get_best_result` nor sit on the Pareto front while a
        feasible one is there, and ``get_dataframe`` gets a ``feasible`` column. Default none.
    """

    def __init__(
        self,
        store: TrialReader,
        run: ExperimentRunRecord,
        metric: MetricSpec | None,
        mode: ModeSpec | None,
        results: list[TrialResult],
        constraints: Sequence[str] | Constraints | None = None,
    ) -> None:
        self.constraints = Constraints.parse(constraints, "ResultGrid")
        self._store = store
        self.run = run
        self.experiment_name = run.experiment_name
        self.run_key = run.run_key
        self.metric = metric
        self.mode = mode
        self._results = results
        # The run's board (store/board.py) when the grid judges the recorded constraints.
        self._board: Board | None = None
        # Read back from the trials DB (from_db): its questions are the store's board's.
        self._read_back = False

    @classmethod
    def from_db(
        cls,
        experiment_name: str,
        run: str | int = "latest",
        *,
        db_url: str | None = None,
        trials_conn_id: str = "trials_default",
        store: TrialReader | TrialStore | None = None,
        constraints: Sequence[str] | Constraints | None = None,
    ) -> ResultGrid:
        """The run's trials as the trials DB holds them.

        :param experiment_name: the experiment (the DAG's ``experiment_name``, or the runner's).
        :param run: ``"latest"`` (default), a run id, or a run key (an Airflow run_id).
        :param db_url: the trials DB; default: found as the DAGs find it (the ``trials_conn_id``
            connection, else ``AIRFLOW_TRIALS_DB_URL``, else the default SQLite file).
        :param trials_conn_id: the connection; default ``trials_default``.
        :param store: an open store (or its reader) to read instead of ``db_url``.
        :param constraints: the search's constraints, as given to ``OptunaSearch(constraints=)``;
            default: those the trials DB records for the experiment (``tuning_experiment`` and
            ``TrialsDbCallback`` record the searcher's), none when it records none. ``[]``: judge
            no constraint.
        :raises ExperimentNotFoundError: no such experiment or run.
        :raises ValueError: a constraint that is not ``"<metric> <= <number>"`` or ``>=``.
        """
        given = (
            None if constraints is None else Constraints.parse(constraints, "ResultGrid.from_db")
        )
        from airflow_trials.store import TrialReader, TrialStore

        if store is None:
            from airflow_trials.trials_db_url import trials_db_url

            store = TrialReader(db_url or trials_db_url(trials_conn_id, create_dir=False)[0])
        elif isinstance(store, TrialStore):
            store = store.reader
        record = store.resolve_run(experiment_name, run)
        experiment = next(e for e in store.list_experiments() if e.name == experiment_name)
        metric, mode = decode_metrics(experiment.metric, experiment.mode)
        trials = store.list_trials(experiment_run_id=record.id)
        board = run_board(store, record.id, experiment.goal)
        results = [TrialResult.of(t, store) for t in sorted(trials, key=lambda t: t.trial_id)]
        results = with_checkpoints(store, results, board)
        checked = experiment.parsed_constraints() if given is None else given
        grid = cls(store, record, metric, mode, results, checked)
        # Read back: its questions are the store's board's; the board read here answers its own
        # (the recorded constraints').
        grid._read_back = True
        grid._board = board if checked.spec == experiment.parsed_constraints().spec else None
        return grid

    # -- Sequence ----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._results)

    def __getitem__(self, index: int) -> TrialResult:  # type: ignore[override]
        return self._results[index]

    def __iter__(self) -> Iterator[TrialResult]:
        return iter(self._results)

    def __repr__(self) -> str:
        return (
            f"ResultGrid({self.experiment_name!r}, run={self.run_key!r}, trials={len(self)}, "
            f"terminated={self.num_terminated}, errors={self.num_errors})"
        )

    @property
    def errors(self) -> list[str]:
        """The errors of the trials that ended in ERROR."""
        return [r.error or "" for r in self._results if r.status is TrialStatus.ERROR]

    @property
    def num_errors(self) -> int:
        return len(self.errors)

    @property
    def num_terminated(self) -> int:
        return sum(r.status is TrialStatus.TERMINATED for r in self._results)

    # -- the best trial ------------------------------------------------------------------------
    def get_best_result(
        self,
        metric: str | None = None,
        mode: str | None = None,
        scope: Literal["last", "all"] = "last",
        filter_nan_and_inf: bool = True,
        terminated_only: bool = False,
    ) -> TrialResult:
        """The trial with the best value of ``metric``, as Ray Tune's
        ``ResultGrid.get_best_result``.

        Like Ray Tune's, it ranks every trial that reported the metric, whatever its status: one
        that ended in ERROR, or has not ended yet, can be the best. ``select_best`` ranks the
        TERMINATED trials only; ``scope="all", terminated_only=True`` gives its trial.

        Every question is answered by the run's board (``TrialReader.board``, docs/store.md "The
        board"), asked with this metric and mode, the result ``scope`` judges, the statuses that
        count and the grid's constraints, as the trials DB holds the run when asked.

        With the grid's ``constraints``, only the feasible trials (judged on the result ranked)
        are ranked while there is one (with none feasible, every trial is, and a warning says so).

        With several metrics there is no single best trial (nor in Ray Tune): a list of metrics,
        or no metric on a grid whose experiment records several, raises a ValueError pointing to
        :meth:`get_pareto_front`; one of those metrics, given alone, is ranked in its recorded
        mode.

        :param metric: default: the experiment's metric.
        :param mode: ``"min"`` or ``"max"``; default: the experiment's mode (of that metric).
        :param scope: ``"last"`` (default, as Ray Tune) compares each trial's last reported value;
            ``"all"`` compares each trial's best value over all its results (the leaderboard's
            order).
        :param filter_nan_and_inf: skip NaN and infinite values; default True. The trials DB
            stores them as missing values, so a grid read from it never ranks them either way.
        :param terminated_only: rank only the trials that ended TERMINATED, as ``select_best``
            does; default False (every trial, as Ray Tune).
        :raises ValueError: no metric given or recorded, several metrics, a bad mode or scope, no
            trial reported the metric (the message lists the metrics they did report), or, with
            ``terminated_only``, none of those that did ended TERMINATED (the message counts their
            statuses).
        """
        metric, mode = self._metric_and_mode(metric, mode)
        if scope not in ("last", "all"):
            raise ValueError(f"scope must be 'last' or 'all', got {scope!r}.")
        judged = "best" if scope == "all" else "last"
        board = self._ask(Goal.of(metric, mode), judged, terminated_only, filter_nan_and_inf)
        return self._by_id(checked_board(self, board, metric, filter_nan_and_inf).best_trial_id)

    def get_pareto_front(
        self,
        metric: list[str] | None = None,
        mode: list[str] | None = None,
        scope: Literal["last"] = "last",
        filter_nan_and_inf: bool = True,
        terminated_only: bool = True,
    ) -> list[TrialResult]:
        """The trials on the Pareto front of several metrics: those that no other trial beats on
        every metric (at least as good on each, better on one), ordered by trial id. Ray Tune has
        no multi-objective best; this is :meth:`get_best_result` for several metrics, and
        :func:`~airflow_trials.core.constraints.front_ranks` ranks the rest (``get_dataframe``'s
        ``pareto_rank`` column).

        It compares the trials that ended TERMINATED (docs/store.md "Which trials count"), and
        with ``constraints`` the feasible ones while there is one; equal trials share the front.
        It is the front of the run's board asked that question (``TrialReader.board``)::

            front = grid.get_pareto_front(["val_acc", "latency"], ["max", "min"])
            print([(r.trial_id, r.metrics["val_acc"], r.metrics["latency"]) for r in front])

        :param metric: the metrics, a list; default: the experiment's, when it records several.
        :param mode: one ``"min"`` or ``"max"`` per metric, in the same order; default: the
            experiment's, when ``metric`` is its own.
        :param scope: ``"last"`` (the only one): each trial's last result. A trial's best result
            of one metric need not be its best of another, so ``"all"`` has no single row per trial
            to compare and is refused, naming the fix.
        :param filter_nan_and_inf: skip a trial with a NaN or infinite value of a metric; default
            True. False compares infinite values (NaN still compares with nothing): only a grid of
            results in memory holds any, since the trials DB stores them as missing.
        :param terminated_only: only the trials that ended TERMINATED (default True, every front's).
        :raises ValueError: no metrics given or recorded, one metric (a string), metrics and modes
            that do not pair up, ``scope="all"``, no trial reported every metric (the message
            lists the metrics they did report), or, with ``terminated_only``, none of those that
            did ended TERMINATED.
        """
        metrics, modes = self._metrics_and_modes("get_pareto_front", metric, mode)
        if scope != "last":
            raise ValueError(
                f"get_pareto_front compares each trial's last result (scope='last'), got "
                f"scope={scope!r}: a trial's best values of {metrics!r} may come from different "
                "results, so there is no one best row per trial to compare. Use scope='last', or "
                "rank one metric over every result with get_best_result(metric=..., "
                "scope='all')."
            )
        board = self._ask(Goal.of(metrics, modes), "last", terminated_only, filter_nan_and_inf)
        front = checked_board(self, board, metrics, filter_nan_and_inf).front_trial_ids
        return [r for r in self._results if r.trial_id in front]

    def get_dataframe(
        self,
        filter_metric: str | None = None,
        filter_mode: str | None = None,
        *,
        pareto_metric: list[str] | None = None,
        pareto_mode: list[str] | None = None,
    ) -> pd.DataFrame:
        """One row per trial: its metrics, its config as ``config/<key>`` columns, trial_id, status
        and checkpoints, as Ray Tune's ``ResultGrid.get_dataframe``; with several metrics, also a
        ``pareto_rank`` column.

        ``pareto_rank`` is each row's Pareto rank over the metrics among the trials that count: 0
        on the front (the trials :meth:`get_pareto_front` returns), 1 on the front once those
        are removed, and so on; missing (``<NA>``) for a row without a finite value of every
        metric, or whose trial did not end TERMINATED. It is the run's board's ``pareto_rank``,
        but with ``filter_metric``: each row is then its trial's best result of that metric, which
        no board row is, so those rows are ranked here by the same rule
        (:func:`~airflow_trials.core.constraints.front_ranks`, docs/store.md "Which trials
        count"). It is there when the experiment records
        several metrics, or ``pareto_metric`` is given; one metric gives the same frame as always.

        With the grid's ``constraints``, a ``feasible`` column says whether each row meets them
        all (False for a row that does not report a constrained metric), and ``pareto_rank`` ranks
        the feasible rows first (:func:`~airflow_trials.core.constraints.constrained_ranks`).

        :param filter_metric: with ``filter_mode``, each trial's row is its result with the best
            value of this metric instead of its last result.
        :param filter_mode: ``"min"`` or ``"max"``.
        :param pareto_metric: the metrics ``pareto_rank`` ranks the rows by, a list; default: the
            experiment's, when it records several.
        :param pareto_mode: one ``"min"`` or ``"max"`` per metric; give it with ``pareto_metric``.
        """
        import pandas as pd

        pareto = self._frame_pareto(filter_metric, filter_mode, pareto_metric, pareto_mode)
        rows = [
            frame_row(result, self._shown_metrics(result, filter_metric, filter_mode))
            for result in self._results
        ]
        frame = pd.DataFrame(rows)
        feasible = [self.constraints.feasible(row) for row in rows]
        if self.constraints:
            frame["feasible"] = pd.array(feasible, dtype=bool)
        if pareto is not None:
            ranks = self._pareto_ranks(*pareto, rows, feasible if filter_metric else None)
            frame["pareto_rank"] = pd.array(ranks, dtype="Int64")
        return frame

    # -- internals ---------------------------------------------------------------------------
    def _frame_pareto(
        self,
        filter_metric: str | None,
        filter_mode: str | None,
        pareto_metric: list[str] | None,
        pareto_mode: list[str] | None,
    ) -> tuple[list[str], list[str]] | None:
        """``get_dataframe``'s arguments checked: the metrics and modes ``pareto_rank`` ranks by
        (given, else the experiment's several); None: no ``pareto_rank``."""
        if (filter_metric is None) != (filter_mode is None):
            raise ValueError(
                "get_dataframe takes filter_metric and filter_mode together, or neither."
            )
        if (pareto_metric is None) != (pareto_mode is None):
            raise ValueError(
                "get_dataframe takes pareto_metric and pareto_mode together (e.g. "
                "pareto_metric=['val_acc', 'latency'], pareto_mode=['max', 'min']), or neither "
                "(then the experiment's, when it records several metrics)."
            )
        if pareto_metric is not None:
            return self._metrics_and_modes("get_dataframe", pareto_metric, pareto_mode)
        if isinstance(self.metric, list) and isinstance(self.mode, list):
            return self.metric, self.mode
        return None

    def _ask(self, goal: Goal, judged: str, counted_only: bool, finite_only: bool) -> Board:
        """The run's board asked this question (store/board.py): ranked by ``goal``, each trial
        judged on its ``"best"`` or ``"last"`` result, the TERMINATED trials counted
        (``counted_only``) or every one, with the grid's constraints. The board read at open
        when it is that one; a grid of results in memory ranks them by the same ranking."""
        own = self._board
        if (
            own is not None
            and counted_only
            and (own.goal.metrics, own.goal.modes) == (goal.metrics, goal.modes)
            and own.goal.several == goal.several
            and judged == ("last" if own.goal.several else "best")
        ):
            return own
        counted = COUNTED_STATUSES if counted_only else EVERY_STATUS
        if not self._read_back and judged == "last":
            return memory_board(self, goal, counted, finite_only)
        return self._store.board(
            self.run.id, goal, judged=judged, counted=counted, constraints=self.constraints
        )

    def _pareto_ranks(
        self,
        metrics: list[str],
        modes: list[str],
        rows: list[dict[str, Any]],
        feasible: list[bool] | None,
    ) -> list[int | None]:
        """Each frame row's Pareto rank: the board's (each trial's last result). ``feasible``
        (one flag per row) when the rows are each trial's best result of ``filter_metric``,
        which no board row is: those rows are ranked here, by the same rule (``front_ranks``)."""
        if feasible is None:
            board = self._ask(Goal.of(metrics, modes), "last", True, True)
            ranks = {r.trial_id: r.pareto_rank for r in board.rows}
            return [ranks.get(row["trial_id"]) for row in rows]
        values = [[row.get(m) for m in metrics] for row in rows]
        statuses = [result.status for result in self._results]
        return front_ranks(values, modes, statuses, feasible if self.constraints else None)

    def _shown_metrics(
        self, result: TrialResult, filter_metric: str | None, filter_mode: str | None
    ) -> Mapping[str, Any]:
        """The result a trial's row shows: its last, or its best of ``filter_metric``."""
        if filter_metric is None:
            return result.metrics
        return best_row(self._store.get_results(result.trial_id), filter_metric, filter_mode) or {}

    def _metric_and_mode(self, metric: str | None, mode: str | None) -> tuple[str, str]:
        if isinstance(metric, list | tuple) or (metric is None and isinstance(self.metric, list)):
            whose = "given" if metric else f"experiment {self.experiment_name}'s"
            raise ValueError(
                f"get_best_result ranks one metric, and there is no single best trial of several "
                f"(the {whose} {list(metric or self.metric or ())!r}): use get_pareto_front() "
                "for the trials no other trial beats on every metric, or pass one metric= (and "
                "mode=) to get_best_result."
            )
        from airflow_trials.core.goal import PYTHON_FLAGS, Goal

        # A metric not the experiment's needs mode= (ModeNeeded); its own keeps its mode.
        chosen = Goal.of(self.metric, self.mode).pick(metric, mode, PYTHON_FLAGS)
        if chosen.metric is None or chosen.modes[0] is None:
            raise ValueError(
                f"Experiment {self.experiment_name} has no metric and mode recorded; pass metric= "
                "and mode=."
            )
        return chosen.metric, chosen.modes[0]

    def _metrics_and_modes(
        self, owner: str, metric: list[str] | None, mode: list[str] | None
    ) -> tuple[list[str], list[str]]:
        """Several metrics and modes, checked; the experiment's when none are given."""
        if metric is None:
            if not (isinstance(self.metric, list) and isinstance(self.mode, list)):
                recorded = (
                    f"records one metric, {self.metric!r}" if self.metric else "records no metric"
                )
                raise ValueError(
                    f"{owner}: experiment {self.experiment_name} {recorded}; pass the metrics "
                    "and their modes as lists, e.g. metric=['val_acc', 'latency'], "
                    "mode=['max', 'min']."
                )
            return self.metric, self.mode
        if isinstance(metric, str):
            raise ValueError(
                f"{owner}: metric={metric!r} is one metric; pass several as a list with one mode "
                "each (e.g. metric=['val_acc', 'latency'], mode=['max', 'min']), or rank one "
                "metric with get_best_result."
            )
        if mode is None and metric == self.metric and isinstance(self.mode, list):
            mode = self.mode
        return check_several(owner, metric, mode)

    def _by_id(self, trial_id: str | None) -> TrialResult:
        found = next((r for r in self._results if r.trial_id == trial_id), None)
        if found is None:
            raise ValueError(
                f"The best trial of experiment {self.experiment_name} run {self.run_key}, "
                f"{trial_id}, started after this grid was opened; open it again to see it."
            )
        return found
