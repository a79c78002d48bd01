"""OptunaSearch: Optuna's samplers (TPE by default) over this package's JSON search spaces."""

from __future__ import annotations

import copy
import logging
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import optuna
from optuna.trial import TrialState

from airflow_trials.core.constraints import Constraints
from airflow_trials.core.pareto import MetricSpec, ModeSpec
from airflow_trials.core.result import TRAINING_ITERATION, Result
from airflow_trials.core.searcher import (
    ObjectiveValue,
    Searcher,
    Suggestion,
    check_metric_and_mode,
)
from airflow_trials.searchers.optuna_space import (
    SEPARATOR,
    OptunaSpace,
    convert_search_space,
    flat_point,
    indexed_choices,
    is_leaf,
)
from airflow_trials.searchers.optuna_values import constraint_values, told_value

log = logging.getLogger(__name__)

Finished = (
    tuple[Mapping[str, Any], "ObjectiveValue | None"]
    | tuple[Mapping[str, Any], "ObjectiveValue | None", "Mapping[str, Any] | None"]
)
"""A finished trial as :meth:`OptunaSearch.suggest_after` takes it: its config and its value, a
list of one value per metric with several (None: it failed); and, with ``constraints``, its last
result, which the constraint values are computed from."""


class OptunaSearch(Searcher):
    """Ray Tune 2.60's ``OptunaSearch``: Optuna's ask-and-tell over a JSON search space.

    Each suggestion is ``study.ask()`` with the space's distributions; each result is reported as
    the trial's intermediate value at its ``training_iteration`` (``trial.report``); each end is
    told with the metric of the trial's last result (``study.tell``), as FAIL when it errored and
    as PRUNED when it ended before reporting. Values that are not domains are copied into every
    config. Domains Optuna cannot sample are refused when the space is set, naming the key::

        from airflow_trials import OptunaSearch, TrialRunner
        from airflow_trials.core.search import choice, loguniform

        search = OptunaSearch({"lr": loguniform(1e-4, 1e-1), "layers": choice([2, 4])},
                              metric="loss", mode="min", seed=0)
        runner = TrialRunner("mnist", search_alg=search, num_samples=40,
                             trainable="my_pkg.train:train", storage_path="/shared/results")

    Several metrics at once, as Ray Tune's: ``metric=["val_acc", "latency"], mode=["max",
    "min"]`` makes a multi-objective study (``directions``), whatever the sampler (the default
    TPE handles several objectives, as does ``optuna.samplers.NSGAIISampler``). Each end is told
    with the list of the last result's values, and ``study.best_trials`` is the Pareto front.
    Optuna keeps no intermediate values for several objectives (``Trial.report`` takes one), so
    results are not reported then, as in Ray Tune. A scheduler beside it judges one of the
    metrics in the same mode, or none (FIFO, the default).

    :param space: the search space, as for ``generate_configs`` (nested dicts allowed; values may
        also be Optuna distributions); default None: set later by ``set_search_properties``.
    :param metric: the result key to optimise, or a list of them to optimise at once; default
        None (set later).
    :param mode: ``"min"`` or ``"max"``, or with several metrics a list of one per metric in the
        same order; default None (set later).
    :param points_to_evaluate: configs (or parts of configs: Optuna samples the rest) to run
        first, in this order; default none.
    :param sampler: any ``optuna.samplers.BaseSampler`` (CMA-ES, GP, NSGA-II...); default
        ``TPESampler(seed=seed)``.
    :param seed: seeds the default TPE sampler; give a ``sampler`` its own seed instead. Default
        None.
    :param evaluated_rewards: the metric each of ``points_to_evaluate`` already reached (with
        several metrics, a list of one value per metric): those points are then added as finished
        trials rather than run. Default none.
    :param constraints: bounds on reported metrics that a trial must meet to count, as strings
        ``"<metric> <= <number>"`` or ``"<metric> >= <number>"`` (e.g. ``["latency <= 5.0"]``;
        :mod:`airflow_trials.core.constraints`). Each ended trial's values are computed from its
        last result and set on the Optuna trial (``Trial.set_constraint``), which Optuna 5's
        constrained samplers (TPE, NSGA-II, GP) read: they steer away from infeasible configs, and
        ``study.best_trial(s)`` holds feasible trials only. Default none.
    """

    def __init__(
        self,
        space: Mapping[str, Any] | None = None,
        metric: MetricSpec | None = None,
        mode: ModeSpec | None = None,
        points_to_evaluate: Sequence[Mapping[str, Any]] | None = None,
        sampler: optuna.samplers.BaseSampler | None = None,
        seed: int | None = None,
        evaluated_rewards: Sequence[ObjectiveValue] | None = None,
        constraints: Sequence[str] | None = None,
    ) -> None:
        if metric is not None and not isinstance(metric, str | list | tuple):
            raise ValueError(
                "OptunaSearch optimises one metric, given as a string, or several, given as a "
                f"list of strings; got {metric!r}."
            )
        super().__init__(metric, mode)
        if sampler is not None and not isinstance(sampler, optuna.samplers.BaseSampler):
            raise TypeError(
                "OptunaSearch: sampler must be an optuna.samplers.BaseSampler, got "
                f"{type(sampler).__name__}."
            )
        if sampler is not None and seed is not None:
            raise ValueError(
                "OptunaSearch: seed= seeds only the default TPE sampler; pass the seed to your "
                "sampler instead, e.g. optuna.samplers.CmaEsSampler(seed=0)."
            )
        self.constraints = Constraints.parse(constraints, "OptunaSearch")
        if self.constraints and evaluated_rewards is not None:
            raise ValueError(
                "OptunaSearch: evaluated_rewards gives each point one value per metric but no "
                f"value of the constraints {self.constraints.spec!r}; leave evaluated_rewards out "
                "and add those points with add_evaluated_point(config, value, result=their last "
                "result)."
            )
        self._points = [dict(point) for point in points_to_evaluate or ()]
        self._evaluated_rewards = None if evaluated_rewards is None else list(evaluated_rewards)
        if self._evaluated_rewards is not None and len(self._evaluated_rewards) != len(
            self._points
        ):
            raise ValueError(
                f"OptunaSearch: evaluated_rewards has {len(self._evaluated_rewards)} values but "
                f"points_to_evaluate has {len(self._points)} points; give one reward per point."
            )
        for i, reward in enumerate(self._evaluated_rewards or ()):
            # Checked now, not at the first ask.
            told_value(self.metric, f"evaluated_rewards[{i}]", reward)
        self._sampler = sampler
        self._seed = seed
        self._space: Mapping[str, Any] | None = None
        self._distributions: OptunaSpace = {}
        self._study: optuna.Study | None = None
        self._ot_trials: dict[str, optuna.trial.Trial] = {}
        self._completed: set[str] = set()
        self._points_asked = 0
        self._sampler_seed = seed  # the default sampler's seed; resume_after changes it
        if space:
            self._set_space(space)

    @property
    def _several(self) -> bool:
        """Does it optimise several metrics at once (a multi-objective study)?"""
        return isinstance(self.metric, list)

    convert_search_space = staticmethod(convert_search_space)

    def _set_space(self, space: Mapping[str, Any]) -> None:
        distributions = convert_search_space(space)
        if not distributions:
            raise ValueError(
                "OptunaSearch: the search space has no domain to search, only fixed values; "
                "give at least one key a domain such as uniform(0, 1)."
            )
        self._distributions = distributions
        self._space = space
        points = [
            flat_point(f"points_to_evaluate[{i}]", point, space, self._distributions)
            for i, point in enumerate(self._points)
        ]
        if self._evaluated_rewards is not None:
            for i, flat in enumerate(points):
                missing = sorted(set(distributions) - set(flat))
                if missing:
                    raise ValueError(
                        f"OptunaSearch: points_to_evaluate[{i}] has an evaluated reward but no "
                        "value "
                        f"for {missing}; an evaluated point needs a value for every domain."
                    )
        self._flat_points = points

    def set_search_properties(
        self, metric: str | None, mode: str | None, config: Mapping[str, Any]
    ) -> bool:
        """Take the space (and the metric and mode, when given); False if this searcher has a
        space."""
        if self._space is not None:
            return False
        self._set_space(config)
        self._metric, self._mode = check_metric_and_mode(
            "OptunaSearch", metric or self._metric, mode or self._mode
        )
        return True

    @property
    def study(self) -> optuna.Study:
        """The Optuna study, created on first use: read ``best_params`` (with several metrics,
        ``best_trials``, the Pareto front), plot it, save it."""
        if self._study is None:
            self._study = self._create_study()
        return self._study

    def _require_space(self) -> Mapping[str, Any]:
        if self._space is None:
            raise ValueError(
                "OptunaSearch has no search space; pass space= to OptunaSearch(...) or give it "
                "through set_search_properties before the first suggestion."
            )
        return self._space

    def _create_study(self) -> optuna.Study:
        self._require_space()
        if not self.metric or not self.mode:
            raise ValueError(
                f"OptunaSearch needs a metric and a mode, got metric={self.metric!r}, "
                f"mode={self.mode!r}; pass both, e.g. OptunaSearch(..., metric='loss', mode='min')."
            )
        study = self._new_study(
            self._sampler or optuna.samplers.TPESampler(seed=self._sampler_seed)
        )
        self._add_evaluated_rewards(study)
        return study

    def _new_study(self, sampler: optuna.samplers.BaseSampler) -> optuna.Study:
        """An empty study in this searcher's direction, or directions with several metrics."""
        directions = self.mode if isinstance(self.mode, list) else [self.mode]
        return optuna.create_study(
            directions=["minimize" if mode == "min" else "maximize" for mode in directions],
            sampler=sampler,
            # The runner's scheduler stops trials, as in Ray Tune.
            pruner=optuna.pruners.NopPruner(),
        )

    def _finished(
        self,
        where: str,
        flat: Mapping[str, Any],
        value: ObjectiveValue | None,
        state: TrialState = TrialState.COMPLETE,
        intermediate_values: dict[int, float] | None = None,
        result: Mapping[str, Any] | None = None,
    ) -> optuna.trial.FrozenTrial:
        """A finished Optuna trial of flat params (from :func:`flat_point`), for ``add_trial``;
        ``where`` names its value in messages (``evaluated_rewards[0]``); with ``constraints``, a
        COMPLETE one's constraint values from ``result``."""
        dists = {path: self._distributions[path] for path in flat}
        bounded = None
        if state is TrialState.COMPLETE and self.constraints and result is not None:
            bounded = constraint_values(self.constraints, where, result)
        return optuna.trial.create_trial(
            params=dict(flat),
            distributions=dists,
            state=state,
            intermediate_values=intermediate_values,
            constraints=bounded,
            **told_value(self.metric, where, value),
        )

    def _add_evaluated_rewards(self, study: optuna.Study) -> None:
        """``points_to_evaluate`` with their ``evaluated_rewards``, as finished trials (when
        given)."""
        if self._evaluated_rewards is not None:
            for i, (flat, reward) in enumerate(
                zip(self._flat_points, self._evaluated_rewards, strict=True)
            ):
                study.add_trial(self._finished(f"evaluated_rewards[{i}]", flat, reward))

    def suggest(self, trial_id: str) -> Suggestion:
        study = self.study
        ot_trial = self._ot_trials.get(trial_id)
        if ot_trial is None:
            # points_to_evaluate go first, in order, one per new trial (none when they were
            # evaluated)
            if self._evaluated_rewards is None and self._points_asked < len(self._flat_points):
                study.enqueue_trial(self._flat_points[self._points_asked])
            self._points_asked += 1
            ot_trial = self._ot_trials[trial_id] = study.ask(
                fixed_distributions=self._distributions
            )
        return self._config(self._require_space(), ot_trial.params)

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
        """Add a config evaluated elsewhere to the study, as Ray Tune's ``OptunaSearch`` does
        (``study.add_trial``): COMPLETE with ``value`` (with several metrics, a list of one value
        per metric); FAIL with ``error`` (or no value); PRUNED with ``pruned``.
        ``intermediate_values`` are its metric at steps 0, 1, ... (one metric only: Optuna keeps
        none for several).

        :param parameters: the trial's config (the search space's keys; fixed values are ignored).
        :param result: with ``constraints``, the trial's last result, which its constraint values
            are computed from. Without it Optuna counts the trial as feasible (a warning says so).
        """
        flat = flat_point(
            "add_evaluated_point parameters", parameters, self._require_space(), self._distributions
        )
        if intermediate_values and self._several:
            raise ValueError(
                f"OptunaSearch optimises several metrics, {self.metric!r}, and Optuna keeps no "
                "intermediate values for several objectives (Trial.report takes one); call "
                "add_evaluated_point without intermediate_values."
            )
        if error or (value is None and not pruned):
            state, value = TrialState.FAIL, None
        else:
            state, value = (TrialState.PRUNED, None) if pruned else (TrialState.COMPLETE, value)
        if state is TrialState.COMPLETE and self.constraints and result is None:
            # The resumed sweep's driver tells ended trials by value only; refusing them would
            # make a constrained sweep impossible to resume, so say what the sampler is told.
            log.warning(
                "OptunaSearch: a point with value %r was added without its result, so its "
                "constraints %s are unknown and Optuna counts it as feasible; pass result= to "
                "add_evaluated_point.",
                value,
                self.constraints.spec,
            )
        self.study.add_trial(
            self._finished(
                "add_evaluated_point value",
                flat,
                value,
                state,
                dict(enumerate(intermediate_values or ())),
                result,
            )
        )

    def resume_after(self, asked: int) -> None:
        """A resumed run had asked ``asked`` times before: skip that many of ``points_to_evaluate``,
        and reseed the sampler so that it does not draw the first process's points again (the
        default TPE sampler from ``seed`` and ``asked``, so a resume stays reproducible; a sampler
        of your own with ``reseed_rng()``)."""
        if asked <= 0:
            return
        self._points_asked = max(self._points_asked, asked)
        if self._sampler is None:
            self._sampler_seed = (
                None if self._seed is None else zlib.crc32(f"{self._seed}:resumed:{asked}".encode())
            )
        else:
            self._sampler.reseed_rng()
        if self._study is not None:
            self._study.sampler = self._sampler or optuna.samplers.TPESampler(
                seed=self._sampler_seed
            )

    def suggest_after(
        self, trial_id: str, finished: Sequence[Finished], index: int, seed: int
    ) -> Suggestion:
        """One suggestion from a study that knows only ``finished`` (the Airflow path's ask: each
        trial task asks at its start, from the run's trials the trials DB holds, as Optuna's
        distributed workers ask one shared study). This searcher's own study is not touched.

        :param trial_id: the trial asking (for messages).
        :param finished: ``(config, value)`` of the run's ended trials (with several metrics,
            value is a list of one value per metric); value None: it failed. With
            ``constraints``, ``(config, value, last result)``: a finished trial without its result
            is refused, since its constraint values are unknown.
        :param index: the trial's place in the run: ``points_to_evaluate[index]`` is its config
            when there is one.
        :param seed: seeds the default TPE sampler (with this searcher's own ``seed=`` mixed in), so
            that trials asking at once get different points; a sampler given to this searcher is
            copied and reseeded instead.
        """
        space = self._require_space()
        if self._sampler is not None:
            sampler = copy.deepcopy(self._sampler)
            sampler.reseed_rng()
        else:  # this searcher's own seed=, when given, is mixed in: another seed, other points
            mixed = seed if self._seed is None else zlib.crc32(f"{self._seed}:{seed}".encode())
            sampler = optuna.samplers.TPESampler(seed=mixed)
        study = self._new_study(sampler)
        for i, entry in enumerate(finished):
            config, value = entry[0], entry[1]
            result = entry[2] if len(entry) > 2 else None
            if self.constraints and value is not None and result is None:
                raise ValueError(
                    f"OptunaSearch: trial {trial_id} asks after finished trial {i}, which comes "
                    f"without its last result, so the constraints {self.constraints.spec!r} "
                    "cannot be computed for it; pass (config, value, last result) for each "
                    "finished trial, or run a constrained search on the TrialRunner."
                )
            flat = flat_point(f"finished trial {i}", config, space, self._distributions)
            study.add_trial(
                self._finished(
                    f"finished trial {i}'s value",
                    flat,
                    value,
                    TrialState.FAIL if value is None else TrialState.COMPLETE,
                    result=result,
                )
            )
        self._add_evaluated_rewards(study)
        if self._evaluated_rewards is None and index < len(self._flat_points):
            study.enqueue_trial(self._flat_points[index])
        log.debug("OptunaSearch: trial %s asks after %d finished trials.", trial_id, len(finished))
        return self._config(space, study.ask(fixed_distributions=self._distributions).params)

    def _config(
        self, space: Mapping[str, Any], params: Mapping[str, Any], prefix: str = ""
    ) -> dict[str, Any]:
        config: dict[str, Any] = {}
        for key, value in space.items():
            path = f"{prefix}{key}"
            if path in self._distributions:
                choices = indexed_choices(value)
                param = params[path]
                config[key] = copy.deepcopy(choices[param]) if choices is not None else param
            elif isinstance(value, Mapping) and value and not is_leaf(value):
                config[key] = self._config(value, params, f"{path}{SEPARATOR}")
            else:
                config[key] = copy.deepcopy(value)
        return config

    def _trial(self, trial_id: str) -> optuna.trial.Trial | None:
        if trial_id in self._completed:
            log.warning(
                "OptunaSearch: trial %s already completed; ignoring what came after.", trial_id
            )
            return None
        try:
            return self._ot_trials[trial_id]
        except KeyError as e:
            raise ValueError(
                f"OptunaSearch did not suggest trial {trial_id}; tell it only about trials it "
                "suggested."
            ) from e

    def _value(self, trial_id: str, result: Result) -> ObjectiveValue:
        if isinstance(self.metric, list):
            missing = [m for m in self.metric if m not in result]
            if missing:
                raise ValueError(
                    f"Trial {trial_id} reported a result without {missing[0]!r}, one of the "
                    f"metrics OptunaSearch optimises ({self.metric!r}; it reported "
                    f"{sorted(result)}); report every one of them in every result, or set "
                    "metric= to keys it reports."
                )
            return [float(result[m]) for m in self.metric]
        return self._one_value(trial_id, result)

    def _one_value(self, trial_id: str, result: Result) -> float:
        if self.metric not in result:
            raise ValueError(
                f"Trial {trial_id} reported a result without {self.metric!r}, the metric "
                "OptunaSearch "
                f"optimises (it reported {sorted(result)}); report it in every result, or set "
                "metric= "
                f"to one of those keys."
            )
        return float(result[self.metric])

    def on_trial_result(self, trial_id: str, result: Result) -> None:
        ot_trial = self._trial(trial_id)
        if ot_trial is None:
            return
        if self._several:
            # Optuna's Trial.report takes one objective: a multi-objective study keeps no
            # intermediate values (Ray Tune skips them too). The end is told in full.
            return
        if TRAINING_ITERATION not in result:
            raise ValueError(
                f"Trial {trial_id}: OptunaSearch needs {TRAINING_ITERATION!r} in each result as "
                "the "
                "step of its intermediate value; the runner adds it, so add it when you call it "
                "yourself."
            )
        ot_trial.report(self._one_value(trial_id, result), step=int(result[TRAINING_ITERATION]))

    def on_trial_complete(
        self, trial_id: str, result: Result | None = None, error: bool = False
    ) -> None:
        ot_trial = self._trial(trial_id)
        if ot_trial is None:
            return
        study = self.study
        if error:
            study.tell(ot_trial, state=TrialState.FAIL)
        elif not result:
            study.tell(ot_trial, state=TrialState.PRUNED)  # ended before it reported anything
        else:
            value = self._value(trial_id, result)
            if self.constraints:
                where = f"trial {trial_id}"
                for key, amount in constraint_values(self.constraints, where, result).items():
                    ot_trial.set_constraint(key, amount)
            study.tell(ot_trial, value)
        del self._ot_trials[trial_id]
        self._completed.add(trial_id)
