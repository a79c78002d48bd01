"""The search-algorithm interface (Ray Tune's ``Searcher``) and ``ConcurrencyLimiter``."""

from __future__ import annotations

import abc
import math
from collections.abc import Mapping, Sequence
from typing import Any

from airflow_trials.core.pareto import MetricSpec, ModeSpec, check_metrics
from airflow_trials.core.result import Result
from airflow_trials.core.status import TrialStatus

#: What :meth:`Searcher.suggest` returns when it will suggest no more trials (Ray Tune's value).
FINISHED = "FINISHED"

Suggestion = dict[str, Any] | str | None
"""A new trial's config; None: nothing to suggest now, ask again later; or :data:`FINISHED`."""

ObjectiveValue = float | list[float]
"""What a trial reached: its metric's value, or with several metrics one value per metric."""


class Searcher(abc.ABC):
    """Suggests each new trial's config from the results of the trials before it.

    The shape is Ray Tune 2.60's ``Searcher``, so a searcher written for Ray Tune ports by
    changing its imports. The :class:`~airflow_trials.TrialRunner` drives it
    (``TrialRunner(search_alg=..., num_samples=..., trainable=...)``):

    1. ``set_search_properties(metric, mode, config)`` may be called once, before the first
       suggestion, to give the searcher what it was not constructed with; it returns False when
       it already had them (and then keeps its own).
    2. ``suggest(trial_id)`` is called when a trial could start: it returns that trial's config,
       None when it has nothing to suggest now (it is asked again later), or :data:`FINISHED` when
       it will suggest no more trials.
    3. ``on_trial_result(trial_id, result)`` is called for every result of a trial it suggested.
    4. ``on_trial_complete(trial_id, result, error)`` is called once per such trial when it ends:
       ``result`` is its last result (None if it never reported), ``error`` is True when it failed
       for good.

    A runnable example, random search in ten lines::

        import random
        from airflow_trials import Searcher

        class RandomX(Searcher):
            def suggest(self, trial_id):
                return {"x": random.random()}

            def on_trial_complete(self, trial_id, result=None, error=False):
                print(trial_id, result and result.get(self.metric))

        searcher = RandomX(metric="loss", mode="min")
        assert set(searcher.suggest("t-1")) == {"x"}

    An exception a searcher raises ends the experiment: the runner stops its unfinished trials
    and raises :class:`~airflow_trials.SearcherError` naming the searcher.

    :param metric: the result key the searcher optimises, or a list of them for a searcher that
        optimises several at once (``OptunaSearch``); default None (set later).
    :param mode: ``"min"`` or ``"max"``, or with several metrics a list of one per metric;
        default None (set later).
    """

    FINISHED = FINISHED

    def __init__(self, metric: MetricSpec | None = None, mode: ModeSpec | None = None) -> None:
        self._metric, self._mode = check_metric_and_mode(type(self).__name__, metric, mode)

    @property
    def metric(self) -> MetricSpec | None:
        return self._metric

    @property
    def mode(self) -> ModeSpec | None:
        return self._mode

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: Mapping[str, Any]
    ) -> bool:
        """Take the experiment's metric, mode and search space; False if not taken (the default)."""
        return False

    def take_metric(self, metric: MetricSpec | None, mode: ModeSpec | None) -> None:
        """Take the experiment's metric and mode where this searcher has none of its own."""
        self._metric, self._mode = check_metric_and_mode(
            type(self).__name__, self._metric or metric, self._mode or mode
        )

    @abc.abstractmethod
    def suggest(self, trial_id: str) -> Suggestion:
        """The config of the new trial ``trial_id``, None (nothing now) or :data:`FINISHED`."""

    def on_trial_result(self, trial_id: str, result: Result) -> None:
        """One result of a trial this searcher suggested; the default ignores it."""
        return None

    @abc.abstractmethod
    def on_trial_complete(
        self, trial_id: str, result: Result | None = None, error: bool = False
    ) -> None:
        """The trial ended: ``result`` is its last result, ``error`` says it failed for good."""

    def add_evaluated_point(
        self,
        parameters: Mapping[str, Any],
        value: ObjectiveValue | None,
        error: bool = False,
        pruned: bool = False,
        intermediate_values: Sequence[float] | None = None,
        *,
        result: Mapping[str, Any] | None = None,
    ) -> None:
        """Learn a config evaluated elsewhere (Ray Tune's name): a resumed sweep tells the searcher
        its run's ended trials with this, and the trials it did not suggest when they end. ``value``
        is the metric it reached, a list of one value per metric with several (None with
        ``error``: it failed; with ``pruned``: stopped early). ``result`` is its last result, for a
        searcher that reads more of it than the metric (constraints)."""
        raise NotImplementedError(
            f"{type(self).__name__} cannot learn from trials it did not suggest "
            "(add_evaluated_point), so a "
            "sweep cannot resume it; implement add_evaluated_point, or use OptunaSearch."
        )

    def resume_after(self, asked: int) -> None:
        """A resumed run had asked this searcher ``asked`` times in an earlier process (those trials
        are told with :meth:`add_evaluated_point`, or continue with their configs): a searcher that
        hands out ``points_to_evaluate`` first skips the ones already handed out. Default:
        nothing."""
        return None


