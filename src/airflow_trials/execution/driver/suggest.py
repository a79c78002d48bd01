"""SearchDriver: makes the runner's new trials from a Searcher's suggestions and tells it every
result and end."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

from airflow_trials.core.callback import Callback
from airflow_trials.core.parameters import TrainableWithParameters
from airflow_trials.core.resources import Resources
from airflow_trials.core.result import Result
from airflow_trials.core.searcher import (
    FINISHED,
    ObjectiveValue,
    Searcher,
    agree_on_metric,
    objective_value,
)
from airflow_trials.core.status import TrialStatus
from airflow_trials.core.trial import Trial
from airflow_trials.exceptions import SearcherError

# Set per suggested trial by the driver, so a trial template cannot hold them.
_PER_TRIAL = ("trainable", "config", "trial_id", "experiment_name")


def build_search_driver(
    search_alg: Searcher | SearchDriver | None,
    num_samples: int,
    trainable: str | TrainableWithParameters | None,
    trial_kwargs: Mapping[str, Any] | None,
    experiment_name: str,
    resume: bool,
    scheduler: object = None,
) -> SearchDriver | None:
    """The runner's driver of ``search_alg``, or None without one; ValueError for arguments that
    clash, and for a ``scheduler`` judging by another metric or mode (:func:`agree_on_metric`).
    A :class:`SearchDriver` the caller built (the sweep driver's, with its run's trial ids) is
    used as it is."""
    if isinstance(search_alg, SearchDriver):
        if trainable is not None or trial_kwargs or num_samples != 1 or resume:
            raise ValueError(
                "A SearchDriver carries its own trainable, trial_kwargs and num_samples; pass it "
                "alone."
            )
        agree_on_metric(scheduler, search_alg.searcher)
        return search_alg
    if search_alg is None:
        if trainable is not None or trial_kwargs or num_samples != 1:
            raise ValueError(
                "num_samples, trainable and trial_kwargs describe the trials a search_alg "
                "suggests; "
                "pass search_alg= too, or create the trials yourself with add_trial()."
            )
        return None
    if resume:
        raise ValueError(
            f"Experiment {experiment_name}: TrialRunner(resume=True) cannot resume a search_alg "
            "yet, "
            f"because the searcher's state is not saved with the experiment. Resume without "
            f"search_alg (the saved trials continue), or start a new experiment."
        )
    agree_on_metric(scheduler, search_alg)
    return SearchDriver(search_alg, num_samples, trainable, trial_kwargs or {}, experiment_name)


class SearchDriver(Callback):
    """Asks a :class:`Searcher` for new trials and tells it about them, as Ray Tune's controller
    does.

    The runner calls :meth:`next_trial` at each step and adds the trial it returns; as one of the
    runner's callbacks, the driver tells the searcher every result of the trials it suggested and
    how each ended. The searcher is asked only when no trial waits to start and one more could
    start now (a free slot for the template's resources, or nothing running), so a sequential
    searcher has as many results as possible before each suggestion. It stops asking after
    ``num_samples`` trials or when the searcher returns ``FINISHED``.

    An exception from the searcher becomes a :class:`SearcherError` naming it (chained), after
    which the searcher is not called again; the runner then stops its unfinished trials.

    :param searcher: the :class:`Searcher`.
    :param num_samples: the most trials it may create; a whole number >= 1.
    :param trainable: the import path (or ``with_parameters`` bundle) every trial runs.
    :param trial_kwargs: the other :class:`Trial` arguments of every trial (``resources``,
        ``max_failures``, ``stopping_criterion``, checkpoint settings).
    :param experiment_name: the trials' experiment.
    :param trial_ids: the ids its trials get, in order (a sweep's, fixed before it runs); default
        ``<random prefix>_00001`` and on. With them, ``num_samples`` is their number.
    """

    def __init__(
        self,
        searcher: Searcher,
        num_samples: int,
        trainable: str | TrainableWithParameters | None,
        trial_kwargs: Mapping[str, Any],
        experiment_name: str,
        trial_ids: Sequence[str] | None = None,
    ) -> None:
        if not isinstance(searcher, Searcher):
            raise TypeError(
                "search_alg must be a Searcher (such as OptunaSearch), got "
                f"{type(searcher).__name__}."
            )
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples < 1:
            raise ValueError(f"num_samples must be a whole number >= 1, got {num_samples!r}.")
        if trial_ids is not None and len(trial_ids) != num_samples:
            raise ValueError(
                f"trial_ids has {len(trial_ids)} ids for num_samples={num_samples}; give one id "
                "per trial."
            )
        if trainable is None:
            raise ValueError(
                "A search_alg suggests configs of one trainable: pass "
                "trainable='my_pkg.train:train' too."
            )
        taken = sorted(set(trial_kwargs) & set(_PER_TRIAL))
        if taken:
            raise ValueError(
                f"trial_kwargs cannot set {taken}: the searcher gives each trial its config and "
                "the "
                f"runner its id and experiment; pass the trainable as trainable=."
            )
        self.searcher = searcher
        self.num_samples = num_samples
        self.trainable = trainable
        self.trial_kwargs = dict(trial_kwargs)
        self.experiment_name = experiment_name
        try:
            self.resources = self._new_trial("template", {}).resources
        except TypeError as e:  # a keyword Trial does not take
            raise ValueError(
                f"trial_kwargs: {e}; it takes Trial's arguments: resources, stopping_criterion, "
                f"checkpoint_freq, checkpoint_at_end, keep_checkpoints_num, checkpoint_score_attr, "
                f"max_failures, restore_path."
            ) from e
        self.num_created = 0
        self._prefix = uuid.uuid4().hex[:8]  # a rerun into the same storage gets new directories
        self._trial_ids = None if trial_ids is None else list(trial_ids)
        self._searcher_finished = False
        self._failed = False
        self._live: set[str] = set()
        self._adopted: dict[str, dict[str, Any]] = {}

    def resume(
        self,
        ended: Sequence[tuple[Any, ...]],
        adopted: Sequence[Trial],
        asked: int,
    ) -> None:
        """Pick up a run an earlier process began: tell the searcher the run's ended trials
        (``(trial id, config, value)``, value None: failed; or ``(trial id, config, value, last
        result)``, whose result a searcher with constraints computes their values from) with
        ``add_evaluated_point``; learn how
        each of ``adopted`` (trials the runner runs with configs it did not ask for now: resumed
        ones, warm starts) ends the same way; and skip the ``asked`` suggestions handed out before
        (``Searcher.resume_after``)."""
        self.searcher.resume_after(
            asked
        )  # first: it may reseed the sampler before the study is built
        for trial_id, config, value, *last in ended:
            result = last[0] if last else None
            self._call("add_evaluated_point", self._learn, trial_id, config, value, result)
        self._adopted.update((trial.trial_id, dict(trial.config)) for trial in adopted)

    def _learn(
        self,
        trial_id: str,
        config: Mapping[str, Any],
        value: ObjectiveValue | None,
        result: Mapping[str, Any] | None = None,
    ) -> None:
        if result is not None and getattr(self.searcher, "constraints", None):
            # OptunaSearch(constraints=...), maybe behind a ConcurrencyLimiter: the values are
            # computed from the last result.
            self.searcher.add_evaluated_point(config, value, error=value is None, result=result)
        else:
            self.searcher.add_evaluated_point(config, value, error=value is None)

    @property
    def name(self) -> str:
        inner = getattr(self.searcher, "searcher", None)
        outer = type(self.searcher).__name__
        return f"{outer}({type(inner).__name__})" if isinstance(inner, Searcher) else outer

    def is_finished(self) -> bool:
        """Will it create no more trials?"""
        return self._failed or self._searcher_finished or self.num_created >= self.num_samples

    def _new_trial(self, trial_id: str, config: Mapping[str, Any]) -> Trial:
        return Trial(
            self.trainable,
            config,
            trial_id=trial_id,
            experiment_name=self.experiment_name,
            **self.trial_kwargs,
        )

    def next_trial(
        self, unfinished: Sequence[Trial], has_resources: Callable[[Resources], bool]
    ) -> Trial | None:
        """The searcher's next trial, when it is asked and suggests one; None otherwise.

        :param unfinished: the runner's trials that have not ended.
        :param has_resources: whether a trial of these resources could start now.
        """
        if self.is_finished() or any(t.status == TrialStatus.PENDING for t in unfinished):
            return None
        if any(t.status == TrialStatus.RUNNING for t in unfinished) and not has_resources(
            self.resources
        ):
            return None
        trial_id = (
            f"{self._prefix}_{self.num_created + 1:05d}"
            if self._trial_ids is None
            else self._trial_ids[self.num_created]
        )
        suggestion = self._call("suggest", self.searcher.suggest, trial_id)
        if suggestion == FINISHED:
            self._searcher_finished = True
            return None
        if suggestion is None:
            if not unfinished:
                self._fail(
                    f"returned None for trial {trial_id} while no trial of the experiment is "
                    f"running or waiting, so nothing could change its answer; return "
                    f"Searcher.FINISHED to end the search"
                )
            return None
        if not isinstance(suggestion, Mapping):
            self._fail(
                f"suggested {type(suggestion).__name__} {suggestion!r} for trial {trial_id}; "
                f"suggest() returns a config dict, None or Searcher.FINISHED"
            )
        try:
            trial = self._new_trial(trial_id, suggestion)
        except ValueError as e:
            self._fail(f"suggested a config for trial {trial_id} that no trial can take: {e}", e)
        self.num_created += 1
        self._live.add(trial_id)
        return trial

    # -- telling the searcher, as a runner callback
    # -------------------------------------------------
    def on_trial_result(self, trial: Trial, result: Result) -> None:
        if trial.trial_id in self._live and not self._failed:
            self._call("on_trial_result", self.searcher.on_trial_result, trial.trial_id, result)

    def on_trial_complete(self, trial: Trial) -> None:
        self._end(trial, error=False)

    def on_trial_error(self, trial: Trial) -> None:
        self._end(trial, error=True)

    def _end(self, trial: Trial, *, error: bool) -> None:
        if trial.trial_id in self._adopted and not self._failed:
            value = (
                None if error else objective_value(trial.last_result, self.searcher.metric or "")
            )
            config = self._adopted.pop(trial.trial_id)
            if (
                error or value is not None
            ):  # stopped before it reported the metric: nothing to learn
                last = None if error else trial.last_result
                self._call("add_evaluated_point", self._learn, trial.trial_id, config, value, last)
            return
        if trial.trial_id not in self._live or self._failed:
            return
        self._live.discard(trial.trial_id)
        # Its last result: a trial stopped before it reported (still PENDING) has none.
        result = None if error or not trial.last_result else dict(trial.last_result)
        self._call(
            "on_trial_complete",
            self.searcher.on_trial_complete,
            trial.trial_id,
            result=result,
            error=error,
        )

    def _call(
        self, hook: str, method: Callable[..., Any], trial_id: str, *args: Any, **kwargs: Any
    ) -> Any:
        try:
            return method(trial_id, *args, **kwargs)
        except (
            Exception
        ) as e:  # any error of user code ends the search: re-raised, named and chained
            self._fail(f"raised {type(e).__name__} in {hook}() for trial {trial_id}: {e}", e)

    def _fail(self, what: str, cause: BaseException | None = None) -> NoReturn:
        self._failed = True
        raise SearcherError(
            f"Search algorithm {self.name} of experiment {self.experiment_name} {what}. The "
            f"experiment ended: its unfinished trials were stopped and every result so far is kept."
        ) from cause
