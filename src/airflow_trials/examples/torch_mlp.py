"""A PyTorch trainable: a small MLP classifier that trains on the GPU Ray gives its trial, else the
CPU.

Trainable path: ``airflow_trials.examples.torch_mlp:train``. Needs PyTorch (the ``torch`` extra:
``pip install -c constraints.txt '.[torch]'``); nothing else of the package imports it. Config keys:
``lr``, ``hidden`` (units per layer), ``batch_size``, ``seed`` and ``n_samples`` (the size of the
synthetic data set, made from the seed, so nothing is downloaded). It trains one epoch per report,
forever: give the trial a stopping criterion such as ``{"training_iteration": 10}``.

Each result carries ``val_loss``, ``val_accuracy``, ``on_cuda`` (1 when it trained on a GPU) and
``visible_gpus`` (the ``CUDA_VISIBLE_DEVICES`` Ray set for the trial). Each checkpoint holds the
model's and the optimizer's state on the CPU, so a trial resumed on another node (with or without
a GPU) continues where it stopped.
"""

from __future__ import annotations

import os
from typing import Any

import airflow_trials


def spirals(torch: Any, n_samples: int, seed: int) -> tuple[Any, Any, Any, Any]:
    """Two interleaved spirals in 2-D, 80% train and 20% validation (not linearly separable)."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (n_samples,), generator=generator)
    radius = torch.rand(n_samples, generator=generator) * 3 + 0.2
    angle = radius * 2.5 + labels * torch.pi
    points = torch.stack([radius * torch.cos(angle), radius * torch.sin(angle)], dim=1)
    points += 0.1 * torch.randn(points.shape, generator=generator)
    split = int(0.8 * n_samples)
    return points[:split], labels[:split], points[split:], labels[split:]


def mlp(nn: Any, hidden: int) -> Any:
    """The classifier: 2 inputs, two hidden layers of ``hidden`` units, 2 logits."""
    return nn.Sequential(
        nn.Linear(2, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 2)
    )


def fit_epoch(
    torch: Any, model: Any, optimizer: Any, loss_fn: Any, x: Any, y: Any, batch_size: int
) -> None:
    """One pass over ``(x, y)`` in shuffled batches of ``batch_size``."""
    model.train()
    order = torch.randperm(len(x), device=x.device)
    for i in range(0, len(order), batch_size):
        batch = order[i : i + batch_size]
        optimizer.zero_grad()
        loss_fn(model(x[batch]), y[batch]).backward()
        optimizer.step()


def evaluate(torch: Any, model: Any, loss_fn: Any, x: Any, y: Any) -> tuple[float, float]:
    """``(loss, accuracy)`` of ``model`` on ``(x, y)``."""
    model.eval()
    with torch.no_grad():
        logits = model(x)
        return float(loss_fn(logits, y)), float((logits.argmax(dim=1) == y).float().mean())


def train(config: dict[str, Any]) -> None:
    import torch
    from torch import nn

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(int(config.get("seed", 0)))
    x_train, y_train, x_val, y_val = (
        t.to(device)
        for t in spirals(torch, int(config.get("n_samples", 2000)), int(config.get("seed", 0)))
    )
    model = mlp(nn, int(config.get("hidden", 32))).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=float(config.get("lr", 0.01)))
    loss_fn = nn.CrossEntropyLoss()
    start = 0
    checkpoint = (
        airflow_trials.get_checkpoint()
    )  # the dict reported below (a path only for directories)
    if isinstance(checkpoint, dict):
        model.load_state_dict(checkpoint["model"])
        optimizer.load_state_dict(checkpoint["optimizer"])
        start = checkpoint["epoch"]
    batch_size = int(config.get("batch_size", 64))
    for epoch in range(start + 1, 1_000_000):
        fit_epoch(torch, model, optimizer, loss_fn, x_train, y_train, batch_size)
        val_loss, val_accuracy = evaluate(torch, model, loss_fn, x_val, y_val)
        airflow_trials.report(
            {
                "val_loss": val_loss,
                "val_accuracy": val_accuracy,
                "on_cuda": int(device.type == "cuda"),
                "visible_gpus": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            },
            checkpoint={
                "epoch": epoch,
                "model": {k: v.cpu() for k, v in model.state_dict().items()},
                "optimizer": _to_cpu(optimizer.state_dict()),
            },
        )


def _to_cpu(state: Any) -> Any:
    if hasattr(state, "cpu"):
        return state.cpu()
    if isinstance(state, dict):
        return {k: _to_cpu(v) for k, v in state.items()}
    if isinstance(state, list):
        return [_to_cpu(v) for v in state]
    return state