def ended_trials(
    trials: Sequence[Any], metric: MetricSpec, exclude: str | None = None
) -> list[tuple[dict[str, Any], ObjectiveValue | None]]:
    """``(config, value)`` of the ended trials a searcher learns from
    (:func:`ended_trial_values`)."""
    return [(config, value) for _, config, value in ended_trial_values(trials, metric, exclude)]


def ended_trial_values(
    trials: Sequence[Any], metric: MetricSpec, exclude: str | None = None
) -> list[tuple[str, dict[str, Any], ObjectiveValue | None]]:
    """``(trial id, config, value)`` of the ended trials (records with ``trial_id``, ``config``,
    ``status``, ``last_result``) a searcher learns from: a finished trial's metric in its last
    result (as Ray Tune tells a searcher, early-stopped trials included), or with several metrics
    the list of their values; None for a trial that failed for good. Trials stopped before they
    reported the metric (every one of them, with several), and ``exclude``, are left out."""
    ended: list[tuple[str, dict[str, Any], ObjectiveValue | None]] = []
    for trial in trials:
        if trial.trial_id == exclude or not trial.config:
            continue
        if trial.status is TrialStatus.ERROR:
            ended.append((trial.trial_id, dict(trial.config), None))
        elif (
            trial.status is TrialStatus.TERMINATED
            and (value := objective_value(trial.last_result, metric)) is not None
        ):
            ended.append((trial.trial_id, dict(trial.config), value))
    return ended


def metric_value(result: Mapping[str, Any] | None, metric: str) -> float | None:
    """``result[metric]`` as a finite float; None when it is missing or not a finite number."""
    value = (result or {}).get(metric)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def objective_value(result: Mapping[str, Any] | None, metric: MetricSpec) -> ObjectiveValue | None:
    """:func:`metric_value` of one metric; with several, the list of their values, None when one
    of them is missing or not a finite number."""
    if isinstance(metric, str):
        return metric_value(result, metric)
    values = [metric_value(result, name) for name in metric]
    return [v for v in values if v is not None] if None not in values else None


def check_metric_and_mode(
    owner: str, metric: MetricSpec | None, mode: ModeSpec | None
) -> tuple[MetricSpec | None, ModeSpec | None]:
    """One metric with its mode checked as always (:func:`check_mode`), or several as
    :func:`~airflow_trials.core.pareto.check_metrics` checks them."""
    metric, mode = check_metrics(owner, metric, mode)
    if isinstance(mode, list):
        return metric, mode
    return metric, check_mode(owner, mode)


