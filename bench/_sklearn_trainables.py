"""The tuning-quality benchmark's trainable: an MLP on scikit-learn's digits, one epoch per report,
in both APIs."""

from __future__ import annotations

import functools
import math
import warnings
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

#: The validation split is fixed: every trial, arm and seed scores on the same 25% of the digits.
SPLIT_SEED = 0
VALIDATION_FRACTION = 0.25
NUM_CLASSES = 10

Report = Callable[[dict[str, float]], Any]
Split = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]


@functools.lru_cache(maxsize=1)
def digits_split() -> Split:
    """(x_train, x_val, y_train, y_val): the 1,797 8x8 digits, pixels scaled to [0, 1], stratified.

    Cached per process, so a reused actor loads and splits the data once.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split(
        x / 16.0, y, test_size=VALIDATION_FRACTION, random_state=SPLIT_SEED, stratify=y
    )
    return x_train, x_val, y_train, y_val


def train_epochs(config: Mapping[str, Any], report: Report) -> None:
    """Train ``config["max_t"]`` epochs of an MLPClassifier with ``partial_fit``; report after each.

    ``config`` holds ``learning_rate_init``, ``alpha``, ``hidden_units`` (one hidden layer of that
    width), ``batch_size``, ``max_t`` and ``seed`` (the network's initialisation and shuffling, so
    one config trains the same way in every arm).
    """
    from sklearn.metrics import log_loss
    from sklearn.neural_network import MLPClassifier

    x_train, x_val, y_train, y_val = digits_split()
    classes = np.arange(NUM_CLASSES)
    model = MLPClassifier(
        hidden_layer_sizes=(int(config["hidden_units"]),),
        learning_rate_init=float(config["learning_rate_init"]),
        alpha=float(config["alpha"]),
        batch_size=int(config["batch_size"]),
        random_state=int(config["seed"]),
    )
    for _ in range(int(config["max_t"])):
        with warnings.catch_warnings():
            # A diverging learning rate overflows; that trial then scores badly, which is the point.
            warnings.simplefilter("ignore", RuntimeWarning)
            model.partial_fit(x_train, y_train, classes=classes)
            proba = model.predict_proba(x_val)
        val_acc = float(np.mean(classes[np.argmax(proba, axis=1)] == y_val))
        report({"val_acc": val_acc, "val_loss": _loss(log_loss, y_val, proba, classes)})


def _loss(
    log_loss: Callable[..., float], y_val: np.ndarray, proba: np.ndarray, classes: np.ndarray
) -> float:
    """The validation cross-entropy, or infinity when the network diverged to NaN."""
    if not np.all(np.isfinite(proba)):
        return math.inf
    return float(log_loss(y_val, proba, labels=classes))


def ours(config: dict[str, Any]) -> None:
    """For our TrialRunner: ``Trial("bench._sklearn_trainables:ours", config)``."""
    import airflow_trials

    train_epochs(config, airflow_trials.report)


def ray_tune(config: dict[str, Any]) -> None:
    """For Ray Tune's ``Tuner``."""
    from ray import tune

    train_epochs(config, tune.report)
