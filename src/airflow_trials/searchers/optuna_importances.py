"""Hyperparameter importances by Optuna's evaluators: a run's trials as an in-memory study, and
``optuna.importance.get_param_importances`` over it.

The pure part (which parameters, on which distributions, from which trials) is
:mod:`airflow_trials.core.importances`; this module only hands it to Optuna, imported on first
use. Each metric is its own single-objective study, minimized or maximized as its mode says, so
PED-ANOVA's "top quantile" is the best trials of that metric::

    from airflow_trials.core.importances import prepare_importances
    from airflow_trials.searchers.optuna_importances import evaluate_importances

    data = prepare_importances(configs, values, metric="loss", mode="min", subject="run r1")
    for row in evaluate_importances(data, "ped-anova").params:
        print(row.name, row.importance)
"""

from __future__ import annotations

import importlib.util
import warnings
from typing import TYPE_CHECKING, Any

from airflow_trials.core.importances import (
    DEFAULT_EVALUATOR,
    EvaluatorUnavailableError,
    ImportanceInput,
    Importances,
    ParamSpec,
    check_evaluator,
    ranked,
)

if TYPE_CHECKING:
    from optuna.distributions import BaseDistribution
    from optuna.importance import BaseImportanceEvaluator

#: fANOVA's forest. Optuna's default (64 trees of depth 64) takes over a minute at 1,000 trials
#: on one core, in its pure-Python tree walk; 16 trees of depth 8 take seconds (2 to 12 on a
#: loaded 2-core machine) and rank the same parameter first on this package's tests. Seeded, so
#: a page shows the same ranking twice.
FANOVA_TREES = 16
FANOVA_MAX_DEPTH = 8
FANOVA_SEED = 0
SKLEARN_HINT = (
    "fANOVA needs scikit-learn, which is not installed where the importances are computed (the "
    "Airflow api-server for the dashboard, your shell for the CLI); install it there with "
    "pip install 'scikit-learn>=1.5', or use the default evaluator ped-anova, which needs nothing "
    "more."
)


def evaluate_importances(data: ImportanceInput, evaluator: str = DEFAULT_EVALUATOR) -> Importances:
    """The importances of ``data``'s parameters for its metric, most important first.

    :param data: from :func:`~airflow_trials.core.importances.prepare_importances`.
    :param evaluator: ``"ped-anova"`` (default) or ``"fanova"``.
    :raises EvaluatorUnavailableError: ``"fanova"`` without scikit-learn installed.
    """
    check_evaluator(evaluator)
    judge = _evaluator(evaluator)
    import optuna

    distributions = {name: _distribution(spec) for name, spec in data.params.items()}
    study = optuna.create_study(
        storage=None,
        direction="minimize" if data.mode == "min" else "maximize",
        study_name=f"importances of {data.mode} {data.metric} for {data.subject}",
    )
    study.add_trials(
        [
            optuna.trial.create_trial(
                params=params,
                distributions={name: distributions[name] for name in params},
                value=value,
            )
            for _, params, value in data.points
        ]
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = optuna.importance.get_param_importances(study, evaluator=judge)
    notes = list(dict.fromkeys(str(w.message) for w in caught))
    left_out = sorted(set(data.params) - set(found))
    if left_out:
        notes.append(
            f"{evaluator} leaves out the parameters some trials lack: {', '.join(left_out)}."
        )
    return Importances(
        subject=data.subject,
        metric=data.metric,
        mode=data.mode,
        evaluator=evaluator,
        params=ranked(found, data),
        num_trials=data.num_trials,
        num_skipped=data.num_skipped,
        constant=list(data.constant),
        notes=notes,
    )


def _evaluator(name: str) -> BaseImportanceEvaluator:
    from optuna.importance import FanovaImportanceEvaluator, PedAnovaImportanceEvaluator

    if name == "ped-anova":
        return PedAnovaImportanceEvaluator()
    if importlib.util.find_spec("sklearn") is None:
        raise EvaluatorUnavailableError(SKLEARN_HINT)
    try:
        return FanovaImportanceEvaluator(
            n_trees=FANOVA_TREES, max_depth=FANOVA_MAX_DEPTH, seed=FANOVA_SEED
        )
    except ImportError as e:  # installed, but broken (a wheel built for another numpy...)
        raise EvaluatorUnavailableError(f"{SKLEARN_HINT} Importing it failed: {e}") from e


def _distribution(spec: ParamSpec) -> BaseDistribution:
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if spec.kind == "categorical":
        return CategoricalDistribution(list(spec.choices))
    low: Any = spec.low
    high: Any = spec.high
    if spec.kind == "int":
        return IntDistribution(int(low), int(high), log=spec.log)
    return FloatDistribution(float(low), float(high), log=spec.log)