def check_mode(owner: str, mode: str | None) -> str | None:
    if mode not in (None, "min", "max"):
        raise ValueError(f"{owner}: mode must be 'min' or 'max', got {mode!r}.")
    return mode


class ConcurrencyLimiter(Searcher):
    """Lets at most ``max_concurrent`` of a searcher's trials be unfinished at once (Ray Tune's).

    A sequential searcher learns from more results this way: with ``max_concurrent=2`` it is
    asked for a third trial only after one of the first two ended. Every call is passed to the
    wrapped searcher; ``suggest`` returns None while the limit is reached.

    :param searcher: the :class:`Searcher` to limit.
    :param max_concurrent: the most of its trials unfinished at once; a whole number >= 1.
    """

    def __init__(self, searcher: Searcher, max_concurrent: int) -> None:
        if not isinstance(searcher, Searcher):
            raise TypeError(
                f"ConcurrencyLimiter wraps a Searcher, got {type(searcher).__name__} {searcher!r}."
            )
        if (
            not isinstance(max_concurrent, int)
            or isinstance(max_concurrent, bool)
            or max_concurrent < 1
        ):
            raise ValueError(
                "ConcurrencyLimiter: max_concurrent must be a whole number >= 1, got "
                f"{max_concurrent!r}."
            )
        super().__init__()
        self.searcher = searcher
        self.max_concurrent = max_concurrent
        self.live_trials: set[str] = set()

    @property
    def metric(self) -> MetricSpec | None:
        return self.searcher.metric

    @property
    def mode(self) -> ModeSpec | None:
        return self.searcher.mode

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: Mapping[str, Any]
    ) -> bool:
        return self.searcher.set_search_properties(metric, mode, config)

    def suggest(self, trial_id: str) -> Suggestion:
        if len(self.live_trials) >= self.max_concurrent:
            return None
        suggestion = self.searcher.suggest(trial_id)
        if suggestion is not None and suggestion != FINISHED:
            self.live_trials.add(trial_id)
        return suggestion

    def on_trial_result(self, trial_id: str, result: Result) -> None:
        if trial_id in self.live_trials:
            self.searcher.on_trial_result(trial_id, result)

    def on_trial_complete(
        self, trial_id: str, result: Result | None = None, error: bool = False
    ) -> None:
        if trial_id not in self.live_trials:
            return
        self.live_trials.discard(trial_id)
        self.searcher.on_trial_complete(trial_id, result=result, error=error)

    def add_evaluated_point(
        self,
        parameters: Mapping[str, Any],
        value: ObjectiveValue | None,
        error: bool = False,
        pruned: bool = False,
        intermediate_values: Sequence[float] | None = None,
        *,
        result: Mapping[str, Any] | None = None,
    ) -> None:
        if result is None:  # a searcher written for Ray Tune's signature takes no result
            self.searcher.add_evaluated_point(parameters, value, error, pruned, intermediate_values)
        else:
            self.searcher.add_evaluated_point(
                parameters, value, error, pruned, intermediate_values, result=result
            )

    @property
    def constraints(self) -> Any:
        """The wrapped searcher's constraints (OptunaSearch's), None for one without."""
        return getattr(self.searcher, "constraints", None)

    def resume_after(self, asked: int) -> None:
        self.searcher.resume_after(asked)


