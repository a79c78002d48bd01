"""A real, small model: logistic regression trained with NumPy mini-batch SGD on generated data.

Trainable path: ``airflow_trials.examples.regression:train``. Config keys: ``lr`` (learning rate),
``l2`` (weight decay), ``batch_size``, ``seed`` (data and init), ``num_samples`` and
``num_features`` of the generated data. Reports ``train_loss``, ``val_loss``, ``val_accuracy``
and ``weight_norm`` (the weights' L2 norm: a smaller model, at some cost in accuracy, which
``l2`` trades off; ``dags/two_objective_tuning.py`` tunes both) per epoch, and checkpoints the
weights with every report.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np

import airflow_trials


def make_data(num_samples: int, num_features: int, seed: int) -> tuple[np.ndarray, ...]:
    """A linearly separable-ish binary problem with label noise, split 80/20."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_samples, num_features))
    true_w = rng.normal(size=num_features)
    logits = x @ true_w + 0.5 * rng.normal(size=num_samples)
    y = (logits > 0).astype(np.float64)
    split = int(0.8 * num_samples)
    return x[:split], y[:split], x[split:], y[split:]


def _loss(w: np.ndarray, b: float, x: np.ndarray, y: np.ndarray, l2: float) -> float:
    z = x @ w + b
    # log(1 + exp(-z)) for y=1 and log(1 + exp(z)) for y=0, computed stably.
    nll = np.logaddexp(0.0, z) - y * z
    return float(nll.mean() + 0.5 * l2 * (w @ w))


def train(config: dict[str, Any]) -> None:
    lr = float(config.get("lr", 0.1))
    l2 = float(config.get("l2", 0.0))
    batch_size = int(config.get("batch_size", 64))
    seed = int(config.get("seed", 0))
    x_train, y_train, x_val, y_val = make_data(
        int(config.get("num_samples", 20_000)), int(config.get("num_features", 50)), seed
    )
    rng = np.random.default_rng(seed + 1)
    w = np.zeros(x_train.shape[1])
    b = 0.0
    epoch = 0
    # This trainable reports its checkpoints as dicts, so that is what it gets back.
    checkpoint = cast("dict[str, Any] | None", airflow_trials.get_checkpoint())
    if checkpoint is not None:
        w, b, epoch = np.asarray(checkpoint["w"]), float(checkpoint["b"]), int(checkpoint["epoch"])
        rng = np.random.default_rng(seed + 1 + epoch)
    while True:
        epoch += 1
        order = rng.permutation(len(x_train))
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            xb, yb = x_train[idx], y_train[idx]
            p = 1.0 / (1.0 + np.exp(-(xb @ w + b)))
            grad_w = xb.T @ (p - yb) / len(idx) + l2 * w
            grad_b = float((p - yb).mean())
            w -= lr * grad_w
            b -= lr * grad_b
        val_pred = (x_val @ w + b) > 0
        metrics = {
            "train_loss": _loss(w, b, x_train, y_train, l2),
            "val_loss": _loss(w, b, x_val, y_val, l2),
            "val_accuracy": float((val_pred == (y_val > 0.5)).mean()),
            "weight_norm": float(np.sqrt(w @ w)),
            "epoch": epoch,
        }
        airflow_trials.report(metrics, checkpoint={"w": w.tolist(), "b": b, "epoch": epoch})