def agree_on_metric(scheduler: object, searcher: Searcher) -> None:
    """Make a scheduler and a searcher judge trials by one metric and mode, as Ray Tune's Tuner
    does with TuneConfig's: one that has none takes the other's. ValueError, before any trial
    starts, when both have one and they differ (a scheduler stopping trials on one metric while
    the searcher learns from another tunes neither).

    A searcher that optimises several metrics goes with a scheduler that judges none (FIFO), or
    with one that judges one of them in the same mode: a scheduler without a metric of its own
    cannot take several, so that is refused, naming the fix (:func:`_agree_on_several`). A
    scheduler that judges several (``takes_several_metrics``: MOASHA) judges the searcher's, in
    the same order and modes."""
    if isinstance(searcher.metric, list) and isinstance(searcher.mode, list):
        _agree_on_several(scheduler, searcher, searcher.metric, searcher.mode)
        return
    metric, mode = getattr(scheduler, "metric", None), getattr(scheduler, "mode", None)
    clash = [
        f"{name} {theirs!r} vs {ours!r}"
        for name, theirs, ours in (
            ("metric", metric, searcher.metric),
            ("mode", mode, searcher.mode),
        )
        if theirs and ours and theirs != ours
    ]
    if clash:
        raise ValueError(
            f"The scheduler {type(scheduler).__name__} and the searcher {type(searcher).__name__} "
            "disagree "
            f"on {', '.join(clash)} (scheduler vs searcher): give both the same metric and mode, "
            "or set "
            f"them on one of them only."
        )
    setter = getattr(scheduler, "set_search_properties", None)
    if setter is not None and (searcher.metric or searcher.mode):
        setter(None if metric else searcher.metric, None if mode else searcher.mode)


def _agree_on_several(
    scheduler: object, searcher: Searcher, metrics: list[str], modes: list[str]
) -> None:
    """A scheduler beside a searcher of several metrics: FIFO (no metric) is fine; one judging by
    one of them takes its mode from the searcher, or must have the same; anything else is
    refused."""
    own = getattr(scheduler, "metric", None)
    setter = getattr(scheduler, "set_search_properties", None)
    if own is None and setter is None:
        return  # judges no metric, as FIFOScheduler
    name, searcher_name = type(scheduler).__name__, type(searcher).__name__
    if getattr(scheduler, "takes_several_metrics", False):
        _agree_on_the_same_several(scheduler, searcher, metrics, modes)
        return
    fix = (
        f"pass one metric to the scheduler, e.g. {name}(metric={metrics[0]!r}, "
        f"mode={modes[0]!r}), or use FIFOScheduler (the default), which judges no metric"
    )
    if own is None:
        raise ValueError(
            f"The scheduler {name} judges trials by one metric, but the searcher "
            f"{searcher_name} optimises several: {metrics!r} (modes {modes!r}), and a scheduler "
            f"cannot take several; {fix}."
        )
    if own not in metrics:
        raise ValueError(
            f"The scheduler {name} judges trials by {own!r}, which is not one of the metrics "
            f"{metrics!r} the searcher {searcher_name} optimises; {fix}."
        )
    wanted = modes[metrics.index(own)]
    theirs = getattr(scheduler, "mode", None)
    if theirs and theirs != wanted:
        raise ValueError(
            f"The scheduler {name} and the searcher {searcher_name} disagree on the mode of "
            f"{own!r}: {theirs!r} vs {wanted!r} (scheduler vs searcher); give the scheduler "
            f"mode={wanted!r}, or no mode."
        )
    if not theirs and setter is not None:
        setter(None, wanted)


def _agree_on_the_same_several(
    scheduler: object, searcher: Searcher, metrics: list[str], modes: list[str]
) -> None:
    """A scheduler of several metrics (MOASHA) beside a searcher of several: the same metrics in
    the same order with the same modes; one that has none takes the searcher's."""
    own, theirs = getattr(scheduler, "metric", None), getattr(scheduler, "mode", None)
    setter = getattr(scheduler, "set_search_properties", None)
    if own is None and theirs is None and setter is not None:
        setter(metrics, modes)
        return
    if list(own or []) != metrics or list(theirs or []) != modes:
        raise ValueError(
            f"The scheduler {type(scheduler).__name__} judges trials by {own!r} (modes "
            f"{theirs!r}) but the searcher {type(searcher).__name__} optimises {metrics!r} (modes "
            f"{modes!r}); give both the same metrics, in the same order with the same modes, or "
            "set them on one of them only."
        )
